// The C ABI edge: every exported function validates its arguments, runs inside api_guard (so no
// exception escapes), and leaves everything unchanged when it fails.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "args.h"
#include "build_info.h"
#include "common/error.h"
#include "engine_factory.h"
#include "fp8_state.h"
#include "handles.h"
#include "lnmlp.h"
#include "module/loader.h"
#include "nccl_communicator.h"
#include "plan.h"
#include "plan/features.h"
#include "plan/sharding.h"

using namespace lnmlp;

namespace {

bool as_bool(int32_t v, const char* name) {
  if (v != 0 && v != 1) fail(LNMLP_ERROR_INVALID_ARGUMENT, name, " must be 0 or 1, got ", v);
  return v == 1;
}

void require_out(const void* p, const char* name) {
  if (p == nullptr) fail(LNMLP_ERROR_NULL_POINTER, name, " is NULL; pass where to write the result");
}

// The C API's plan size getters: the plan held while `get` reads it, *bytes written.
template <typename Get> int32_t get_plan_bytes(const char* fn, const lnmlp_plan* plan, int64_t* bytes, Get&& get) {
  return api_guard(fn, [&] {
    const Held<lnmlp_plan> held(plan, "plan");
    require_out(bytes, "bytes");
    *bytes = get(*plan);
  });
}

// Applies `change` to a copy of the descriptor's config and stores it only if nothing threw.
template <typename Fn> void edit(lnmlp_desc* d, Fn&& change) {
  const Held<lnmlp_desc> held(d, "desc");
  Config c = d->cfg;
  change(c);
  d->cfg = c;
}

// A communicator handle over a collective library's own communicator (`native`, the argument
// `name` of type `type`), made by `make`.
template <typename Make> int32_t create_native_comm(const char* fn, const void* native, const char* name,
                                                    const char* type, lnmlp_comm** comm, Make make) {
  return api_guard(fn, [&] {
    if (native == nullptr) fail(LNMLP_ERROR_NULL_POINTER, name, " is NULL; pass a pointer to an ", type);
    require_out(comm, "comm");
    auto c = std::make_unique<lnmlp_comm>();
    c->impl = make(native);
    *comm = register_handle(std::move(c));
  });
}

}  // namespace

