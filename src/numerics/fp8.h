// FP8 element formats and their conversions to and from fp32 (docs/design.md, "FP8").
//
//  E4M3  the OCP / NVIDIA "e4m3fn" format: 1 sign, 4 exponent (bias 7), 3 mantissa bits.
//        No infinities; NaN is S.1111.111 (0x7f / 0xff); max finite 448 (0x7e); smallest
//        subnormal 2^-9, smallest normal 2^-6.
//  E5M2  IEEE-like: 1 sign, 5 exponent (bias 15), 2 mantissa bits. Infinities S.11111.00
//        (0x7c / 0xfc), NaNs S.11111.01..11; max finite 57344 (0x7b); smallest subnormal 2^-16,
//        smallest normal 2^-14.
//
// fp32 -> fp8 (float_to_fp8) rounds to nearest, ties to even, and SATURATES: every value whose
// magnitude is beyond max finite becomes ± max finite, for E5M2 too (never infinity), and so do
// ±infinity inputs, for both formats (TransformerEngine's saturating cast, CUDA's __NV_SATFINITE).
// NaN becomes the format's canonical NaN, 0x7f for both formats (sign and payload dropped): what
// NVIDIA's cvt.rn.satfinite writes, and so TransformerEngine's casts, and the same bits on host and
// device (a GPU's arithmetic canonicalizes NaNs; the host's keeps their signs). ml_dtypes keeps
// a NaN's sign (S.1111.111, S.11111.10): lnmlp's codes differ from its only there. Values that
// round to zero keep their sign
// (-tiny -> 0x80). Magnitudes at or below half the smallest subnormal round to zero (exactly half
// is a tie and goes to the even code, zero).
//
// fp8 -> fp32 (fp8_to_float) is exact; NaN codes become the quiet NaN with the code's sign
// (0x7fc00000 / 0xffc00000), E5M2 infinities become infinities.
//
// Both are checked bit-exactly against ml_dtypes (bindings/python/tests/test_fp8_formats.py) and
// against a brute-force reference (tests/test_fp8_formats.cpp).
//
// The host path is written as branch-free integer selects (bit masks, see select_bits), so that
// `#pragma omp simd` loops over it vectorize with GCC 12 at every x86-64 ISA level (checked with
// -fopt-info-vec for SSE2, AVX2 and AVX-512). On the device, encoding is the hardware's
// cvt.rn.satfinite (cuda_fp8.h), whose NaN is the canonical code; a NaN input is mapped to it
// explicitly all the same. Decoding shares the integer code.
#pragma once

#include <cstdint>
#include <type_traits>

#include "dtype.h"
#include "hd.h"

#if defined(__CUDACC__)
#include <cuda_fp8.h>
#endif

