// The C API of the FP8 quantizer state (DELAYED scaling): per-quantizer reads and writes, and the
// versioned blob for checkpoints. Every value is checked before anything is written.
#include <cmath>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "fp8_state.h"
#include "handles.h"
#include "lnmlp.h"

using namespace lnmlp;

namespace {

constexpr char kBlobMagic[8] = {'L', 'N', 'M', 'L', 'P', 'Q', 'S', '1'};
constexpr int32_t kBlobVersion = 1;
struct BlobHeader {
  char magic[8];
  int32_t version, recipe, history_len, quantizers;
};
static_assert(sizeof(BlobHeader) == 24, "the blob header is 24 bytes");

int64_t blob_bytes(const lnmlp_plan& p) {
  if (!p.recipe.stateful()) return 0;
  return static_cast<int64_t>(sizeof(BlobHeader)) + p.recipe.state_floats() * 4;
}

void require_stateful(const lnmlp_plan& p) {
  if (!p.recipe.stateful())
    fail(LNMLP_ERROR_INVALID_ARGUMENT, "this plan's recipe keeps no quantizer state (only LNMLP_RECIPE_DELAYED does)");
}

void require_quantizer(int32_t q) {
  if (q < 0 || q >= kQuantizerCount)
    fail(LNMLP_ERROR_INVALID_ARGUMENT, "unknown quantizer ", q, " (expected an LNMLP_QUANTIZER_* value, 0 to 5)");
}

// A scale the quantizers can use: finite and > 0.
void check_scale(float s, int q) {
  if (!(std::isfinite(s) && s > 0.0f))
    fail(LNMLP_ERROR_INVALID_ARGUMENT, "the scale of quantizer ", quantizer_name(q), " must be finite and > 0, got ",
         s);
}

// An amax as a pass records it: >= 0, +inf or NaN.
void check_history(const float* h, int64_t n, int q) {
  for (int64_t i = 0; i < n; ++i)
    if (h[i] < 0.0f)
      fail(LNMLP_ERROR_INVALID_ARGUMENT, "amax history entry ", i, " of quantizer ", quantizer_name(q),
           " is negative (", h[i], "); amaxes are >= 0, +inf or NaN");
}

// The whole state, copied to the host.
std::vector<float> read_state(const lnmlp_plan& p) {
  std::vector<float> s(static_cast<size_t>(p.recipe.state_floats()));
  p.engine->copy_to_host(s.data(), p.state(), p.recipe.state_floats() * 4);
  return s;
}

}  // namespace

namespace lnmlp {

void init_fp8_state(lnmlp_plan& p) {
  if (!p.recipe.stateful()) return;
  const int64_t n = p.recipe.state_floats(), stride = p.recipe.state_stride();
  std::vector<float> s(static_cast<size_t>(n), 0.0f);
  for (int q = 0; q < kQuantizerCount; ++q) s[static_cast<size_t>(q * stride)] = 1.0f;
  p.fp8_state = static_cast<float*>(p.engine->allocate(n * 4));
  p.engine->copy_from_host(p.fp8_state, s.data(), n * 4);
}

}  // namespace lnmlp

