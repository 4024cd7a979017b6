// fuzz_plan: bytes -> descriptor setter calls -> lnmlp_plan_create -> size and shape queries ->
// forward and backward over buffers of exactly the sizes the plan reports, with the header's
// promises checked on every call (README.md: the byte format and the list of checks).
//
// The harness keeps a model of the descriptor (what every setter that succeeded set), derived from
// include/lnmlp.h alone, and checks against it: which setter calls must succeed or fail, which
// configurations lnmlp_plan_create must refuse, and every shape, dtype and size the plan reports.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "lnmlp.h"

namespace {

using fuzz::Buf;
using fuzz::Reader;

// ---- the descriptor model ----------------------------------------------------------------------

struct Model {
  int64_t T = 0, H = 0, F = 0;  // 0: shape not set
  int32_t norm = LNMLP_NORM_LAYERNORM;
  int64_t num_acts = 1;
  int32_t acts[2] = {LNMLP_ACT_RELU, LNMLP_ACT_LINEAR};
  int32_t bias1 = 0, bias2 = 0;
  int32_t dtype = LNMLP_DTYPE_F32;
  int32_t remat = LNMLP_REMAT_SAVE_ALL;
  int32_t backend = LNMLP_BACKEND_CPU, device = 0;
  int32_t accumulate = 0, grad_dtype = -1, weight_dtype = -1;
  int32_t recipe = LNMLP_RECIPE_NONE;
  int32_t fp8_format = LNMLP_FP8_FORMAT_DEFAULT;
  int64_t history = 1024;
  int32_t external_workspace = 0;
  int64_t group_size = 1;
  int64_t prepared_max = 0;  // the largest prepared token count (0: none)
  int32_t norm_output = 0;
  int32_t weight_layout = LNMLP_WEIGHT_LAYOUT_IN_OUT;

