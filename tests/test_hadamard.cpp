// NVFP4's random Hadamard transform (src/numerics/hadamard.h) against its definition computed here
// in double: TransformerEngine's sign vector as listed in its source, and H16 built by Sylvester's
// doubling [[H, H], [H, -H]] (not the butterfly the library runs).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "float_bits.h"
#include "numerics/dtype.h"
#include "numerics/hadamard.h"

namespace {

using namespace lnmlp::numerics;
using lnmlp_test::to_bits;

constexpr int kSigns[16] = {1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1};

std::vector<double> sylvester16() {
  std::vector<double> h = {1.0};
  for (int n = 1; n < 16; n *= 2) {
    std::vector<double> next(4 * n * n);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        const double v = h[i * n + j];
        next[i * 2 * n + j] = v;
        next[i * 2 * n + j + n] = v;
        next[(i + n) * 2 * n + j] = v;
        next[(i + n) * 2 * n + j + n] = -v;
      }
    h = next;
  }
  return h;
}

// y_j = sum_i x_i s_i H[i][j] / 4, in double (exact for the inputs of the exactness test).
std::vector<double> reference(const float* x) {
  static const std::vector<double> h = sylvester16();
  std::vector<double> y(16, 0.0);
  for (int j = 0; j < 16; ++j)
    for (int i = 0; i < 16; ++i) y[j] += static_cast<double>(x[i]) * kSigns[i] * h[i * 16 + j] / 4.0;
  return y;
}

TEST(RandomHadamard, SignMaskIsTransformerEnginesVector) {
  for (int i = 0; i < 16; ++i) EXPECT_EQ(((kRhtSignMask >> i) & 1u) != 0, kSigns[i] < 0) << i;
}

// bf16 values whose exponents span at most 12: every partial sum is exact, so the result is the
// exact sum rounded once, bit for bit.
TEST(RandomHadamard, ExactWherePartialSumsAre) {
  std::mt19937 gen(1);
  std::uniform_int_distribution<int> exponent(-6, 6), mantissa(0, 127), sign(0, 1);
  for (int trial = 0; trial < 20000; ++trial) {
    float x[16], y[16];
    for (float& v : x) {
      const float m = 1.0f + static_cast<float>(mantissa(gen)) / 128.0f;  // 8 significant bits
      v = (sign(gen) ? -m : m) * std::ldexp(1.0f, exponent(gen));
      if (trial % 7 == 0 && mantissa(gen) < 16) v = 0.0f;
      ASSERT_EQ(bf16_to_float(float_to_bf16(v)), v);
    }
    random_hadamard16(x, y);
    const std::vector<double> want = reference(x);
    for (int j = 0; j < 16; ++j) ASSERT_EQ(to_bits(y[j]), to_bits(static_cast<float>(want[j]))) << trial << ", " << j;
  }
}

// Any fp32 block: within the butterfly's rounding, 4 stages of 2^-24 relative on sum |x_i| / 4.
TEST(RandomHadamard, WithinTheButterflysRoundingElsewhere) {
  std::mt19937 gen(2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> spread(-30.0f, 30.0f);
  for (int trial = 0; trial < 20000; ++trial) {
    float x[16], y[16];
    double mass = 0.0;
    for (float& v : x) {
      v = normal(gen) * std::exp2(spread(gen));
      mass += std::fabs(static_cast<double>(v)) / 4.0;
    }
    random_hadamard16(x, y);
    const std::vector<double> want = reference(x);
    for (int j = 0; j < 16; ++j) ASSERT_NEAR(y[j], want[j], 5.0 * 0x1p-24 * mass) << trial << ", " << j;
  }
}

// diag(s) H16 / 4 is orthogonal: transforming both operands of A B^T along their shared dimension
// (what the recipe does to the weight-gradient GEMM's inputs) leaves the product; and the
// transform works in place.
TEST(RandomHadamard, OrthogonalSoAGemmAlongItIsUnchanged) {
  const int64_t m = 5, n = 3, k = 64;
  std::mt19937 gen(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> a(m * k), b(n * k);
  for (float& v : a) v = normal(gen);
  for (float& v : b) v = normal(gen);
  std::vector<float> ta(m * k), tb = b;
  random_hadamard_rows(a.data(), m, k, ta.data());
  random_hadamard_rows(tb.data(), n, k, tb.data());  // in place
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double plain = 0.0, transformed = 0.0, mass = 0.0;
      for (int64_t c = 0; c < k; ++c) {
        plain += static_cast<double>(a[i * k + c]) * b[j * k + c];
        transformed += static_cast<double>(ta[i * k + c]) * tb[j * k + c];
        mass += std::fabs(static_cast<double>(a[i * k + c]) * b[j * k + c]);
      }
      EXPECT_NEAR(transformed, plain, 1e-5 * (mass + 1.0)) << i << ", " << j;
    }
  std::vector<float> again(n * k);
  random_hadamard_rows(b.data(), n, k, again.data());
  for (int64_t i = 0; i < n * k; ++i) ASSERT_EQ(to_bits(again[i]), to_bits(tb[i]));
}

}  // namespace
