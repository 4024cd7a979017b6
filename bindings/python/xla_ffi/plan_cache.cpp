#include "plan_cache.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <sstream>
#include <stdexcept>

namespace lnmlp_xla {
namespace {

void check(int32_t status, const char* what) {
  if (status != LNMLP_SUCCESS)
    throw std::runtime_error(std::string(what) + ": " + lnmlp_last_error() + " [" + lnmlp_status_string(status) + "]");
}

template <typename T> void put(std::ostringstream& o, T v) { o.write(reinterpret_cast<const char*>(&v), sizeof v); }

lnmlp_plan* create_plan(const PlanConfig& c) {
  lnmlp_desc* d = nullptr;
  check(lnmlp_desc_create(&d), "lnmlp_desc_create");
  std::unique_ptr<lnmlp_desc, int32_t (*)(lnmlp_desc*)> desc(d, lnmlp_desc_destroy);
  check(lnmlp_desc_set_backend(d, c.backend, c.device), "backend");
  check(lnmlp_desc_set_shape(d, c.tokens, c.hidden, c.ffn), "shape");
  check(lnmlp_desc_set_norm(d, c.norm), "norm_type");
  check(lnmlp_desc_set_zero_centered_gamma(d, c.zero_centered_gamma), "zero_centered_gamma");
  check(lnmlp_desc_set_epsilon(d, c.epsilon), "epsilon");
  const int32_t acts[2] = {c.act0, c.act1};
  check(lnmlp_desc_set_activations(d, c.act1 < 0 ? 1 : 2, acts), "activation_type");
  if (c.act0 == LNMLP_ACT_CLAMPED_SILU)
    check(lnmlp_desc_set_clamped_swiglu(d, c.clamp_limit, c.clamp_alpha, c.clamp_offset), "act_params");
  check(lnmlp_desc_set_bias(d, c.has_bias1, c.has_bias2), "biases");
  check(lnmlp_desc_set_dtype(d, c.dtype), "dtype");
  check(lnmlp_desc_set_remat(d, c.remat), "remat");
  check(lnmlp_desc_set_norm_output(d, c.norm_output), "norm output");
  check(lnmlp_desc_set_recipe(d, c.recipe), "recipe");
  if (c.recipe != LNMLP_RECIPE_NONE) {
    check(lnmlp_desc_set_fp8_format(d, c.fp8_format), "fp8_format");
    check(lnmlp_desc_set_delayed_scaling(d, c.margin, c.amax_history_len, c.amax_compute_algo), "delayed scaling");
    check(lnmlp_desc_set_scaling_options(d, c.power_2_scale, c.amax_epsilon), "scaling options");
  }
  if (c.recipe == LNMLP_RECIPE_NVFP4)
    check(lnmlp_desc_set_nvfp4_options(d, c.nvfp4_options & 1, (c.nvfp4_options >> 1) & 1, (c.nvfp4_options >> 2) & 1),
          "NVFP4 options");
  if (c.weight_dtype != -1) {
    check(lnmlp_desc_set_weight_dtype(d, c.weight_dtype), "kernels' dtype");
    check(lnmlp_desc_set_weight_gradients(d, 0, c.weight_dtype), "kernel gradients' dtype");
  }
  // On a GPU the workspace is XLA's (its allocator accounts for device memory and reuses it); on
  // the CPU the plan owns it, so its pages stay mapped from call to call instead of being faulted
  // in anew for every buffer XLA allocates (docs/jax.md, "Buffers").
  check(lnmlp_desc_set_external_workspace(d, c.backend == LNMLP_BACKEND_CPU ? 0 : 1), "external workspace");
  lnmlp_plan* plan = nullptr;
  check(lnmlp_plan_create(d, &plan), "lnmlp_plan_create");
  return plan;
}

}  // namespace

std::string PlanConfig::key() const {
  std::ostringstream o;
  const int64_t shared_tokens = backend == LNMLP_BACKEND_CPU ? 0 : tokens;
  for (int64_t v : {shared_tokens, hidden, ffn, amax_history_len}) put(o, v);
  for (int32_t v :
       {norm, zero_centered_gamma, act0, act1, has_bias1, has_bias2, dtype, remat, recipe, fp8_format, margin,
        amax_compute_algo, power_2_scale, backend, device, weight_dtype, norm_output, nvfp4_options})
    put(o, v);
  for (float v : {epsilon, clamp_limit, clamp_alpha, clamp_offset, amax_epsilon}) put(o, v);
  return o.str();
}

void SharedPlan::reserve(int64_t tokens) {
  if (plan != nullptr && tokens <= config.tokens) return;
  PlanConfig c = config;
  c.tokens = std::max(tokens, c.tokens);
  lnmlp_plan* bigger = create_plan(c);  // first, so that a failure leaves the old plan in place
  lnmlp_plan_destroy(plan);
  plan = bigger;
  config = c;
  check(lnmlp_plan_get_alignment(plan, &alignment), "lnmlp_plan_get_alignment");
  external_workspace = c.backend != LNMLP_BACKEND_CPU;
}

namespace {
std::mutex cache_mutex;
std::map<std::string, std::shared_ptr<SharedPlan>> cache;
}  // namespace

std::shared_ptr<SharedPlan> shared_plan(const PlanConfig& config) {
  std::shared_ptr<SharedPlan> p;
  {
    std::lock_guard<std::mutex> lock(cache_mutex);
    std::shared_ptr<SharedPlan>& slot = cache[config.key()];
    if (!slot) {
      slot = std::make_shared<SharedPlan>();
      slot->config = config;
    }
    p = slot;
  }
  std::lock_guard<std::mutex> lock(p->mutex);
  try {
    p->reserve(config.tokens);
  } catch (...) {
    if (p->plan == nullptr) {  // a configuration lnmlp refuses: leave no empty entry behind
      std::lock_guard<std::mutex> cache_lock(cache_mutex);
      cache.erase(config.key());
    }
    throw;
  }
  return p;
}

int64_t plan_count() {
  std::lock_guard<std::mutex> lock(cache_mutex);
  return static_cast<int64_t>(cache.size());
}

}  // namespace lnmlp_xla