  bool io_dtype_ok() const { return dtype == LNMLP_DTYPE_F32 || dtype == LNMLP_DTYPE_BF16 || dtype == LNMLP_DTYPE_F16; }
  int32_t weight_type() const { return weight_dtype == -1 ? dtype : weight_dtype; }
  int32_t grad_type() const { return grad_dtype == -1 ? dtype : grad_dtype; }
  bool clamped_ok() const {
    const auto clamped = [](int32_t a) { return a == LNMLP_ACT_CLAMPED_SILU || a == LNMLP_ACT_CLAMPED_LINEAR; };
    const bool any = clamped(acts[0]) || (num_acts == 2 && clamped(acts[1]));
    return !any || (num_acts == 2 && acts[0] == LNMLP_ACT_CLAMPED_SILU && acts[1] == LNMLP_ACT_CLAMPED_LINEAR);
  }
  // A configuration the header says lnmlp_plan_create refuses.
  const char* must_refuse(bool cuda_available) const {
    if (T == 0) return "the shape was never set";
    if (!io_dtype_ok()) return "the I/O dtype is not F32, BF16 or F16";
    if (!clamped_ok()) return "clamped_silu / clamped_linear outside their pair";
    if (grad_type() != dtype && grad_type() != LNMLP_DTYPE_F32) return "a weight-gradient dtype other than io or F32";
    if (weight_type() != dtype && weight_type() != LNMLP_DTYPE_F32) return "a weight dtype other than io or F32";
    if (weight_type() != dtype && recipe == LNMLP_RECIPE_NONE) return "fp32 weights without an FP8 recipe";
    if (backend == LNMLP_BACKEND_CPU && device != 0) return "the CPU backend with a device other than 0";
    if (backend == LNMLP_BACKEND_CUDA && !cuda_available) return "the CUDA backend where it is not supported";
    if (recipe == LNMLP_RECIPE_NVFP4 && fp8_format == LNMLP_FP8_FORMAT_HYBRID) return "NVFP4 with the HYBRID format";
    if (group_size > 1) return "sharding without a communicator";
    if (prepared_max > T) return "a prepared token count above the most a call takes";
    return nullptr;
  }
};

bool is_bool(int64_t v) { return v == 0 || v == 1; }
bool finite(float v) { return std::isfinite(v); }

// What a setter call must do, from the header: succeed, fail, or either (where the header leaves
// the check to lnmlp_plan_create); kMust* are checked, kEither only updates the model on success.
enum Expect { kMustSucceed, kMustFail, kEither };

void check_setter(const char* what, int32_t st, Expect e) {
  if (e == kMustSucceed) FUZZ_CHECK(st == LNMLP_SUCCESS, "%s must succeed, got %s", what, lnmlp_status_string(st));
  if (e == kMustFail) {
    FUZZ_CHECK(st != LNMLP_SUCCESS, "%s must fail, but succeeded", what);
    FUZZ_CHECK(fuzz::is_argument_error(st), "%s failed with %s, not an argument error", what, lnmlp_status_string(st));
  }
}

// A setter of one 0/1 flag, called with int(0,1): it must succeed exactly for 0 and 1. Returns the
// value the descriptor now holds, or -1 when the call failed.
template <typename Setter> int32_t set_flag(Reader& r, const char* what, Setter set) {
  const int32_t v = r.pick32(0, 1);
  const int32_t st = set(v);
  check_setter(what, st, is_bool(v) ? kMustSucceed : kMustFail);
  return st == LNMLP_SUCCESS ? v : -1;
}

// Tensor dims: mostly 1..64, sometimes a few up to 4096 (plans created, not run), sometimes hostile.
int64_t pick_dim(Reader& r) {
  static const int64_t kMedium[32] = {65,   96,   100,  127,  128,  129,  130,  144,  160,  192, 255,
                                      256,  257,  320,  384,  500,  511,  512,  513,  640,  768, 1000,
                                      1023, 1024, 1025, 1536, 2048, 2049, 3000, 4095, 4096, 4097};
  const uint8_t t = r.u8();
  if (t < 0xC0) return 1 + t % 64;
  if (t < 0xE0) return kMedium[t - 0xC0];
  switch (t - 0xE0) {
    case 0: return 0;
    case 1: return -1;
    case 2: return int64_t{1} << 31;
    case 3: return (int64_t{1} << 31) - 1;
    case 4: return int64_t{1} << 32;
    case 5: return int64_t{1} << 40;
    case 6: return int64_t{1} << 62;
    case 7: return INT64_MAX;
    case 8: return INT64_MIN;
    case 9: return -65536;
    case 10: return int64_t{3037000500};  // just above sqrt(2^63)
    case 11: return int64_t{1} << 30;
    case 12: return int64_t{1} << 20;
    case 13: return (int64_t{1} << 30) + 1;
    case 14: return INT32_MAX;
    case 15: return static_cast<int64_t>(r.u64());
    default: return 1 + (t & 7);
  }
}

// The setters, the ops of the byte format (README.md).
enum Op {
  kOpShape,
  kOpNorm,
  kOpZeroCenteredGamma,
  kOpEpsilon,
  kOpActivations,
  kOpClampedSwiglu,
  kOpBias,
  kOpDtype,
  kOpRemat,
  kOpBackend,
  kOpNumThreads,
  kOpWeightGradients,
  kOpWeightDtype,
  kOpRecipe,
  kOpFp8Format,
  kOpDelayedScaling,
  kOpScalingOptions,
  kOpExternalWorkspace,
  kOpSharding,
  kOpCommunicator,
  kOpNullDesc,
  kOpStaleDesc,
  kOpQuerySupport,
  kOpPreparedTokens,
  kOpNormOutput,
  kOpWeightLayout,
  kOpGemmMath,
  kOpNvfp4Options,
  kOpCount
};

// A setter with valid arguments on a handle that is NULL or not live: the handle error, always.
int32_t call_setter_on(lnmlp_desc* d, int which) {
  const int32_t relu = LNMLP_ACT_RELU;
  const int64_t one_token = 1;
  switch (which % 24) {
    case 0: return API(lnmlp_desc_set_shape(d, 1, 1, 1));
    case 1: return API(lnmlp_desc_set_norm(d, LNMLP_NORM_RMSNORM));
    case 2: return API(lnmlp_desc_set_zero_centered_gamma(d, 1));
    case 3: return API(lnmlp_desc_set_epsilon(d, 1e-5f));
    case 4: return API(lnmlp_desc_set_activations(d, 1, &relu));
    case 5: return API(lnmlp_desc_set_clamped_swiglu(d, 7.0f, 1.702f, 1.0f));
    case 6: return API(lnmlp_desc_set_bias(d, 1, 1));
    case 7: return API(lnmlp_desc_set_dtype(d, LNMLP_DTYPE_BF16));
    case 8: return API(lnmlp_desc_set_remat(d, LNMLP_REMAT_SAVE_STATS));
    case 9: return API(lnmlp_desc_set_backend(d, LNMLP_BACKEND_CPU, 0));
    case 10: return API(lnmlp_desc_set_num_threads(d, 1));
    case 11: return API(lnmlp_desc_set_weight_gradients(d, 1, -1));
    case 12: return API(lnmlp_desc_set_weight_dtype(d, -1));
    case 13: return API(lnmlp_desc_set_recipe(d, LNMLP_RECIPE_DELAYED));
    case 14: return API(lnmlp_desc_set_fp8_format(d, LNMLP_FP8_FORMAT_E4M3));
    case 15: return API(lnmlp_desc_set_delayed_scaling(d, 0, 16, LNMLP_AMAX_ALGO_MAX));
    case 16: return API(lnmlp_desc_set_scaling_options(d, 1, 0.0f));
    case 17: return API(lnmlp_desc_set_external_workspace(d, 1));
    case 18: return API(lnmlp_desc_set_prepared_tokens(d, 1, &one_token));
    case 19: return API(lnmlp_desc_set_norm_output(d, 1));
    case 20: return API(lnmlp_desc_set_weight_layout(d, LNMLP_WEIGHT_LAYOUT_OUT_IN));
    case 21: return API(lnmlp_desc_set_gemm_math(d, LNMLP_GEMM_MATH_TF32));
    case 23: return API(lnmlp_desc_set_nvfp4_options(d, 1, 0, 1));
    default: return API(lnmlp_desc_set_sharding(d, 1, 0, 0));
  }
}

void run_op(Reader& r, lnmlp_desc* desc, lnmlp_desc* stale, Model& m) {
  const int op = r.u8() % kOpCount;
  switch (op) {
    case kOpShape: {
      const int64_t T = pick_dim(r), H = pick_dim(r), F = pick_dim(r);
      const int32_t st = API(lnmlp_desc_set_shape(desc, T, H, F));
      check_setter("set_shape", st, T >= 1 && H >= 1 && F >= 1 ? kMustSucceed : kMustFail);
      if (st == LNMLP_SUCCESS) m.T = T, m.H = H, m.F = F;
      break;
    }
    case kOpNorm: {
      const int32_t v = set_flag(r, "set_norm", [&](int32_t f) { return API(lnmlp_desc_set_norm(desc, f)); });
      if (v >= 0) m.norm = v;
      break;
    }
    case kOpZeroCenteredGamma:
      set_flag(r, "set_zero_centered_gamma",
               [&](int32_t f) { return API(lnmlp_desc_set_zero_centered_gamma(desc, f)); });
      break;
    case kOpEpsilon: {
      const float v = r.pick_float();
      check_setter("set_epsilon", API(lnmlp_desc_set_epsilon(desc, v)),
                   finite(v) && v >= 0.0f ? kMustSucceed : kMustFail);
      break;
    }
    case kOpActivations: {
      const int64_t count = r.pick(1, 2);
      const uint8_t null_sel = r.u8();
      // Exactly two entries on the heap: a read past them is an AddressSanitizer report.
      std::vector<int32_t> acts = {r.pick32(0, 8), r.pick32(0, 8)};
      const int32_t* p = (null_sel & 7) == 7 ? nullptr : acts.data();
      const int32_t st = API(lnmlp_desc_set_activations(desc, count, p));
      bool ok = (count == 1 || count == 2) && p != nullptr;
      for (int64_t i = 0; ok && i < count; ++i) ok = acts[i] >= 0 && acts[i] <= LNMLP_ACT_CLAMPED_LINEAR;
      check_setter("set_activations", st, ok ? kEither : kMustFail);  // either: the clamped pair rule
      if (st == LNMLP_SUCCESS) {
        FUZZ_CHECK(ok, "set_activations accepted an invalid list");
        m.num_acts = count;
        m.acts[0] = acts[0];
        m.acts[1] = count == 2 ? acts[1] : LNMLP_ACT_LINEAR;
      } else if (ok && fuzz::verbose()) {
        std::fprintf(stderr, "[fuzz_plan] set_activations(%lld: %d, %d) refused: %s\n", static_cast<long long>(count),
                     acts[0], acts[1], lnmlp_last_error());
      }
      break;
    }
    case kOpClampedSwiglu: {
      const float limit = r.pick_float(), alpha = r.pick_float(), offset = r.pick_float();
      const bool ok = finite(limit) && limit > 0.0f && finite(alpha) && finite(offset);
      check_setter("set_clamped_swiglu", API(lnmlp_desc_set_clamped_swiglu(desc, limit, alpha, offset)),
                   ok ? kMustSucceed : kMustFail);
      break;
    }
    case kOpBias: {
      const int32_t b1 = r.pick32(0, 1), b2 = r.pick32(0, 1);
      const int32_t st = API(lnmlp_desc_set_bias(desc, b1, b2));
      check_setter("set_bias", st, is_bool(b1) && is_bool(b2) ? kMustSucceed : kMustFail);
      if (st == LNMLP_SUCCESS) m.bias1 = b1, m.bias2 = b2;
      break;
    }
    case kOpDtype: {
      const int32_t v = r.pick32(0, 2);
      const int32_t st = API(lnmlp_desc_set_dtype(desc, v));
      // Any LNMLP_DTYPE_* may pass the setter; plan creation refuses all but F32, BF16 and F16.
      check_setter("set_dtype", st,
                   v >= 0 && v <= 2                                   ? kMustSucceed
                   : v >= LNMLP_DTYPE_U8 && v <= LNMLP_DTYPE_FP8_E5M2 ? kEither
                                                                      : kMustFail);
      if (st == LNMLP_SUCCESS) m.dtype = v;
      break;
    }
    case kOpRemat: {
      const int32_t v = r.pick32(0, 3);
      const int32_t st = API(lnmlp_desc_set_remat(desc, v));
      check_setter("set_remat", st, v >= 0 && v <= 3 ? kMustSucceed : kMustFail);
      if (st == LNMLP_SUCCESS) m.remat = v;
      break;
    }
    case kOpBackend: {
      // Mostly the CPU; the CUDA backend only has to fail cleanly where there is no GPU.
      const uint8_t t = r.u8();
      const int32_t backend = t < 0xC0 ? LNMLP_BACKEND_CPU : t < 0xE0 ? 1 : r.pick32(0, 1);
      const int32_t device = r.pick32(0, 1);
      const int32_t st = API(lnmlp_desc_set_backend(desc, backend, device));
      const bool known = (backend == 0 || backend == 1) && device >= 0;
      // CPU with a device other than 0: the setter or plan creation refuses it.
      check_setter("set_backend", st, !known ? kMustFail : backend == 0 && device != 0 ? kEither : kMustSucceed);
      if (st == LNMLP_SUCCESS) m.backend = backend, m.device = device;
      break;
    }
    case kOpNumThreads: {
      // 0 .. 2 (never more than this machine's share), or a value the setter must refuse.
      int64_t v = r.pick(0, 2);
      if (v > 2 && v <= 65536) v = -v;
      check_setter("set_num_threads", API(lnmlp_desc_set_num_threads(desc, v)),
                   v >= 0 && v <= 65536 ? kMustSucceed : kMustFail);
      break;
    }
    case kOpWeightGradients: {
      const int32_t acc = r.pick32(0, 1), dt = r.pick32(-1, 2);
      const int32_t st = API(lnmlp_desc_set_weight_gradients(desc, acc, dt));
      check_setter("set_weight_gradients", st,
                   !is_bool(acc)                         ? kMustFail
                   : (dt == -1 || dt == LNMLP_DTYPE_F32) ? kMustSucceed
                                                         : kEither);
      if (st == LNMLP_SUCCESS) m.accumulate = acc, m.grad_dtype = dt;
      break;
    }
    case kOpWeightDtype: {
      const int32_t dt = r.pick32(-1, 2);
      const int32_t st = API(lnmlp_desc_set_weight_dtype(desc, dt));
      check_setter("set_weight_dtype", st, (dt == -1 || dt == LNMLP_DTYPE_F32) ? kMustSucceed : kEither);
      if (st == LNMLP_SUCCESS) m.weight_dtype = dt;
      break;
    }
    case kOpRecipe: {
      const int32_t v = r.pick32(0, 5);
      const int32_t st = API(lnmlp_desc_set_recipe(desc, v));
      check_setter("set_recipe", st, v >= 0 && v <= 5 ? kMustSucceed : kMustFail);
      if (st == LNMLP_SUCCESS) m.recipe = v;
      break;
    }
    case kOpFp8Format: {
      const int32_t v = r.pick32(-1, 1);
      const int32_t st = API(lnmlp_desc_set_fp8_format(desc, v));
      check_setter("set_fp8_format", st, v >= -1 && v <= 1 ? kMustSucceed : kMustFail);
      if (st == LNMLP_SUCCESS) m.fp8_format = v;
      break;
    }
    case kOpDelayedScaling: {
      const int32_t margin = r.pick32(-2, 2);
      const int64_t len = r.pick(1, 16);
      const int32_t algo = r.pick32(0, 1);
      const int32_t st = API(lnmlp_desc_set_delayed_scaling(desc, margin, len, algo));
      const bool ok = margin >= -126 && margin <= 127 && len >= 1 && len <= 65536 && is_bool(algo);
      check_setter("set_delayed_scaling", st, ok ? kMustSucceed : kMustFail);
      if (st == LNMLP_SUCCESS) m.history = len;
      break;
    }
    case kOpScalingOptions: {
      const int32_t p2 = r.pick32(-1, 1);
      const float eps = r.pick_float();
      const bool ok = p2 >= -1 && p2 <= 1 && finite(eps) && eps >= 0.0f;
      check_setter("set_scaling_options", API(lnmlp_desc_set_scaling_options(desc, p2, eps)),
                   ok ? kMustSucceed : kMustFail);
      break;
    }
    case kOpExternalWorkspace: {
      const int32_t v = set_flag(r, "set_external_workspace",
                                 [&](int32_t f) { return API(lnmlp_desc_set_external_workspace(desc, f)); });
      if (v >= 0) m.external_workspace = v;
      break;
    }
    case kOpSharding: {
      const int64_t size = r.pick(1, 2), rank = r.pick(0, 1);
      const int32_t sp = r.pick32(0, 1);
      const int32_t st = API(lnmlp_desc_set_sharding(desc, size, rank, sp));
      const bool ok = size >= 1 && rank >= 0 && rank < size && is_bool(sp);
      check_setter("set_sharding", st, !ok ? kMustFail : size > INT32_MAX ? kEither : kMustSucceed);
      if (st == LNMLP_SUCCESS) m.group_size = size;
      break;
    }
    case kOpCommunicator: {
      // NULL (no communicator) is valid; anything else here was never created: not a live handle.
      const uint8_t t = r.u8();
      if (t % 2 == 0) {
        EXPECT_STATUS(API(lnmlp_desc_set_communicator(desc, nullptr)), LNMLP_SUCCESS);
      } else {
        auto* bogus = reinterpret_cast<lnmlp_comm*>(static_cast<uintptr_t>(t) * 16 + 8);  // NOLINT
        EXPECT_STATUS(API(lnmlp_desc_set_communicator(desc, bogus)), LNMLP_ERROR_INVALID_HANDLE);
      }
      break;
    }
    case kOpNullDesc: EXPECT_STATUS(call_setter_on(nullptr, r.u8()), LNMLP_ERROR_NULL_POINTER); break;
    case kOpStaleDesc: EXPECT_STATUS(call_setter_on(stale, r.u8()), LNMLP_ERROR_INVALID_HANDLE); break;
    case kOpPreparedTokens: {
      // An array of exactly min(count, 32) values (AddressSanitizer sees a read past it), or NULL.
      const int32_t count = r.pick32(0, 32);
      const bool null_array = (r.u8() & 7) == 7;
      std::vector<int64_t> values(static_cast<size_t>(std::clamp(count, 0, 32)));
      for (int64_t& v : values) v = pick_dim(r);
      const int32_t st = API(lnmlp_desc_set_prepared_tokens(desc, count, null_array ? nullptr : values.data()));
      if (count < 0 || count > 32) {
        EXPECT_STATUS(st, LNMLP_ERROR_INVALID_ARGUMENT);
      } else if (count > 0 && null_array) {
        EXPECT_STATUS(st, LNMLP_ERROR_NULL_POINTER);
      } else if (std::any_of(values.begin(), values.end(), [](int64_t v) { return v < 1; })) {
        EXPECT_STATUS(st, LNMLP_ERROR_INVALID_ARGUMENT);
      } else {
        EXPECT_STATUS(st, LNMLP_SUCCESS);
        m.prepared_max = values.empty() ? 0 : *std::max_element(values.begin(), values.end());
      }
      break;
    }
    case kOpNormOutput: {
      const int32_t v =
          set_flag(r, "set_norm_output", [&](int32_t f) { return API(lnmlp_desc_set_norm_output(desc, f)); });
      if (v >= 0) m.norm_output = v;
      break;
    }
    case kOpWeightLayout: {
      const int32_t v =
          set_flag(r, "set_weight_layout", [&](int32_t f) { return API(lnmlp_desc_set_weight_layout(desc, f)); });
      if (v >= 0) m.weight_layout = v;
      break;
    }
    case kOpGemmMath: {
      // Any OR of LNMLP_GEMM_MATH_* is accepted (the CPU backend computes exactly all the same).
      const int32_t v = r.pick32(0, 3);
      const int32_t known = LNMLP_GEMM_MATH_FP8_FAST_ACCUMULATION | LNMLP_GEMM_MATH_TF32;
      check_setter("set_gemm_math", API(lnmlp_desc_set_gemm_math(desc, v)),
                   (v & ~known) == 0 ? kMustSucceed : kMustFail);
      break;
    }
    case kOpNvfp4Options: {
      const int32_t rht = r.pick32(0, 1), sr = r.pick32(0, 1), two_d = r.pick32(0, 1);
      check_setter("set_nvfp4_options", API(lnmlp_desc_set_nvfp4_options(desc, rht, sr, two_d)),
                   is_bool(rht) && is_bool(sr) && is_bool(two_d) ? kMustSucceed : kMustFail);
      break;
    }
    default: {
      const int32_t backend = r.pick32(0, 1), feature = r.pick32(0, 10);
      const bool null_out = (r.u8() & 15) == 15;
      int32_t answer = -7;
      const int32_t st = API(lnmlp_query_support(backend, feature, null_out ? nullptr : &answer));
      const bool ok = (backend == 0 || backend == 1) && feature >= 0 && feature <= 10;
      if (null_out) {
        FUZZ_CHECK(st != LNMLP_SUCCESS, "query_support with a NULL answer pointer succeeded");
      } else if (ok) {
        EXPECT_STATUS(st, LNMLP_SUCCESS);
        FUZZ_CHECK(answer >= LNMLP_UNSUPPORTED && answer <= LNMLP_SUPPORTED_EMULATED,
                   "query_support answered %d, not an LNMLP_*SUPPORTED* value", answer);
      } else {
        EXPECT_STATUS(st, LNMLP_ERROR_INVALID_ARGUMENT);
        FUZZ_CHECK(answer == -7, "a failed query_support wrote its answer");
      }
      break;
    }
  }
}

// ---- plans ---------------------------------------------------------------------------------------

// Element counts beyond which a plan is not created (its memory), or not run (time per input).
constexpr int64_t kCreateElems = int64_t{1} << 20;
constexpr int64_t kRunDim = 128;
constexpr int64_t kRunMacs = int64_t{1} << 18;

bool mul_le(int64_t a, int64_t b, int64_t cap) {
  int64_t p;
  return !__builtin_mul_overflow(a, b, &p) && p <= cap;
}

struct Shape {
  int64_t rank = -9;
  int64_t dims[LNMLP_MAX_TENSOR_RANK] = {-9, -9, -9};
  int32_t dtype = -9;
  int64_t elems() const {
    int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= dims[i];
    return rank < 0 ? 0 : n;
  }
  int64_t bytes() const { return elems() * fuzz::elem_bytes(dtype); }
};

Shape shape(lnmlp_plan* plan, int32_t tensor, int64_t tokens) {
  Shape s;
  EXPECT_STATUS(API(lnmlp_plan_get_tensor_shape(plan, tensor, tokens, &s.rank, s.dims, &s.dtype)), LNMLP_SUCCESS);
  FUZZ_CHECK(s.rank == -1 || (s.rank >= 1 && s.rank <= LNMLP_MAX_TENSOR_RANK), "tensor %d: rank %lld", tensor,
             static_cast<long long>(s.rank));
  for (int64_t i = s.rank < 0 ? 0 : s.rank; i < LNMLP_MAX_TENSOR_RANK; ++i)
    FUZZ_CHECK(s.dims[i] == 0, "tensor %d: dims[%lld] past the rank is %lld, not 0", tensor, static_cast<long long>(i),
               static_cast<long long>(s.dims[i]));
  return s;
}

void expect_dims(const Shape& s, int32_t tensor, std::initializer_list<int64_t> dims, int32_t dtype) {
  FUZZ_CHECK(s.rank == static_cast<int64_t>(dims.size()), "tensor %d: rank %lld, the header says %zu", tensor,
             static_cast<long long>(s.rank), dims.size());
  int i = 0;
  for (int64_t d : dims) {
    FUZZ_CHECK(s.dims[i] == d, "tensor %d: dims[%d] = %lld, the header says %lld", tensor, i,
               static_cast<long long>(s.dims[i]), static_cast<long long>(d));
    ++i;
  }
  FUZZ_CHECK(s.dtype == dtype, "tensor %d: dtype %d, expected %d", tensor, s.dtype, dtype);
}

void expect_absent(const Shape& s, int32_t tensor) {
  FUZZ_CHECK(s.rank == -1, "tensor %d: rank %lld, but the plan does not take it", tensor,
             static_cast<long long>(s.rank));
}

// The state blob of a DELAYED plan (empty for other recipes), to see whether a call changed it.
std::vector<uint8_t> state_blob(lnmlp_plan* plan) {
  int64_t n = -1;
  EXPECT_STATUS(API(lnmlp_plan_get_state_bytes(plan, &n)), LNMLP_SUCCESS);
  std::vector<uint8_t> b(static_cast<size_t>(n));
  if (n > 0) EXPECT_STATUS(API(lnmlp_plan_export_state(plan, b.data(), n)), LNMLP_SUCCESS);
  return b;
}

// The saved buffer's sections (LNMLP_SAVED_*) of a call with `tokens` tokens (0 .. T) that uses
// `call_bytes` of it: which exist follows from the remat policy, the recipe and the norm output;
// each has its shape, starts at a 256-byte boundary and lies inside the call's bytes, apart from
// the others. A section the plan does not save has offset and rank -1.
void check_saved_sections(lnmlp_plan* plan, const Model& m, int64_t tokens, int64_t call_bytes) {
  const bool fo = m.remat == LNMLP_REMAT_FORWARD_ONLY, all = m.remat == LNMLP_REMAT_SAVE_ALL;
  const bool fp8 = m.recipe != LNMLP_RECIPE_NONE;
  const bool per_tensor = m.recipe == LNMLP_RECIPE_DELAYED || m.recipe == LNMLP_RECIPE_CURRENT;
  const bool blocked =
      m.recipe == LNMLP_RECIPE_BLOCK || m.recipe == LNMLP_RECIPE_MXFP8 || m.recipe == LNMLP_RECIPE_NVFP4;
  // Codes: a byte per element, NVFP4's half (the columnwise copy's rows: H or F, of ceil(T/2) bytes).
  const bool fp4 = m.recipe == LNMLP_RECIPE_NVFP4;
  const int64_t H = m.H, F = m.F;
  struct Want {
    bool present;
    int64_t min_bytes;  // codes and block scales: at least this many bytes
    std::vector<int64_t> dims;
    int32_t dtype;
  };
  const Want want[LNMLP_SAVED_COUNT] = {
      {!fo && m.norm == LNMLP_NORM_LAYERNORM, 0, {tokens}, LNMLP_DTYPE_F32},
      {!fo, 0, {tokens}, LNMLP_DTYPE_F32},
      {m.norm_output != 0 || (all && !fp8), 0, {tokens, H}, m.dtype},
      {all || m.remat == LNMLP_REMAT_SAVE_FFN1, 0, {tokens, m.num_acts, F}, m.dtype},
      {all && !fp8, 0, {tokens, F}, m.dtype},
      {!fo && per_tensor, 0, {4}, LNMLP_DTYPE_F32},
      {all && fp8, fp4 ? H * ((tokens + 1) / 2) : tokens * H, {}, LNMLP_DTYPE_U8},
      {all && blocked, tokens > 0 ? 1 : 0, {}, LNMLP_DTYPE_U8},
      {all && fp8, fp4 ? F * ((tokens + 1) / 2) : tokens * F, {}, LNMLP_DTYPE_U8},
      {all && blocked, tokens > 0 ? 1 : 0, {}, LNMLP_DTYPE_U8},
  };
  std::vector<std::pair<int64_t, int64_t>> spans;  // offset, bytes
  for (int32_t sec = 0; sec < LNMLP_SAVED_COUNT; ++sec) {
    int64_t offset = -9, rank = -9, dims[LNMLP_MAX_TENSOR_RANK] = {-9, -9, -9};
    int32_t dtype = -9;
    EXPECT_STATUS(API(lnmlp_plan_get_saved_section(plan, sec, tokens, &offset, &rank, dims, &dtype)), LNMLP_SUCCESS);
    const Want& w = want[sec];
    if (!w.present) {
      FUZZ_CHECK(offset == -1 && rank == -1, "saved section %d: offset %lld rank %lld, but the plan does not save it",
                 sec, static_cast<long long>(offset), static_cast<long long>(rank));
      continue;
    }
    FUZZ_CHECK(dtype == w.dtype, "saved section %d: dtype %d, expected %d", sec, dtype, w.dtype);
    int64_t elems = 1;
    if (w.dims.empty()) {
      FUZZ_CHECK(rank == 1 && dims[0] >= w.min_bytes, "saved section %d: rank %lld, %lld bytes (at least %lld)", sec,
                 static_cast<long long>(rank), static_cast<long long>(dims[0]), static_cast<long long>(w.min_bytes));
      elems = dims[0];
    } else {
      FUZZ_CHECK(rank == static_cast<int64_t>(w.dims.size()), "saved section %d: rank %lld, expected %zu", sec,
                 static_cast<long long>(rank), w.dims.size());
      for (size_t i = 0; i < w.dims.size(); ++i) {
        FUZZ_CHECK(dims[i] == w.dims[i], "saved section %d: dims[%zu] = %lld, expected %lld", sec, i,
                   static_cast<long long>(dims[i]), static_cast<long long>(w.dims[i]));
        elems *= w.dims[i];
      }
    }
    const int64_t bytes = elems * fuzz::elem_bytes(w.dtype);
    FUZZ_CHECK(offset >= 0 && offset % 256 == 0 && offset + bytes <= call_bytes,
               "saved section %d at %lld, %lld bytes: not 256-aligned inside the call's %lld bytes", sec,
               static_cast<long long>(offset), static_cast<long long>(bytes), static_cast<long long>(call_bytes));
    if (bytes > 0) spans.emplace_back(offset, bytes);
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i)
    FUZZ_CHECK(spans[i - 1].first + spans[i - 1].second <= spans[i].first,
               "saved sections overlap: [%lld, +%lld) and [%lld, +%lld)", static_cast<long long>(spans[i - 1].first),
               static_cast<long long>(spans[i - 1].second), static_cast<long long>(spans[i].first),
               static_cast<long long>(spans[i].second));
}

// Every query of a fresh plan, checked against the model and the header's arithmetic.
void check_queries(lnmlp_plan* plan, const Model& m, Reader& r) {
  int64_t ws = -1, saved = -1, per_token = -1, align = -1, hist = -1, state_bytes = -1;
  EXPECT_STATUS(API(lnmlp_plan_get_workspace_bytes(plan, &ws)), LNMLP_SUCCESS);
  EXPECT_STATUS(API(lnmlp_plan_get_saved_bytes(plan, &saved)), LNMLP_SUCCESS);
  EXPECT_STATUS(API(lnmlp_plan_get_saved_bytes_per_token(plan, &per_token)), LNMLP_SUCCESS);
  EXPECT_STATUS(API(lnmlp_plan_get_alignment(plan, &align)), LNMLP_SUCCESS);
  EXPECT_STATUS(API(lnmlp_plan_get_amax_history_length(plan, &hist)), LNMLP_SUCCESS);
  EXPECT_STATUS(API(lnmlp_plan_get_state_bytes(plan, &state_bytes)), LNMLP_SUCCESS);
  EXPECT_STATUS(API(lnmlp_plan_get_workspace_bytes(plan, nullptr)), LNMLP_ERROR_NULL_POINTER);
  EXPECT_STATUS(API(lnmlp_plan_get_saved_bytes(plan, nullptr)), LNMLP_ERROR_NULL_POINTER);
  EXPECT_STATUS(API(lnmlp_plan_get_saved_bytes_per_token(plan, nullptr)), LNMLP_ERROR_NULL_POINTER);
  EXPECT_STATUS(API(lnmlp_plan_get_alignment(plan, nullptr)), LNMLP_ERROR_NULL_POINTER);
  EXPECT_STATUS(API(lnmlp_plan_get_amax_history_length(plan, nullptr)), LNMLP_ERROR_NULL_POINTER);
  EXPECT_STATUS(API(lnmlp_plan_get_state_bytes(plan, nullptr)), LNMLP_ERROR_NULL_POINTER);

  FUZZ_CHECK(ws >= 0 && saved >= 0 && per_token >= 0, "negative sizes: workspace %lld, saved %lld, per token %lld",
             static_cast<long long>(ws), static_cast<long long>(saved), static_cast<long long>(per_token));
  FUZZ_CHECK(align == 64, "a CPU plan's alignment is %lld, the header says 64", static_cast<long long>(align));
  const bool delayed = m.recipe == LNMLP_RECIPE_DELAYED;
  FUZZ_CHECK(hist == (delayed ? m.history : 0), "amax history length %lld, expected %lld", static_cast<long long>(hist),
             static_cast<long long>(delayed ? m.history : 0));
  // The blob: magic (8), four int32 (16), then per quantizer a float32 scale and the history.
  const int64_t blob = delayed ? 24 + LNMLP_QUANTIZER_COUNT * (1 + m.history) * 4 : 0;
  FUZZ_CHECK(state_bytes == blob, "state bytes %lld, the header's blob format has %lld",
             static_cast<long long>(state_bytes), static_cast<long long>(blob));

  // Saved bytes per token (LNMLP_REMAT_*): 4 (rmsnorm) or 8 (layernorm) of statistics, then per
  // policy; FP8 recipes save 1-byte codes of the norm and activation outputs (and block scales).
  // The norm output (lnmlp_desc_set_norm_output) adds e*H where the policy does not save it.
  const int64_t e = fuzz::elem_bytes(m.dtype), A = m.num_acts, H = m.H, F = m.F;
  const int64_t stats = m.norm == LNMLP_NORM_RMSNORM ? 4 : 8;
  const bool fp8 = m.recipe != LNMLP_RECIPE_NONE;
  const bool blocked = m.recipe == LNMLP_RECIPE_BLOCK || m.recipe == LNMLP_RECIPE_MXFP8;
  // NVFP4: half a byte per element (rounded down here: the buffer's lower bound), and exactly
  // ceil((H + F) / 2) + ceil((H + F) / 16) per token with its E4M3 scales.
  const bool fp4 = m.recipe == LNMLP_RECIPE_NVFP4;
  const bool saves_norm_output = m.norm_output || (m.remat == LNMLP_REMAT_SAVE_ALL && !fp8);
  int64_t want = 0;
  switch (m.remat) {
    case LNMLP_REMAT_SAVE_ALL: want = stats + e * A * F + (fp4 ? (H + F) / 2 : fp8 ? H + F : e * F); break;
    case LNMLP_REMAT_SAVE_FFN1: want = stats + e * A * F; break;
    case LNMLP_REMAT_SAVE_STATS: want = stats; break;
    default: want = 0; break;
  }
  if (saves_norm_output) want += e * H;
  if (fp4 && m.remat == LNMLP_REMAT_SAVE_ALL) {
    const int64_t exact = want + (H + F) % 2 + (H + F + 15) / 16;
    FUZZ_CHECK(per_token == exact, "NVFP4 saved bytes per token %lld, the formula gives %lld",
               static_cast<long long>(per_token), static_cast<long long>(exact));
  } else if (blocked && m.remat == LNMLP_REMAT_SAVE_ALL) {
    FUZZ_CHECK(per_token >= want, "saved bytes per token %lld < %lld", static_cast<long long>(per_token),
               static_cast<long long>(want));
  } else {
    FUZZ_CHECK(per_token == want, "saved bytes per token %lld, the header's formula gives %lld (remat %d, recipe %d)",
               static_cast<long long>(per_token), static_cast<long long>(want), m.remat, m.recipe);
  }
  // The buffer holds T tokens' bytes (block scales, which per_token rounds up to whole bytes per
  // token, come per block of 128 or 32 tokens: `want` leaves them out).
  FUZZ_CHECK(want == 0 ? saved == 0 : saved >= want * m.T, "saved bytes %lld for %lld tokens of %lld bytes (remat %d)",
             static_cast<long long>(saved), static_cast<long long>(m.T), static_cast<long long>(want), m.remat);

  // Every tensor's shape at the most tokens, against the header's table.
  const int32_t io = m.dtype, wt = m.weight_type(), wg = m.grad_type();
  const int64_t T = m.T;
  for (int32_t t : {LNMLP_TENSOR_X, LNMLP_TENSOR_Y, LNMLP_TENSOR_DY, LNMLP_TENSOR_DX})
    expect_dims(shape(plan, t, LNMLP_TOKENS_MAX), t, {T, H}, io);
  for (int32_t t : {LNMLP_TENSOR_GAMMA, LNMLP_TENSOR_DGAMMA}) expect_dims(shape(plan, t, LNMLP_TOKENS_MAX), t, {H}, io);
  for (int32_t t : {LNMLP_TENSOR_BETA, LNMLP_TENSOR_DBETA}) {
    const Shape s = shape(plan, t, LNMLP_TOKENS_MAX);
    if (m.norm == LNMLP_NORM_RMSNORM) expect_absent(s, t);
    else expect_dims(s, t, {H}, io);
  }
  // W1, W2 and their gradients in the plan's weight layout (OUT_IN: W1 [A, F, H], W2 [H, F]).
  const bool out_in = m.weight_layout == LNMLP_WEIGHT_LAYOUT_OUT_IN;
  for (int32_t t : {LNMLP_TENSOR_W1, LNMLP_TENSOR_DW1, LNMLP_TENSOR_W2, LNMLP_TENSOR_DW2}) {
    const Shape s = shape(plan, t, LNMLP_TOKENS_MAX);
    const int32_t dt = t == LNMLP_TENSOR_W1 || t == LNMLP_TENSOR_W2 ? wt : wg;
    if (t == LNMLP_TENSOR_W1 || t == LNMLP_TENSOR_DW1) {
      if (out_in) expect_dims(s, t, {A, F, H}, dt);
      else expect_dims(s, t, {H, A, F}, dt);
    } else {
      if (out_in) expect_dims(s, t, {H, F}, dt);
      else expect_dims(s, t, {F, H}, dt);
    }
  }
  const Shape b1 = shape(plan, LNMLP_TENSOR_B1, LNMLP_TOKENS_MAX),
              db1 = shape(plan, LNMLP_TENSOR_DB1, LNMLP_TOKENS_MAX);
  const Shape b2 = shape(plan, LNMLP_TENSOR_B2, LNMLP_TOKENS_MAX),
              db2 = shape(plan, LNMLP_TENSOR_DB2, LNMLP_TOKENS_MAX);
  if (m.bias1) {
    expect_dims(b1, LNMLP_TENSOR_B1, {A, F}, io);
    expect_dims(db1, LNMLP_TENSOR_DB1, {A, F}, wg);
  } else {
    expect_absent(b1, LNMLP_TENSOR_B1);
    expect_absent(db1, LNMLP_TENSOR_DB1);
  }
  if (m.bias2) {
    expect_dims(b2, LNMLP_TENSOR_B2, {H}, io);
    expect_dims(db2, LNMLP_TENSOR_DB2, {H}, wg);
  } else {
    expect_absent(b2, LNMLP_TENSOR_B2);
    expect_absent(db2, LNMLP_TENSOR_DB2);
  }
  const Shape sv = shape(plan, LNMLP_TENSOR_SAVED, LNMLP_TOKENS_MAX);
  if (saved == 0) expect_absent(sv, LNMLP_TENSOR_SAVED);
  else expect_dims(sv, LNMLP_TENSOR_SAVED, {saved}, LNMLP_DTYPE_U8);
  const Shape fs = shape(plan, LNMLP_TENSOR_FP8_STATE, LNMLP_TOKENS_MAX);
  if (delayed) expect_dims(fs, LNMLP_TENSOR_FP8_STATE, {LNMLP_QUANTIZER_COUNT, 1 + m.history}, LNMLP_DTYPE_F32);
  else expect_absent(fs, LNMLP_TENSOR_FP8_STATE);

  // Some token count: x has that many rows; the call's saved bytes serve it and fit the maximum.
  const int64_t tc = r.pick(0, T);
  int64_t rank = -9, dims[3] = {-9, -9, -9};
  int32_t dtype = -9;
  const int32_t st = API(lnmlp_plan_get_tensor_shape(plan, LNMLP_TENSOR_X, tc, &rank, dims, &dtype));
  if (tc >= 0 && tc <= T) {
    EXPECT_STATUS(st, LNMLP_SUCCESS);
    expect_dims(shape(plan, LNMLP_TENSOR_X, tc), LNMLP_TENSOR_X, {tc, H}, io);
    const Shape s = shape(plan, LNMLP_TENSOR_SAVED, tc);
    if (saved > 0) {
      FUZZ_CHECK(s.rank == 1 && s.dims[0] <= saved && s.dims[0] >= want * tc,
                 "saved bytes of a %lld-token call: %lld (maximum %lld, %lld per token without block scales)",
                 static_cast<long long>(tc), static_cast<long long>(s.dims[0]), static_cast<long long>(saved),
                 static_cast<long long>(want));
    }
    check_saved_sections(plan, m, tc, saved > 0 ? s.dims[0] : 0);
  } else {
    FUZZ_CHECK(tc == LNMLP_TOKENS_MAX ? st == LNMLP_SUCCESS : st == LNMLP_ERROR_INVALID_ARGUMENT,
               "get_tensor_shape with tokens %lld: %s", static_cast<long long>(tc), lnmlp_status_string(st));
    if (st != LNMLP_SUCCESS)
      FUZZ_CHECK(rank == -9 && dims[0] == -9 && dims[2] == -9 && dtype == -9, "a failed get_tensor_shape wrote");
  }
  check_saved_sections(plan, m, T, saved);
  // An unknown section, a bad token count and NULL outputs: refused, nothing written.
  {
    const int32_t sec = r.pick32(0, LNMLP_SAVED_COUNT);
    const int64_t tokens = r.pick(0, T);
    int64_t offset = -9, rank2 = -9, dims2[3] = {-9, -9, -9};
    int32_t dtype2 = -9;
    const int32_t st2 = API(lnmlp_plan_get_saved_section(plan, sec, tokens, &offset, &rank2, dims2, &dtype2));
    if (sec >= 0 && sec < LNMLP_SAVED_COUNT && ((tokens >= 0 && tokens <= T) || tokens == LNMLP_TOKENS_MAX)) {
      EXPECT_STATUS(st2, LNMLP_SUCCESS);
    } else {
      EXPECT_STATUS(st2, LNMLP_ERROR_INVALID_ARGUMENT);
      FUZZ_CHECK(offset == -9 && rank2 == -9 && dims2[0] == -9 && dtype2 == -9, "a failed get_saved_section wrote");
    }
    EXPECT_STATUS(API(lnmlp_plan_get_saved_section(plan, 0, 0, nullptr, &rank2, dims2, &dtype2)),
                  LNMLP_ERROR_NULL_POINTER);
    EXPECT_STATUS(API(lnmlp_plan_get_saved_section(plan, 0, 0, &offset, nullptr, dims2, &dtype2)),
                  LNMLP_ERROR_NULL_POINTER);
    EXPECT_STATUS(API(lnmlp_plan_get_saved_section(plan, 0, 0, &offset, &rank2, nullptr, &dtype2)),
                  LNMLP_ERROR_NULL_POINTER);
    EXPECT_STATUS(API(lnmlp_plan_get_saved_section(plan, 0, 0, &offset, &rank2, dims2, nullptr)),
                  LNMLP_ERROR_NULL_POINTER);
  }
  // Unknown tensors and NULL outputs.
  const int32_t bad = r.pick32(LNMLP_TENSOR_COUNT, LNMLP_TENSOR_COUNT + 1);
  if (bad < 0 || bad >= LNMLP_TENSOR_COUNT) {
    rank = -9, dims[0] = dims[1] = dims[2] = -9, dtype = -9;
    EXPECT_STATUS(API(lnmlp_plan_get_tensor_shape(plan, bad, LNMLP_TOKENS_MAX, &rank, dims, &dtype)),
                  LNMLP_ERROR_INVALID_ARGUMENT);
    FUZZ_CHECK(rank == -9 && dims[0] == -9 && dims[1] == -9 && dims[2] == -9 && dtype == -9,
               "a failed get_tensor_shape wrote its outputs");
  }
  EXPECT_STATUS(API(lnmlp_plan_get_tensor_shape(plan, LNMLP_TENSOR_X, LNMLP_TOKENS_MAX, nullptr, dims, &dtype)),
                LNMLP_ERROR_NULL_POINTER);
  EXPECT_STATUS(API(lnmlp_plan_get_tensor_shape(plan, LNMLP_TENSOR_X, LNMLP_TOKENS_MAX, &rank, nullptr, &dtype)),
                LNMLP_ERROR_NULL_POINTER);
  EXPECT_STATUS(API(lnmlp_plan_get_tensor_shape(plan, LNMLP_TENSOR_X, LNMLP_TOKENS_MAX, &rank, dims, nullptr)),
                LNMLP_ERROR_NULL_POINTER);
}

// ---- execution -----------------------------------------------------------------------------------

// The header's "A call that fails": these fail while the call runs (outputs undefined, FP8 state
// kept); every other failure is found before the call reads or writes anything. (INTERNAL, the
// third of them, is a broken promise by itself: check_status.)
bool fails_while_running(int32_t st) { return st == LNMLP_ERROR_OUT_OF_MEMORY || st == LNMLP_ERROR_BACKEND; }

// One tensor argument of a call.
struct Arg {
  const char* name;
  uint8_t* ptr;  // what the call gets
  Buf* buf;      // where it lives (nullptr for an absent tensor)
  bool present;  // the plan takes it (its rank is not -1)
  bool output;   // written by the call
  bool token_sized;
  bool may_be_null;  // header: NULL is accepted although present
};

// A pointer mistake of the byte format: none, NULL, non-NULL for an absent tensor, misaligned by
// one byte, or an output pointing at another tensor.
enum Mutation { kNone, kNull, kNonNull, kMisalign, kAlias };

struct Mutator {
  Mutation kind = kNone;
  int target = 0, source = 0;
  // Backward only: in two calls (lnmlp_plan_backward_data, then _weights), from a bit of the
  // mutation's byte that chooses nothing else (so earlier inputs keep their meaning otherwise).
  bool split = false;
  // Backward only, from another such bit: the plan's calls placed in whole tensors first
  // (lnmlp_plan_set_rng_place), from the bytes after it: first token, whole tokens, F part, parts.
  bool placed = false;
  int64_t first_token = 0, whole_tokens = 0;
  int32_t ffn_part = 0, ffn_parts = 1;
  void read(Reader& r) {
    const uint8_t m = r.u8();
    split = (m & 4) != 0;
    placed = (m & 8) != 0;
    if (placed) {
      first_token = r.pick(0, 40);
      whole_tokens = r.pick(0, 80);
      ffn_part = r.pick32(0, 3);
      ffn_parts = r.pick32(1, 4);
    }
    if (m < 0xC0) return;
    kind = static_cast<Mutation>(1 + m % 4);
    target = r.u8();
    source = r.u8();
  }
  // Applies the mistake to args; returns whether the header says the call must then fail.
  bool apply(std::vector<Arg>& args, uint8_t* dummy, int64_t tokens) const {
    if (kind == kNone) return false;
    Arg& a = args[static_cast<size_t>(target) % args.size()];
    const bool sized = a.buf != nullptr && a.buf->size() > 0 && !(a.token_sized && tokens == 0);
    switch (kind) {
      case kNull:
        if (!a.present || a.ptr == nullptr) return false;
        a.ptr = nullptr;
        return !a.may_be_null && !(a.token_sized && tokens == 0);
      case kNonNull:
        if (a.present) return false;
        a.ptr = dummy;
        return a.may_be_null == false;
      case kMisalign:
        if (!a.present || a.ptr == nullptr) return false;
        a.ptr += 1;
        return sized;
      default: {
        Arg& s = args[static_cast<size_t>(source) % args.size()];
        if (!a.output || !a.present || &s == &a || !s.present || s.ptr == nullptr || a.ptr == nullptr) return false;
        // Only between two tensors with bytes: an empty one overlaps nothing, so the call may rightly
        // accept it and write the output's bytes into the other's (smaller) buffer.
        const bool both_sized = sized && s.buf != nullptr && s.buf->size() > 0 && !(s.token_sized && tokens == 0);
        if (!both_sized) return false;
        a.ptr = s.ptr;
        return true;
      }
    }
  }
};

struct Runner {
  lnmlp_plan* plan;
  const Model& m;
  Reader& r;
  int64_t T, align;
  bool delayed, saves;
  Buf gamma, beta, w1, b1, w2, b2;
  std::vector<uint8_t> dummy_storage = std::vector<uint8_t>(256 + 64);
  uint8_t* dummy;
  int forwards_ok = 0, backwards_ok = 0;