extern "C" {

LNMLP_API int32_t lnmlp_plan_attach_fp8_state(lnmlp_plan* plan, void* state) {
  return api_guard(__func__, [&] {
    PlanUse use(plan);
    require_stateful(*plan);
    const uintptr_t align = plan->cfg.backend == BackendKind::Cuda ? 16 : alignof(float);
    if (reinterpret_cast<uintptr_t>(state) % align != 0)
      fail(LNMLP_ERROR_MISALIGNED, "state (", state, ") is not aligned to ", align, " bytes");
    plan->attached_fp8_state = static_cast<float*>(state);
  });
}

LNMLP_API int32_t lnmlp_plan_get_amax_history_length(const lnmlp_plan* plan, int64_t* length) {
  return api_guard(__func__, [&] {
    const Held<lnmlp_plan> held(plan, "plan");
    if (length == nullptr) fail(LNMLP_ERROR_NULL_POINTER, "length is NULL; pass where to write the result");
    *length = plan->recipe.history_len;
  });
}

LNMLP_API int32_t lnmlp_plan_get_quantizer_state(const lnmlp_plan* plan, int32_t quantizer, float* scale,
                                                 float* amax_history, int64_t length) {
  return api_guard(__func__, [&] {
    PlanUse use(plan);
    require_stateful(*plan);
    require_quantizer(quantizer);
    if (scale == nullptr) fail(LNMLP_ERROR_NULL_POINTER, "scale is NULL; pass where to write the scale");
    if (amax_history != nullptr && length != plan->recipe.history_len)
      fail(LNMLP_ERROR_INVALID_ARGUMENT, "length is ", length, ", but the plan's amax history has ",
           plan->recipe.history_len, " entries (lnmlp_plan_get_amax_history_length)");
    const std::vector<float> s = read_state(*plan);
    const float* q = s.data() + quantizer * plan->recipe.state_stride();
    *scale = q[0];
    if (amax_history != nullptr) std::memcpy(amax_history, q + 1, sizeof(float) * static_cast<size_t>(length));
  });
}

LNMLP_API int32_t lnmlp_plan_set_quantizer_state(lnmlp_plan* plan, int32_t quantizer, float scale,
                                                 const float* amax_history, int64_t length) {
  return api_guard(__func__, [&] {
    PlanUse use(plan);
    require_stateful(*plan);
    require_quantizer(quantizer);
    if (amax_history == nullptr) fail(LNMLP_ERROR_NULL_POINTER, "amax_history is NULL");
    if (length != plan->recipe.history_len)
      fail(LNMLP_ERROR_INVALID_ARGUMENT, "length is ", length, ", but the plan's amax history has ",
           plan->recipe.history_len, " entries (lnmlp_plan_get_amax_history_length)");
    check_scale(scale, quantizer);
    check_history(amax_history, length, quantizer);
    const int64_t stride = plan->recipe.state_stride();
    std::vector<float> q(static_cast<size_t>(stride));
    q[0] = scale;
    std::memcpy(q.data() + 1, amax_history, sizeof(float) * static_cast<size_t>(length));
    plan->engine->copy_from_host(plan->state() + quantizer * stride, q.data(), stride * 4);
  });
}

LNMLP_API int32_t lnmlp_plan_get_state_bytes(const lnmlp_plan* plan, int64_t* bytes) {
  return api_guard(__func__, [&] {
    const Held<lnmlp_plan> held(plan, "plan");
    if (bytes == nullptr) fail(LNMLP_ERROR_NULL_POINTER, "bytes is NULL; pass where to write the result");
    *bytes = blob_bytes(*plan);
  });
}

LNMLP_API int32_t lnmlp_plan_export_state(const lnmlp_plan* plan, void* blob, int64_t bytes) {
  return api_guard(__func__, [&] {
    PlanUse use(plan);
    const int64_t need = blob_bytes(*plan);
    if (need == 0) return;
    if (blob == nullptr) fail(LNMLP_ERROR_NULL_POINTER, "blob is NULL");
    if (bytes < need)
      fail(LNMLP_ERROR_INVALID_ARGUMENT, "the blob has ", bytes, " bytes, but the state needs ", need,
           " (lnmlp_plan_get_state_bytes)");
    const std::vector<float> s = read_state(*plan);
    BlobHeader h{};
    std::memcpy(h.magic, kBlobMagic, sizeof h.magic);
    h.version = kBlobVersion;
    h.recipe = static_cast<int32_t>(plan->recipe.recipe);
    h.history_len = plan->recipe.history_len;
    h.quantizers = kQuantizerCount;
    std::memcpy(blob, &h, sizeof h);
    std::memcpy(static_cast<char*>(blob) + sizeof h, s.data(), s.size() * sizeof(float));
  });
}

LNMLP_API int32_t lnmlp_plan_import_state(lnmlp_plan* plan, const void* blob, int64_t bytes) {
  return api_guard(__func__, [&] {
    PlanUse use(plan);
    const int64_t need = blob_bytes(*plan);
    if (need == 0) {
      if (bytes != 0)
        fail(LNMLP_ERROR_INVALID_ARGUMENT, "this plan's recipe keeps no quantizer state; the blob must be empty");
      return;
    }
    if (blob == nullptr) fail(LNMLP_ERROR_NULL_POINTER, "blob is NULL");
    if (bytes < static_cast<int64_t>(sizeof(BlobHeader)))
      fail(LNMLP_ERROR_INVALID_ARGUMENT, "the blob has ", bytes, " bytes, less than its 24-byte header");
    BlobHeader h;
    std::memcpy(&h, blob, sizeof h);
    if (std::memcmp(h.magic, kBlobMagic, sizeof h.magic) != 0)
      fail(LNMLP_ERROR_INVALID_ARGUMENT, "the blob is not an lnmlp quantizer state (bad magic)");
    if (h.version != kBlobVersion)
      fail(LNMLP_ERROR_INVALID_ARGUMENT, "the blob's version is ", h.version, "; this library reads version ",
           kBlobVersion);
    if (h.recipe != static_cast<int32_t>(plan->recipe.recipe) || h.quantizers != kQuantizerCount)
      fail(LNMLP_ERROR_INVALID_ARGUMENT, "the blob holds the state of recipe ", h.recipe, ", not this plan's ",
           static_cast<int32_t>(plan->recipe.recipe));
    if (h.history_len != plan->recipe.history_len)
      fail(LNMLP_ERROR_INVALID_ARGUMENT, "the blob's amax history has ", h.history_len, " entries, this plan's ",
           plan->recipe.history_len);
    if (bytes != need)
      fail(LNMLP_ERROR_INVALID_ARGUMENT, "the blob has ", bytes, " bytes; a state of this plan has ", need);
    std::vector<float> s(static_cast<size_t>(plan->recipe.state_floats()));
    std::memcpy(s.data(), static_cast<const char*>(blob) + sizeof h, s.size() * sizeof(float));
    const int64_t stride = plan->recipe.state_stride();
    for (int q = 0; q < kQuantizerCount; ++q) {
      check_scale(s[static_cast<size_t>(q * stride)], q);
      check_history(s.data() + q * stride + 1, stride - 1, q);
    }
    plan->engine->copy_from_host(plan->state(), s.data(), need - static_cast<int64_t>(sizeof h));
  });
}

}  // extern "C"
