// Checks of the pointers handed to forward / backward, before anything is written.
#pragma once

#include "plan/call_args.h"
#include "plan.h"

namespace lnmlp {

void check_forward_args(const lnmlp_plan& plan, const ForwardArgs& a);
void check_backward_args(const lnmlp_plan& plan, const BackwardArgs& a);

}  // namespace lnmlp