  Runner(lnmlp_plan* p, const Model& model, Reader& reader) : plan(p), m(model), r(reader) {
    T = model.T;
    EXPECT_STATUS(API(lnmlp_plan_get_alignment(plan, &align)), LNMLP_SUCCESS);
    delayed = model.recipe == LNMLP_RECIPE_DELAYED;
    int64_t saved = 0;
    EXPECT_STATUS(API(lnmlp_plan_get_saved_bytes(plan, &saved)), LNMLP_SUCCESS);
    saves = saved > 0;
    const auto base = reinterpret_cast<uintptr_t>(dummy_storage.data());
    dummy = dummy_storage.data() + (64 - base % 64) % 64;
    gamma = make_input(LNMLP_TENSOR_GAMMA, LNMLP_TOKENS_MAX);
    beta = make_input(LNMLP_TENSOR_BETA, LNMLP_TOKENS_MAX);
    w1 = make_input(LNMLP_TENSOR_W1, LNMLP_TOKENS_MAX);
    b1 = make_input(LNMLP_TENSOR_B1, LNMLP_TOKENS_MAX);
    w2 = make_input(LNMLP_TENSOR_W2, LNMLP_TOKENS_MAX);
    b2 = make_input(LNMLP_TENSOR_B2, LNMLP_TOKENS_MAX);
  }

