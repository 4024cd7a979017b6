// FP4 E2M1, the element format of NVFP4 (docs/design.md, "NVFP4"): 1 sign, 2 exponent (bias 1),
// 1 mantissa bit. The eight magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6; no infinities, no NaN.
//
// fp32 -> E2M1 (float_to_e2m1) is NVIDIA's cvt.rn.satfinite.e2m1x2.f32, which TransformerEngine's
// NVFP4 kernels use: round to nearest, ties to even (0.25 -> 0, 0.75 -> 1, 2.5 -> 2, 5 -> 4),
// saturating (beyond 6, and ±infinity, -> ± 6), a value that rounds to zero keeps its sign, and a
// NaN becomes +6 (code 0x7: the format has no NaN; CUDA's cuda_fp4.hpp documents the same). The
// codes are the low 4 bits of a byte, the sign bit 0x8.
//
// Two codes share a byte (pack_e2m1x2): the element of even index in the low nibble, the next one
// in the high nibble, as TransformerEngine stores NVFP4 data and as ml_dtypes' float4_e2m1fn values
// are packed by TransformerEngine's tests.
//
// The conversions are minifloat.h's, on the host and on the device alike (a GPU before sm_100 has
// no E2M1 instruction; the integer code is exact on both).
#pragma once

#include <cstdint>

#include "minifloat.h"

namespace lnmlp::numerics {

constexpr float kFp4E2M1Max = 6.0f;

struct E2M1Traits {
  static constexpr uint32_t sign_bit = 3;
  static constexpr uint32_t mantissa_bits = 1;
  static constexpr uint32_t bias = 1;
  static constexpr float max = kFp4E2M1Max;
  static constexpr uint32_t max_code = 0x7;
  static constexpr uint32_t nan_code = 0x7;                // NaN -> +6: the format has no NaN
  static constexpr uint32_t first_nan_code = 0x10;         // none
  static constexpr uint32_t inf_code = 0x10;               // none
  static constexpr uint32_t max_float_bits = 0x40c00000u;  // 6.0f
  static constexpr uint32_t nan_value_bits = 0x40c00000u;  // a NaN's round trip: +6
};

// fp32 -> E2M1 code (0..15), round to nearest even, saturating, NaN -> +6.
LNMLP_HD uint8_t float_to_e2m1(float f) { return static_cast<uint8_t>(encode_minifloat<E2M1Traits>(f)); }

// E2M1 code (its low 4 bits) -> fp32, exact.
LNMLP_HD float e2m1_to_float(uint8_t c) { return decode_minifloat<E2M1Traits>(c & 0xfu); }

// e2m1_to_float(float_to_e2m1(v)), bit for bit, without the code.
LNMLP_HD float round_to_e2m1(float v) { return round_to_minifloat<E2M1Traits>(v); }

// fp32 -> E2M1 code, rounding stochastically with the 32 random bits `rbits` (philox.h): a
// magnitude a between grid neighbours lo < hi goes to hi with probability (a - lo) / (hi - lo),
// exactly: up iff rbits < floor((a - lo) / (hi - lo) * 2^32), so that the expected decoded value is
// a itself (unbiased) for every a of the grid's range. Grid values, and only they, are never moved;
// saturation (a >= 6, ±inf -> ± 6), the sign and NaN (-> +6) as float_to_e2m1. Each step is exact
// in fp32: a - lo (lo <= a < 2 lo, or lo = 0), the division by the power of two hi - lo (a
// multiplication by its exact inverse: 2 up to hi = 2, 1 up to 4, 1/2 up to 6), and the
// scaling by 2^32 (for a >= 2^-9 the product is an integer; below, its floor is taken). Branch-free
// (minifloat.h's select_bits), so that a loop over it vectorizes.
LNMLP_HD uint8_t stochastic_float_to_e2m1(float v, uint32_t rbits) {
  const uint32_t u = float_bits(v), abs = u & 0x7fffffffu;
  const bool saturates = abs >= E2M1Traits::max_float_bits;  // and ±inf, NaN
  const uint32_t a_bits = select_bits(saturates, 0u, abs);   // those lanes round 0
  const float a = bits_float(a_bits);
  // The code of the grid value at or below a: 0 or 1 below 1.0 (0.5 is 0x3f000000); above,
  // exponent and mantissa bit.
  const uint32_t lo_code =
      select_bits(a_bits >= 0x3f800000u, (a_bits - (126u << 23)) >> 22, select_bits(a_bits >= 0x3f000000u, 1u, 0u));
  const float lo = decode_minifloat<E2M1Traits>(lo_code);
  // 1 / (hi - lo): 2 up to hi = 2 (codes 0-3 below it), 1 up to 4 (codes 4, 5), 1/2 up to 6.
  const float inverse_step =
      bits_float(select_bits(lo_code <= 3u, 0x40000000u, select_bits(lo_code <= 5u, 0x3f800000u, 0x3f000000u)));
  const float scaled = (a - lo) * inverse_step * 4294967296.0f;  // in [0, 2^32)
  const uint32_t up = rbits < static_cast<uint32_t>(scaled) ? 1u : 0u;
  const uint32_t magnitude = select_bits(saturates, E2M1Traits::max_code, lo_code + up);
  return static_cast<uint8_t>(select_bits(abs > 0x7f800000u, E2M1Traits::nan_code, ((u >> 28) & 0x8u) | magnitude));
}

// Two codes in one byte: `even` (the element of even index) low, `odd` high.
LNMLP_HD uint8_t pack_e2m1x2(uint8_t even, uint8_t odd) {
  return static_cast<uint8_t>((even & 0xfu) | ((odd & 0xfu) << 4));
}

// The code of element i of a row packed two to a byte.
LNMLP_HD uint8_t unpack_e2m1(const uint8_t* packed, int64_t i) {
  return static_cast<uint8_t>((packed[i >> 1] >> ((i & 1) * 4)) & 0xfu);
}

}  // namespace lnmlp::numerics
