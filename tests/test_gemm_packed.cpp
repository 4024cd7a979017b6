// Packed B (src/cpu/gemm.h, packed_b_bytes / make_b_packer): a weight packed once into the GEMM
// library's own layout, then read by GEMMs made with packed_b, of any row count. Tested directly on
// small odd shapes (n and k not multiples of the layout's blocks), B stored [k, n] and [n, k],
// fp32 and bf16, with and without bias, on two threads, against the float64 product of the same
// inputs. Skipped where the CPU's GEMM kernels have no packed layout (below AVX-512).
#include <gtest/gtest.h>
#include <omp.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cpu/gemm.h"
#include "gemm_reference.h"

namespace {

using namespace lnmlp::cpu;

struct Case {
  int64_t n, k;
  bool trans_b, bias;
  GemmType input, output;
};

std::string name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return std::to_string(c.n) + "x" + std::to_string(c.k) + (c.trans_b ? "_Bt" : "") + (c.bias ? "_bias" : "") +
         (c.input == GemmType::BF16 ? "_bf16in" : "_f32in") + (c.output == GemmType::BF16 ? "_bf16out" : "_f32out");
}

class PackedGemm : public ::testing::TestWithParam<Case> {};

// One packing of B serves every row count: the rows of a decode step (1), of odd batches, and
// more than a kernel block.
TEST_P(PackedGemm, OnePackingServesEveryRowCountAndMatchesFloat64) {
  const Case c = GetParam();
  if (c.input == GemmType::BF16 && !gemm_native_bf16()) GTEST_SKIP() << "no bf16 matmul on this CPU";
  GemmShape shape{1, c.n, c.k, false, c.trans_b, c.input, c.output, c.bias};
  const int64_t bytes = packed_b_bytes(shape);
  if (bytes == 0) GTEST_SKIP() << "no packed layout for this CPU's GEMM kernels";
  const int previous = omp_get_max_threads();
  omp_set_num_threads(2);
  auto packer = make_b_packer(shape);
  for (int64_t m : {1, 2, 7, 33, 130}) {
    SCOPED_TRACE(std::to_string(m) + " rows");
    shape.m = m;
    GemmShape packed_shape = shape;
    packed_shape.packed_b = true;
    auto gemm = make_gemm(packed_shape);
    gemm_reference::AlignedBytes scratch(gemm->scratch_bytes()), packed(bytes);
    const double error = gemm_reference::gemm_error(shape, static_cast<unsigned>(m),
                                                    [&](const void* a, const void* b, const void* bias, void* out) {
                                                      packer->run(b, packed.get());
                                                      gemm->run(a, packed.get(), bias, out, scratch.get());
                                                    });
    EXPECT_LE(error, gemm_reference::tolerance(c.output));
  }
  omp_set_num_threads(previous);
}

std::vector<Case> cases() {
  std::vector<Case> out;
  const int64_t shapes[][2] = {{67, 45}, {211, 37}, {9, 300}};  // n, k
  for (const auto& s : shapes)
    for (bool tb : {false, true})
      for (GemmType in : {GemmType::F32, GemmType::BF16})
        for (GemmType o : {GemmType::F32, GemmType::BF16}) {
          if (in == GemmType::F32 && o == GemmType::BF16) continue;  // not a GEMM of the block
          out.push_back({s[0], s[1], tb, true, in, o});
          out.push_back({s[0], s[1], tb, false, in, o});
        }
  return out;
}

INSTANTIATE_TEST_SUITE_P(AllLayouts, PackedGemm, ::testing::ValuesIn(cases()), name);

}  // namespace
