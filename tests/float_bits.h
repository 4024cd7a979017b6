// The bit pattern of a float and back, for the conversion tests.
#pragma once

#include <cstdint>
#include <cstring>

namespace lnmlp_test {

inline float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint32_t to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

}  // namespace lnmlp_test
