// The peer lnmlp-bench measures in the same run: the block's GEMMs alone, with the same shapes,
// types and library (oneDNN, through the library's own GEMM layer), and nothing else. The
// difference to the fused block is everything that is not a GEMM.
#pragma once

#include <cstdint>

struct GemmPeerResult {
  double forward_ms;   // GEMM1 + GEMM2
  double backward_ms;  // dact, dW2, dgrad, dW1 (+ GEMM1 again for save_stats)
};

// dtype: LNMLP_DTYPE_*; gated: A = 2; recompute_gemm1: the save_stats policy.
GemmPeerResult time_gemms_alone(int64_t tokens, int64_t hidden, int64_t ffn, int32_t num_acts, int32_t dtype,
                                bool bias1, bool bias2, bool recompute_gemm1, int iters);
