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
// The host path is minifloat.h's, written as branch-free integer selects (bit masks, see
// select_bits), so that `#pragma omp simd` loops over it vectorize with GCC 12 at every x86-64 ISA level (checked with
// -fopt-info-vec for SSE2, AVX2 and AVX-512). On the device, encoding is the hardware's
// cvt.rn.satfinite (cuda_fp8.h), whose NaN is the canonical code; a NaN input is mapped to it
// explicitly all the same. Decoding shares the integer code.
#pragma once

#include <cstdint>
#include <type_traits>

#include "dtype.h"
#include "hd.h"
#include "minifloat.h"

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
  static constexpr uint32_t sign_bit = 7;
  static constexpr uint32_t mantissa_bits = 3;
  static constexpr uint32_t bias = 7;
  static constexpr float max = kFp8E4M3Max;
  static constexpr uint32_t max_code = 0x7e;
  static constexpr uint32_t nan_code = 0x7f;       // what encoding a NaN gives
  static constexpr uint32_t first_nan_code = 0x7f; // codes >= this decode to NaN
  static constexpr uint32_t inf_code = 0x100;      // none: a value no 7-bit code takes
  static constexpr uint32_t max_float_bits = 0x43e00000u;  // 448.0f
  static constexpr uint32_t nan_value_bits = 0x7fc00000u;  // a NaN's round trip: the quiet NaN
};

template <> struct Fp8Traits<Fp8Format::E5M2> {
  static constexpr uint32_t sign_bit = 7;
  static constexpr uint32_t mantissa_bits = 2;
  static constexpr uint32_t bias = 15;
  static constexpr float max = kFp8E5M2Max;
  static constexpr uint32_t max_code = 0x7b;
  static constexpr uint32_t nan_code = 0x7f;
  static constexpr uint32_t first_nan_code = 0x7d;
  static constexpr uint32_t inf_code = 0x7c;
  static constexpr uint32_t max_float_bits = 0x47600000u;  // 57344.0f
  static constexpr uint32_t nan_value_bits = 0x7fc00000u;
};

// fp32 -> fp8, round to nearest even, saturating (see the top of this file).
template <Fp8Format F> LNMLP_HD uint8_t float_to_fp8(float f) {
  using T = Fp8Traits<F>;
#if defined(__CUDA_ARCH__)
  const __nv_fp8_storage_t r =
      __nv_cvt_float_to_fp8(f, __NV_SATFINITE, F == Fp8Format::E4M3 ? __NV_E4M3 : __NV_E5M2);
  return static_cast<uint8_t>(f != f ? T::nan_code : static_cast<uint32_t>(r));
#else
  return static_cast<uint8_t>(encode_minifloat<T>(f));
#endif
}

// fp8 -> fp32, exact.
template <Fp8Format F> LNMLP_HD float fp8_to_float(uint8_t c) { return decode_minifloat<Fp8Traits<F>>(c); }

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
// without the code (minifloat.h): what a quantizer whose codes only a decode would read (the CPU
// backend's GEMM operands) writes. A NaN gives the canonical code's +NaN, 0x7fc00000.
template <Fp8Format F> LNMLP_HD float round_to_fp8(float v) { return round_to_minifloat<Fp8Traits<F>>(v); }

}  // namespace lnmlp::numerics
