// lnmlp_query_support's answers that every backend able to run gives alike: the backend itself,
// the three dtypes, external workspace and every FP8 recipe (native or emulated exactly:
// docs/fp8.md). Sharding is each backend's own answer (the CPU backend's always, over MPI or
// callbacks; the CUDA backend's when its module was built with NCCL).
#pragma once

#include <cstdint>

#include "lnmlp.h"

namespace lnmlp {

constexpr bool every_backend_supports(int32_t feature) {
  switch (feature) {
    case LNMLP_FEATURE_BACKEND:
    case LNMLP_FEATURE_DTYPE_F32:
    case LNMLP_FEATURE_DTYPE_BF16:
    case LNMLP_FEATURE_DTYPE_F16:
    case LNMLP_FEATURE_EXTERNAL_WORKSPACE:
    case LNMLP_FEATURE_RECIPE_DELAYED:
    case LNMLP_FEATURE_RECIPE_CURRENT:
    case LNMLP_FEATURE_RECIPE_BLOCK:
    case LNMLP_FEATURE_RECIPE_MXFP8: return true;
    default: return false;
  }
}

}  // namespace lnmlp
