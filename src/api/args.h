// Checks of the pointers handed to forward / backward, before anything is written.
#pragma once

#include "plan.h"
#include "plan/call_args.h"

namespace lnmlp {

void check_forward_args(const lnmlp_plan& plan, const ForwardArgs& a);
void check_backward_args(const lnmlp_plan& plan, const BackwardArgs& a);

}  // namespace lnmlp
