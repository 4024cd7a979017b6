// The grid of plans several call tests run over (test_norm_output.cpp, test_backward_split.cpp,
// test_saved_sections.cpp): a dtype, an FP8 recipe, a remat policy and the norm, named for the
// test's name, and the small gated problem each runs (T 37, H 48, F 40, silu x linear, both
// biases).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "test_util.h"

namespace lnmlp_test {

struct PlanCase {
  int32_t dtype;
  int32_t recipe;
  int32_t remat;
  bool rms;
  std::string name() const {
    static const char* recipes[] = {"none", "delayed", "current", "block", "mxfp8"};
    static const char* remats[] = {"save_all", "save_ffn1", "save_stats", "forward_only"};
    const char* dt = dtype == LNMLP_DTYPE_F32 ? "f32" : dtype == LNMLP_DTYPE_BF16 ? "bf16" : "f16";
    return std::string(dt) + "_" + recipes[recipe] + "_" + remats[remat] + (rms ? "_rmsnorm" : "_layernorm");
  }
};

// Every dtype, FP8 recipe and remat policy up to `last_remat`, the norm alternating over the grid
// (RMSNorm where recipe + remat is odd, or even with `rms_when_even`).
inline std::vector<PlanCase> plan_grid(int32_t last_remat, bool rms_when_even = false) {
  std::vector<PlanCase> v;
  for (int32_t dt : {LNMLP_DTYPE_F32, LNMLP_DTYPE_BF16, LNMLP_DTYPE_F16})
    for (int32_t recipe = LNMLP_RECIPE_NONE; recipe <= LNMLP_RECIPE_MXFP8; ++recipe)
      for (int32_t remat = LNMLP_REMAT_SAVE_ALL; remat <= last_remat; ++remat)
        v.push_back({dt, recipe, remat, (recipe + remat) % 2 == (rms_when_even ? 0 : 1)});
  return v;
}

// The run options of a case: its recipe and remat policy (the rest each test's own).
inline RunOptions plan_case_options(const PlanCase& k) {
  RunOptions o;
  o.recipe = k.recipe;
  o.remat = k.remat;
  return o;
}

inline Problem plan_case_problem(const PlanCase& k, uint64_t seed, int64_t tokens = 37) {
  lnmlp_ref::Config c;
  c.tokens = tokens;
  c.hidden = 48;
  c.ffn = 40;
  c.norm = k.rms ? lnmlp_ref::Norm::RmsNorm : lnmlp_ref::Norm::LayerNorm;
  c.acts = {LNMLP_ACT_SILU, LNMLP_ACT_LINEAR};
  c.has_bias1 = c.has_bias2 = true;
  return make_problem(c, k.dtype, seed);
}

}  // namespace lnmlp_test