  // A buffer of exactly the tensor's bytes for `tokens` (none for an absent tensor).
  Buf make(int32_t tensor, int64_t tokens) {
    const Shape s = shape(plan, tensor, tokens);
    if (s.rank < 0) return Buf();
    return Buf(s.bytes(), align);
  }
  Buf make_input(int32_t tensor, int64_t tokens) {
    const Shape s = shape(plan, tensor, tokens);
    if (s.rank < 0) return Buf();
    Buf b(s.bytes(), align);
    const uint8_t mode = r.u8();
    fuzz::fill(b.data(), s.elems(), s.dtype, mode, r.u32(), r);
    return b;
  }
  Buf make_output(int32_t tensor, int64_t tokens, uint8_t sentinel) {
    Buf b = make(tensor, tokens);
    b.fill_byte(sentinel);
    return b;
  }
  static uint8_t* ptr(Buf& b) { return b.allocated() ? b.data() : nullptr; }

  // The FP8 state argument: NULL, a caller array of valid values, or a misaligned one.
  struct StateArg {
    Buf array;
    float* ptr = nullptr;
    bool must_fail = false;
  };
  // amax_array: the call's flags ask for a CURRENT or NVFP4 plan's amax array there, which is then
  // required.
  StateArg make_state(uint8_t mode, bool amax_array) {
    StateArg s;
    s.must_fail = amax_array;  // until an array is given
    if (mode % 4 < 2) return s;
    s.must_fail = false;
    int64_t hist = 0;
    EXPECT_STATUS(API(lnmlp_plan_get_amax_history_length(plan, &hist)), LNMLP_SUCCESS);
    const int64_t floats = LNMLP_QUANTIZER_COUNT * (1 + (delayed ? hist : 1));
    s.array = Buf(floats * 4 + 4, 16);
    auto* f = reinterpret_cast<float*>(s.array.data());
    for (int64_t q = 0; q < LNMLP_QUANTIZER_COUNT; ++q) {
      const int64_t stride = floats / LNMLP_QUANTIZER_COUNT;
      f[q * stride] = std::ldexp(1.0f, static_cast<int>(r.u8() % 41) - 20);  // finite, > 0
      for (int64_t i = 1; i < stride; ++i) f[q * stride + i] = static_cast<float>(r.u8());
    }
    s.ptr = f;
    if (mode % 4 == 3) {
      s.ptr = reinterpret_cast<float*>(s.array.data() + 1);  // misaligned for float
      s.must_fail = true;
    }
    if (!delayed && !amax_array) s.must_fail = true;  // fp8_state is for DELAYED plans (or the amax array)
    return s;
  }

