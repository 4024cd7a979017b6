// Host-side parts of the CUDA backend that need no GPU, so they run everywhere: both backends
// run the six GEMMs of one table (block/gemm_roles.h) with the shapes and transposes the block's
// math needs, the column-reduction chunking covers every row exactly once with a bounded number
// of chunks, a GEMM falls back to the heuristic's next algorithm when cuBLASLt refuses one at run
// time, and a GEMM without any algorithm says why.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "block/gemm_roles.h"
#include "cpu/gemm_plan.h"
#include "cuda/gemm_algorithms.h"
#include "cuda/gemm_cublaslt.h"
#include "cuda/gemm_plan.h"
#include "cuda/kernels.h"

namespace {

using lnmlp::block::GemmRole;
using lnmlp::numerics::DType;

TEST(CudaHost, TheSixGemmsAreTheCpuBackends) {
  for (DType d : {DType::F32, DType::BF16, DType::F16})
    for (int32_t A : {1, 2})
      for (bool bias : {false, true}) {
        lnmlp::Config c;
        c.tokens = 37, c.hidden = 72, c.ffn = 40, c.num_acts = A, c.dtype = d;
        c.has_bias1 = bias, c.has_bias2 = !bias;
        const int64_t T = 37, H = 72, F = 40, AF = A * F;
        // C[m, n] = op(A) op(B): h = ln W1, y = act W2, dact = dy W2^T, dW2 = act^T dy, dn = dh W1^T, dW1 = ln^T dh.
        const struct {
          int64_t m, n, k;
          bool ta, tb, out_f32;
        } want[] = {{T, AF, H, false, false, false}, {T, H, F, false, false, false}, {T, F, H, false, true, true},
                    {F, H, T, true, false, false},   {T, H, AF, false, true, true},  {H, AF, T, true, false, false}};
        for (int i = 0; i < lnmlp::block::kGemmRoles; ++i) {
          SCOPED_TRACE(i);
          const auto s = lnmlp::block::gemm_spec(lnmlp::block::kAllGemmRoles[i], c);
          const auto g = lnmlp::cuda::cuda_gemm(s, c).shape;
          const auto cs = lnmlp::cpu::cpu_gemm(s, c).shape;
          EXPECT_EQ(s.m, want[i].m);
          EXPECT_EQ(s.n, want[i].n);
          EXPECT_EQ(s.k, want[i].k);
          EXPECT_EQ(s.trans_a, want[i].ta);
          EXPECT_EQ(s.trans_b, want[i].tb);
          for (auto m : {g.m, cs.m}) EXPECT_EQ(m, s.m);
          for (auto n : {g.n, cs.n}) EXPECT_EQ(n, s.n);
          for (auto k : {g.k, cs.k}) EXPECT_EQ(k, s.k);
          EXPECT_EQ(g.trans_a, s.trans_a);
          EXPECT_EQ(g.trans_b, s.trans_b);
          EXPECT_EQ(cs.trans_a, s.trans_a);
          EXPECT_EQ(cs.trans_b, s.trans_b);
          EXPECT_EQ(g.a, lnmlp::cuda::lt_type(d));
          // dact and dn in fp32 on both; the rest in the I/O dtype on the GPU (the CPU backend
          // goes through fp32 for f16 only because its GEMM library has no f16).
          EXPECT_EQ(g.c == lnmlp::cuda::LtType::F32, want[i].out_f32 || d == DType::F32);
          if (want[i].out_f32) {
            EXPECT_EQ(cs.output, lnmlp::cpu::GemmType::F32);
          }
        }
        // The forward GEMMs add their bias (in the epilogue); nothing else does.
        EXPECT_EQ(lnmlp::cuda::cuda_gemm(lnmlp::block::gemm_spec(GemmRole::Gemm1, c), c).shape.bias, bias);
        EXPECT_EQ(lnmlp::cuda::cuda_gemm(lnmlp::block::gemm_spec(GemmRole::Gemm2, c), c).shape.bias, !bias);
        for (GemmRole r : {GemmRole::Dact, GemmRole::Dw2, GemmRole::Dn, GemmRole::Dw1})
          EXPECT_FALSE(lnmlp::cuda::cuda_gemm(lnmlp::block::gemm_spec(r, c), c).shape.bias);
      }
}

TEST(CudaHost, ColumnChunkingCoversEveryRowOnce) {
  for (int64_t rows : {int64_t{1}, int64_t{2}, int64_t{37}, int64_t{1000}, int64_t{1100}, int64_t{16384},
                       int64_t{1} << 31})
    for (int64_t cols : {int64_t{1}, int64_t{40}, int64_t{256}, int64_t{257}, int64_t{4096}, int64_t{57344},
                         int64_t{1} << 24}) {
      SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(cols));
      const lnmlp::cuda::Chunking c = lnmlp::cuda::column_chunking(rows, cols);
      ASSERT_GE(c.chunks, 1);
      ASSERT_GE(c.rows_per_chunk, 1);
      EXPECT_LE(c.chunks, 1024);  // a grid's y dimension, and the size of the partials
      EXPECT_GE(c.chunks * c.rows_per_chunk, rows);  // every row in a chunk
      EXPECT_LT((c.chunks - 1) * c.rows_per_chunk, rows);  // no empty chunk
      EXPECT_EQ(lnmlp::cuda::column_chunking(rows, cols).chunks, c.chunks);  // a function of the shape only
    }
}

