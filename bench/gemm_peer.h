// The peer lnmlp-bench measures in the same run: the block's GEMMs alone, with the same shapes,
// types and library (oneDNN, through the library's own GEMM layer), and nothing else. The
// difference to the fused block is everything that is not a GEMM.
#pragma once

#include <cstdint>
#include <memory>

#include "lnmlp.h"

struct GemmPeerTimes {
  double forward_s;   // GEMM1 + GEMM2
  double backward_s;  // dact, dW2, dgrad, dW1 (+ GEMM1 again for save_stats)
};

// The block's GEMMs, created once; run_once() times one forward + backward's worth of them, so
// the caller can interleave them with the block's own iterations (a shared machine drifts).
class GemmPeer {
 public:
  // dtype: LNMLP_DTYPE_*; num_acts: A; recompute_gemm1: the save_stats policy; weight_layout:
  // LNMLP_WEIGHT_LAYOUT_*.
  GemmPeer(int64_t tokens, int64_t hidden, int64_t ffn, int32_t num_acts, int32_t dtype, bool bias1, bool bias2,
           bool recompute_gemm1, int32_t weight_layout = LNMLP_WEIGHT_LAYOUT_IN_OUT);
  ~GemmPeer();
  GemmPeerTimes run_once();
  // GEMM1 and GEMM2 alone (a forward-only step's worth): seconds. packed_weights: reading W1 and
  // W2 packed, as the CPU backend's forward does in a call that declares them unchanged (where
  // the GEMM library has a packed layout on this CPU; else as they are).
  double run_forward_once(bool packed_weights = false);

 private:
  struct State;
  std::unique_ptr<State> s_;
};
