// The tensors of one forward or backward call, as the C API receives them (docs/design.md, "The plan and its calls"),
// checked before they reach the engine (api/args.h): non-NULL where required, aligned, not
// overlapping. Host pointers for the CPU backend, device pointers for the CUDA backend.
#pragma once

#include <cstdint>

namespace lnmlp {

// ForwardArgs::amax, BackwardArgs::amax: lnmlp.h's LNMLP_CALL_AMAX_MEASURE, and
// LNMLP_CALL_AMAX_GIVEN_<Q> as bit kAmaxGivenShift + Q (quantizer Q's amax is given).
constexpr int32_t kAmaxMeasure = 2;
constexpr int kAmaxGivenShift = 8;

struct ForwardArgs {
  int64_t tokens;  // rows of x and y in this call (this rank's under sequence parallelism)
  const void* x;
  const void* gamma;
  const void* beta;  // NULL for rmsnorm
  const void* w1;
  const void* b1;  // NULL without bias1
  const void* w2;
  const void* b2;  // NULL without bias2
  void* y;
  void* saved;  // NULL when the plan saves nothing
  void* stream;
  float* fp8_state;        // the call's delayed-scaling state in backend memory (plan/fp8_recipe.h); NULL otherwise
  bool weights_unchanged;  // LNMLP_CALL_WEIGHTS_UNCHANGED: W1, W2 as when the plan's kept copies were made
  // Current scaling in stages: the call's LNMLP_CALL_AMAX_* bits; fp8_state is then the amax array.
  int32_t amax = 0;
};

// Which part of backward a call runs: all of it (lnmlp_plan_backward), or it in two calls
// (TransformerEngine's delay_wgrad_compute): everything but dW1 and dW2, keeping what their GEMMs
// read that forward did not save in the deferred buffer (lnmlp_plan_backward_data), then dW1 and
// dW2 from it (lnmlp_plan_backward_weights).
enum class BackwardPart : int32_t { Whole = 0, Data = 1, Weights = 2 };

struct BackwardArgs {
  int64_t tokens;  // as in ForwardArgs
  const void* dy;
  const void* x;
  const void* gamma;
  const void* beta;
  const void* w1;
  const void* b1;
  const void* w2;
  const void* saved;
  void* dx;
  void* dgamma;
  void* dbeta;
  void* dw1;
  void* db1;
  void* dw2;
  void* db2;
  void* stream;
  float* fp8_state;        // as in ForwardArgs
  bool weights_unchanged;  // as in ForwardArgs
  int32_t amax = 0;        // as in ForwardArgs
  BackwardPart part = BackwardPart::Whole;
  void* deferred = nullptr;  // Data: written; Weights: read (plan/layout.h's DeferredLayout)
};

}  // namespace lnmlp
