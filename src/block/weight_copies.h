// The copies of W1 and W2 a plan's GEMMs read -- widened (f16, or bf16 where the CPU has no bf16
// GEMM) or quantized with their scales (FP8 recipes) -- kept in the plan's workspace from one call
// to the next, so that a call whose weights are unchanged since the call that made them
// (LNMLP_CALL_WEIGHTS_UNCHANGED) reuses them instead of making them again. Each weight has its
// own workspace slots at fixed offsets (schedule.cpp's Pass takes them first in every pass), one
// per orientation its GEMMs read, or one for both where one operand serves both; the per-tensor
// scale they were made with is in the pass's quantizer scalars, also at a fixed offset.
#pragma once

#include "exec.h"

namespace lnmlp::block {

struct WeightCopies {
  static constexpr int kW1 = 0, kW2 = 1;               // [weight], from plan/fp8_recipe.h's quantizer
  static constexpr int kRowwise = 0, kColumnwise = 1;  // [orientation]

  bool made[2][2] = {};
  Operand operand[2][2] = {};
  // The forward GEMMs' packed copies (Exec::pack_weight), made only by a call that declares the
  // weights unchanged: packing costs a pass over the weight, which pays when later calls reuse it.
  const void* packed[2] = {};
  const void* workspace = nullptr;  // the workspace they live in

  bool any(int w) const { return made[w][kRowwise] || made[w][kColumnwise]; }
  void forget() { *this = WeightCopies{}; }
};

}  // namespace lnmlp::block