// lnmlp_desc_set_gemm_math reaches the GEMMs it names, and no other: fast accumulation in GEMM1
// and GEMM2 of per-tensor FP8 recipes, TF32 where both inputs are fp32.
TEST(CudaHost, GemmMathReachesTheGemmsItNames) {
  using lnmlp::cuda::LtType;
  struct Plan {
    lnmlp::numerics::DType dtype;
    lnmlp::Recipe recipe;
    bool power_2 = true;
  };
  for (const Plan p : {Plan{DType::BF16, lnmlp::Recipe::Delayed}, Plan{DType::F32, lnmlp::Recipe::Current},
                       Plan{DType::BF16, lnmlp::Recipe::Block}, Plan{DType::F32, lnmlp::Recipe::Block, false},
                       Plan{DType::BF16, lnmlp::Recipe::Mxfp8}, Plan{DType::F32, lnmlp::Recipe::None},
                       Plan{DType::BF16, lnmlp::Recipe::None}})
    for (bool native_block : {false, true}) {
      lnmlp::Config c;
      c.tokens = 64, c.hidden = 64, c.ffn = 96, c.num_acts = 2, c.dtype = p.dtype;
      c.fp8.recipe = p.recipe;
      c.fp8.power_2_scale = p.power_2 ? 1 : 0;
      c.fp8_fast_accumulation = c.allow_tf32 = true;
      const bool per_tensor = p.recipe == lnmlp::Recipe::Delayed || p.recipe == lnmlp::Recipe::Current;
      for (GemmRole role : lnmlp::block::kAllGemmRoles) {
        SCOPED_TRACE(std::to_string(static_cast<int>(p.recipe)) + " " + std::to_string(static_cast<int>(role)));
        const auto s = lnmlp::cuda::cuda_gemm(lnmlp::block::gemm_spec(role, c), c, native_block).shape;
        const bool forward = role == GemmRole::Gemm1 || role == GemmRole::Gemm2;
        EXPECT_EQ(s.fast_accumulation, per_tensor && forward);
        EXPECT_EQ(s.tf32, s.a == LtType::F32 && s.b == LtType::F32);
        c.fp8_fast_accumulation = c.allow_tf32 = false;
        const auto exact = lnmlp::cuda::cuda_gemm(lnmlp::block::gemm_spec(role, c), c, native_block).shape;
        EXPECT_FALSE(exact.fast_accumulation || exact.tf32);
        c.fp8_fast_accumulation = c.allow_tf32 = true;
      }
    }
}

// cuBLASLt refusing, at run time, algorithms its heuristic offered: the run falls through to the
// next ones in order, keeps the first that runs, and reports the first refusal only when all
// refuse.
TEST(CudaHost, AGemmFallsBackToTheNextAlgorithmCuBlasLtAccepts) {
  lnmlp::cuda::GemmAlgorithms<int> algos;
  algos.add(10, 1024);
  algos.add(20, 4096);
  algos.add(30, 0);
  EXPECT_EQ(algos.workspace_bytes(), 4096);  // the region fits whichever runs
  std::vector<int> tried;
  auto refusing = [&](std::vector<int> refused) {
    return [&tried, refused](const int& algo) {
      tried.push_back(algo);
      for (int r : refused)
        if (r == algo) return 7;  // a refusal's status
      return 0;
    };
  };
  EXPECT_EQ(algos.run(refusing({})), 0);
  EXPECT_EQ(tried, (std::vector<int>{10}));
  tried.clear();
  EXPECT_EQ(algos.run(refusing({10})), 0);
  EXPECT_EQ(tried, (std::vector<int>{10, 20}));
  EXPECT_EQ(algos.in_use(), 1);
  tried.clear();
  EXPECT_EQ(algos.run(refusing({10})), 0);  // the one that ran stays in use
  EXPECT_EQ(tried, (std::vector<int>{20}));
  tried.clear();
  EXPECT_EQ(algos.run(refusing({20, 10})), 0);  // from the best again, after the one in use
  EXPECT_EQ(tried, (std::vector<int>{20, 10, 30}));
  EXPECT_EQ(algos.in_use(), 2);
  tried.clear();
  EXPECT_EQ(algos.run(refusing({10, 20, 30})), 7);
  EXPECT_EQ(tried, (std::vector<int>{30, 10, 20}));
  EXPECT_EQ(algos.in_use(), 2);  // unchanged when every one refuses
}

