// The plan's delayed-scaling state: created at plan creation, read and written by the C API.
#pragma once

#include "plan.h"

namespace lnmlp {

// Allocates the state in backend memory and sets every scale to 1 and every history to zeros
// (DELAYED plans only; does nothing for other recipes).
void init_fp8_state(lnmlp_plan& plan);

}  // namespace lnmlp
