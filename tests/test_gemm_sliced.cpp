// The sliced GEMM (src/cpu/gemm_onednn.cpp, SplitGemm): a large GEMM run as single-threaded GEMMs
// on bands of C's rows or columns, taken by two threads one at a time. make_gemm picks it only for
// large GEMMs on CPUs with oneDNN's brgemm kernels, so it is tested directly on small odd shapes:
// every transpose, bias, accumulation, fp32 and bf16 output, both slicing directions, against a
// float64 product of the same inputs.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cpu/gemm.h"
#include "gemm_reference.h"

namespace {

using namespace lnmlp::cpu;

struct Case {
  int64_t m, n, k;  // m >= n: slices of rows; m < n: slices of columns
  bool trans_a, trans_b, bias, accumulate;
  GemmType input, output;
  int slices;
};

std::string name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return std::to_string(c.m) + "x" + std::to_string(c.n) + "x" + std::to_string(c.k) + (c.trans_a ? "_At" : "") +
         (c.trans_b ? "_Bt" : "") + (c.bias ? "_bias" : "") + (c.accumulate ? "_acc" : "") +
         (c.input == GemmType::BF16 ? "_bf16in" : "_f32in") + (c.output == GemmType::BF16 ? "_bf16out" : "_f32out") +
         "_" + std::to_string(c.slices) + "slices";
}

// Runs case c's sliced GEMM on two OpenMP threads (of the calling thread) and returns
// max |C - float64 reference| / max |reference|.
double sliced_gemm_error(const Case& c, unsigned seed) {
  const int previous = omp_get_max_threads();
  omp_set_num_threads(2);  // the slices are shared by two threads
  GemmShape shape{c.m, c.n, c.k, c.trans_a, c.trans_b, c.input, c.output, c.bias};
  shape.accumulate = c.accumulate;
  auto gemm = lnmlp::cpu::make_sliced_gemm(shape, c.slices);
  gemm_reference::AlignedBytes scratch(gemm->scratch_bytes());
  const double error = gemm_reference::gemm_error(
      shape, seed,
      [&](const void* a, const void* b, const void* bias, void* out) { gemm->run(a, b, bias, out, scratch.get()); });
  omp_set_num_threads(previous);
  return error;
}

double tolerance(const Case& c) { return gemm_reference::tolerance(c.output); }

class SlicedGemm : public ::testing::TestWithParam<Case> {};

TEST_P(SlicedGemm, MatchesFloat64Product) {
  const Case c = GetParam();
  if (c.input == GemmType::BF16 && !lnmlp::cpu::gemm_native_bf16()) GTEST_SKIP() << "no bf16 matmul on this CPU";
  EXPECT_LE(sliced_gemm_error(c, 11), tolerance(c));
}

// Two threads, each with its own sliced GEMM and OpenMP team, at the same time (concurrent
// plans): each result still matches its reference. scripts/tsan.sh runs this under TSan.
TEST(SlicedGemmThreads, ConcurrentGemmsFromTwoThreads) {
  const Case rows{203, 67, 45, false, true, true, false, GemmType::F32, GemmType::F32, 5};
  const Case cols{61, 211, 37, true, false, false, true, GemmType::F32, GemmType::F32, 4};
  auto worst_of_three = [](const Case& c, unsigned seed, double* worst) {
    *worst = 0.0;
    for (unsigned i = 0; i < 3; ++i) *worst = std::max(*worst, sliced_gemm_error(c, seed + i));
  };
  double error[2] = {1.0, 1.0};
  std::thread first(worst_of_three, rows, 20u, &error[0]);
  std::thread second(worst_of_three, cols, 30u, &error[1]);
  first.join();
  second.join();
  EXPECT_LE(error[0], tolerance(rows));
  EXPECT_LE(error[1], tolerance(cols));
}

std::vector<Case> cases() {
  std::vector<Case> out;
  const int64_t shapes[][3] = {{203, 67, 45}, {61, 211, 37}};  // rows sliced; columns sliced
  for (const auto& s : shapes)
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (GemmType in : {GemmType::F32, GemmType::BF16})
          for (GemmType o : {GemmType::F32, GemmType::BF16}) {
            if (in == GemmType::F32 && o == GemmType::BF16) continue;  // not a GEMM of the block
            out.push_back({s[0], s[1], s[2], ta, tb, true, false, in, o, 5});
            out.push_back({s[0], s[1], s[2], ta, tb, false, true, in, o, 3});
          }
  return out;
}

INSTANTIATE_TEST_SUITE_P(AllLayouts, SlicedGemm, ::testing::ValuesIn(cases()), name);

}  // namespace
