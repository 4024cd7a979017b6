// A value's bit pattern and back (std::bit_cast before C++20), for the conversions the tests and
// the reference make by hand.
#pragma once

#include <cstdint>
#include <cstring>

namespace lnmlp_ref {

template <class To, class From> inline To bit_copy(const From& v) {
  static_assert(sizeof(To) == sizeof(From), "a bit copy keeps the size");
  To t;
  std::memcpy(&t, &v, sizeof t);
  return t;
}

}  // namespace lnmlp_ref

namespace lnmlp_test {

inline float from_bits(uint32_t u) { return lnmlp_ref::bit_copy<float>(u); }
inline uint32_t to_bits(float f) { return lnmlp_ref::bit_copy<uint32_t>(f); }

}  // namespace lnmlp_test