// A GEMM cuBLASLt has no algorithm for says why: the GPU where the GPU decides it, else where to
// look (cuBLASLt's own log), never "Hopper only" for a refusal on Hopper.
TEST(CudaHost, AGemmWithoutAlgorithmsSaysWhy) {
  using lnmlp::cuda::LtScale;
  using lnmlp::cuda::LtType;
  auto reason = [](LtType a, LtScale scale, int sm, bool bias = false) {
    lnmlp::cuda::LtShape s;
    s.m = 256, s.n = 128, s.k = 512, s.trans_b = true, s.a = s.b = a, s.c = LtType::BF16, s.bias = bias;
    s.scale_a = s.scale_b = scale;
    return lnmlp::cuda::gemm_refusal_reason(s, sm, true, true);
  };
  auto says = [](const std::string& text, const char* part) { return text.find(part) != std::string::npos; };
  const std::string block_ada = reason(LtType::E4M3, LtScale::Vec128, 89);
  EXPECT_TRUE(says(block_ada, "Hopper (sm_90)") && says(block_ada, "this GPU is sm_89")) << block_ada;
  const std::string block_hopper = reason(LtType::E4M3, LtScale::Blk128, 90, true);
  EXPECT_FALSE(says(block_hopper, "Hopper")) << block_hopper;
  EXPECT_TRUE(says(block_hopper, "block scaling") && says(block_hopper, "bias epilogue") &&
              says(block_hopper, "CUBLASLT_LOG_MASK"))
      << block_hopper;
  const std::string fp8_ampere = reason(LtType::E5M2, LtScale::Tensor, 80);
  EXPECT_TRUE(says(fp8_ampere, "sm_89 or newer") && says(fp8_ampere, "sm_80")) << fp8_ampere;
  const std::string fp8_hopper = reason(LtType::E4M3, LtScale::Tensor, 90);
  EXPECT_TRUE(says(fp8_hopper, "no FP8 algorithm") && says(fp8_hopper, "CUBLASLT_LOG_MASK")) << fp8_hopper;
  EXPECT_TRUE(says(reason(LtType::BF16, LtScale::Tensor, 90), "multiples of 8"));
  lnmlp::cuda::LtShape old_library;
  old_library.a = old_library.b = LtType::E4M3;
  old_library.scale_a = LtScale::Vec128;
  EXPECT_TRUE(says(lnmlp::cuda::gemm_refusal_reason(old_library, 90, false, true), "12.9 or newer"));
  // NVFP4's native GEMMs: FP4 tensor cores, then the library, then cuBLASLt's own log.
  const std::string fp4_hopper = reason(LtType::E2M1, LtScale::Vec16, 90);
  EXPECT_TRUE(says(fp4_hopper, "sm_100 or newer") && says(fp4_hopper, "this GPU is sm_90")) << fp4_hopper;
  const std::string fp4_blackwell = reason(LtType::E2M1, LtScale::Vec16, 100);
  EXPECT_TRUE(says(fp4_blackwell, "no FP4 algorithm") && says(fp4_blackwell, "CUBLASLT_LOG_MASK")) << fp4_blackwell;
  lnmlp::cuda::LtShape fp4_old_library;
  fp4_old_library.a = fp4_old_library.b = LtType::E2M1;
  fp4_old_library.scale_a = fp4_old_library.scale_b = LtScale::Vec16;
  EXPECT_TRUE(says(lnmlp::cuda::gemm_refusal_reason(fp4_old_library, 100, true, false), "12.8 or newer"));
}

}  // namespace
