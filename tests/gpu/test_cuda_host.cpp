// Host-side parts of the CUDA backend that need no GPU, so they run everywhere: the GEMM list is
// the CPU backend's (src/cpu/block_gemms.h), and the column-reduction chunking covers every row
// exactly once with a bounded number of chunks.
#include <gtest/gtest.h>

#include "cpu/block_gemms.h"
#include "cuda/gemm_cublaslt.h"
#include "cuda/kernels.h"

namespace {

using lnmlp::numerics::DType;

TEST(CudaHost, TheSixGemmsAreTheCpuBackends) {
  for (DType d : {DType::F32, DType::BF16, DType::F16})
    for (int64_t A : {1, 2})
      for (bool bias : {false, true}) {
        const auto g = lnmlp::cuda::block_gemm_shapes(37, 72, 40, A, d, bias, !bias);
        const auto c = lnmlp::cpu::block_gemm_shapes(37, 72, 40, A, d, bias, !bias);
        const lnmlp::cuda::GemmShape* gs[] = {&g.gemm1, &g.gemm2, &g.dact, &g.dw2, &g.dn, &g.dw1};
        const lnmlp::cpu::GemmShape* cs[] = {&c.gemm1, &c.gemm2, &c.dact, &c.dw2, &c.dn, &c.dw1};
        for (int i = 0; i < 6; ++i) {
          SCOPED_TRACE(i);
          EXPECT_EQ(gs[i]->m, cs[i]->m);
          EXPECT_EQ(gs[i]->n, cs[i]->n);
          EXPECT_EQ(gs[i]->k, cs[i]->k);
          EXPECT_EQ(gs[i]->trans_a, cs[i]->trans_a);
          EXPECT_EQ(gs[i]->trans_b, cs[i]->trans_b);
          EXPECT_EQ(gs[i]->input, d);
          // dact and dn in fp32 on both; the rest in the I/O dtype on the GPU (the CPU backend
          // goes through fp32 for f16 only because its GEMM library has no f16).
          EXPECT_EQ(gs[i]->output_f32, i == 2 || i == 4);
          if (i == 2 || i == 4) {
            EXPECT_EQ(cs[i]->output, lnmlp::cpu::GemmType::F32);
          }
        }
        // The forward GEMMs add their bias (in the epilogue); nothing else does.
        EXPECT_EQ(g.gemm1.bias, bias);
        EXPECT_EQ(g.gemm2.bias, !bias);
        for (const auto* s : {&g.dact, &g.dw2, &g.dn, &g.dw1}) EXPECT_FALSE(s->bias);
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

}  // namespace