  // After a pass of a DELAYED plan, its state (the plan's, or the caller's array) holds values the
  // state functions accept -- scales finite and > 0, amaxes >= 0, +inf or NaN -- so that it exports
  // as a blob the plan imports again.
  void check_state_after_pass(const char* call, const StateArg& state) {
    if (!delayed) return;
    const std::vector<uint8_t> blob = state_blob(plan);
    const int32_t st = API(lnmlp_plan_import_state(plan, blob.data(), static_cast<int64_t>(blob.size())));
    FUZZ_CHECK(st == LNMLP_SUCCESS, "after a %s the plan's FP8 state exports as a blob its import refuses", call);
    if (state.ptr == nullptr) return;
    const int64_t stride = state.array.size() / 4 / LNMLP_QUANTIZER_COUNT;
    for (int64_t q = 0; q < LNMLP_QUANTIZER_COUNT; ++q) {
      const float scale = state.ptr[q * stride];
      FUZZ_CHECK(std::isfinite(scale) && scale > 0.0f,
                 "after a %s the caller's fp8_state holds scale %g (quantizer %lld)", call, scale,
                 static_cast<long long>(q));
      for (int64_t i = 1; i < stride; ++i)
        FUZZ_CHECK(!(state.ptr[q * stride + i] < 0.0f), "after a %s the caller's fp8_state holds amax %g", call,
                   state.ptr[q * stride + i]);
    }
  }

