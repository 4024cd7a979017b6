// Conversions between double and the I/O element types, written independently of the library
// (bf16: round-to-nearest-even on the bits; f16: the compiler's IEEE _Float16), for the tests and
// lnmlp-bench to make inputs and read outputs.
#pragma once

#include <cstdint>
#include <cstring>

namespace lnmlp_ref {

inline uint16_t double_to_bf16(double d) {
  const float f = static_cast<float>(d);
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  const uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}

inline double bf16_to_double(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t double_to_f16(double d) {
  const _Float16 v = static_cast<_Float16>(static_cast<float>(d));
  uint16_t h;
  std::memcpy(&h, &v, 2);
  return h;
}

inline double f16_to_double(uint16_t h) {
  _Float16 v;
  std::memcpy(&v, &h, 2);
  return static_cast<double>(v);
}

}  // namespace lnmlp_ref
