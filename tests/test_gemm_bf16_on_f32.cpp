// The bf16 GEMM on fp32 copies (src/cpu/gemm_bf16_on_f32.h), which the CPU backend uses where the
// GEMM library has no bf16 matmul (e.g. AVX2-only CPUs). Tested directly, so that it is covered on
// every machine, including those whose bf16 GEMMs run natively: every transpose, with and without
// bias, fp32 and bf16 output, against a float64 product of the same bf16 inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <vector>

#include "cpu/gemm.h"
#include "cpu/gemm_bf16_on_f32.h"
#include "numerics/dtype.h"

namespace {

using namespace lnmlp::cpu;
using lnmlp::numerics::bf16_to_float;
using lnmlp::numerics::float_to_bf16;

struct Case {
  bool trans_a, trans_b, bias;
  GemmType output;
};

class Bf16OnF32Gemm : public ::testing::TestWithParam<Case> {};

TEST_P(Bf16OnF32Gemm, MatchesFloat64ProductOfTheBf16Inputs) {
  const Case c = GetParam();
  const int64_t m = 37, n = 53, k = 71;  // odd sizes: no kernel's tile divides them
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  auto random_bf16 = [&](int64_t count) {
    std::vector<uint16_t> v(count);
    for (auto& x : v) x = float_to_bf16(dist(rng));
    return v;
  };
  const std::vector<uint16_t> a = random_bf16(m * k), b = random_bf16(k * n), bias = random_bf16(n);

  const GemmShape shape{m, n, k, c.trans_a, c.trans_b, GemmType::BF16, c.output, c.bias};
  auto gemm = lnmlp::cpu::make_bf16_on_f32_gemm(shape, lnmlp::cpu::make_gemm);
  std::vector<unsigned char> scratch(gemm->scratch_bytes() + 64);
  void* aligned_scratch = scratch.data() + (64 - reinterpret_cast<uintptr_t>(scratch.data()) % 64) % 64;
  std::vector<float> c32(m * n);
  std::vector<uint16_t> c16(m * n);
  void* out = c.output == GemmType::F32 ? static_cast<void*>(c32.data()) : static_cast<void*>(c16.data());
  gemm->run(a.data(), b.data(), c.bias ? bias.data() : nullptr, out, aligned_scratch);

  double worst = 0.0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double ref = c.bias ? bf16_to_float(bias[j]) : 0.0;
      for (int64_t p = 0; p < k; ++p) {
        const double av = bf16_to_float(c.trans_a ? a[p * m + i] : a[i * k + p]);
        const double bv = bf16_to_float(c.trans_b ? b[j * k + p] : b[p * n + j]);
        ref += av * bv;
      }
      const double got = c.output == GemmType::F32 ? c32[i * n + j] : bf16_to_float(c16[i * n + j]);
      // fp32 accumulation of k products: a few ulps of fp32 times sqrt(k) against |sum| ~ sqrt(k);
      // a bf16 output adds one rounding (2^-9 relative).
      const double tol = c.output == GemmType::F32 ? 1e-4 : std::fabs(ref) * 0x1p-8 + 1e-4;
      worst = std::max(worst, std::fabs(got - ref) - tol);
      ASSERT_LE(std::fabs(got - ref), tol) << "at (" << i << ", " << j << ")";
    }
  EXPECT_LE(worst, 0.0);
}

INSTANTIATE_TEST_SUITE_P(All, Bf16OnF32Gemm,
                         ::testing::Values(Case{false, false, false, GemmType::F32}, Case{false, false, true, GemmType::BF16},
                                           Case{true, false, false, GemmType::BF16}, Case{false, true, false, GemmType::F32},
                                           Case{true, false, false, GemmType::F32}, Case{false, true, true, GemmType::BF16}));

}  // namespace