namespace lnmlp::numerics {

enum class Fp8Format : int32_t { E4M3 = 0, E5M2 = 1 };

constexpr const char* fp8_name(Fp8Format f) { return f == Fp8Format::E4M3 ? "e4m3" : "e5m2"; }

// The largest finite value of each format (448 and 57344).
constexpr float kFp8E4M3Max = 448.0f;
constexpr float kFp8E5M2Max = 57344.0f;
constexpr float fp8_max(Fp8Format f) { return f == Fp8Format::E4M3 ? kFp8E4M3Max : kFp8E5M2Max; }

// Calls fn(std::integral_constant<Fp8Format, F>{}) for the runtime format (host code).
template <typename Fn> decltype(auto) dispatch_fp8(Fp8Format f, Fn&& fn) {
  if (f == Fp8Format::E4M3) return fn(std::integral_constant<Fp8Format, Fp8Format::E4M3>{});
  return fn(std::integral_constant<Fp8Format, Fp8Format::E5M2>{});
}

// The format's constants. Codes are the magnitude bits (sign excluded).
template <Fp8Format F> struct Fp8Traits;

template <> struct Fp8Traits<Fp8Format::E4M3> {
  static constexpr uint32_t mantissa_bits = 3;
  static constexpr uint32_t bias = 7;
  static constexpr float max = kFp8E4M3Max;
  static constexpr uint32_t max_code = 0x7e;
  static constexpr uint32_t nan_code = 0x7f;       // what encoding a NaN gives
  static constexpr uint32_t first_nan_code = 0x7f; // codes >= this decode to NaN
  static constexpr uint32_t inf_code = 0x100;      // none: a value no 7-bit code takes
  static constexpr uint32_t max_float_bits = 0x43e00000u;  // 448.0f
};

template <> struct Fp8Traits<Fp8Format::E5M2> {
  static constexpr uint32_t mantissa_bits = 2;
  static constexpr uint32_t bias = 15;
  static constexpr float max = kFp8E5M2Max;
  static constexpr uint32_t max_code = 0x7b;
  static constexpr uint32_t nan_code = 0x7f;
  static constexpr uint32_t first_nan_code = 0x7d;
  static constexpr uint32_t inf_code = 0x7c;
  static constexpr uint32_t max_float_bits = 0x47600000u;  // 57344.0f
};

// cond ? a : b as bit masks. Plain ?: lets GCC sink the float operation of the arm not taken
// into a branch, which it then cannot if-convert (floating point may trap) without AVX-512
// masking; with masks every arm is computed and the loop vectorizes from SSE2 up.
LNMLP_HD uint32_t select_bits(bool cond, uint32_t a, uint32_t b) {
  const uint32_t m = 0u - static_cast<uint32_t>(cond);
  return (a & m) | (b & ~m);
}

// fp32 -> fp8, round to nearest even, saturating (see the top of this file).
template <Fp8Format F> LNMLP_HD uint8_t float_to_fp8(float f) {
  using T = Fp8Traits<F>;
#if defined(__CUDA_ARCH__)
  const __nv_fp8_storage_t r =
      __nv_cvt_float_to_fp8(f, __NV_SATFINITE, F == Fp8Format::E4M3 ? __NV_E4M3 : __NV_E5M2);
  return static_cast<uint8_t>(f != f ? T::nan_code : static_cast<uint32_t>(r));
#else
  constexpr uint32_t shift = 23u - T::mantissa_bits;  // float mantissa bits dropped
  constexpr uint32_t min_normal_bits = (127u + 1u - T::bias) << 23;
  // Subnormal range: a float whose ulp is the fp8 subnormal spacing 2^(1-bias-M) aligns that grid
  // with its last mantissa bit, so adding it lets the FPU do the round-to-nearest-even; the
  // result's low bits are the code (2^M, the smallest normal code, when it rounds up).
  constexpr uint32_t magic_bits = (127u + 24u - T::bias - T::mantissa_bits) << 23;
  const uint32_t u = float_bits(f);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7fffffffu;
  // Normal range: round to nearest even on bit `shift`, then rebias; a carry into the exponent is
  // the correct rounding up to the next binade. (Wraps harmlessly when a is below the normal range:
  // that lane takes the subnormal result.)
  const uint32_t normal =
      (a + ((1u << (shift - 1)) - 1u) + ((a >> shift) & 1u) - ((127u - T::bias) << 23)) >> shift;
  const uint32_t subnormal = float_bits(bits_float(a) + bits_float(magic_bits)) - magic_bits;
  uint32_t magnitude = select_bits(a >= min_normal_bits, normal, subnormal);
  // Anything at or beyond max finite (±inf included) saturates; below max, rounding never
  // exceeds max_code, so the comparison with max itself is exact.
  magnitude = select_bits(a >= T::max_float_bits, T::max_code, magnitude);
  return static_cast<uint8_t>(select_bits(a > 0x7f800000u, T::nan_code, sign | magnitude));
#endif
}

// fp8 -> fp32, exact.
template <Fp8Format F> LNMLP_HD float fp8_to_float(uint8_t c) {
  using T = Fp8Traits<F>;
  constexpr uint32_t shift = 23u - T::mantissa_bits;
  constexpr uint32_t min_normal_bits = (127u + 1u - T::bias) << 23;
  const uint32_t sign = static_cast<uint32_t>(c & 0x80u) << 24;
  const uint32_t em = c & 0x7fu;  // exponent and mantissa
  const uint32_t normal = (em << shift) + ((127u - T::bias) << 23);
  // Subnormal (exponent field 0): 2^(1-bias) (1 + m 2^-M) - 2^(1-bias) = m 2^(1-bias-M), exactly.
  const uint32_t subnormal = float_bits(bits_float(min_normal_bits | (em << shift)) - bits_float(min_normal_bits));
  uint32_t magnitude = select_bits(em < (1u << T::mantissa_bits), subnormal, normal);
  magnitude = select_bits(em == T::inf_code, 0x7f800000u, magnitude);
  magnitude = select_bits(em >= T::first_nan_code, 0x7fc00000u, magnitude);
  return bits_float(sign | magnitude);
}

// The same with the format chosen at run time. Both formats are computed and one selected, so a
// loop over these still vectorizes; hoist the format out of hot loops where you can.
LNMLP_HD uint8_t float_to_fp8(float f, Fp8Format fmt) {
  const uint8_t e4m3 = float_to_fp8<Fp8Format::E4M3>(f);
  const uint8_t e5m2 = float_to_fp8<Fp8Format::E5M2>(f);
  return static_cast<uint8_t>(select_bits(fmt == Fp8Format::E4M3, e4m3, e5m2));
}

LNMLP_HD float fp8_to_float(uint8_t c, Fp8Format fmt) {
  const float e4m3 = fp8_to_float<Fp8Format::E4M3>(c);
  const float e5m2 = fp8_to_float<Fp8Format::E5M2>(c);
  return bits_float(select_bits(fmt == Fp8Format::E4M3, float_bits(e4m3), float_bits(e5m2)));
}

// The value v takes after a round trip through the format, fp8_to_float(float_to_fp8(v)) bit for
// bit (tests/test_fp8_formats.cpp checks every fp32 of the range that rounds), computed in fp32
// without the code: what a quantizer whose codes only a decode would read (the CPU backend's GEMM
// operands) writes in about half the instructions. c is a power of two whose ulp is the format's
// spacing at |v| (2^(e-M) for |v| in [2^e, 2^(e+1)); below the smallest normal, the subnormal
// spacing), so |v| + c is |v| rounded to nearest even on the format's grid, plus c, and taking c
// away again is exact; a carry into the next binade is the correct rounding up. Saturation, the
// sign and NaN (the canonical code's +NaN, 0x7fc00000) then as float_to_fp8. (Beyond max finite,
// c overflows: those lanes take the saturated value.)
template <Fp8Format F> LNMLP_HD float round_to_fp8(float v) {
  using T = Fp8Traits<F>;
  constexpr uint32_t min_normal_bits = (127u + 1u - T::bias) << 23;
  const uint32_t u = float_bits(v);
  const uint32_t a = u & 0x7fffffffu;
  const uint32_t e = a & 0x7f800000u;
  const uint32_t c = (e > min_normal_bits ? e : min_normal_bits) + ((23u - T::mantissa_bits) << 23);
  const float rounded = (bits_float(a) + bits_float(c)) - bits_float(c);
  const uint32_t magnitude = select_bits(a >= T::max_float_bits, T::max_float_bits, float_bits(rounded));
  return bits_float(select_bits(a > 0x7f800000u, 0x7fc00000u, (u & 0x80000000u) | magnitude));
}

}  // namespace lnmlp::numerics
