// The lnmlp plans behind the XLA FFI handlers, shared by every call site (every layer of a model)
// with the same configuration, created the first time an executable using them is instantiated
// and kept for the life of the process. On the CPU one plan serves every token count: its most
// tokens grow to the largest call (ABI 2's tokens per call; the plan owns its workspace). On a GPU
// the workspace is XLA's, sized at trace time for the plan's most tokens, so a plan serves one
// token count.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "lnmlp.h"

namespace lnmlp_xla {

// What the plan computes: the lnmlp descriptor's settings, as the JAX side passes them in the
// custom call's attributes (lnmlp/jax/_ffi.py writes the same names).
struct PlanConfig {
  int64_t tokens = 0, hidden = 0, ffn = 0;
  int32_t norm = LNMLP_NORM_LAYERNORM, zero_centered_gamma = 0;
  float epsilon = 1e-6f;
  int32_t act0 = LNMLP_ACT_RELU, act1 = -1;  // act1 -1: one activation
  float clamp_limit = 7.0f, clamp_alpha = 1.702f, clamp_offset = 1.0f;
  int32_t has_bias1 = 0, has_bias2 = 0, dtype = LNMLP_DTYPE_F32, remat = LNMLP_REMAT_SAVE_ALL;
  int32_t recipe = LNMLP_RECIPE_NONE, fp8_format = LNMLP_FP8_FORMAT_DEFAULT;
  int32_t margin = 0, amax_compute_algo = LNMLP_AMAX_ALGO_MAX, power_2_scale = -1;
  int64_t amax_history_len = 1024;
  float amax_epsilon = 0.0f;
  int32_t backend = LNMLP_BACKEND_CPU, device = 0;
  int32_t weight_dtype = -1;  // -1: the I/O dtype; LNMLP_DTYPE_F32: fp32 kernels (and gradients) under FP8
  int32_t norm_output = 0;    // 1: forward also gives the norm output (a section of saved)
  // NVFP4's options (lnmlp_desc_set_nvfp4_options): bit 0 disable_rht, bit 1
  // disable_stochastic_rounding, bit 2 disable_2d_quantization.
  int32_t nvfp4_options = 0;

  // Whether the plan's backward rounds stochastically: its random state is then an operand of
  // each backward call (lnmlp/jax/_quantizer_set.py), set on the plan before it runs.
  bool draws_random() const { return recipe == LNMLP_RECIPE_NVFP4 && (nvfp4_options & 2) == 0; }

  std::string key() const;  // equal for configurations that share a plan (on the CPU: any tokens)
};

// A plan and the lock that keeps its calls one at a time (XLA may run two executables, or two
// independent call sites of one, at once; an lnmlp plan serves one thread at a time).
struct SharedPlan {
  std::mutex mutex;
  PlanConfig config;  // config.tokens: the plan's most tokens per call
  lnmlp_plan* plan = nullptr;
  int64_t alignment = 0;            // of the workspace and the saved buffer (lnmlp_plan_get_alignment)
  bool external_workspace = false;  // the calls attach XLA's workspace buffer (GPU)

  // Makes the plan take calls of `tokens` tokens, replacing it by one for that many when it takes
  // fewer (the CPU's growth; the mutex must be held). Throws std::runtime_error with lnmlp's message.
  void reserve(int64_t tokens);
  ~SharedPlan() { lnmlp_plan_destroy(plan); }
};

// The plan for `config`, created on first use, or on the CPU grown to config.tokens.
// Throws std::runtime_error with lnmlp's message when the configuration is invalid.
std::shared_ptr<SharedPlan> shared_plan(const PlanConfig& config);

// How many plans the cache holds (for tests: calls that should share a plan do).
int64_t plan_count();

}  // namespace lnmlp_xla
