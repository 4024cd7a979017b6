// The library's fp32 <-> f16 / bf16 conversions (src/numerics/dtype.h, used by every CPU kernel)
// against independent ones: the compiler's IEEE _Float16 for f16, and the test suite's own
// double-based round-to-nearest-even for bf16 (tests/reference/dtype_convert.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "dtype_convert.h"
#include "float_bits.h"
#include "numerics/dtype.h"

namespace {

using namespace lnmlp::numerics;

using lnmlp_test::from_bits;
using lnmlp_test::to_bits;
uint16_t compiler_f16(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}
float compiler_f16_to_float(uint16_t b) {
  _Float16 h;
  std::memcpy(&h, &b, 2);
  return static_cast<float>(h);
}

// Checks one float against the independent conversions; NaN only has to stay NaN.
void expect_both(float f) {
  if (std::isnan(f)) {
    EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(f))));
    EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(f))));
    return;
  }
  ASSERT_EQ(float_to_f16(f), compiler_f16(f)) << "f16 of " << f << " (bits " << std::hex << to_bits(f) << ")";
  ASSERT_EQ(float_to_bf16(f), lnmlp_ref::bf16_from_double(f)) << "bf16 of " << f << " (bits " << std::hex
                                                               << to_bits(f) << ")";
}

TEST(DtypeConversions, EveryHalfWidensExactly) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float want = compiler_f16_to_float(static_cast<uint16_t>(h)), got = f16_to_float(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << std::hex << h;
    } else {
      ASSERT_EQ(to_bits(got), to_bits(want)) << "f16 bits " << std::hex << h;
    }
    const double bf_want = lnmlp_ref::bf16_to_double(static_cast<uint16_t>(h));
    if (!std::isnan(bf_want)) {
      ASSERT_EQ(static_cast<double>(bf16_to_float(static_cast<uint16_t>(h))), bf_want);
    }
  }
}

TEST(DtypeConversions, TiesAndNeighboursRoundToNearestEven) {
  // For every pair of adjacent finite values of each format: the exact midpoint (a tie) and the
  // floats one ulp either side of it.
  for (uint32_t h = 0; h < 0x7bff; ++h) {
    for (uint32_t sign : {0u, 0x8000u}) {
      const float lo = f16_to_float(static_cast<uint16_t>(h | sign));
      const float hi = f16_to_float(static_cast<uint16_t>((h + 1) | sign));
      const float mid = static_cast<float>((static_cast<double>(lo) + hi) / 2);  // exact in float
      expect_both(mid);
      expect_both(std::nextafter(mid, 0.0f));
      expect_both(std::nextafter(mid, 2.0f * mid));
    }
  }
  for (uint32_t b = 0; b < 0x7f7f; ++b) {
    const float lo = from_bits(b << 16), hi = from_bits((b + 1) << 16);
    const float mid = static_cast<float>((static_cast<double>(lo) + hi) / 2);
    expect_both(mid);
    expect_both(std::nextafter(mid, 0.0f));
    expect_both(std::nextafter(mid, INFINITY));
  }
}

TEST(DtypeConversions, SweepOfAllFloats) {
  // Every 251st bit pattern (a prime stride, so all exponent/mantissa positions are visited),
  // covering zeros, subnormals, normals, overflow to infinity, infinities and NaNs.
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 251) expect_both(from_bits(static_cast<uint32_t>(u)));
  for (float f : {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, -65520.0f, 1e-8f, 2.9802322e-08f, INFINITY, -INFINITY,
                  3.4028235e38f, -3.4028235e38f})
    expect_both(f);
}

}  // namespace
