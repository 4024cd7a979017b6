// The small floating-point element formats (FP8 E4M3 / E5M2 in fp8.h, FP4 E2M1 in fp4.h): one
// fp32 <-> code conversion for all of them, parameterized by each format's traits.
//
// A format's traits (a struct of constants):
//   sign_bit        the code's sign bit (7 for FP8, 3 for FP4); the magnitude is the bits below it
//   mantissa_bits   M; the exponent's bias
//   max, max_code, max_float_bits   the largest finite value, its code, its fp32 bits
//   nan_code        what encoding a NaN gives (the sign dropped)
//   nan_value_bits  the fp32 bits a NaN's round trip gives (a NaN, or max for a format without NaN)
//   first_nan_code  magnitude codes >= this decode to NaN (beyond every code where there is none)
//   inf_code        the magnitude code of infinity (beyond every code where there is none)
//
// Encoding rounds to nearest, ties to even, and SATURATES (every magnitude beyond max finite, and
// ±infinity, becomes ± max finite); values that round to zero keep their sign. Decoding is exact.
//
// The code is branch-free integer selects (select_bits), so that `#pragma omp simd` loops over it
// vectorize with GCC 12 at every x86-64 ISA level.
#pragma once

#include <cstdint>

#include "dtype.h"
#include "hd.h"

namespace lnmlp::numerics {

// cond ? a : b as bit masks. Plain ?: lets GCC sink the float operation of the arm not taken
// into a branch, which it then cannot if-convert (floating point may trap) without AVX-512
// masking; with masks every arm is computed and the loop vectorizes from SSE2 up.
LNMLP_HD uint32_t select_bits(bool cond, uint32_t a, uint32_t b) {
  const uint32_t m = 0u - static_cast<uint32_t>(cond);
  return (a & m) | (b & ~m);
}

// fp32 -> code, round to nearest even, saturating.
template <typename T> LNMLP_HD uint32_t encode_minifloat(float f) {
  constexpr uint32_t shift = 23u - T::mantissa_bits;  // float mantissa bits dropped
  constexpr uint32_t min_normal_bits = (127u + 1u - T::bias) << 23;
  // Subnormal range: a float whose ulp is the format's subnormal spacing 2^(1-bias-M) aligns that
  // grid with its last mantissa bit, so adding it lets the FPU do the round-to-nearest-even; the
  // result's low bits are the code (2^M, the smallest normal code, when it rounds up).
  constexpr uint32_t magic_bits = (127u + 24u - T::bias - T::mantissa_bits) << 23;
  const uint32_t u = float_bits(f);
  const uint32_t sign = (u >> (31u - T::sign_bit)) & (1u << T::sign_bit);
  const uint32_t a = u & 0x7fffffffu;
  // Normal range: round to nearest even on bit `shift`, then rebias; a carry into the exponent is
  // the correct rounding up to the next binade. (Wraps harmlessly when a is below the normal range:
  // that lane takes the subnormal result.)
  const uint32_t normal = (a + ((1u << (shift - 1)) - 1u) + ((a >> shift) & 1u) - ((127u - T::bias) << 23)) >> shift;
  const uint32_t subnormal = float_bits(bits_float(a) + bits_float(magic_bits)) - magic_bits;
  uint32_t magnitude = select_bits(a >= min_normal_bits, normal, subnormal);
  // Anything at or beyond max finite (±inf included) saturates; below max, rounding never
  // exceeds max_code, so the comparison with max itself is exact.
  magnitude = select_bits(a >= T::max_float_bits, T::max_code, magnitude);
  return select_bits(a > 0x7f800000u, T::nan_code, sign | magnitude);
}

// code -> fp32, exact.
template <typename T> LNMLP_HD float decode_minifloat(uint32_t c) {
  constexpr uint32_t shift = 23u - T::mantissa_bits;
  constexpr uint32_t min_normal_bits = (127u + 1u - T::bias) << 23;
  const uint32_t sign = (c & (1u << T::sign_bit)) << (31u - T::sign_bit);
  const uint32_t em = c & ((1u << T::sign_bit) - 1u);  // exponent and mantissa
  const uint32_t normal = (em << shift) + ((127u - T::bias) << 23);
  // Subnormal (exponent field 0): 2^(1-bias) (1 + m 2^-M) - 2^(1-bias) = m 2^(1-bias-M), exactly.
  const uint32_t subnormal = float_bits(bits_float(min_normal_bits | (em << shift)) - bits_float(min_normal_bits));
  uint32_t magnitude = select_bits(em < (1u << T::mantissa_bits), subnormal, normal);
  magnitude = select_bits(em == T::inf_code, 0x7f800000u, magnitude);
  magnitude = select_bits(em >= T::first_nan_code, 0x7fc00000u, magnitude);
  return bits_float(sign | magnitude);
}

// decode_minifloat(encode_minifloat(v)) bit for bit, computed in fp32 without the code (about half
// the instructions). c is a power of two whose ulp is the format's spacing at |v| (2^(e-M) for
// |v| in [2^e, 2^(e+1)); below the smallest normal, the subnormal spacing), so |v| + c is |v|
// rounded to nearest even on the format's grid, plus c, and taking c away again is exact; a carry
// into the next binade is the correct rounding up. Saturation, the sign and NaN then as encoding.
// (Beyond max finite, c overflows: those lanes take the saturated value.)
template <typename T> LNMLP_HD float round_to_minifloat(float v) {
  constexpr uint32_t min_normal_bits = (127u + 1u - T::bias) << 23;
  const uint32_t u = float_bits(v);
  const uint32_t a = u & 0x7fffffffu;
  const uint32_t e = a & 0x7f800000u;
  const uint32_t c = (e > min_normal_bits ? e : min_normal_bits) + ((23u - T::mantissa_bits) << 23);
  const float rounded = (bits_float(a) + bits_float(c)) - bits_float(c);
  const uint32_t magnitude = select_bits(a >= T::max_float_bits, T::max_float_bits, float_bits(rounded));
  return bits_float(select_bits(a > 0x7f800000u, T::nan_value_bits, (u & 0x80000000u) | magnitude));
}

}  // namespace lnmlp::numerics
