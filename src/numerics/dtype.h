// Element types of the I/O tensors and their conversions to and from fp32.
//
// bf16 and f16 travel as uint16_t bit patterns. Conversions round to nearest even and overflow
// goes to infinity, as IEEE casts do; every NaN becomes the format's canonical NaN, 0x7fff (sign
// and payload dropped), which is what NVIDIA GPUs write (cvt.rn.f16.f32, cvt.rn.bf16.f32), so
// that host and device give the same bits: a GPU's arithmetic already canonicalizes NaNs (any
// NaN result is 0x7fffffff), while the host's keeps signs and payloads.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "hd.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace lnmlp::numerics {

enum class DType : int32_t { F32 = 0, BF16 = 1, F16 = 2 };

constexpr int64_t dtype_bytes(DType t) { return t == DType::F32 ? 4 : 2; }
constexpr const char* dtype_name(DType t) {
  return t == DType::F32 ? "f32" : t == DType::BF16 ? "bf16" : "f16";
}

LNMLP_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

LNMLP_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// The canonical NaN of bf16 and of f16.
constexpr uint16_t kBf16CanonicalNan = 0x7fff;
constexpr uint16_t kF16CanonicalNan = 0x7fff;

LNMLP_HD float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

LNMLP_HD uint16_t float_to_bf16(float f) {
  const uint32_t u = float_bits(f);
  // Round to nearest even: add 0x7fff plus the lowest kept bit, then truncate. NaN becomes the
  // canonical NaN. Written as a select, not a branch, so loops over it vectorize.
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? uint32_t{kBf16CanonicalNan} : rounded);
}

// IEEE binary16 <-> fp32. On the device these are the CUDA intrinsics. On the host they are
// written out as branch-free integer selects because GCC 12 does not vectorize _Float16
// conversions, and these run inside every f16 loop of the CPU backend; they are checked against
// the compiler's _Float16 (every f16 value, every tie and a dense sweep of floats) in
// tests/test_dtype_conversions.cpp.
LNMLP_HD float f16_to_float(uint16_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(h));
#else
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7fffu;                                      // exponent and mantissa
  const uint32_t normal = (em << 13) + ((127u - 15u) << 23);             // rebias the exponent
  // Subnormal (em < 2^10): 2^-14 * (1 + em*2^-10) - 2^-14 = em * 2^-24, exactly.
  const uint32_t subnormal = float_bits(bits_float((113u << 23) | (em << 13)) - bits_float(113u << 23));
  const uint32_t inf_nan = 0x7f800000u | ((em & 0x3ffu) << 13);
  uint32_t magnitude = em < 0x0400u ? subnormal : normal;
  magnitude = em >= 0x7c00u ? inf_nan : magnitude;
  return bits_float(sign | magnitude);
#endif
}

LNMLP_HD uint16_t float_to_f16(float f) {
#if defined(__CUDA_ARCH__)
  return f != f ? kF16CanonicalNan : __half_as_ushort(__float2half_rn(f));
#else
  const uint32_t u = float_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  // Normal f16 range: round to nearest even on bit 13, then rebias; a carry into the exponent is
  // the correct rounding up to the next binade (or to infinity).
  const uint32_t normal = (a + 0xfffu + ((a >> 13) & 1u) - ((127u - 15u) << 23)) >> 13;
  // Subnormal f16 range (|f| < 2^-14): adding 0.5 (2^-1) aligns the f16 subnormal grid (2^-24)
  // with float's last mantissa bit, so the hardware's round-to-nearest-even does the rounding.
  const float magic = 0.5f;
  const uint32_t subnormal = float_bits(bits_float(a) + magic) - float_bits(magic);
  const uint32_t magnitude = a >= 0x477ff000u   ? 0x7c00u  // rounds to infinity (>= 65520)
                             : a >= 0x38800000u ? normal
                                                : subnormal;
  return static_cast<uint16_t>(a > 0x7f800000u ? uint32_t{kF16CanonicalNan} : sign | magnitude);
#endif
}

// Storage type of each DType, and loads/stores through fp32.
template <DType T> struct Storage;
template <> struct Storage<DType::F32> { using type = float; };
template <> struct Storage<DType::BF16> { using type = uint16_t; };
template <> struct Storage<DType::F16> { using type = uint16_t; };
template <DType T> using storage_t = typename Storage<T>::type;

template <DType T> LNMLP_HD float load(storage_t<T> v) {
  if constexpr (T == DType::F32) return v;
  else if constexpr (T == DType::BF16) return bf16_to_float(v);
  else return f16_to_float(v);
}

template <DType T> LNMLP_HD storage_t<T> store(float v) {
  if constexpr (T == DType::F32) return v;
  else if constexpr (T == DType::BF16) return float_to_bf16(v);
  else return float_to_f16(v);
}

// Calls fn(std::integral_constant<DType, D>{}) for the runtime dtype: the one dtype switch of the
// host code (kernels and loops are compiled once per dtype).
template <typename Fn> decltype(auto) dispatch_dtype(DType d, Fn&& fn) {
  switch (d) {
    case DType::BF16: return fn(std::integral_constant<DType, DType::BF16>{});
    case DType::F16: return fn(std::integral_constant<DType, DType::F16>{});
    case DType::F32: break;
  }
  return fn(std::integral_constant<DType, DType::F32>{});
}

// The value v takes after a round trip through the storage type.
template <DType T> LNMLP_HD float round_to(float v) { return load<T>(store<T>(v)); }

}  // namespace lnmlp::numerics
