// The grid of plans several call tests run over (test_norm_output.cpp, test_backward_split.cpp,
// test_saved_sections.cpp): a dtype, an FP8 recipe, a remat policy and the norm, named for the
// test's name, and the small gated problem each runs (T 37, H 48, F 40, silu x linear, both
// biases).
#pragma once

#include <cstdint>
#include <initializer_list>
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

// Runs body(case) for a bf16 LayerNorm plan of each recipe and remat policy given, each under a
// trace that names them.
template <typename Body>
void for_each_bf16_plan(std::initializer_list<int32_t> recipes, std::initializer_list<int32_t> remats, Body&& body) {
  for (const int32_t recipe : recipes)
    for (const int32_t remat : remats) {
      SCOPED_TRACE("recipe " + std::to_string(recipe) + ", remat " + std::to_string(remat));
      body(PlanCase{LNMLP_DTYPE_BF16, recipe, remat, false});
    }
}

// The run options of a case: its recipe and remat policy (the rest each test's own).
inline RunOptions plan_case_options(const PlanCase& k) {
  RunOptions o;
  o.recipe = k.recipe;
  o.remat = k.remat;
  return o;
}

inline Problem plan_case_problem(const PlanCase& k, uint64_t seed, int64_t tokens = 37) {
  const auto norm = k.rms ? lnmlp_ref::Norm::RmsNorm : lnmlp_ref::Norm::LayerNorm;
  return make_problem(lnmlp_ref::biased_config(tokens, 48, 40, {LNMLP_ACT_SILU, LNMLP_ACT_LINEAR}, norm), k.dtype,
                      seed);
}

}  // namespace lnmlp_test
