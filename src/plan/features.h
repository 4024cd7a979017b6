// lnmlp_query_support's answers that every backend able to run gives alike: the backend itself,
// the three dtypes, external workspace and every FP8 recipe (native or emulated exactly:
// docs/fp8.md; which of the two is each backend's answer). Sharding is each backend's own answer
// (the CPU backend's always, over MPI or callbacks; the CUDA backend's when its module was built
// with NCCL).
#pragma once

#include <cstdint>

#include "config.h"
#include "lnmlp.h"

namespace lnmlp {

// The recipe a LNMLP_FEATURE_RECIPE_* feature asks about; Recipe::None for other features.
constexpr Recipe feature_recipe(int32_t feature) {
  switch (feature) {
    case LNMLP_FEATURE_RECIPE_DELAYED: return Recipe::Delayed;
    case LNMLP_FEATURE_RECIPE_CURRENT: return Recipe::Current;
    case LNMLP_FEATURE_RECIPE_BLOCK: return Recipe::Block;
    case LNMLP_FEATURE_RECIPE_MXFP8: return Recipe::Mxfp8;
    case LNMLP_FEATURE_RECIPE_NVFP4: return Recipe::Nvfp4;
    default: return Recipe::None;
  }
}

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