  static void check_unchanged(const char* call, const std::vector<Arg>& args,
                              const std::vector<std::vector<uint8_t>>& before, bool outputs_too, const Buf* extra,
                              const std::vector<uint8_t>* extra_before) {
    for (size_t i = 0; i < args.size(); ++i) {
      if (args[i].buf == nullptr) continue;
      if (args[i].output && !outputs_too) continue;
      FUZZ_CHECK(args[i].buf->same(before[i]), "%s changed %s %s", call, args[i].name,
                 args[i].output ? "although it failed (outputs must stay as they were)" : "(an input)");
    }
    if (extra != nullptr && extra->allocated())
      FUZZ_CHECK(extra->same(*extra_before), "%s changed the caller's fp8_state array", call);
  }

  // A parameter gradient after a backward with no tokens: zeros, or as it was when it accumulates.
  void check_no_token_gradient(const char* name, const Buf& b, const std::vector<uint8_t>& before) const {
    if (m.accumulate) {
      FUZZ_CHECK(b.same(before), "backward with no tokens changed accumulated %s", name);
      return;
    }
    const int64_t e = fuzz::elem_bytes(m.grad_type());
    for (int64_t k = 0; k < b.size(); k += e) {
      uint32_t bits = 0;
      std::memcpy(&bits, b.data() + k, static_cast<size_t>(e));
      const uint32_t mag = e == 4 ? bits & 0x7fffffffu : bits & 0x7fffu;
      FUZZ_CHECK(mag == 0, "backward with no tokens left %s[%lld] = 0x%x, not zero", name,
                 static_cast<long long>(k / e), bits);
    }
  }

  // One forward (and backward) with a token count, flags and pointer mistakes from the bytes.
  void iteration(bool workspace_missing) {
    const int64_t tc = r.pick(0, T);
    const bool tc_ok = tc >= 0 && tc <= T;
    const int64_t rows = tc_ok ? tc : T;  // invalid counts get buffers for the most tokens
    const int32_t flags = r.pick32(0, 1);
    // pick32's hi + 1 is LNMLP_CALL_AMAX_MEASURE: amaxes in stages, which a CURRENT or NVFP4 plan
    // takes with an amax array in fp8_state (make_state's aligned array, of 2 floats per quantizer).
    const bool amax_stage =
        flags == LNMLP_CALL_AMAX_MEASURE && (m.recipe == LNMLP_RECIPE_CURRENT || m.recipe == LNMLP_RECIPE_NVFP4);
    const bool flags_ok = flags == 0 || flags == 1 || amax_stage;
    StateArg state = make_state(r.u8(), amax_stage);
    Mutator fwd_mut, bwd_mut;
    fwd_mut.read(r);
    bwd_mut.read(r);

    Buf x = make_input(LNMLP_TENSOR_X, rows);
    Buf y = make_output(LNMLP_TENSOR_Y, rows, 0xA5);
    Buf saved = make_output(LNMLP_TENSOR_SAVED, rows, 0x5A);

    std::vector<Arg> f = {
        {"x", ptr(x), &x, true, false, true, false},
        {"gamma", ptr(gamma), &gamma, true, false, false, false},
        {"beta", ptr(beta), beta.allocated() ? &beta : nullptr, beta.allocated(), false, false, false},
        {"w1", ptr(w1), &w1, true, false, false, false},
        {"b1", ptr(b1), b1.allocated() ? &b1 : nullptr, b1.allocated(), false, false, false},
        {"w2", ptr(w2), &w2, true, false, false, false},
        {"b2", ptr(b2), b2.allocated() ? &b2 : nullptr, b2.allocated(), false, false, false},
        {"y", ptr(y), &y, true, true, true, false},
        // "saved may be NULL only when the plan saves 0 bytes or the call has no tokens"; whether a
        // non-NULL one is refused when it saves nothing, the header does not say.
        {"saved", ptr(saved), saved.allocated() ? &saved : nullptr, saved.allocated(), true, true, !saves},
    };
    const bool fwd_mut_fails = fwd_mut.apply(f, dummy, rows);
    const bool fwd_must_fail = !tc_ok || !flags_ok || state.must_fail || fwd_mut_fails || workspace_missing;

    std::vector<std::vector<uint8_t>> before;
    for (const Arg& a : f) before.push_back(a.buf ? a.buf->snapshot() : std::vector<uint8_t>());
    const std::vector<uint8_t> state_before = state.array.snapshot();
    const std::vector<uint8_t> blob_before = state_blob(plan);

    const int32_t st = API(lnmlp_plan_forward(plan, tc, f[0].ptr, f[1].ptr, f[2].ptr, f[3].ptr, f[4].ptr, f[5].ptr,
                                              f[6].ptr, f[7].ptr, f[8].ptr, state.ptr, flags, nullptr));
    if (fwd_must_fail) {
      FUZZ_CHECK(st != LNMLP_SUCCESS,
                 "forward must fail (tokens %lld of %lld, flags %d, fp8_state %s, mutation %d of %s, workspace %s) "
                 "but succeeded",
                 static_cast<long long>(tc), static_cast<long long>(T), flags, state.ptr ? "given" : "NULL",
                 fwd_mut.kind, f[static_cast<size_t>(fwd_mut.target) % f.size()].name,
                 workspace_missing ? "missing" : "ok");
    }
    if (st != LNMLP_SUCCESS) {
      // "A call that fails": argument errors change nothing; OUT_OF_MEMORY and BACKEND (failures while
      // it runs) leave the outputs undefined, but the FP8 state as it was.
      check_unchanged("a failed forward", f, before, !fails_while_running(st), &state.array, &state_before);
      FUZZ_CHECK(state_blob(plan) == blob_before, "a failed forward changed the plan's FP8 state");
      if (!fwd_must_fail && fuzz::verbose())
        std::fprintf(stderr, "[fuzz_plan] forward (tokens %lld) failed: %s: %s\n", static_cast<long long>(tc),
                     lnmlp_status_string(st), lnmlp_last_error());
    } else {
      check_unchanged("forward", f, before, tc == 0, tc == 0 ? &state.array : nullptr, &state_before);
      ++forwards_ok;
      if (tc == 0 || state.ptr != nullptr)
        FUZZ_CHECK(state_blob(plan) == blob_before, "forward (tokens %lld, fp8_state %s) changed the plan's FP8 state",
                   static_cast<long long>(tc), state.ptr ? "given" : "NULL");
      check_state_after_pass("forward", state);
    }
    // Backward reads what this forward saved: only after it succeeded, or when the call is bad anyway.
    if (st != LNMLP_SUCCESS && tc_ok && flags_ok) return;
    backward(tc, rows, flags, state, bwd_mut, x, saved, workspace_missing || !tc_ok || !flags_ok);
  }

