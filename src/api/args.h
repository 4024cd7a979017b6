// Checks of what forward / backward are handed, before anything is written.
#pragma once

#include <cstdint>

#include "plan.h"
#include "plan/call_args.h"

namespace lnmlp {

// Throws unless flags are LNMLP_CALL_* flags this version knows; returns whether the weights are
// unchanged (LNMLP_CALL_WEIGHTS_UNCHANGED).
bool check_call_flags(int32_t flags);
// The call's saved buffer: `saved` itself, or with LNMLP_CALL_SAVED_SECTIONS the array of its
// sections there (read now; NULL for none).
SavedBuffer saved_buffer(const void* saved, int32_t flags);
// The LNMLP_CALL_AMAX_* bits of flags (checked against the plan with the call's other arguments).
int32_t amax_flags(int32_t flags);
// A forward, backward or backward-data call's flags into its arguments: whether the weights are
// unchanged, the amax stages, and the saved buffer (`saved`, or its sections apart).
template <typename Args> void take_call_flags(int32_t flags, const void* saved, Args& a) {
  a.weights_unchanged = check_call_flags(flags);
  a.amax = amax_flags(flags);
  a.saved = saved_buffer(saved, flags);
}
// Also check the call's token count and FP8 state.
void check_forward_args(const lnmlp_plan& plan, const ForwardArgs& a);
void check_backward_args(const lnmlp_plan& plan, const BackwardArgs& a);

}  // namespace lnmlp
