// The tensors of one forward or backward call, as the C API receives them (docs/design.md, "The plan and its calls"),
// checked before they reach the engine (api/args.h): non-NULL where required, aligned, not
// overlapping. Host pointers for the CPU backend, device pointers for the CUDA backend.
#pragma once

#include <array>
#include <cstdint>

#include "layout.h"
#include "rng_stream.h"

namespace lnmlp {

// The saved buffer a call writes (forward) or reads (backward): one allocation, or with
// LNMLP_CALL_SAVED_SECTIONS its sections apart, each in a buffer of its own. From a pointer: the
// one buffer (the deferred buffer is always one).
struct SavedBuffer {
  SavedBuffer() = default;
  SavedBuffer(const void* base) : base(const_cast<void*>(base)) {}  // NOLINT(google-explicit-constructor)
  void* base = nullptr;
  bool apart = false;                            // the sections below instead of base
  std::array<void*, kSavedSections> sections{};  // with apart: section i's buffer (LNMLP_SAVED_*), or NULL
  bool given() const { return base != nullptr || apart; }
  // Region r's bytes (a region of plan/layout.h's SavedLayout when apart); NULL when r is absent
  // or no buffer is given (sizing the workspace).
  char* at(const Region& r) const {
    if (!r.present()) return nullptr;
    if (apart) return r.section >= 0 ? static_cast<char*>(sections[r.section]) : nullptr;
    return base != nullptr ? static_cast<char*>(base) + r.offset : nullptr;
  }
};

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
  SavedBuffer saved;  // none when the plan saves nothing
  void* stream;
  float* fp8_state;        // the call's delayed-scaling state in backend memory (plan/fp8_recipe.h); NULL otherwise
  bool weights_unchanged = false;  // LNMLP_CALL_WEIGHTS_UNCHANGED: W1, W2 as when the plan's kept copies were made
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
  SavedBuffer saved;
  void* dx;
  void* dgamma;
  void* dbeta;
  void* dw1;
  void* db1;
  void* dw2;
  void* db2;
  void* stream;
  float* fp8_state;        // as in ForwardArgs
  bool weights_unchanged = false;  // as in ForwardArgs
  int32_t amax = 0;        // as in ForwardArgs
  BackwardPart part = BackwardPart::Whole;
  void* deferred = nullptr;  // Data: written; Weights: read (plan/layout.h's DeferredLayout)
  // The random stream of the call's stochastic rounding (NVFP4): the plan's random state and place.
  RngStream rng = {};
};

}  // namespace lnmlp
