// Element types of the I/O tensors and their conversions to and from fp32.
//
// bf16 and f16 travel as uint16_t bit patterns. Conversions round to nearest even; NaN stays NaN
// and overflow goes to infinity, as IEEE casts do.
#pragma once

#include <cstdint>
#include <cstring>

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

LNMLP_HD float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

LNMLP_HD uint16_t float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  // Round to nearest even: add 0x7fff plus the lowest kept bit, then truncate.
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

LNMLP_HD float f16_to_float(uint16_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(h));
#else
  _Float16 v;
  std::memcpy(&v, &h, sizeof v);
  return static_cast<float>(v);
#endif
}

LNMLP_HD uint16_t float_to_f16(float f) {
#if defined(__CUDA_ARCH__)
  return __half_as_ushort(__float2half_rn(f));
#else
  _Float16 v = static_cast<_Float16>(f);  // IEEE round to nearest even
  uint16_t h;
  std::memcpy(&h, &v, sizeof h);
  return h;
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

// The value v takes after a round trip through the storage type.
template <DType T> LNMLP_HD float round_to(float v) { return load<T>(store<T>(v)); }

}  // namespace lnmlp::numerics
