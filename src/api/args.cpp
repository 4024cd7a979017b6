#include "args.h"

#include <array>
#include <cstdint>
#include <initializer_list>

#include "common/error.h"
#include "lnmlp.h"
#include "plan/layout.h"

namespace lnmlp {
namespace {

struct Tensor {
  const char* name;
  const void* ptr;
  int64_t bytes;
  bool required;  // true: must be non-NULL; false: must be NULL
  bool output;
  const char* why_null = "";  // why a NULL is required, when it is
  bool optional = false;      // with required: NULL is accepted too (the backend does not read it)
  int64_t align = 0;          // the alignment it needs; 0: its element's (the I/O dtype)
};

constexpr const char* kNoBeta = " (RMSNorm has no beta)";
constexpr const char* kNoBias1 = " (the descriptor disabled bias1; see lnmlp_desc_set_bias)";
constexpr const char* kNoBias2 = " (the descriptor disabled bias2; see lnmlp_desc_set_bias)";
constexpr const char* kNoSaved = " (this plan saves nothing)";
constexpr const char* kNotThisPart = " in this part of backward";

// Byte sizes of every tensor of the block in the plan's dtype.
struct Sizes {
  SavedLayout saved_layout;  // the call's
  int64_t th, h, w1, b1, w2, saved;
  int64_t w;                      // W1's and W2's element bytes (their dtype's)
  int64_t g, dw1, db1, dw2, db2;  // dW1, db1, dW2, db2 in their dtype (g: its element's bytes)
  Sizes(const lnmlp_plan& plan, int64_t tokens) {
    const Config& c = plan.cfg;
    const int64_t e = numerics::dtype_bytes(c.dtype);
    th = tokens * c.hidden * e;  // x, y, dy, dx: the call's rows (this rank's under sequence parallelism)
    saved_layout = plan.saved_of_call(tokens);
    saved = saved_layout.total_bytes;
    h = c.hidden * e;
    w = numerics::dtype_bytes(c.weight_type());
    w1 = c.hidden * c.act_width() * w;
    b1 = c.act_width() * e;
    w2 = c.ffn * c.hidden * w;
    g = numerics::dtype_bytes(c.param_grad_type());
    dw1 = c.hidden * c.act_width() * g;
    db1 = b1 / e * g;
    dw2 = c.ffn * c.hidden * g;
    db2 = h / e * g;
  }
};

// A call's tensors, the saved buffer's sections one by one where the call passes them apart. In
// an array, not a vector: checking arguments must not allocate.
class TensorList {
 public:
  TensorList(std::initializer_list<Tensor> list) {
    for (const Tensor& t : list) items_[n_++] = t;
  }
  // The saved buffer (one tensor) or its sections (LNMLP_CALL_SAVED_SECTIONS), required where the
  // plan saves them, otherwise NULL; with `optional` NULL is accepted too. Aligned as the engine
  // asks.
  void add_saved(const lnmlp_plan& plan, const SavedBuffer& saved, const Sizes& s, bool required, bool output,
                 const char* why_null, bool optional) {
    const int64_t align = plan.engine->alignment();
    if (!saved.apart) {
      items_[n_++] = {"saved", saved.base, s.saved, required, output, why_null, optional, align};
      return;
    }
    static constexpr const char* kNotSaved = " (the plan does not save this section)";
    for (const Region* r : s.saved_layout.regions()) {
      const bool present = required && r->present();
      items_[n_++] = {saved_section_name(r->section),
                      saved.sections[r->section],
                      r->bytes,
                      present,
                      output,
                      present || !required ? why_null : kNotSaved,
                      optional,
                      align};
    }
  }
  const Tensor* begin() const { return items_.data(); }
  size_t size() const { return n_; }