extern "C" {

LNMLP_API int32_t lnmlp_get_version(int32_t* major, int32_t* minor, int32_t* patch, int32_t* abi) {
  if (major) *major = LNMLP_VERSION_MAJOR;
  if (minor) *minor = LNMLP_VERSION_MINOR;
  if (patch) *patch = LNMLP_VERSION_PATCH;
  if (abi) *abi = LNMLP_ABI_VERSION;
  return LNMLP_SUCCESS;
}

LNMLP_API const char* lnmlp_status_string(int32_t status) {
  switch (status) {
    case LNMLP_SUCCESS: return "LNMLP_SUCCESS";
    case LNMLP_ERROR_INVALID_ARGUMENT: return "LNMLP_ERROR_INVALID_ARGUMENT";
    case LNMLP_ERROR_NULL_POINTER: return "LNMLP_ERROR_NULL_POINTER";
    case LNMLP_ERROR_SIZE_OVERFLOW: return "LNMLP_ERROR_SIZE_OVERFLOW";
    case LNMLP_ERROR_INVALID_HANDLE: return "LNMLP_ERROR_INVALID_HANDLE";
    case LNMLP_ERROR_NOT_SUPPORTED: return "LNMLP_ERROR_NOT_SUPPORTED";
    case LNMLP_ERROR_OUT_OF_MEMORY: return "LNMLP_ERROR_OUT_OF_MEMORY";
    case LNMLP_ERROR_WORKSPACE_TOO_SMALL: return "LNMLP_ERROR_WORKSPACE_TOO_SMALL";
    case LNMLP_ERROR_NO_WORKSPACE: return "LNMLP_ERROR_NO_WORKSPACE";
    case LNMLP_ERROR_MISALIGNED: return "LNMLP_ERROR_MISALIGNED";
    case LNMLP_ERROR_PLAN_BUSY: return "LNMLP_ERROR_PLAN_BUSY";
    case LNMLP_ERROR_BACKEND: return "LNMLP_ERROR_BACKEND";
    case LNMLP_ERROR_INTERNAL: return "LNMLP_ERROR_INTERNAL";
    default: return "LNMLP_UNKNOWN_STATUS";
  }
}

LNMLP_API const char* lnmlp_last_error(void) { return lnmlp::last_error(); }

LNMLP_API int32_t lnmlp_query_support(int32_t backend, int32_t feature, int32_t* supported) {
  return api_guard(__func__, [&] {
    require_out(supported, "supported");
    if (backend != LNMLP_BACKEND_CPU && backend != LNMLP_BACKEND_CUDA)
      fail(LNMLP_ERROR_INVALID_ARGUMENT, "unknown backend ", backend, " (expected LNMLP_BACKEND_CPU or _CUDA)");
    if (feature < LNMLP_FEATURE_BACKEND || feature > LNMLP_FEATURE_RECIPE_NVFP4)
      fail(LNMLP_ERROR_INVALID_ARGUMENT, "unknown feature ", feature);
    int32_t yes = 0;
    if (backend == LNMLP_BACKEND_CPU) {
      // Sharding over MPI or callbacks (docs/sharding.md), every recipe included; every recipe's
      // GEMMs emulated exactly (docs/fp8.md).
      yes = feature_recipe(feature) != Recipe::None                                ? LNMLP_SUPPORTED_EMULATED
            : every_backend_supports(feature) || feature == LNMLP_FEATURE_SHARDING ? LNMLP_SUPPORTED
                                                                                   : LNMLP_UNSUPPORTED;
    } else {
      yes = cuda_feature_supported(feature);  // loads the CUDA module and probes for a device
    }
    *supported = yes;
  });
}

LNMLP_API int32_t lnmlp_get_build_info(const char** info) {
  return api_guard(__func__, [&] {
    require_out(info, "info");
    *info = lnmlp::build_info();
  });
}

/* ---- descriptor ---- */

LNMLP_API int32_t lnmlp_desc_create(lnmlp_desc** desc) {
  return api_guard(__func__, [&] {
    require_out(desc, "desc");
    *desc = register_handle(std::make_unique<lnmlp_desc>());
  });
}

LNMLP_API int32_t lnmlp_desc_destroy(lnmlp_desc* desc) {
  return api_guard(__func__, [&] {
    if (desc == nullptr) return;
    unregister_handle(desc);
  });
}

LNMLP_API int32_t lnmlp_desc_set_shape(lnmlp_desc* desc, int64_t tokens, int64_t hidden, int64_t ffn) {
  return api_guard(__func__, [&] {
    edit(desc, [&](Config& c) {
      if (tokens < 1) fail(LNMLP_ERROR_INVALID_ARGUMENT, "tokens must be >= 1, got ", tokens);
      if (hidden < 1) fail(LNMLP_ERROR_INVALID_ARGUMENT, "hidden must be >= 1, got ", hidden);
      if (ffn < 1) fail(LNMLP_ERROR_INVALID_ARGUMENT, "ffn must be >= 1, got ", ffn);
      c.tokens = tokens;
      c.hidden = hidden;
      c.ffn = ffn;
    });
  });
}

LNMLP_API int32_t lnmlp_desc_set_norm(lnmlp_desc* desc, int32_t norm_type) {
  return api_guard(__func__, [&] {
    edit(desc, [&](Config& c) {
      if (norm_type != LNMLP_NORM_LAYERNORM && norm_type != LNMLP_NORM_RMSNORM)
        fail(LNMLP_ERROR_INVALID_ARGUMENT, "unknown norm_type ", norm_type,
             " (expected LNMLP_NORM_LAYERNORM = 0 or LNMLP_NORM_RMSNORM = 1)");
      c.norm = static_cast<Norm>(norm_type);
    });
  });
}

LNMLP_API int32_t lnmlp_desc_set_zero_centered_gamma(lnmlp_desc* desc, int32_t enabled) {
  return api_guard(__func__,
                   [&] { edit(desc, [&](Config& c) { c.zero_centered_gamma = as_bool(enabled, "enabled"); }); });
}

LNMLP_API int32_t lnmlp_desc_set_epsilon(lnmlp_desc* desc, float epsilon) {
  return api_guard(__func__, [&] {
    edit(desc, [&](Config& c) {
      if (!(epsilon >= 0.0f) || !std::isfinite(epsilon))
        fail(LNMLP_ERROR_INVALID_ARGUMENT, "epsilon must be finite and >= 0, got ", epsilon);
      c.epsilon = epsilon;
    });
  });
}

LNMLP_API int32_t lnmlp_desc_set_activations(lnmlp_desc* desc, int64_t count, const int32_t* activations) {
  return api_guard(__func__, [&] {
    edit(desc, [&](Config& c) {
      if (count != 1 && count != 2)
        fail(LNMLP_ERROR_INVALID_ARGUMENT, "count must be 1 or 2 (the activation list has 1 or 2 entries), got ",
             count);
      if (activations == nullptr) fail(LNMLP_ERROR_NULL_POINTER, "activations is NULL");
      for (int64_t i = 0; i < count; ++i) {
        if (activations[i] < 0 || activations[i] >= numerics::kNumActs)
          fail(LNMLP_ERROR_INVALID_ARGUMENT, "activations[", i, "] = ", activations[i], " is not an LNMLP_ACT_* value");
        c.acts[i] = static_cast<Act>(activations[i]);
      }
      c.num_acts = static_cast<int32_t>(count);
      if (count == 1) c.acts[1] = Act::Linear;
    });
  });
}

LNMLP_API int32_t lnmlp_desc_set_clamped_swiglu(lnmlp_desc* desc, float limit, float alpha, float offset) {
  return api_guard(__func__, [&] {
    edit(desc, [&](Config& c) {
      if (!(limit > 0.0f) || !std::isfinite(limit))
        fail(LNMLP_ERROR_INVALID_ARGUMENT, "limit must be finite and > 0, got ", limit);
      if (!std::isfinite(alpha)) fail(LNMLP_ERROR_INVALID_ARGUMENT, "alpha must be finite, got ", alpha);
      if (!std::isfinite(offset)) fail(LNMLP_ERROR_INVALID_ARGUMENT, "offset must be finite, got ", offset);
      c.act_params = ActParams{limit, alpha, offset};
    });
  });
}

LNMLP_API int32_t lnmlp_desc_set_bias(lnmlp_desc* desc, int32_t has_bias1, int32_t has_bias2) {
  return api_guard(__func__, [&] {
    edit(desc, [&](Config& c) {
      c.has_bias1 = as_bool(has_bias1, "has_bias1");
      c.has_bias2 = as_bool(has_bias2, "has_bias2");
    });
  });
}

LNMLP_API int32_t lnmlp_desc_set_dtype(lnmlp_desc* desc, int32_t dtype) {
  return api_guard(__func__, [&] {
    edit(desc, [&](Config& c) {
      if (dtype != LNMLP_DTYPE_F32 && dtype != LNMLP_DTYPE_BF16 && dtype != LNMLP_DTYPE_F16)
        fail(LNMLP_ERROR_INVALID_ARGUMENT, "unknown dtype ", dtype,
             " (expected LNMLP_DTYPE_F32 = 0, LNMLP_DTYPE_BF16 = 1 or LNMLP_DTYPE_F16 = 2)");
      c.dtype = static_cast<DType>(dtype);
    });
  });
}

LNMLP_API int32_t lnmlp_desc_set_remat(lnmlp_desc* desc, int32_t policy) {
  return api_guard(__func__, [&] {
    edit(desc, [&](Config& c) {
      if (policy < LNMLP_REMAT_SAVE_ALL || policy > LNMLP_REMAT_FORWARD_ONLY)
        fail(LNMLP_ERROR_INVALID_ARGUMENT, "unknown remat policy ", policy, " (expected an LNMLP_REMAT_* value)");
      c.remat = static_cast<Remat>(policy);
    });
  });
}

LNMLP_API int32_t lnmlp_desc_set_backend(lnmlp_desc* desc, int32_t backend, int32_t device) {
  return api_guard(__func__, [&] {
    edit(desc, [&](Config& c) {
      if (backend != LNMLP_BACKEND_CPU && backend != LNMLP_BACKEND_CUDA)
        fail(LNMLP_ERROR_INVALID_ARGUMENT, "unknown backend ", backend,
             " (expected LNMLP_BACKEND_CPU = 0 or LNMLP_BACKEND_CUDA = 1)");
      if (device < 0) fail(LNMLP_ERROR_INVALID_ARGUMENT, "device must be >= 0, got ", device);
      c.backend = static_cast<BackendKind>(backend);
      c.device = device;
    });
  });
}

LNMLP_API int32_t lnmlp_desc_set_num_threads(lnmlp_desc* desc, int64_t num_threads) {
  return api_guard(__func__, [&] {
    edit(desc, [&](Config& c) {
      if (num_threads < 0 || num_threads > kMaxThreads)
        fail(LNMLP_ERROR_INVALID_ARGUMENT, "num_threads must be in [0, ", kMaxThreads, "] (0 = all cores), got ",
             num_threads);
      c.num_threads = static_cast<int32_t>(num_threads);
    });
  });
}

LNMLP_API int32_t lnmlp_desc_set_weight_gradients(lnmlp_desc* desc, int32_t accumulate, int32_t dtype) {
  return api_guard(__func__, [&] {
    edit(desc, [&](Config& c) {
      if (dtype != -1 && dtype != LNMLP_DTYPE_F32 && dtype != LNMLP_DTYPE_BF16 && dtype != LNMLP_DTYPE_F16)
        fail(LNMLP_ERROR_INVALID_ARGUMENT, "dtype must be -1 (the plan's dtype) or an LNMLP_DTYPE_* value, got ",
             dtype);
      c.accumulate_grads = as_bool(accumulate, "accumulate");
      c.param_grad_dtype = dtype;
    });
  });
}

LNMLP_API int32_t lnmlp_desc_set_weight_dtype(lnmlp_desc* desc, int32_t dtype) {
  return api_guard(__func__, [&] {
    edit(desc, [&](Config& c) {
      if (dtype != -1 && dtype != LNMLP_DTYPE_F32 && dtype != LNMLP_DTYPE_BF16 && dtype != LNMLP_DTYPE_F16)
        fail(LNMLP_ERROR_INVALID_ARGUMENT, "dtype must be -1 (the plan's dtype) or an LNMLP_DTYPE_* value, got ",
             dtype);
      c.weight_dtype = dtype;
    });
  });
}

LNMLP_API int32_t lnmlp_desc_set_norm_output(lnmlp_desc* desc, int32_t enabled) {
  return api_guard(__func__, [&] {
    edit(desc, [&](Config& c) {
      if (enabled != 0 && enabled != 1) fail(LNMLP_ERROR_INVALID_ARGUMENT, "enabled must be 0 or 1, got ", enabled);
      c.norm_output = enabled == 1;
    });
  });
}

LNMLP_API int32_t lnmlp_desc_set_prepared_tokens(lnmlp_desc* desc, int32_t count, const int64_t* tokens) {
  return api_guard(__func__, [&] {
    edit(desc, [&](Config& c) {
      if (count < 0 || count > Config::kMaxPreparedCounts)
        fail(LNMLP_ERROR_INVALID_ARGUMENT, "count must be in [0, ", Config::kMaxPreparedCounts, "], got ", count);
      if (count > 0 && tokens == nullptr) fail(LNMLP_ERROR_NULL_POINTER, "tokens is NULL with count ", count);
      std::vector<int64_t> counts(tokens, tokens + count);
      for (int64_t t : counts)
        if (t < 1) fail(LNMLP_ERROR_INVALID_ARGUMENT, "each prepared token count must be >= 1, got ", t);
      std::sort(counts.begin(), counts.end());
      counts.erase(std::unique(counts.begin(), counts.end()), counts.end());
      c.num_prepared = static_cast<int32_t>(counts.size());
      std::copy(counts.begin(), counts.end(), c.prepared_rows);
    });
  });
}

LNMLP_API int32_t lnmlp_desc_set_weight_layout(lnmlp_desc* desc, int32_t layout) {
  return api_guard(__func__, [&] {
    edit(desc, [&](Config& c) {
      if (layout != LNMLP_WEIGHT_LAYOUT_IN_OUT && layout != LNMLP_WEIGHT_LAYOUT_OUT_IN)
        fail(LNMLP_ERROR_INVALID_ARGUMENT, "layout must be LNMLP_WEIGHT_LAYOUT_IN_OUT (0) or OUT_IN (1), got ", layout);
      c.weight_layout = static_cast<WeightLayout>(layout);
    });
  });
}

LNMLP_API int32_t lnmlp_desc_set_gemm_math(lnmlp_desc* desc, int32_t flags) {
  return api_guard(__func__, [&] {
    edit(desc, [&](Config& c) {
      constexpr int32_t known = LNMLP_GEMM_MATH_FP8_FAST_ACCUMULATION | LNMLP_GEMM_MATH_TF32;
      if ((flags & ~known) != 0)
        fail(LNMLP_ERROR_INVALID_ARGUMENT, "flags must be LNMLP_GEMM_MATH_* values OR'ed (0 .. ", known, "), got ",
             flags);
      c.fp8_fast_accumulation = (flags & LNMLP_GEMM_MATH_FP8_FAST_ACCUMULATION) != 0;
      c.allow_tf32 = (flags & LNMLP_GEMM_MATH_TF32) != 0;
    });
  });
}

LNMLP_API int32_t lnmlp_desc_set_recipe(lnmlp_desc* desc, int32_t recipe) {
  return api_guard(__func__, [&] {
    edit(desc, [&](Config& c) {
      if (recipe < LNMLP_RECIPE_NONE || recipe > LNMLP_RECIPE_NVFP4)
        fail(LNMLP_ERROR_INVALID_ARGUMENT, "unknown recipe ", recipe, " (expected an LNMLP_RECIPE_* value)");
      c.fp8.recipe = static_cast<Recipe>(recipe);
    });
  });
}

LNMLP_API int32_t lnmlp_desc_set_fp8_format(lnmlp_desc* desc, int32_t format) {
  return api_guard(__func__, [&] {
    edit(desc, [&](Config& c) {
      if (format < LNMLP_FP8_FORMAT_DEFAULT || format > LNMLP_FP8_FORMAT_E4M3)
        fail(LNMLP_ERROR_INVALID_ARGUMENT, "unknown FP8 format ", format,
             " (expected LNMLP_FP8_FORMAT_DEFAULT, _HYBRID or _E4M3)");
      c.fp8.format = static_cast<Fp8Mix>(format);
    });
  });
}

LNMLP_API int32_t lnmlp_desc_set_nvfp4_options(lnmlp_desc* desc, int32_t disable_rht,
                                               int32_t disable_stochastic_rounding, int32_t disable_2d_quantization) {
  return api_guard(__func__, [&] {
    edit(desc, [&](Config& c) {
      c.fp8.nvfp4_rht = !as_bool(disable_rht, "disable_rht");
      c.fp8.nvfp4_stochastic_rounding = !as_bool(disable_stochastic_rounding, "disable_stochastic_rounding");
      c.fp8.nvfp4_2d_weights = !as_bool(disable_2d_quantization, "disable_2d_quantization");
    });
  });
}

LNMLP_API int32_t lnmlp_desc_set_delayed_scaling(lnmlp_desc* desc, int32_t margin, int64_t amax_history_len,
                                                 int32_t amax_compute_algo) {
  return api_guard(__func__, [&] {
    edit(desc, [&](Config& c) {
      if (margin < -126 || margin > 127)
        fail(LNMLP_ERROR_INVALID_ARGUMENT, "margin must be in [-126, 127], got ", margin);
      if (amax_history_len < 1 || amax_history_len > kMaxAmaxHistory)
        fail(LNMLP_ERROR_INVALID_ARGUMENT, "amax_history_len must be in [1, ", kMaxAmaxHistory, "], got ",
             amax_history_len);
      if (amax_compute_algo != LNMLP_AMAX_ALGO_MAX && amax_compute_algo != LNMLP_AMAX_ALGO_MOST_RECENT)
        fail(LNMLP_ERROR_INVALID_ARGUMENT, "amax_compute_algo must be LNMLP_AMAX_ALGO_MAX or _MOST_RECENT, got ",
             amax_compute_algo);
      c.fp8.margin = margin;
      c.fp8.amax_history_len = static_cast<int32_t>(amax_history_len);
      c.fp8.amax_max = amax_compute_algo == LNMLP_AMAX_ALGO_MAX;
    });
  });
}

LNMLP_API int32_t lnmlp_desc_set_scaling_options(lnmlp_desc* desc, int32_t power_2_scale, float amax_epsilon) {
  return api_guard(__func__, [&] {
    edit(desc, [&](Config& c) {
      if (power_2_scale < -1 || power_2_scale > 1)
        fail(LNMLP_ERROR_INVALID_ARGUMENT, "power_2_scale must be -1 (the recipe's default), 0 or 1, got ",
             power_2_scale);
      if (!std::isfinite(amax_epsilon) || amax_epsilon < 0.0f)
        fail(LNMLP_ERROR_INVALID_ARGUMENT, "amax_epsilon must be finite and >= 0, got ", amax_epsilon);
      c.fp8.power_2_scale = power_2_scale;
      c.fp8.amax_epsilon = amax_epsilon;
    });
  });
}

LNMLP_API int32_t lnmlp_desc_set_sharding(lnmlp_desc* desc, int64_t group_size, int64_t rank,
                                          int32_t sequence_parallel) {
  return api_guard(__func__, [&] {
    edit(desc, [&](Config& c) {
      if (group_size < 1 || group_size > INT32_MAX)
        fail(LNMLP_ERROR_INVALID_ARGUMENT, "group_size must be in [1, INT32_MAX], got ", group_size);
      if (rank < 0 || rank >= group_size)
        fail(LNMLP_ERROR_INVALID_ARGUMENT, "rank must be in [0, group_size = ", group_size, "), got ", rank);
      c.shard.sequence_parallel = as_bool(sequence_parallel, "sequence_parallel");
      c.shard.size = static_cast<int32_t>(group_size);
      c.shard.rank = static_cast<int32_t>(rank);
    });
  });
}

LNMLP_API int32_t lnmlp_desc_set_communicator(lnmlp_desc* desc, lnmlp_comm* comm) {
  return api_guard(__func__, [&] {
    const Held<lnmlp_desc> held(desc, "desc");
    desc->comm = comm != nullptr ? lookup_handle(comm, "comm")->impl : nullptr;
    desc->cfg.shard.comm = desc->comm.get();
  });
}

LNMLP_API int32_t lnmlp_comm_create_callbacks(const lnmlp_comm_callbacks* table, lnmlp_comm** comm) {
  return api_guard(__func__, [&] {
    if (table == nullptr) fail(LNMLP_ERROR_NULL_POINTER, "table is NULL");
    require_out(comm, "comm");
    // The only layout so far; later versions of the table accept this size too.
    if (table->struct_size != static_cast<int64_t>(sizeof(lnmlp_comm_callbacks)))
      fail(LNMLP_ERROR_INVALID_ARGUMENT, "table->struct_size is ", table->struct_size, ", but this library's ",
           "lnmlp_comm_callbacks has ", sizeof(lnmlp_comm_callbacks), " bytes: set it to sizeof(lnmlp_comm_callbacks)");
    auto c = std::make_unique<lnmlp_comm>();
    c->impl = make_callback_communicator(*table);
    *comm = register_handle(std::move(c));
  });
}

LNMLP_API int32_t lnmlp_comm_create_mpi(const void* mpi_comm, lnmlp_comm** comm) {
  return create_native_comm(__func__, mpi_comm, "mpi_comm", "MPI_Comm", comm, make_mpi_communicator);
}

LNMLP_API int32_t lnmlp_comm_create_nccl(const void* nccl_comm, lnmlp_comm** comm) {
  return create_native_comm(__func__, nccl_comm, "nccl_comm", "ncclComm_t", comm, make_nccl_communicator);
}

LNMLP_API int32_t lnmlp_comm_destroy(lnmlp_comm* comm) {
  return api_guard(__func__, [&] {
    if (comm == nullptr) return;
    unregister_handle(comm);
  });
}

LNMLP_API int32_t lnmlp_desc_set_external_workspace(lnmlp_desc* desc, int32_t enabled) {
  return api_guard(__func__,
                   [&] { edit(desc, [&](Config& c) { c.external_workspace = as_bool(enabled, "enabled"); }); });
}

/* ---- plan ---- */

LNMLP_API int32_t lnmlp_plan_create(const lnmlp_desc* desc, lnmlp_plan** plan) {
  return api_guard(__func__, [&] {
    const Held<lnmlp_desc> held(desc, "desc");
    require_out(plan, "plan");
    validate_config(desc->cfg);
    validate_sharding(desc->cfg);
    validate_prepared_tokens(desc->cfg);
    auto p = std::make_unique<lnmlp_plan>();
    p->cfg = shard_config(desc->cfg);
    p->comm = desc->comm;
    p->saved = make_saved_layout(p->cfg);
    p->recipe = resolve_recipe(p->cfg.fp8);
    p->engine = make_engine(p->cfg, p->saved);
    p->workspace_bytes = p->engine->workspace_bytes();
    if (!p->cfg.external_workspace && p->workspace_bytes > 0) {
      p->owned_workspace = p->engine->allocate(p->workspace_bytes);
      p->workspace = p->owned_workspace;
    }
    init_fp8_state(*p);
    *plan = register_handle(std::move(p));
  });
}

LNMLP_API int32_t lnmlp_plan_destroy(lnmlp_plan* plan) {
  return api_guard(__func__, [&] {
    if (plan == nullptr) return;
    unregister_plan(plan);
  });
}

LNMLP_API int32_t lnmlp_plan_get_workspace_bytes(const lnmlp_plan* plan, int64_t* bytes) {
  return get_plan_bytes(__func__, plan, bytes, [](const lnmlp_plan& p) { return p.workspace_bytes; });
}

LNMLP_API int32_t lnmlp_plan_get_saved_bytes(const lnmlp_plan* plan, int64_t* bytes) {
  return get_plan_bytes(__func__, plan, bytes, [](const lnmlp_plan& p) { return p.saved.total_bytes; });
}

LNMLP_API int32_t lnmlp_plan_get_saved_bytes_per_token(const lnmlp_plan* plan, int64_t* bytes) {
  return get_plan_bytes(__func__, plan, bytes, [](const lnmlp_plan& p) { return p.saved.bytes_per_token; });
}

LNMLP_API int32_t lnmlp_plan_get_alignment(const lnmlp_plan* plan, int64_t* bytes) {
  return get_plan_bytes(__func__, plan, bytes, [](const lnmlp_plan& p) { return p.engine->alignment(); });
}

LNMLP_API int32_t lnmlp_plan_attach_workspace(lnmlp_plan* plan, void* workspace, int64_t bytes) {
  return api_guard(__func__, [&] {
    PlanUse use(plan);
    if (!plan->cfg.external_workspace)
      fail(LNMLP_ERROR_INVALID_ARGUMENT,
           "this plan owns its workspace; enable lnmlp_desc_set_external_workspace before lnmlp_plan_create to attach "
           "your own");
    if (bytes < 0) fail(LNMLP_ERROR_INVALID_ARGUMENT, "bytes must be >= 0, got ", bytes);
    if (workspace == nullptr && plan->workspace_bytes > 0) fail(LNMLP_ERROR_NULL_POINTER, "workspace is NULL");
    if (bytes < plan->workspace_bytes)
      fail(LNMLP_ERROR_WORKSPACE_TOO_SMALL, "the workspace has ", bytes, " bytes, but this plan needs ",
           plan->workspace_bytes, " (lnmlp_plan_get_workspace_bytes)");
    const int64_t align = plan->engine->alignment();
    if (reinterpret_cast<uintptr_t>(workspace) % static_cast<uintptr_t>(align) != 0)
      fail(LNMLP_ERROR_MISALIGNED, "workspace (", workspace, ") is not aligned to ", align, " bytes");
    plan->workspace = workspace;
  });
}

namespace {
void require_workspace(const lnmlp_plan* plan) {
  if (plan->workspace == nullptr && plan->workspace_bytes > 0)
    fail(LNMLP_ERROR_NO_WORKSPACE,
         "this plan uses external workspace and none is attached; call lnmlp_plan_attach_workspace with ",
         plan->workspace_bytes, " bytes first");
}

// Backward, or one of its two calls (args.part), checked and run. A call that quantizes the
// gradients with stochastic rounding draws from the plan's random stream, which then moves on;
// not a call that stops at a stage to measure amaxes (LNMLP_CALL_AMAX_MEASURE with dy's or dh's
// not given), whose outputs are left undefined.
void run_backward(lnmlp_plan* plan, BackwardArgs& args) {
  check_backward_args(*plan, args);
  if (args.fp8_state == nullptr && args.part != BackwardPart::Weights) args.fp8_state = plan->state();
  require_workspace(plan);
  const RngStream& rng = plan->rng;
  if (plan->recipe.draws_random() && rng.whole_tokens > 0 && args.tokens > rng.whole_tokens - rng.first_token)
    fail(LNMLP_ERROR_INVALID_ARGUMENT, "the call's ", args.tokens, " tokens from token ", rng.first_token, " pass the ",
         rng.whole_tokens, " tokens of lnmlp_plan_set_rng_place");
  args.rng = rng;
  plan->engine->backward(args, plan->workspace);
  constexpr int32_t kGradientsGiven = (1 << (kAmaxGivenShift + kDy)) | (1 << (kAmaxGivenShift + kDh));
  const bool stopped = (args.amax & kAmaxMeasure) != 0 && (args.amax & kGradientsGiven) != kGradientsGiven;
  if (plan->recipe.draws_random() && args.part != BackwardPart::Weights && args.tokens > 0 && !stopped)
    ++plan->rng.offset;
}
}  // namespace

LNMLP_API int32_t lnmlp_plan_forward(lnmlp_plan* plan, int64_t tokens, const void* x, const void* gamma,
                                     const void* beta, const void* w1, const void* b1, const void* w2, const void* b2,
                                     void* y, void* saved, void* fp8_state, int32_t flags, void* stream) {
  return api_guard(__func__, [&] {
    PlanUse use(plan);
    ForwardArgs args{tokens, x, gamma, beta, w1, b1, w2, b2, y, {}, stream, static_cast<float*>(fp8_state)};
    take_call_flags(flags, saved, args);
    check_forward_args(*plan, args);
    if (args.fp8_state == nullptr) args.fp8_state = plan->state();
    require_workspace(plan);
    plan->engine->forward(args, plan->workspace);
  });
}

LNMLP_API int32_t lnmlp_plan_backward(lnmlp_plan* plan, int64_t tokens, const void* dy, const void* x,
                                      const void* gamma, const void* beta, const void* w1, const void* b1,
                                      const void* w2, const void* saved, void* dx, void* dgamma, void* dbeta, void* dw1,
                                      void* db1, void* dw2, void* db2, void* fp8_state, int32_t flags, void* stream) {
  return api_guard(__func__, [&] {
    PlanUse use(plan);
    BackwardArgs args{tokens, dy,     x,     gamma, beta, w1,  b1,  w2,     {},
                      dx,     dgamma, dbeta, dw1,   db1,  dw2, db2, stream, static_cast<float*>(fp8_state)};
    take_call_flags(flags, saved, args);
    run_backward(plan, args);
  });
}

LNMLP_API int32_t lnmlp_plan_backward_data(lnmlp_plan* plan, int64_t tokens, const void* dy, const void* x,
                                           const void* gamma, const void* beta, const void* w1, const void* b1,
                                           const void* w2, const void* saved, void* dx, void* dgamma, void* dbeta,
                                           void* db1, void* db2, void* deferred, void* fp8_state, int32_t flags,
                                           void* stream) {
  return api_guard(__func__, [&] {
    PlanUse use(plan);
    BackwardArgs args{tokens, dy,     x,     gamma,   beta, w1,      b1,  w2,     {},
                      dx,     dgamma, dbeta, nullptr, db1,  nullptr, db2, stream, static_cast<float*>(fp8_state)};
    take_call_flags(flags, saved, args);
    args.part = BackwardPart::Data;
    args.deferred = deferred;
    run_backward(plan, args);
  });
}

LNMLP_API int32_t lnmlp_plan_set_rng_state(lnmlp_plan* plan, uint64_t seed, uint64_t offset) {
  return api_guard(__func__, [&] {
    PlanUse use(plan);
    plan->rng.seed = seed;
    plan->rng.offset = offset;
  });
}

LNMLP_API int32_t lnmlp_plan_set_rng_place(lnmlp_plan* plan, int64_t first_token, int64_t whole_tokens,
                                           int32_t ffn_part, int32_t ffn_parts) {
  return api_guard(__func__, [&] {
    PlanUse use(plan);
    const Config& c = plan->cfg;
    if (first_token < 0 || whole_tokens < 0 || (whole_tokens > 0 && first_token >= whole_tokens))
      fail(LNMLP_ERROR_INVALID_ARGUMENT, "first_token must be >= 0 and below whole_tokens (>= 0; 0: the call's ",
           "count), got first_token ", first_token, " and whole_tokens ", whole_tokens);
    if (ffn_parts < 1 || ffn_part < 0 || ffn_part >= ffn_parts)
      fail(LNMLP_ERROR_INVALID_ARGUMENT, "ffn_part must be in [0, ffn_parts) with ffn_parts >= 1, got part ", ffn_part,
           " of ", ffn_parts);
    if (ffn_parts > 1 && c.shard.size > 1)
      fail(LNMLP_ERROR_INVALID_ARGUMENT,
           "a plan sharded by lnmlp_desc_set_sharding places its F by its rank: ", "ffn_parts must be 1, got ",
           ffn_parts);
    if (ffn_parts > 1 && c.ffn % numerics::kNvfp4BlockLength != 0)
      fail(LNMLP_ERROR_INVALID_ARGUMENT, "with ffn_parts > 1 the plan's ffn (one part) must be a multiple of ",
           numerics::kNvfp4BlockLength, ", got ", c.ffn);
    // Each representation's stream is 2^48 indices long (fp8_recipe.h's nvfp4_stream_first_index).
    constexpr int64_t kStreamLength = int64_t{1} << 48;
    const int64_t tokens = std::max(whole_tokens, first_token + c.tokens);
    const int64_t widest = std::max(c.hidden, c.act_width() * ffn_parts);
    if (tokens > kStreamLength / widest)
      fail(LNMLP_ERROR_INVALID_ARGUMENT, "the whole tensors of ", tokens, " tokens x ", widest,
           " have 2^48 elements or more, past a random stream's length");
    plan->rng.first_token = first_token;
    plan->rng.whole_tokens = whole_tokens;
    plan->rng.ffn_part = ffn_part;
    plan->rng.ffn_parts = ffn_parts;
  });
}

LNMLP_API int32_t lnmlp_plan_get_rng_state(const lnmlp_plan* plan, uint64_t* seed, uint64_t* offset) {
  return api_guard(__func__, [&] {
    PlanUse use(plan);
    require_out(seed, "seed");
    require_out(offset, "offset");
    *seed = plan->rng.seed;
    *offset = plan->rng.offset;
  });
}

LNMLP_API int32_t lnmlp_plan_backward_weights(lnmlp_plan* plan, int64_t tokens, const void* dy, const void* saved,
                                              const void* deferred, void* dw1, void* dw2, int32_t flags, void* stream) {
  return api_guard(__func__, [&] {
    PlanUse use(plan);
    BackwardArgs args{};  // what the weights call reads and writes; the rest NULL
    args.tokens = tokens;
    args.dy = dy;
    args.saved = saved_buffer(saved, flags);
    args.dw1 = dw1;
    args.dw2 = dw2;
    args.stream = stream;
    args.weights_unchanged = check_call_flags(flags);
    args.part = BackwardPart::Weights;
    args.deferred = const_cast<void*>(deferred);
    run_backward(plan, args);
  });
}

}  // extern "C"
