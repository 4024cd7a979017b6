// Conversions between double and the I/O element types, written independently of the library
// (bf16: round-to-nearest-even computed in double; f16: the compiler's IEEE _Float16), for the
// tests and lnmlp-bench to make inputs and read outputs.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "float_bits.h"

namespace lnmlp_ref {

// double -> bfloat16 bits, round to nearest even, straight from double (no double rounding via
// float). bf16 has float's exponent range: normal numbers have 8 significant bits, so the rounding
// quantum is 2^(e-7) for |v| in [2^e, 2^(e+1)), and 2^-133 in the subnormal range (e < -126).
inline uint16_t bf16_from_double(double v) {
  if (std::isnan(v)) return std::signbit(v) ? 0xFFC0 : 0x7FC0;
  if (std::isinf(v) || v == 0.0) {
    return static_cast<uint16_t>(bit_copy<uint32_t>(static_cast<float>(v)) >> 16);  // exact
  }
  int e = std::ilogb(v);
  if (e < -126) e = -126;
  const double q = std::ldexp(1.0, e - 7);
  double r = std::nearbyint(v / q) * q;  // the default rounding mode is to nearest, ties to even
  const double max_bf16 = std::ldexp(255.0, 127 - 7);  // 0x7F7F: (2 - 2^-7) * 2^127
  if (std::fabs(r) > max_bf16) r = std::copysign(std::numeric_limits<double>::infinity(), v);
  // exact: r has <= 8 significant bits in float's range
  return static_cast<uint16_t>(bit_copy<uint32_t>(static_cast<float>(r)) >> 16);
}

inline double bf16_to_double(uint16_t b) { return bit_copy<float>(static_cast<uint32_t>(b) << 16); }

#if defined(__clang__) && __clang_major__ < 15
// clang before 15 has no _Float16 on x86-64 without AVX512-FP16 (the tsan and fuzz presets build
// with clang 14): IEEE binary16 by hand, round to nearest even from the double itself.
inline uint16_t f16_from_double(double v) {
  const uint16_t sign = std::signbit(v) ? 0x8000 : 0;
  const double a = std::fabs(v);
  if (std::isnan(v)) return 0x7fff;  // the canonical NaN (numerics/dtype.h)
  if (std::isinf(v)) return sign | 0x7c00;
  if (a < 0x1p-14) return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(a * 0x1p24)));
  int e = 0;
  std::frexp(a, &e);                                 // a = m * 2^e, m in [0.5, 1)
  double q = std::nearbyint(std::ldexp(a, 11 - e));  // 11 significant bits, in [1024, 2048]
  int biased = e - 1 + 15;
  if (q == 2048) q = 1024, ++biased;
  if (biased >= 31) return sign | 0x7c00;
  return static_cast<uint16_t>(sign | (biased << 10) | (static_cast<int>(q) - 1024));
}

inline double f16_to_double(uint16_t b) {
  const double sign = (b & 0x8000) ? -1.0 : 1.0;
  const int biased = (b >> 10) & 0x1f, frac = b & 0x3ff;
  if (biased == 31) return frac != 0 ? std::nan("") : sign * HUGE_VAL;
  if (biased == 0) return sign * std::ldexp(frac, -24);
  return sign * std::ldexp(1024 + frac, biased - 25);
}
#else
inline uint16_t f16_from_double(double v) {
  return bit_copy<uint16_t>(static_cast<_Float16>(v));  // IEEE conversion, round to nearest even
}

inline double f16_to_double(uint16_t b) { return static_cast<double>(bit_copy<_Float16>(b)); }
#endif

}  // namespace lnmlp_ref