 private:
  std::array<Tensor, 32> items_{};
  size_t n_ = 0;
};

void check_tensors(const lnmlp_plan& plan, const TensorList& list) {
  const Tensor* ts = list.begin();
  const size_t n = list.size();
  const int64_t elem = numerics::dtype_bytes(plan.cfg.dtype);
  for (size_t i = 0; i < n; ++i) {
    const Tensor& t = ts[i];
    if (t.required && !t.optional && t.ptr == nullptr)
      fail(LNMLP_ERROR_NULL_POINTER, t.name, " is NULL, but this plan needs it");
    if (!t.required && t.ptr != nullptr)
      fail(LNMLP_ERROR_INVALID_ARGUMENT, t.name, " must be NULL for this plan", t.why_null);
    if (t.ptr == nullptr) continue;
    const int64_t align = t.align > 0 ? t.align : elem;
    if (reinterpret_cast<uintptr_t>(t.ptr) % static_cast<uintptr_t>(align) != 0)
      fail(LNMLP_ERROR_MISALIGNED, t.name, " (", t.ptr, ") is not aligned to ", align, " bytes");
  }
  // Outputs must not overlap any other tensor.
  for (size_t i = 0; i < n; ++i) {
    if (!ts[i].output || ts[i].ptr == nullptr) continue;
    const auto a0 = reinterpret_cast<uintptr_t>(ts[i].ptr);
    const auto a1 = a0 + static_cast<uintptr_t>(ts[i].bytes);
    for (size_t j = 0; j < n; ++j) {
      if (j == i || ts[j].ptr == nullptr) continue;
      const auto b0 = reinterpret_cast<uintptr_t>(ts[j].ptr);
      const auto b1 = b0 + static_cast<uintptr_t>(ts[j].bytes);
      if (a0 < b1 && b0 < a1)
        fail(LNMLP_ERROR_INVALID_ARGUMENT, "output ", ts[i].name, " overlaps ", ts[j].name,
             "; outputs must not share memory with any other tensor");
    }
  }
}

constexpr int32_t kAmaxFlags = LNMLP_CALL_AMAX_MEASURE | LNMLP_CALL_AMAX_GIVEN_LN_OUT | LNMLP_CALL_AMAX_GIVEN_W1 |
                               LNMLP_CALL_AMAX_GIVEN_ACT_OUT | LNMLP_CALL_AMAX_GIVEN_W2 | LNMLP_CALL_AMAX_GIVEN_DY |
                               LNMLP_CALL_AMAX_GIVEN_DH;
static_assert(LNMLP_CALL_AMAX_MEASURE == kAmaxMeasure && LNMLP_CALL_AMAX_GIVEN_LN_OUT == 1 << kAmaxGivenShift &&
                  LNMLP_CALL_AMAX_GIVEN_DH == LNMLP_CALL_AMAX_GIVEN_LN_OUT << LNMLP_QUANTIZER_DH,
              "the LNMLP_CALL_AMAX_* flags are plan/call_args.h's bits");

// The call's token count, flags and FP8 state (or a CURRENT plan's amax array).
void check_call(const lnmlp_plan& plan, int64_t tokens, const float* fp8_state, int32_t amax) {
  const int64_t most = plan.cfg.rows();
  if (tokens < 0 || tokens > most)
    fail(LNMLP_ERROR_INVALID_ARGUMENT, "tokens must be in [0, ", most, "] (the plan's ",
         plan.cfg.sequence_parallel() ? "rows per rank" : "most tokens", "), got ", tokens);
  // Per-tensor amaxes in stages: current scaling's, and NVFP4's global ones (two per quantizer).
  const bool staged = plan.recipe.recipe == Recipe::Current || plan.recipe.nvfp4();
  if (amax != 0 && !staged)
    fail(LNMLP_ERROR_INVALID_ARGUMENT,
         "the LNMLP_CALL_AMAX_* flags (amaxes in stages) are for LNMLP_RECIPE_CURRENT and LNMLP_RECIPE_NVFP4 plans "
         "only");
  if (amax != 0 && fp8_state == nullptr)
    fail(LNMLP_ERROR_NULL_POINTER, "fp8_state is NULL, but the LNMLP_CALL_AMAX_* flags need the amax array there (",
         plan.recipe.nvfp4() ? "float32 [LNMLP_QUANTIZER_COUNT][2] for NVFP4" : "float32 [LNMLP_QUANTIZER_COUNT]", ")");
  if (fp8_state == nullptr) return;
  if (staged && amax == 0)
    fail(LNMLP_ERROR_INVALID_ARGUMENT,
         "fp8_state must be NULL: this plan's recipe keeps no quantizer state (a CURRENT or NVFP4 plan takes an "
         "amax array there only with LNMLP_CALL_AMAX_* flags)");
  if (!plan.recipe.stateful() && !staged)
    fail(LNMLP_ERROR_INVALID_ARGUMENT,
         "fp8_state must be NULL: this plan's recipe keeps no quantizer state (only LNMLP_RECIPE_DELAYED does)");
  if (reinterpret_cast<uintptr_t>(fp8_state) % alignof(float) != 0)
    fail(LNMLP_ERROR_MISALIGNED, "fp8_state (", static_cast<const void*>(fp8_state), ") is not aligned to ",
         alignof(float), " bytes");
}

}  // namespace

bool check_call_flags(int32_t flags) {
  if ((flags & ~(LNMLP_CALL_WEIGHTS_UNCHANGED | LNMLP_CALL_SAVED_SECTIONS | kAmaxFlags)) != 0)
    fail(LNMLP_ERROR_INVALID_ARGUMENT, "flags must be LNMLP_CALL_* values (LNMLP_CALL_DEFAULT, ",
         "LNMLP_CALL_WEIGHTS_UNCHANGED, LNMLP_CALL_SAVED_SECTIONS, LNMLP_CALL_AMAX_*), got ", flags);
  return (flags & LNMLP_CALL_WEIGHTS_UNCHANGED) != 0;
}

static_assert(LNMLP_SAVED_COUNT == kSavedSections, "plan/layout.h's sections are lnmlp.h's");

SavedBuffer saved_buffer(const void* saved, int32_t flags) {
  if ((flags & LNMLP_CALL_SAVED_SECTIONS) == 0) return {saved};
  SavedBuffer b;
  b.apart = true;
  if (saved != nullptr)  // NULL: no section, as a NULL buffer is none
    for (int i = 0; i < kSavedSections; ++i) b.sections[i] = static_cast<void* const*>(saved)[i];
  return b;
}

int32_t amax_flags(int32_t flags) { return flags & kAmaxFlags; }

void check_forward_args(const lnmlp_plan& plan, const ForwardArgs& a) {
  const Config& c = plan.cfg;
  check_call(plan, a.tokens, a.fp8_state, a.amax);
  const Sizes s(plan, a.tokens);
  const bool none = a.tokens == 0;  // a call with no tokens reads and writes no token's tensor: NULL is fine
  const bool saves = plan.saved.total_bytes > 0;
  TensorList list{{"x", a.x, s.th, true, false, "", none},
                  {"gamma", a.gamma, s.h, true, false},
                  {"beta", a.beta, s.h, c.has_beta(), false, kNoBeta},
                  {"w1", a.w1, s.w1, true, false, "", false, s.w},
                  {"b1", a.b1, s.b1, c.has_bias1, false, kNoBias1},
                  {"w2", a.w2, s.w2, true, false, "", false, s.w},
                  {"b2", a.b2, s.h, c.has_bias2, false, kNoBias2},
                  {"y", a.y, s.th, true, true, "", none}};
  list.add_saved(plan, a.saved, s, saves, true, kNoSaved, none);
  check_tensors(plan, list);
}

void check_backward_args(const lnmlp_plan& plan, const BackwardArgs& a) {
  const Config& c = plan.cfg;
  if (c.remat == Remat::ForwardOnly)
    fail(LNMLP_ERROR_INVALID_ARGUMENT,
         "this plan was created with LNMLP_REMAT_FORWARD_ONLY and saves nothing for backward; "
         "create the plan with another remat policy to train");
  check_call(plan, a.tokens, a.fp8_state, a.amax);
  const Sizes s(plan, a.tokens);
  const bool none = a.tokens == 0;
  // Which tensors the part takes (the others must be NULL): the weights call reads dy, saved and
  // deferred and writes dW1 and dW2; the data call the rest, and writes deferred.
  const bool data = a.part != BackwardPart::Weights, weights = a.part != BackwardPart::Data;
  const bool split = a.part != BackwardPart::Whole;
  const int64_t deferred = split ? plan.deferred_bytes(a.tokens) : 0;  // only the two calls take one
  const char* why = kNotThisPart;
  TensorList list{{"dy", a.dy, s.th, true, false, "", none},
                  {"x", a.x, s.th, data, false, why, none},
                  {"gamma", a.gamma, s.h, data, false, why},
                  {"beta", a.beta, s.h, data && c.has_beta(), false, data ? kNoBeta : why},
                  {"w1", a.w1, s.w1, data, false, why, false, s.w},
                  // b1 is read only when GEMM1 is recomputed (SAVE_STATS); otherwise it may be NULL.
                  {"b1", a.b1, s.b1, data && c.has_bias1, false, data ? kNoBias1 : why, c.remat != Remat::SaveStats},
                  {"w2", a.w2, s.w2, data, false, why, false, s.w},
                  {"dx", a.dx, s.th, data, true, why, none},
                  {"dgamma", a.dgamma, s.h, data, true, why},
                  {"dbeta", a.dbeta, s.h, data && c.has_beta(), true, data ? kNoBeta : why},
                  {"dw1", a.dw1, s.dw1, weights, true, why, false, s.g},
                  {"db1", a.db1, s.db1, data && c.has_bias1, true, data ? kNoBias1 : why, false, s.g},
                  {"dw2", a.dw2, s.dw2, weights, true, why, false, s.g},
                  {"db2", a.db2, s.db2, data && c.has_bias2, true, data ? kNoBias2 : why, false, s.g},
                  // Written by the data call, read by the weights call; aligned as the saved buffer.
                  {"deferred", a.deferred, deferred, split, data, why, none, plan.engine->alignment()}};
  list.add_saved(plan, a.saved, s, true, false, "", none);
  check_tensors(plan, list);
}

}  // namespace lnmlp