  void backward(int64_t tc, int64_t rows, int32_t flags, StateArg& state, const Mutator& mut, Buf& x, Buf& saved,
                bool must_fail) {
    Buf dy = make_input(LNMLP_TENSOR_DY, rows);
    Buf dx = make_output(LNMLP_TENSOR_DX, rows, 0xA5);
    Buf dgamma = make_output(LNMLP_TENSOR_DGAMMA, rows, 0xA5);
    Buf dbeta = make_output(LNMLP_TENSOR_DBETA, rows, 0xA5);
    // Accumulated gradients start from values; overwritten ones from a sentinel.
    Buf dw1 = m.accumulate ? make_input(LNMLP_TENSOR_DW1, rows) : make_output(LNMLP_TENSOR_DW1, rows, 0xA5);
    Buf db1 = m.accumulate ? make_input(LNMLP_TENSOR_DB1, rows) : make_output(LNMLP_TENSOR_DB1, rows, 0xA5);
    Buf dw2 = m.accumulate ? make_input(LNMLP_TENSOR_DW2, rows) : make_output(LNMLP_TENSOR_DW2, rows, 0xA5);
    Buf db2 = m.accumulate ? make_input(LNMLP_TENSOR_DB2, rows) : make_output(LNMLP_TENSOR_DB2, rows, 0xA5);
    const bool stats_only = m.remat == LNMLP_REMAT_SAVE_STATS;
    const auto opt = [](Buf& b) { return b.allocated() ? &b : nullptr; };
    std::vector<Arg> a = {
        {"dy", ptr(dy), &dy, true, false, true, false},
        {"x", ptr(x), &x, true, false, true, false},
        {"gamma", ptr(gamma), &gamma, true, false, false, false},
        {"beta", ptr(beta), opt(beta), beta.allocated(), false, false, false},
        {"w1", ptr(w1), &w1, true, false, false, false},
        // b1: needed only when the plan recomputes GEMM1 (SAVE_STATS); a non-NULL one without
        // bias1 is a case the header leaves open (may_be_null doubles as "not asserted").
        {"b1", ptr(b1), opt(b1), b1.allocated(), false, false, !stats_only || !b1.allocated()},
        {"w2", ptr(w2), &w2, true, false, false, false},
        {"saved", ptr(saved), opt(saved), saved.allocated(), false, true, false},
        {"dx", ptr(dx), &dx, true, true, true, false},
        {"dgamma", ptr(dgamma), &dgamma, true, true, false, false},
        {"dbeta", ptr(dbeta), opt(dbeta), dbeta.allocated(), true, false, false},
        {"dw1", ptr(dw1), &dw1, true, true, false, false},
        {"db1", ptr(db1), opt(db1), db1.allocated(), true, false, false},
        {"dw2", ptr(dw2), &dw2, true, true, false, false},
        {"db2", ptr(db2), opt(db2), db2.allocated(), true, false, false},
    };
    // In two calls: the data call takes the deferred buffer where backward takes dW1 and dW2.
    Buf deferred;
    if (mut.split) {
      int64_t bytes = 0;
      EXPECT_STATUS(API(lnmlp_plan_get_deferred_bytes(plan, rows, &bytes)), LNMLP_SUCCESS);
      deferred = Buf(bytes, align);
      deferred.fill_byte(0xA5);
      a.erase(a.begin() + 13);  // dw2
      a.erase(a.begin() + 11);  // dw1
      a.push_back({"deferred", ptr(deferred), &deferred, m.remat != LNMLP_REMAT_FORWARD_ONLY, true, true, false});
    }
    const bool mut_fails = mut.apply(a, dummy, rows);
    const bool bwd_must_fail = must_fail || mut_fails || state.must_fail || m.remat == LNMLP_REMAT_FORWARD_ONLY;

    std::vector<std::vector<uint8_t>> before;
    for (const Arg& t : a) before.push_back(t.buf ? t.buf->snapshot() : std::vector<uint8_t>());
    const std::vector<uint8_t> state_before = state.array.snapshot();
    const std::vector<uint8_t> blob_before = state_blob(plan);

    const std::vector<uint8_t> dw1_before = dw1.snapshot(), dw2_before = dw2.snapshot();
    // The place, for this call only: a setter that fails leaves the plan's as it was; a backward
    // whose tokens pass the whole tokens succeeds only where it draws nothing (its random state
    // then stays where it was).
    bool past_the_place = false;
    if (mut.placed) {
      const int32_t ps =
          API(lnmlp_plan_set_rng_place(plan, mut.first_token, mut.whole_tokens, mut.ffn_part, mut.ffn_parts));
      FUZZ_CHECK(ps == LNMLP_SUCCESS || ps == LNMLP_ERROR_INVALID_ARGUMENT,
                 "set_rng_place(%lld, %lld, %d, %d) returned %s", static_cast<long long>(mut.first_token),
                 static_cast<long long>(mut.whole_tokens), mut.ffn_part, mut.ffn_parts, lnmlp_status_string(ps));
      past_the_place = ps == LNMLP_SUCCESS && mut.whole_tokens > 0 && tc > mut.whole_tokens - mut.first_token;
    }
    uint64_t seed_before = 0, offset_before = 0;
    EXPECT_STATUS(API(lnmlp_plan_get_rng_state(plan, &seed_before, &offset_before)), LNMLP_SUCCESS);
    struct PlaceReset {
      lnmlp_plan* plan;
      ~PlaceReset() { lnmlp_plan_set_rng_place(plan, 0, 0, 0, 1); }
    } place_reset{plan};
    const int32_t st =
        mut.split ? API(lnmlp_plan_backward_data(plan, tc, a[0].ptr, a[1].ptr, a[2].ptr, a[3].ptr, a[4].ptr, a[5].ptr,
                                                 a[6].ptr, a[7].ptr, a[8].ptr, a[9].ptr, a[10].ptr, a[11].ptr,
                                                 a[12].ptr, a[13].ptr, state.ptr, flags, nullptr))
                  : API(lnmlp_plan_backward(plan, tc, a[0].ptr, a[1].ptr, a[2].ptr, a[3].ptr, a[4].ptr, a[5].ptr,
                                            a[6].ptr, a[7].ptr, a[8].ptr, a[9].ptr, a[10].ptr, a[11].ptr, a[12].ptr,
                                            a[13].ptr, a[14].ptr, state.ptr, flags, nullptr));
    if (bwd_must_fail) {
      FUZZ_CHECK(
          st != LNMLP_SUCCESS, "backward must fail (tokens %lld, flags %d, remat %d, mutation %d of %s) but succeeded",
          static_cast<long long>(tc), flags, m.remat, mut.kind, a[static_cast<size_t>(mut.target) % a.size()].name);
    }
    if (past_the_place && st == LNMLP_SUCCESS) {
      uint64_t seed = 0, offset = 0;
      EXPECT_STATUS(API(lnmlp_plan_get_rng_state(plan, &seed, &offset)), LNMLP_SUCCESS);
      FUZZ_CHECK(offset == offset_before,
                 "a backward with tokens past lnmlp_plan_set_rng_place's whole drew from "
                 "the random stream");
    }
    if (st != LNMLP_SUCCESS) {
      check_unchanged("a failed backward", a, before, !fails_while_running(st), &state.array, &state_before);
      FUZZ_CHECK(state_blob(plan) == blob_before, "a failed backward changed the plan's FP8 state");
      if (!bwd_must_fail && fuzz::verbose())
        std::fprintf(stderr, "[fuzz_plan] backward (tokens %lld) failed: %s: %s\n", static_cast<long long>(tc),
                     lnmlp_status_string(st), lnmlp_last_error());
      return;
    }
    check_unchanged("backward", a, before, false, nullptr, nullptr);
    ++backwards_ok;
    if (mut.split) {
      FUZZ_CHECK(dw1.same(dw1_before) && dw2.same(dw2_before), "backward's data call wrote dW1 or dW2");
      // The weights call, given what the data call was: it must succeed, and change nothing but
      // dW1 and dW2 (no input, no FP8 state).
      const std::vector<uint8_t> state_mid = state.array.snapshot(), blob_mid = state_blob(plan);
      const std::vector<uint8_t> dy_mid = dy.snapshot(), saved_mid = saved.snapshot(),
                                 deferred_mid = deferred.snapshot();
      const int32_t w = API(lnmlp_plan_backward_weights(plan, tc, ptr(dy), ptr(saved), ptr(deferred), ptr(dw1),
                                                        ptr(dw2), flags, nullptr));
      FUZZ_CHECK(w == LNMLP_SUCCESS, "backward's weights call failed after its data call succeeded: %s: %s",
                 lnmlp_status_string(w), lnmlp_last_error());
      FUZZ_CHECK(dy.same(dy_mid) && saved.same(saved_mid) && deferred.same(deferred_mid),
                 "backward's weights call changed dy, saved or the deferred buffer");
      FUZZ_CHECK(state.array.same(state_mid) && state_blob(plan) == blob_mid,
                 "backward's weights call changed the FP8 state");
    }
    if (tc == 0 || state.ptr != nullptr)
      FUZZ_CHECK(state_blob(plan) == blob_before, "backward (tokens %lld, fp8_state %s) changed the plan's FP8 state",
                 static_cast<long long>(tc), state.ptr ? "given" : "NULL");
    check_state_after_pass("backward", state);
    if (tc == 0) {
      FUZZ_CHECK(state.array.same(state_before), "backward with no tokens changed the caller's FP8 state");
      // No tokens: the parameter gradients are zeros, or stay as they were when they accumulate.
      for (size_t i = 0; i < a.size(); ++i) {
        const bool grad = a[i].buf == &db1 || a[i].buf == &db2 || a[i].buf == &dw1 || a[i].buf == &dw2;
        if (!grad || a[i].ptr != a[i].buf->data()) continue;
        check_no_token_gradient(a[i].name, *a[i].buf, before[i]);
      }
      if (mut.split) {
        check_no_token_gradient("dw1", dw1, dw1_before);
        check_no_token_gradient("dw2", dw2, dw2_before);
      }
    }
  }
};

// Handle misuse on a destroyed plan: every use is LNMLP_ERROR_INVALID_HANDLE.
void check_dead_plan(lnmlp_plan* dead) {
  int64_t v = -9, rank = 0, dims[3] = {0, 0, 0};
  int32_t dtype = 0;
  float scale = 0.0f;
  EXPECT_STATUS(API(lnmlp_plan_destroy(dead)), LNMLP_ERROR_INVALID_HANDLE);
  EXPECT_STATUS(API(lnmlp_plan_get_workspace_bytes(dead, &v)), LNMLP_ERROR_INVALID_HANDLE);
  EXPECT_STATUS(API(lnmlp_plan_get_saved_bytes(dead, &v)), LNMLP_ERROR_INVALID_HANDLE);
  EXPECT_STATUS(API(lnmlp_plan_get_state_bytes(dead, &v)), LNMLP_ERROR_INVALID_HANDLE);
  EXPECT_STATUS(API(lnmlp_plan_get_tensor_shape(dead, LNMLP_TENSOR_X, LNMLP_TOKENS_MAX, &rank, dims, &dtype)),
                LNMLP_ERROR_INVALID_HANDLE);
  EXPECT_STATUS(API(lnmlp_plan_get_quantizer_state(dead, 0, &scale, nullptr, 0)), LNMLP_ERROR_INVALID_HANDLE);
  FUZZ_CHECK(v == -9, "a call on a destroyed plan wrote its output");
}

void run_plan(lnmlp_plan* plan, const Model& m, Reader& r) {
  check_queries(plan, m, r);
  int64_t ws = 0, align = 64;
  EXPECT_STATUS(API(lnmlp_plan_get_workspace_bytes(plan, &ws)), LNMLP_SUCCESS);
  EXPECT_STATUS(API(lnmlp_plan_get_alignment(plan, &align)), LNMLP_SUCCESS);

  // Workspace: attach mode from the bytes for an external-workspace plan; an owned one refuses it.
  Buf workspace(ws, align);
  bool workspace_missing = false;
  const uint8_t wmode = r.u8() % 8;
  if (m.external_workspace) {
    if (wmode == 5 && ws > 0) {
      EXPECT_STATUS(API(lnmlp_plan_attach_workspace(plan, workspace.data(), ws - 1)), LNMLP_ERROR_WORKSPACE_TOO_SMALL);
      workspace_missing = true;
    } else if (wmode == 6 && ws > 0) {
      Buf big(ws + 1, align);
      EXPECT_STATUS(API(lnmlp_plan_attach_workspace(plan, big.data() + 1, ws)), LNMLP_ERROR_MISALIGNED);
      workspace_missing = true;
    } else if (wmode == 7) {
      workspace_missing = ws > 0;
    } else {
      if (wmode == 4 && ws > 0)
        EXPECT_STATUS(API(lnmlp_plan_attach_workspace(plan, nullptr, ws)), LNMLP_ERROR_NULL_POINTER);
      EXPECT_STATUS(API(lnmlp_plan_attach_workspace(plan, workspace.data(), ws)), LNMLP_SUCCESS);
    }
  } else {
    // A plan that owns its workspace takes no other.
    FUZZ_CHECK(API(lnmlp_plan_attach_workspace(plan, workspace.data(), ws)) != LNMLP_SUCCESS,
               "attach_workspace succeeded on a plan that owns its workspace");
  }

  const bool small =
      m.T <= kRunDim && m.H <= kRunDim && m.F <= kRunDim && mul_le(m.T * m.H, m.num_acts * m.F, kRunMacs);
  if (!small) return;
  Runner run(plan, m, r);
  const int iterations = 1 + r.u8() % 3;
  for (int i = 0; i < iterations; ++i) run.iteration(workspace_missing);
  if (fuzz::verbose())
    std::fprintf(stderr,
                 "[fuzz_plan] plan T %lld H %lld F %lld A %lld dtype %d recipe %d remat %d: %d of %d forwards ok, %d "
                 "backwards ok\n",
                 static_cast<long long>(m.T), static_cast<long long>(m.H), static_cast<long long>(m.F),
                 static_cast<long long>(m.num_acts), m.dtype, m.recipe, m.remat, run.forwards_ok, iterations,
                 run.backwards_ok);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Reader r(data, size);

  int32_t major = -1, minor = -1, patch = -1, abi = -1;
  EXPECT_STATUS(API(lnmlp_get_version(&major, &minor, &patch, &abi)), LNMLP_SUCCESS);
  FUZZ_CHECK(abi == LNMLP_ABI_VERSION && major == LNMLP_VERSION_MAJOR, "version %d.%d.%d abi %d", major, minor, patch,
             abi);
  const char* info = nullptr;
  EXPECT_STATUS(API(lnmlp_get_build_info(&info)), LNMLP_SUCCESS);
  FUZZ_CHECK(info != nullptr, "build info is NULL");
  static const bool cuda_available = [] {
    int32_t s = 0;
    return lnmlp_query_support(LNMLP_BACKEND_CUDA, LNMLP_FEATURE_BACKEND, &s) == LNMLP_SUCCESS &&
           s != LNMLP_UNSUPPORTED;
  }();

  // A destroyed descriptor: its handle stays invalid.
  lnmlp_desc* stale = nullptr;
  EXPECT_STATUS(API(lnmlp_desc_create(&stale)), LNMLP_SUCCESS);
  EXPECT_STATUS(API(lnmlp_desc_destroy(stale)), LNMLP_SUCCESS);
  EXPECT_STATUS(API(lnmlp_desc_destroy(stale)), LNMLP_ERROR_INVALID_HANDLE);
  EXPECT_STATUS(API(lnmlp_desc_create(nullptr)), LNMLP_ERROR_NULL_POINTER);

  lnmlp_desc* desc = nullptr;
  EXPECT_STATUS(API(lnmlp_desc_create(&desc)), LNMLP_SUCCESS);
  Model m;
  const int ops = r.u8() % 33;
  for (int i = 0; i < ops; ++i) run_op(r, desc, stale, m);

  // Plan creation: NULL and dead handles first, then the descriptor, when its plan is small enough
  // to allocate, or so large that the size checks must refuse it.
  auto* const kUntouched = reinterpret_cast<lnmlp_plan*>(uintptr_t{0x1237});  // NOLINT
  lnmlp_plan* plan = kUntouched;
  EXPECT_STATUS(API(lnmlp_plan_create(desc, nullptr)), LNMLP_ERROR_NULL_POINTER);
  EXPECT_STATUS(API(lnmlp_plan_create(nullptr, &plan)), LNMLP_ERROR_NULL_POINTER);
  EXPECT_STATUS(API(lnmlp_plan_create(stale, &plan)), LNMLP_ERROR_INVALID_HANDLE);
  FUZZ_CHECK(plan == kUntouched, "a failed plan_create wrote *plan");
  int64_t AF = 0;
  if (__builtin_mul_overflow(m.num_acts, m.F, &AF)) AF = INT64_MAX;
  const bool fits =
      m.T == 0 || (mul_le(m.T, m.H, kCreateElems) && mul_le(m.T, AF, kCreateElems) && mul_le(m.H, AF, kCreateElems));
  const bool huge = m.T >= (int64_t{1} << 31) || m.H >= (int64_t{1} << 31) || AF >= (int64_t{1} << 31);
  if (fits || huge) {
    const int32_t st = API(lnmlp_plan_create(desc, &plan));
    const char* refuse = m.must_refuse(cuda_available);
    if (refuse != nullptr)
      FUZZ_CHECK(st != LNMLP_SUCCESS, "plan_create must refuse this descriptor (%s), but succeeded", refuse);
    if (huge) FUZZ_CHECK(st != LNMLP_SUCCESS, "plan_create accepted sizes beyond 2^31 (tokens, hidden, A x ffn)");
    FUZZ_CHECK(st != LNMLP_ERROR_INTERNAL, "plan_create: INTERNAL");
    if (st != LNMLP_SUCCESS) {
      FUZZ_CHECK(plan == kUntouched, "a failed plan_create wrote *plan");
      if (refuse == nullptr && !huge && fuzz::verbose())
        std::fprintf(stderr, "[fuzz_plan] plan_create refused: %s: %s\n", lnmlp_status_string(st), lnmlp_last_error());
    } else {
      FUZZ_CHECK(plan != nullptr && plan != kUntouched, "plan_create succeeded without a plan");
      // Plans outlive their descriptor; a descriptor is not a plan, nor a plan a descriptor.
      EXPECT_STATUS(API(lnmlp_desc_destroy(desc)), LNMLP_SUCCESS);
      EXPECT_STATUS(API(lnmlp_desc_destroy(desc)), LNMLP_ERROR_INVALID_HANDLE);
      EXPECT_STATUS(API(lnmlp_desc_set_shape(desc, 1, 1, 1)), LNMLP_ERROR_INVALID_HANDLE);
      desc = nullptr;
      int64_t v = -9;
      EXPECT_STATUS(API(lnmlp_plan_get_workspace_bytes(reinterpret_cast<lnmlp_plan*>(stale), &v)),  // NOLINT
                    LNMLP_ERROR_INVALID_HANDLE);
      EXPECT_STATUS(API(lnmlp_desc_set_norm(reinterpret_cast<lnmlp_desc*>(plan), 0)),  // NOLINT
                    LNMLP_ERROR_INVALID_HANDLE);
      run_plan(plan, m, r);
      EXPECT_STATUS(API(lnmlp_plan_destroy(plan)), LNMLP_SUCCESS);
      check_dead_plan(plan);
    }
  }
  if (desc != nullptr) EXPECT_STATUS(API(lnmlp_desc_destroy(desc)), LNMLP_SUCCESS);
  EXPECT_STATUS(API(lnmlp_plan_destroy(nullptr)), LNMLP_SUCCESS);
  EXPECT_STATUS(API(lnmlp_desc_destroy(nullptr)), LNMLP_SUCCESS);
  return 0;
}
