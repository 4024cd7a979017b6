// The public C API's contract, tested through lnmlp.h only: every bad input of docs/design.md,
// "Errors, safety and threads", returns its own status and a message naming the argument, and
// leaves descriptors, plans and output buffers exactly as they were; handles, workspace,
// threads, versions and queries.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dtype_convert.h"
#include "lnmlp.h"
#include "reference.h"

namespace {

constexpr uint8_t kSentinel = 0xA5;
constexpr size_t kSlack = 512;  // bytes around every buffer, so tests can shift pointers safely

// ---------------------------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------------------------

// A byte buffer whose data() is 256-byte aligned, with kSlack spare bytes after it.
class Buf {
 public:
  Buf() = default;
  explicit Buf(size_t bytes) : bytes_(bytes), storage_(bytes + kSlack + 256, kSentinel) {
    const auto base = reinterpret_cast<uintptr_t>(storage_.data());
    p_ = storage_.data() + ((256 - base % 256) % 256);
  }
  Buf(Buf&&) = default;
  Buf& operator=(Buf&&) = default;
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;

  uint8_t* data() const { return p_; }
  size_t size() const { return bytes_; }
  void fill(uint8_t v) {
    if (p_) std::memset(p_, v, bytes_);
  }
  std::vector<uint8_t> copy() const { return p_ ? std::vector<uint8_t>(p_, p_ + bytes_) : std::vector<uint8_t>{}; }
  bool all(uint8_t v) const {
    for (size_t i = 0; i < bytes_; ++i)
      if (p_[i] != v) return false;
    return true;
  }

 private:
  size_t bytes_ = 0;
  std::vector<uint8_t> storage_;
  uint8_t* p_ = nullptr;
};

size_t elem_bytes(int32_t dtype) { return dtype == LNMLP_DTYPE_F32 ? 4 : 2; }

// Writes n values exactly representable in every dtype (k/64, |k| <= 64; or 1 + k/128 for scales).
void fill_values(Buf& b, int32_t dtype, size_t n, uint32_t seed, bool around_one = false) {
  uint32_t s = seed * 2654435761u + 12345u;
  for (size_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    const int k = static_cast<int>((s >> 8) % 129) - 64;
    const float v = around_one ? 1.0f + static_cast<float>(k / 2) / 128.0f : static_cast<float>(k) / 64.0f;
    if (dtype == LNMLP_DTYPE_F32) {
      std::memcpy(b.data() + 4 * i, &v, 4);
    } else {
      const uint16_t h = dtype == LNMLP_DTYPE_BF16 ? lnmlp_ref::bf16_from_double(v) : lnmlp_ref::f16_from_double(v);
      std::memcpy(b.data() + 2 * i, &h, 2);
    }
  }
}

// True when `word` occurs in `msg` not preceded by an identifier character (so "b1" is not found
// inside "db1", nor "x" inside "0x1234").
bool names(const std::string& msg, const std::string& word) {
  for (size_t pos = msg.find(word); pos != std::string::npos; pos = msg.find(word, pos + 1)) {
    const char before = pos == 0 ? ' ' : msg[pos - 1];
    if (!(std::isalnum(static_cast<unsigned char>(before)) || before == '_')) return true;
  }
  return false;
}

std::string last_error() {
  const char* m = lnmlp_last_error();
  return m ? std::string(m) : std::string("<NULL>");
}

// Checks a failed call: its status, a non-empty message naming `word`.
#define EXPECT_FAILS(call, status, word)                                                              \
  do {                                                                                                \
    const int32_t st_ = (call);                                                                       \
    EXPECT_EQ(st_, (status)) << #call << " -> " << lnmlp_status_string(st_) << ": " << last_error(); \
    EXPECT_NE(lnmlp_last_error(), nullptr);                                                           \
    EXPECT_FALSE(last_error().empty()) << #call;                                                      \
    EXPECT_TRUE(names(last_error(), (word))) << #call << ": message \"" << last_error()               \
                                             << "\" does not name " << (word);                        \
  } while (0)

#define ASSERT_OK(call) ASSERT_EQ((call), LNMLP_SUCCESS) << #call << ": " << last_error()
#define EXPECT_OK(call) EXPECT_EQ((call), LNMLP_SUCCESS) << #call << ": " << last_error()

// ---------------------------------------------------------------------------------------------
// A configuration, and a plan with every buffer it needs
// ---------------------------------------------------------------------------------------------

struct Cfg {
  const char* name;
  int64_t T, H, F;
  int32_t norm, dtype, remat;
  std::vector<int32_t> acts;
  bool bias1, bias2, ext_ws;
  int32_t zero_centered = 0;
  float eps = 1e-6f;
  bool clamped_params = false;
  float limit = 7.0f, alpha = 1.702f, offset = 1.0f;
  int64_t A() const { return static_cast<int64_t>(acts.size()); }
  bool ln() const { return norm == LNMLP_NORM_LAYERNORM; }
};

std::ostream& operator<<(std::ostream& os, const Cfg& c) { return os << c.name; }

lnmlp_desc* make_desc(const Cfg& c) {
  lnmlp_desc* d = nullptr;
  EXPECT_OK(lnmlp_desc_create(&d));
  EXPECT_OK(lnmlp_desc_set_shape(d, c.T, c.H, c.F));
  EXPECT_OK(lnmlp_desc_set_norm(d, c.norm));
  EXPECT_OK(lnmlp_desc_set_dtype(d, c.dtype));
  EXPECT_OK(lnmlp_desc_set_remat(d, c.remat));
  EXPECT_OK(lnmlp_desc_set_activations(d, static_cast<int32_t>(c.acts.size()), c.acts.data()));
  EXPECT_OK(lnmlp_desc_set_bias(d, c.bias1 ? 1 : 0, c.bias2 ? 1 : 0));
  EXPECT_OK(lnmlp_desc_set_external_workspace(d, c.ext_ws ? 1 : 0));
  EXPECT_OK(lnmlp_desc_set_zero_centered_gamma(d, c.zero_centered));
  EXPECT_OK(lnmlp_desc_set_epsilon(d, c.eps));
  if (c.clamped_params) {
    EXPECT_OK(lnmlp_desc_set_clamped_swiglu(d, c.limit, c.alpha, c.offset));
  }
  return d;
}

enum Role { kRequired, kForbidden, kOptional };

constexpr int kNumFwd = 9;
const char* const kFwdNames[kNumFwd] = {"x", "gamma", "beta", "w1", "b1", "w2", "b2", "y", "saved"};
constexpr int kNumBwd = 15;
const char* const kBwdNames[kNumBwd] = {"dy",     "x",     "gamma", "beta", "w1",  "b1",  "w2", "saved",
                                        "dx",     "dgamma", "dbeta", "dw1",  "db1", "dw2", "db2"};

struct FwdArgs {
  void* p[kNumFwd];
};
struct BwdArgs {
  void* p[kNumBwd];
};

// The most tokens a call of the plan may take (-1 for a handle that is not a plan: the call under
// test then reports the handle).
int64_t plan_tokens(const lnmlp_plan* plan) {
  int64_t rank = 0, dims[LNMLP_MAX_TENSOR_RANK] = {-1, 0, 0};
  int32_t dtype = 0;
  lnmlp_plan_get_tensor_shape(plan, LNMLP_TENSOR_X, LNMLP_TOKENS_MAX, &rank, dims, &dtype);
  return dims[0];
}

int32_t call_forward(lnmlp_plan* plan, const FwdArgs& a) {
  return lnmlp_plan_forward(plan, plan_tokens(plan), a.p[0], a.p[1], a.p[2], a.p[3], a.p[4], a.p[5], a.p[6], a.p[7],
                            a.p[8], nullptr, LNMLP_CALL_DEFAULT, nullptr);
}
int32_t call_backward(lnmlp_plan* plan, const BwdArgs& a) {
  return lnmlp_plan_backward(plan, plan_tokens(plan), a.p[0], a.p[1], a.p[2], a.p[3], a.p[4], a.p[5], a.p[6], a.p[7],
                             a.p[8], a.p[9], a.p[10], a.p[11], a.p[12], a.p[13], a.p[14], nullptr, LNMLP_CALL_DEFAULT,
                             nullptr);
}

// Everything one run produces.
struct Result {
  std::vector<uint8_t> y, saved, dx, dgamma, dbeta, dw1, db1, dw2, db2;
  bool operator==(const Result& o) const {
    return y == o.y && saved == o.saved && dx == o.dx && dgamma == o.dgamma && dbeta == o.dbeta && dw1 == o.dw1 &&
           db1 == o.db1 && dw2 == o.dw2 && db2 == o.db2;
  }
};

struct Block {
  Cfg c;
  lnmlp_plan* plan = nullptr;
  int64_t saved_bytes = 0, ws_bytes = 0, align = 0;
  Buf x, gamma, beta, w1, b1, w2, b2, y, saved, dy, dx, dgamma, dbeta, dw1, db1, dw2, db2, ws, dummy;

  // Creates the plan from `desc` (or from a fresh descriptor made from cfg) and every buffer.
  explicit Block(const Cfg& cfg, const lnmlp_desc* desc = nullptr, uint32_t seed = 1) : c(cfg) {
    lnmlp_desc* own = desc ? nullptr : make_desc(c);
    EXPECT_OK(lnmlp_plan_create(desc ? desc : own, &plan));
    EXPECT_OK(lnmlp_desc_destroy(own));
    if (plan == nullptr) return;
    EXPECT_OK(lnmlp_plan_get_saved_bytes(plan, &saved_bytes));
    EXPECT_OK(lnmlp_plan_get_workspace_bytes(plan, &ws_bytes));
    EXPECT_OK(lnmlp_plan_get_alignment(plan, &align));
    const size_t e = elem_bytes(c.dtype);
    const size_t T = c.T, H = c.H, F = c.F, AF = c.A() * c.F;
    x = Buf(T * H * e), gamma = Buf(H * e), w1 = Buf(H * AF * e), w2 = Buf(F * H * e), dy = Buf(T * H * e);
    fill_values(x, c.dtype, T * H, seed + 1);
    fill_values(gamma, c.dtype, H, seed + 2, true);
    fill_values(w1, c.dtype, H * AF, seed + 3);
    fill_values(w2, c.dtype, F * H, seed + 4);
    fill_values(dy, c.dtype, T * H, seed + 5);
    if (c.ln()) {
      beta = Buf(H * e), dbeta = Buf(H * e);
      fill_values(beta, c.dtype, H, seed + 6);
    }
    if (c.bias1) {
      b1 = Buf(AF * e), db1 = Buf(AF * e);
      fill_values(b1, c.dtype, AF, seed + 7);
    }
    if (c.bias2) {
      b2 = Buf(H * e), db2 = Buf(H * e);
      fill_values(b2, c.dtype, H, seed + 8);
    }
    y = Buf(T * H * e), dx = Buf(T * H * e), dgamma = Buf(H * e), dw1 = Buf(H * AF * e), dw2 = Buf(F * H * e);
    if (saved_bytes > 0) saved = Buf(static_cast<size_t>(saved_bytes));  // else NULL
    dummy = Buf(std::max({T * H, H * AF, F * H}) * e + static_cast<size_t>(saved_bytes));
    if (c.ext_ws) {
      ws = Buf(static_cast<size_t>(ws_bytes));
      EXPECT_OK(lnmlp_plan_attach_workspace(plan, ws.data(), ws_bytes));
    }
  }
  ~Block() { EXPECT_OK(lnmlp_plan_destroy(plan)); }
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;

  bool trains() const { return c.remat != LNMLP_REMAT_FORWARD_ONLY; }

  FwdArgs fwd() const {
    return {{x.data(), gamma.data(), beta.data(), w1.data(), b1.data(), w2.data(), b2.data(), y.data(),
             saved.data()}};
  }
  BwdArgs bwd() const {
    return {{dy.data(), x.data(), gamma.data(), beta.data(), w1.data(), b1.data(), w2.data(), saved.data(),
             dx.data(), dgamma.data(), dbeta.data(), dw1.data(), db1.data(), dw2.data(), db2.data()}};
  }
  Role fwd_role(int i) const {
    switch (i) {
      case 2: return c.ln() ? kRequired : kForbidden;
      case 4: return c.bias1 ? kRequired : kForbidden;
      case 6: return c.bias2 ? kRequired : kForbidden;
      case 8: return saved_bytes > 0 ? kRequired : kForbidden;
      default: return kRequired;
    }
  }
  Role bwd_role(int i) const {
    switch (i) {
      case 3: return c.ln() ? kRequired : kForbidden;
      case 5: return !c.bias1 ? kForbidden : (c.remat == LNMLP_REMAT_SAVE_STATS ? kRequired : kOptional);
      case 10: return c.ln() ? kRequired : kForbidden;
      case 12: return c.bias1 ? kRequired : kForbidden;
      case 14: return c.bias2 ? kRequired : kForbidden;
      default: return kRequired;
    }
  }
  Buf* outputs_fwd[2] = {&y, &saved};
  Buf* outputs_bwd[7] = {&dx, &dgamma, &dbeta, &dw1, &db1, &dw2, &db2};

  void fill_outputs(uint8_t v) {
    for (Buf* b : outputs_fwd) b->fill(v);
    for (Buf* b : outputs_bwd) b->fill(v);
  }
  // Every output buffer still holds the sentinel (nothing was written).
  bool outputs_untouched() const {
    for (const Buf* b : outputs_fwd)
      if (!b->all(kSentinel)) return false;
    for (const Buf* b : outputs_bwd)
      if (!b->all(kSentinel)) return false;
    return true;
  }
  bool bwd_outputs_untouched() const {
    for (const Buf* b : outputs_bwd)
      if (!b->all(kSentinel)) return false;
    return true;
  }

  // Runs forward (and backward when the plan trains) with the default arguments.
  Result run() {
    fill_outputs(kSentinel);
    Result r;
    EXPECT_OK(call_forward(plan, fwd()));
    if (trains()) {
      EXPECT_OK(call_backward(plan, bwd()));
    }
    r.y = y.copy(), r.saved = saved.copy(), r.dx = dx.copy(), r.dgamma = dgamma.copy(), r.dbeta = dbeta.copy();
    r.dw1 = dw1.copy(), r.db1 = db1.copy(), r.dw2 = dw2.copy(), r.db2 = db2.copy();
    return r;
  }
};

// ---------------------------------------------------------------------------------------------
// Plan-level errors, for several configurations (parameterized)
// ---------------------------------------------------------------------------------------------

const Cfg kConfigs[] = {
    {"ln_bf16_swiglu_bias_saveall", 7, 16, 24, LNMLP_NORM_LAYERNORM, LNMLP_DTYPE_BF16, LNMLP_REMAT_SAVE_ALL,
     {LNMLP_ACT_SILU, LNMLP_ACT_LINEAR}, true, true, false},
    {"rms_f32_gelu_nobias_savestats", 5, 12, 20, LNMLP_NORM_RMSNORM, LNMLP_DTYPE_F32, LNMLP_REMAT_SAVE_STATS,
     {LNMLP_ACT_GELU}, false, false, false},
    {"ln_f16_relu_bias1_saveffn1_extws", 6, 8, 16, LNMLP_NORM_LAYERNORM, LNMLP_DTYPE_F16, LNMLP_REMAT_SAVE_FFN1,
     {LNMLP_ACT_RELU}, true, false, true},
    {"rms_bf16_clamped_bias1_savestats", 4, 16, 8, LNMLP_NORM_RMSNORM, LNMLP_DTYPE_BF16, LNMLP_REMAT_SAVE_STATS,
     {LNMLP_ACT_CLAMPED_SILU, LNMLP_ACT_CLAMPED_LINEAR}, true, false, false, 1, 1e-3f, true, 0.5f, 1.5f, 0.75f},
    {"ln_f32_sreglu_bias2_forwardonly", 3, 8, 8, LNMLP_NORM_LAYERNORM, LNMLP_DTYPE_F32, LNMLP_REMAT_FORWARD_ONLY,
     {LNMLP_ACT_SQUARED_RELU, LNMLP_ACT_LINEAR}, false, true, false},
};

class PlanErrors : public ::testing::TestWithParam<Cfg> {
 protected:
  void SetUp() override {
    b_ = std::make_unique<Block>(GetParam());
    ASSERT_NE(b_->plan, nullptr);
    baseline_ = b_->run();
    // The baseline is reproducible at all (so that comparing against it means something).
    ASSERT_TRUE(b_->run() == baseline_);
  }
  // The plan still runs and gives the bits it gave before the failures.
  void ExpectPlanUnchanged() {
    const Result r = b_->run();
    EXPECT_TRUE(r == baseline_) << "a failed call changed the plan's results";
  }
  std::unique_ptr<Block> b_;
  Result baseline_;
};

TEST_P(PlanErrors, ForwardRejectsMissingAndForbiddenTensors) {
  Block& b = *b_;
  for (int i = 0; i < kNumFwd; ++i) {
    SCOPED_TRACE(kFwdNames[i]);
    FwdArgs a = b.fwd();
    b.fill_outputs(kSentinel);
    if (b.fwd_role(i) == kRequired) {
      a.p[i] = nullptr;
      EXPECT_FAILS(call_forward(b.plan, a), LNMLP_ERROR_NULL_POINTER, kFwdNames[i]);
    } else {
      a.p[i] = b.dummy.data();
      EXPECT_FAILS(call_forward(b.plan, a), LNMLP_ERROR_INVALID_ARGUMENT, kFwdNames[i]);
    }
    EXPECT_TRUE(b.outputs_untouched());
  }
  ExpectPlanUnchanged();
}

TEST_P(PlanErrors, BackwardRejectsMissingAndForbiddenTensors) {
  Block& b = *b_;
  if (!b.trains()) return;  // see BackwardOnForwardOnlyPlanIsRefused
  for (int i = 0; i < kNumBwd; ++i) {
    SCOPED_TRACE(kBwdNames[i]);
    BwdArgs a = b.bwd();
    b.fill_outputs(kSentinel);
    switch (b.bwd_role(i)) {
      case kRequired:
        a.p[i] = nullptr;
        EXPECT_FAILS(call_backward(b.plan, a), LNMLP_ERROR_NULL_POINTER, kBwdNames[i]);
        EXPECT_TRUE(b.outputs_untouched());
        break;
      case kForbidden:
        a.p[i] = b.dummy.data();
        EXPECT_FAILS(call_backward(b.plan, a), LNMLP_ERROR_INVALID_ARGUMENT, kBwdNames[i]);
        EXPECT_TRUE(b.outputs_untouched());
        break;
      case kOptional: {  // b1 when the plan does not recompute GEMM1: NULL is fine, same result
        b.run();
        a = b.bwd();
        a.p[i] = nullptr;
        for (Buf* o : b.outputs_bwd) o->fill(kSentinel);
        EXPECT_OK(call_backward(b.plan, a));
        EXPECT_EQ(b.dw1.copy(), baseline_.dw1);
        EXPECT_EQ(b.db1.copy(), baseline_.db1);
        EXPECT_EQ(b.dx.copy(), baseline_.dx);
        break;
      }
    }
  }
  ExpectPlanUnchanged();
}

TEST_P(PlanErrors, RejectsMisalignedTensors) {
  Block& b = *b_;
  // Every present tensor, one byte off (an odd address for bf16/f16).
  for (int i = 0; i < kNumFwd; ++i) {
    SCOPED_TRACE(kFwdNames[i]);
    FwdArgs a = b.fwd();
    if (a.p[i] == nullptr) continue;
    a.p[i] = static_cast<uint8_t*>(a.p[i]) + 1;
    b.fill_outputs(kSentinel);
    EXPECT_FAILS(call_forward(b.plan, a), LNMLP_ERROR_MISALIGNED, kFwdNames[i]);
    EXPECT_TRUE(b.outputs_untouched());
  }
  if (b.trains()) {
    for (int i = 0; i < kNumBwd; ++i) {
      SCOPED_TRACE(kBwdNames[i]);
      BwdArgs a = b.bwd();
      if (a.p[i] == nullptr) continue;
      a.p[i] = static_cast<uint8_t*>(a.p[i]) + 1;
      b.fill_outputs(kSentinel);
      EXPECT_FAILS(call_backward(b.plan, a), LNMLP_ERROR_MISALIGNED, kBwdNames[i]);
      EXPECT_TRUE(b.outputs_untouched());
    }
  }
  // saved aligned for its elements but not to lnmlp_plan_get_alignment.
  EXPECT_EQ(b.align, 64) << "lnmlp.h documents 64 bytes on the CPU backend";
  ASSERT_GE(b.align, 1);
  EXPECT_EQ(b.align & (b.align - 1), 0) << "alignment " << b.align << " is not a power of two";
  if (b.saved_bytes > 0 && b.align > 1) {
    const int64_t off = b.align / 2;
    FwdArgs a = b.fwd();
    a.p[8] = b.saved.data() + off;
    b.fill_outputs(kSentinel);
    EXPECT_FAILS(call_forward(b.plan, a), LNMLP_ERROR_MISALIGNED, "saved");
    EXPECT_TRUE(b.outputs_untouched());
    if (b.trains()) {
      BwdArgs ba = b.bwd();
      ba.p[7] = b.saved.data() + off;
      EXPECT_FAILS(call_backward(b.plan, ba), LNMLP_ERROR_MISALIGNED, "saved");
      EXPECT_TRUE(b.outputs_untouched());
    }
  }
  ExpectPlanUnchanged();
}

TEST_P(PlanErrors, SavedAtExactlyTheReportedAlignmentWorks) {
  Block& b = *b_;
  if (b.saved_bytes == 0 || b.align >= 256) return;  // nothing saved, or no room for the test
  // A saved buffer aligned to lnmlp_plan_get_alignment but not more (256 + align).
  Buf big(static_cast<size_t>(b.saved_bytes + 256 + b.align));
  uint8_t* s = big.data() + 256 + b.align;
  ASSERT_NE(reinterpret_cast<uintptr_t>(s) % static_cast<uintptr_t>(2 * b.align), 0u);
  b.fill_outputs(kSentinel);
  FwdArgs a = b.fwd();
  a.p[8] = s;
  ASSERT_OK(call_forward(b.plan, a));
  EXPECT_EQ(b.y.copy(), baseline_.y);
  if (b.trains()) {
    BwdArgs ba = b.bwd();
    ba.p[7] = s;
    ASSERT_OK(call_backward(b.plan, ba));
    EXPECT_EQ(b.dx.copy(), baseline_.dx);
    EXPECT_EQ(b.dw1.copy(), baseline_.dw1);
    EXPECT_EQ(b.dgamma.copy(), baseline_.dgamma);
  }
}

TEST_P(PlanErrors, RejectsOverlappingBuffers) {
  Block& b = *b_;
  const size_t e = elem_bytes(b.c.dtype);
  const std::vector<uint8_t> x_before = b.x.copy(), w1_before = b.w1.copy(), dy_before = b.dy.copy();
  {  // y is x
    FwdArgs a = b.fwd();
    a.p[7] = b.x.data();
    EXPECT_FAILS(call_forward(b.plan, a), LNMLP_ERROR_INVALID_ARGUMENT, "y");
    EXPECT_TRUE(names(last_error(), "x")) << last_error();
  }
  {  // y overlaps w1 by its tail
    FwdArgs a = b.fwd();
    a.p[7] = b.w1.data() + b.w1.size() - e;
    EXPECT_FAILS(call_forward(b.plan, a), LNMLP_ERROR_INVALID_ARGUMENT, "w1");
  }
  if (b.saved_bytes > 0) {  // saved overlaps y
    FwdArgs a = b.fwd();
    a.p[8] = b.y.data();
    b.fill_outputs(kSentinel);
    EXPECT_FAILS(call_forward(b.plan, a), LNMLP_ERROR_INVALID_ARGUMENT, "saved");
    EXPECT_TRUE(b.outputs_untouched());
    // ... or gamma
    a = b.fwd();
    a.p[8] = b.gamma.data();
    EXPECT_FAILS(call_forward(b.plan, a), LNMLP_ERROR_INVALID_ARGUMENT, "gamma");
  }
  if (b.trains()) {
    b.fill_outputs(kSentinel);
    {  // dx is dy
      BwdArgs a = b.bwd();
      a.p[8] = b.dy.data();
      EXPECT_FAILS(call_backward(b.plan, a), LNMLP_ERROR_INVALID_ARGUMENT, "dx");
      EXPECT_TRUE(names(last_error(), "dy")) << last_error();
    }
    {  // dw2 overlaps dw1 (two outputs)
      BwdArgs a = b.bwd();
      a.p[13] = b.dw1.data() + e;
      EXPECT_FAILS(call_backward(b.plan, a), LNMLP_ERROR_INVALID_ARGUMENT, "dw1");
    }
    {  // dgamma inside saved
      BwdArgs a = b.bwd();
      a.p[9] = b.saved.data() + b.saved.size() / 2 / 256 * 256;
      EXPECT_FAILS(call_backward(b.plan, a), LNMLP_ERROR_INVALID_ARGUMENT, "saved");
    }
    {  // dw1 is w1
      BwdArgs a = b.bwd();
      a.p[11] = b.w1.data();
      EXPECT_FAILS(call_backward(b.plan, a), LNMLP_ERROR_INVALID_ARGUMENT, "dw1");
    }
    EXPECT_TRUE(b.outputs_untouched());
  }
  EXPECT_EQ(b.x.copy(), x_before);
  EXPECT_EQ(b.w1.copy(), w1_before);
  EXPECT_EQ(b.dy.copy(), dy_before);
  ExpectPlanUnchanged();
}

TEST_P(PlanErrors, AdjacentButDisjointBuffersAreFine) {
  Block& b = *b_;
  // x and y back to back in one allocation: touching, not overlapping.
  const size_t n = b.x.size();
  Buf both(2 * n);
  both.fill(kSentinel);
  std::memcpy(both.data(), b.x.data(), n);
  FwdArgs a = b.fwd();
  a.p[0] = both.data();
  a.p[7] = both.data() + n;
  b.fill_outputs(kSentinel);
  ASSERT_OK(call_forward(b.plan, a));
  EXPECT_EQ(std::vector<uint8_t>(both.data() + n, both.data() + 2 * n), baseline_.y);
}

TEST_P(PlanErrors, SavedBytesFollowTheRematPolicy) {
  const Block& b = *b_;
  int64_t per_token = -1;
  ASSERT_OK(lnmlp_plan_get_saved_bytes_per_token(b.plan, &per_token));
  // The formulas documented with LNMLP_REMAT_* in lnmlp.h.
  const int64_t e = static_cast<int64_t>(elem_bytes(b.c.dtype)), stats = b.c.ln() ? 8 : 4;
  const int64_t H = b.c.H, F = b.c.F, AF = b.c.A() * b.c.F;
  switch (b.c.remat) {
    case LNMLP_REMAT_SAVE_ALL: EXPECT_EQ(per_token, stats + e * (H + AF + F)); break;
    case LNMLP_REMAT_SAVE_FFN1: EXPECT_EQ(per_token, stats + e * AF); break;
    case LNMLP_REMAT_SAVE_STATS: EXPECT_EQ(per_token, stats); break;
    default: EXPECT_EQ(per_token, 0); break;
  }
  if (b.trains()) {
    EXPECT_GE(b.saved_bytes, per_token * b.c.T);
  } else {
    EXPECT_EQ(b.saved_bytes, 0);
  }
}

TEST_P(PlanErrors, BackwardOnForwardOnlyPlanIsRefused) {
  Block& b = *b_;
  if (b.trains()) return;  // only the forward-only configuration
  BwdArgs a = b.bwd();
  b.fill_outputs(kSentinel);
  EXPECT_FAILS(call_backward(b.plan, a), LNMLP_ERROR_INVALID_ARGUMENT, "LNMLP_REMAT_FORWARD_ONLY");
  a.p[7] = b.dummy.data();  // whatever is passed as saved
  EXPECT_FAILS(call_backward(b.plan, a), LNMLP_ERROR_INVALID_ARGUMENT, "LNMLP_REMAT_FORWARD_ONLY");
  EXPECT_TRUE(b.outputs_untouched());
  ExpectPlanUnchanged();
}

TEST_P(PlanErrors, RepeatedFailuresInterleavedWithRuns) {
  Block& b = *b_;
  for (int round = 0; round < 3; ++round) {
    FwdArgs a = b.fwd();
    a.p[0] = nullptr;
    EXPECT_EQ(call_forward(b.plan, a), LNMLP_ERROR_NULL_POINTER);
    EXPECT_TRUE(b.run() == baseline_);
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, PlanErrors, ::testing::ValuesIn(kConfigs),
                         [](const ::testing::TestParamInfo<Cfg>& info) { return std::string(info.param.name); });

// ---------------------------------------------------------------------------------------------
// Descriptor setters: bad values, and the descriptor unchanged afterwards
// ---------------------------------------------------------------------------------------------

// A configuration where every descriptor setting shows in the results or the sizes.
Cfg desc_cfg() {
  return {"desc", 6, 16, 12, LNMLP_NORM_LAYERNORM, LNMLP_DTYPE_F32, LNMLP_REMAT_SAVE_FFN1,
          {LNMLP_ACT_CLAMPED_SILU, LNMLP_ACT_CLAMPED_LINEAR}, true, true, false, 1, 1e-3f, true, 0.5f, 1.5f, 0.75f};
}

struct Fingerprint {
  Result r;
  int64_t saved_bytes, ws_bytes;
  bool operator==(const Fingerprint& o) const {
    return r == o.r && saved_bytes == o.saved_bytes && ws_bytes == o.ws_bytes;
  }
};

// Runs a plan made from d with desc_cfg()'s buffers; when `expect` is given and the plan's sizes
// differ from it (the descriptor changed), it does not run (the buffers would not fit).
Fingerprint fingerprint(const lnmlp_desc* d, const Fingerprint* expect = nullptr) {
  Block b(desc_cfg(), d);
  if (b.plan == nullptr) return {};
  if (expect && (b.saved_bytes != expect->saved_bytes || b.ws_bytes != expect->ws_bytes))
    return {{}, b.saved_bytes, b.ws_bytes};
  return {b.run(), b.saved_bytes, b.ws_bytes};
}

struct BadSetter {
  const char* what;
  std::function<int32_t(lnmlp_desc*)> call;
  int32_t status;
  const char* word;
};

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

// Token counts for lnmlp_desc_set_prepared_tokens: 1 .. 31, 0, -2, 3.
const int64_t kCounts[34] = {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15, 16, 17,
                             18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 0,  -2, 3};

std::vector<BadSetter> bad_setters() {
  static const int32_t swiglu_bad[2] = {LNMLP_ACT_SILU, 9};
  static const int32_t neg[1] = {-1};
  static const int32_t pair[2] = {LNMLP_ACT_SILU, LNMLP_ACT_LINEAR};
  constexpr int32_t I = LNMLP_ERROR_INVALID_ARGUMENT;
  return {
      {"tokens 0", [](lnmlp_desc* d) { return lnmlp_desc_set_shape(d, 0, 16, 12); }, I, "tokens"},
      {"hidden 0", [](lnmlp_desc* d) { return lnmlp_desc_set_shape(d, 6, 0, 12); }, I, "hidden"},
      {"ffn 0", [](lnmlp_desc* d) { return lnmlp_desc_set_shape(d, 6, 16, 0); }, I, "ffn"},
      {"tokens -1", [](lnmlp_desc* d) { return lnmlp_desc_set_shape(d, -1, 16, 12); }, I, "tokens"},
      {"hidden -5", [](lnmlp_desc* d) { return lnmlp_desc_set_shape(d, 6, -5, 12); }, I, "hidden"},
      {"ffn min", [](lnmlp_desc* d) { return lnmlp_desc_set_shape(d, 6, 16, INT64_MIN); }, I, "ffn"},
      {"norm 2", [](lnmlp_desc* d) { return lnmlp_desc_set_norm(d, 2); }, I, "norm_type"},
      {"norm -1", [](lnmlp_desc* d) { return lnmlp_desc_set_norm(d, -1); }, I, "norm_type"},
      {"zcg 2", [](lnmlp_desc* d) { return lnmlp_desc_set_zero_centered_gamma(d, 2); }, I, "enabled"},
      {"zcg -1", [](lnmlp_desc* d) { return lnmlp_desc_set_zero_centered_gamma(d, -1); }, I, "enabled"},
      {"eps -1e-3", [](lnmlp_desc* d) { return lnmlp_desc_set_epsilon(d, -1e-3f); }, I, "epsilon"},
      {"eps NaN", [](lnmlp_desc* d) { return lnmlp_desc_set_epsilon(d, kNaN); }, I, "epsilon"},
      {"eps inf", [](lnmlp_desc* d) { return lnmlp_desc_set_epsilon(d, kInf); }, I, "epsilon"},
      {"eps -inf", [](lnmlp_desc* d) { return lnmlp_desc_set_epsilon(d, -kInf); }, I, "epsilon"},
      {"acts count 0", [](lnmlp_desc* d) { return lnmlp_desc_set_activations(d, 0, pair); }, I, "count"},
      {"acts count 3", [](lnmlp_desc* d) { return lnmlp_desc_set_activations(d, 3, pair); }, I, "count"},
      {"acts count -1", [](lnmlp_desc* d) { return lnmlp_desc_set_activations(d, -1, pair); }, I, "count"},
      {"acts NULL", [](lnmlp_desc* d) { return lnmlp_desc_set_activations(d, 1, nullptr); }, LNMLP_ERROR_NULL_POINTER,
       "activations"},
      {"acts NULL x2", [](lnmlp_desc* d) { return lnmlp_desc_set_activations(d, 2, nullptr); },
       LNMLP_ERROR_NULL_POINTER, "activations"},
      {"act 9", [](lnmlp_desc* d) { return lnmlp_desc_set_activations(d, 2, swiglu_bad); }, I, "activations"},
      {"act -1", [](lnmlp_desc* d) { return lnmlp_desc_set_activations(d, 1, neg); }, I, "activations"},
      {"limit 0", [](lnmlp_desc* d) { return lnmlp_desc_set_clamped_swiglu(d, 0.0f, 1.702f, 1.0f); }, I, "limit"},
      {"limit -1", [](lnmlp_desc* d) { return lnmlp_desc_set_clamped_swiglu(d, -1.0f, 1.702f, 1.0f); }, I, "limit"},
      {"limit NaN", [](lnmlp_desc* d) { return lnmlp_desc_set_clamped_swiglu(d, kNaN, 1.702f, 1.0f); }, I, "limit"},
      {"limit inf", [](lnmlp_desc* d) { return lnmlp_desc_set_clamped_swiglu(d, kInf, 1.702f, 1.0f); }, I, "limit"},
      {"alpha NaN", [](lnmlp_desc* d) { return lnmlp_desc_set_clamped_swiglu(d, 7.0f, kNaN, 1.0f); }, I, "alpha"},
      {"alpha -inf", [](lnmlp_desc* d) { return lnmlp_desc_set_clamped_swiglu(d, 7.0f, -kInf, 1.0f); }, I, "alpha"},
      {"offset NaN", [](lnmlp_desc* d) { return lnmlp_desc_set_clamped_swiglu(d, 7.0f, 1.702f, kNaN); }, I, "offset"},
      {"offset inf", [](lnmlp_desc* d) { return lnmlp_desc_set_clamped_swiglu(d, 7.0f, 1.702f, kInf); }, I, "offset"},
      {"bias1 2", [](lnmlp_desc* d) { return lnmlp_desc_set_bias(d, 2, 0); }, I, "has_bias1"},
      {"bias2 2", [](lnmlp_desc* d) { return lnmlp_desc_set_bias(d, 0, 2); }, I, "has_bias2"},
      {"bias2 -1 after valid bias1", [](lnmlp_desc* d) { return lnmlp_desc_set_bias(d, 0, -1); }, I, "has_bias2"},
      {"dtype 3", [](lnmlp_desc* d) { return lnmlp_desc_set_dtype(d, 3); }, I, "dtype"},
      {"dtype -1", [](lnmlp_desc* d) { return lnmlp_desc_set_dtype(d, -1); }, I, "dtype"},
      {"remat 4", [](lnmlp_desc* d) { return lnmlp_desc_set_remat(d, 4); }, I, "remat"},
      {"remat -1", [](lnmlp_desc* d) { return lnmlp_desc_set_remat(d, -1); }, I, "remat"},
      {"backend 2", [](lnmlp_desc* d) { return lnmlp_desc_set_backend(d, 2, 0); }, I, "backend"},
      {"backend -1", [](lnmlp_desc* d) { return lnmlp_desc_set_backend(d, -1, 0); }, I, "backend"},
      {"device -1", [](lnmlp_desc* d) { return lnmlp_desc_set_backend(d, LNMLP_BACKEND_CPU, -1); }, I, "device"},
      {"cuda device -1", [](lnmlp_desc* d) { return lnmlp_desc_set_backend(d, LNMLP_BACKEND_CUDA, -1); }, I, "device"},
      {"threads -1", [](lnmlp_desc* d) { return lnmlp_desc_set_num_threads(d, -1); }, I, "num_threads"},
      {"threads 65537", [](lnmlp_desc* d) { return lnmlp_desc_set_num_threads(d, 65537); }, I, "num_threads"},
      // int64_t sizes are checked whole, not after a narrowing (2^32 + 1 would read as 1).
      {"threads 2^32+1", [](lnmlp_desc* d) { return lnmlp_desc_set_num_threads(d, (int64_t{1} << 32) + 1); }, I,
       "num_threads"},
      {"activations count 2^32+1",
       [](lnmlp_desc* d) {
         static const int32_t acts[2] = {LNMLP_ACT_SILU, LNMLP_ACT_LINEAR};
         return lnmlp_desc_set_activations(d, (int64_t{1} << 32) + 1, acts);
       },
       I, "count"},
      {"recipe 6", [](lnmlp_desc* d) { return lnmlp_desc_set_recipe(d, 6); }, I, "recipe"},
      {"nvfp4 disable_rht 2", [](lnmlp_desc* d) { return lnmlp_desc_set_nvfp4_options(d, 2, 0, 0); }, I, "disable_rht"},
      {"nvfp4 disable_stochastic_rounding -1", [](lnmlp_desc* d) { return lnmlp_desc_set_nvfp4_options(d, 0, -1, 0); },
       I, "disable_stochastic_rounding"},
      {"nvfp4 disable_2d_quantization 3", [](lnmlp_desc* d) { return lnmlp_desc_set_nvfp4_options(d, 0, 0, 3); }, I,
       "disable_2d_quantization"},
      {"recipe -1", [](lnmlp_desc* d) { return lnmlp_desc_set_recipe(d, -1); }, I, "recipe"},
      {"fp8 format 2", [](lnmlp_desc* d) { return lnmlp_desc_set_fp8_format(d, 2); }, I, "format"},
      {"fp8 format -2", [](lnmlp_desc* d) { return lnmlp_desc_set_fp8_format(d, -2); }, I, "format"},
      {"margin 128", [](lnmlp_desc* d) { return lnmlp_desc_set_delayed_scaling(d, 128, 16, 0); }, I, "margin"},
      {"history 0", [](lnmlp_desc* d) { return lnmlp_desc_set_delayed_scaling(d, 0, 0, 0); }, I, "amax_history_len"},
      {"history 65537", [](lnmlp_desc* d) { return lnmlp_desc_set_delayed_scaling(d, 0, 65537, 0); }, I,
       "amax_history_len"},
      {"history 2^32+16",
       [](lnmlp_desc* d) { return lnmlp_desc_set_delayed_scaling(d, 0, (int64_t{1} << 32) + 16, 0); }, I,
       "amax_history_len"},
      {"group_size 2^32+2", [](lnmlp_desc* d) { return lnmlp_desc_set_sharding(d, (int64_t{1} << 32) + 2, 0, 0); }, I,
       "group_size"},
      {"rank 2^32", [](lnmlp_desc* d) { return lnmlp_desc_set_sharding(d, 2, int64_t{1} << 32, 0); }, I, "rank"},
      {"amax algo 2", [](lnmlp_desc* d) { return lnmlp_desc_set_delayed_scaling(d, 0, 16, 2); }, I,
       "amax_compute_algo"},
      {"power_2_scale 2", [](lnmlp_desc* d) { return lnmlp_desc_set_scaling_options(d, 2, 0.0f); }, I, "power_2_scale"},
      {"amax_epsilon -1", [](lnmlp_desc* d) { return lnmlp_desc_set_scaling_options(d, 0, -1.0f); }, I, "amax_epsilon"},
      {"amax_epsilon nan", [](lnmlp_desc* d) { return lnmlp_desc_set_scaling_options(d, 0, std::nanf("")); }, I,
       "amax_epsilon"},
      {"group 0", [](lnmlp_desc* d) { return lnmlp_desc_set_sharding(d, 0, 0, 0); }, I, "group_size"},
      {"rank 2 of 2", [](lnmlp_desc* d) { return lnmlp_desc_set_sharding(d, 2, 2, 0); }, I, "rank"},
      {"rank -1", [](lnmlp_desc* d) { return lnmlp_desc_set_sharding(d, 1, -1, 0); }, I, "rank"},
      {"seq par 2", [](lnmlp_desc* d) { return lnmlp_desc_set_sharding(d, 1, 0, 2); }, I, "sequence_parallel"},
      {"ext ws 2", [](lnmlp_desc* d) { return lnmlp_desc_set_external_workspace(d, 2); }, I, "enabled"},
      {"weight layout 2", [](lnmlp_desc* d) { return lnmlp_desc_set_weight_layout(d, 2); }, I, "layout"},
      {"weight layout -1", [](lnmlp_desc* d) { return lnmlp_desc_set_weight_layout(d, -1); }, I, "layout"},
      {"gemm math 4", [](lnmlp_desc* d) { return lnmlp_desc_set_gemm_math(d, 4); }, I, "flags"},
      {"gemm math -1", [](lnmlp_desc* d) { return lnmlp_desc_set_gemm_math(d, -1); }, I, "flags"},
      {"prepared count -1", [](lnmlp_desc* d) { return lnmlp_desc_set_prepared_tokens(d, -1, kCounts); }, I, "count"},
      {"prepared count 33", [](lnmlp_desc* d) { return lnmlp_desc_set_prepared_tokens(d, 33, kCounts); }, I, "count"},
      {"prepared NULL", [](lnmlp_desc* d) { return lnmlp_desc_set_prepared_tokens(d, 2, nullptr); },
       LNMLP_ERROR_NULL_POINTER, "tokens"},
      {"prepared 0", [](lnmlp_desc* d) { return lnmlp_desc_set_prepared_tokens(d, 3, kCounts + 31); }, I,
       ">= 1, got 0"},
      {"prepared -2", [](lnmlp_desc* d) { return lnmlp_desc_set_prepared_tokens(d, 2, kCounts + 32); }, I,
       ">= 1, got -2"},
  };
}

TEST(DescriptorErrors, BadSetterValuesAreRejectedAndChangeNothing) {
  lnmlp_desc* d = make_desc(desc_cfg());
  const Fingerprint before = fingerprint(d);
  ASSERT_FALSE(before.r.y.empty());
  for (const BadSetter& s : bad_setters()) {
    SCOPED_TRACE(s.what);
    EXPECT_FAILS(s.call(d), s.status, s.word);
    EXPECT_TRUE(fingerprint(d, &before) == before) << "the failed setter changed the descriptor";
  }
  EXPECT_OK(lnmlp_desc_destroy(d));
}

TEST(DescriptorErrors, ValidEdgeValuesAreAccepted) {
  lnmlp_desc* d = nullptr;
  ASSERT_OK(lnmlp_desc_create(&d));
  EXPECT_OK(lnmlp_desc_set_epsilon(d, 0.0f));
  EXPECT_OK(lnmlp_desc_set_sharding(d, 1, 0, 0));
  EXPECT_OK(lnmlp_desc_set_sharding(d, 1, 0, 1));
  EXPECT_OK(lnmlp_desc_set_recipe(d, LNMLP_RECIPE_NONE));
  for (int32_t r = LNMLP_RECIPE_NONE; r <= LNMLP_RECIPE_NVFP4; ++r) EXPECT_OK(lnmlp_desc_set_recipe(d, r));
  EXPECT_OK(lnmlp_desc_set_nvfp4_options(d, 1, 1, 1));
  EXPECT_OK(lnmlp_desc_set_nvfp4_options(d, 0, 0, 0));
  EXPECT_OK(lnmlp_desc_set_fp8_format(d, LNMLP_FP8_FORMAT_DEFAULT));
  EXPECT_OK(lnmlp_desc_set_fp8_format(d, LNMLP_FP8_FORMAT_E4M3));
  EXPECT_OK(lnmlp_desc_set_delayed_scaling(d, -126, 1, LNMLP_AMAX_ALGO_MOST_RECENT));
  EXPECT_OK(lnmlp_desc_set_delayed_scaling(d, 127, 65536, LNMLP_AMAX_ALGO_MAX));
  EXPECT_OK(lnmlp_desc_set_scaling_options(d, -1, 0.0f));
  EXPECT_OK(lnmlp_desc_set_scaling_options(d, 1, 1e-30f));
  EXPECT_OK(lnmlp_desc_set_num_threads(d, 0));
  EXPECT_OK(lnmlp_desc_set_clamped_swiglu(d, 1e-30f, -3.0f, -2.0f));
  for (int32_t a = LNMLP_ACT_LINEAR; a <= LNMLP_ACT_CLAMPED_LINEAR; ++a) EXPECT_OK(lnmlp_desc_set_activations(d, 1, &a));
  EXPECT_OK(lnmlp_desc_destroy(d));
}

// Plan creation refuses a descriptor, names why, leaves *plan alone, and the descriptor stays usable.
void expect_create_fails(lnmlp_desc* d, int32_t status, const char* word) {
  lnmlp_plan* const marker = reinterpret_cast<lnmlp_plan*>(uintptr_t{0x1234});
  lnmlp_plan* p = marker;
  EXPECT_FAILS(lnmlp_plan_create(d, &p), status, word);
  EXPECT_EQ(p, marker) << "a failed lnmlp_plan_create wrote *plan";
}

// Prepared token counts: up to 32 (duplicates counting once), each at most the plan's tokens,
// checked when the plan is made; an empty list clears them.
TEST(PlanCreateErrors, PreparedTokenCounts) {
  lnmlp_desc* d = nullptr;
  ASSERT_OK(lnmlp_desc_create(&d));
  ASSERT_OK(lnmlp_desc_set_shape(d, 31, 4, 4));
  lnmlp_plan* p = nullptr;
  ASSERT_OK(lnmlp_desc_set_prepared_tokens(d, 31, kCounts));  // 1 .. 31
  EXPECT_OK(lnmlp_plan_create(d, &p));
  EXPECT_OK(lnmlp_plan_destroy(p));
  // 3 .. 31, 0, -2: refused, and the list stays 1 .. 31, which a plan of 30 tokens refuses.
  EXPECT_FAILS(lnmlp_desc_set_prepared_tokens(d, 31, kCounts + 2), LNMLP_ERROR_INVALID_ARGUMENT, "got 0");
  ASSERT_OK(lnmlp_desc_set_shape(d, 30, 4, 4));
  expect_create_fails(d, LNMLP_ERROR_INVALID_ARGUMENT, "a prepared token count (31");
  const int64_t repeated[4] = {3, 30, 3, 1};
  ASSERT_OK(lnmlp_desc_set_prepared_tokens(d, 4, repeated));
  EXPECT_OK(lnmlp_plan_create(d, &p));
  EXPECT_OK(lnmlp_plan_destroy(p));
  ASSERT_OK(lnmlp_desc_set_prepared_tokens(d, 0, nullptr));
  EXPECT_OK(lnmlp_plan_create(d, &p));
  EXPECT_OK(lnmlp_plan_destroy(p));
  EXPECT_OK(lnmlp_desc_destroy(d));
}

TEST(PlanCreateErrors, ShapeNotSet) {
  lnmlp_desc* d = nullptr;
  ASSERT_OK(lnmlp_desc_create(&d));
  expect_create_fails(d, LNMLP_ERROR_INVALID_ARGUMENT, "lnmlp_desc_set_shape");
  ASSERT_OK(lnmlp_desc_set_shape(d, 2, 4, 4));
  lnmlp_plan* p = nullptr;
  EXPECT_OK(lnmlp_plan_create(d, &p));
  EXPECT_OK(lnmlp_plan_destroy(p));
  EXPECT_OK(lnmlp_desc_destroy(d));
}

TEST(PlanCreateErrors, SizesThatOverflow) {
  lnmlp_desc* d = nullptr;
  ASSERT_OK(lnmlp_desc_create(&d));
  const int64_t big = int64_t{1} << 40;
  struct {
    int64_t t, h, f;
    const char* word;
  } cases[] = {
      {big, big, 1, "tokens"},  {1, big, big, "hidden"},    {big, 1, big, "ffn"},
      {INT64_MAX, INT64_MAX, INT64_MAX, "tokens"}, {int64_t{1} << 62, 1, 1, "tokens"},
      {1, 1, INT64_MAX, "ffn"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(std::to_string(c.t) + " x " + std::to_string(c.h) + " x " + std::to_string(c.f));
    ASSERT_OK(lnmlp_desc_set_shape(d, c.t, c.h, c.f));
    expect_create_fails(d, LNMLP_ERROR_SIZE_OVERFLOW, c.word);
  }
  // dims >= 2^31 (GEMM libraries index with 32 bits), though the byte counts fit.
  const int64_t d31 = int64_t{1} << 31;
  ASSERT_OK(lnmlp_desc_set_shape(d, d31, 1, 1));
  expect_create_fails(d, LNMLP_ERROR_SIZE_OVERFLOW, "tokens");
  ASSERT_OK(lnmlp_desc_set_shape(d, 1, d31, 1));
  expect_create_fails(d, LNMLP_ERROR_SIZE_OVERFLOW, "hidden");
  ASSERT_OK(lnmlp_desc_set_shape(d, 1, 1, d31));
  expect_create_fails(d, LNMLP_ERROR_SIZE_OVERFLOW, "ffn");
  // A x ffn >= 2^31 with a gated activation.
  const int32_t gated[2] = {LNMLP_ACT_SILU, LNMLP_ACT_LINEAR};
  ASSERT_OK(lnmlp_desc_set_activations(d, 2, gated));
  ASSERT_OK(lnmlp_desc_set_shape(d, 1, 1, d31 / 2));
  expect_create_fails(d, LNMLP_ERROR_SIZE_OVERFLOW, "ffn");
  // The descriptor is still usable.
  ASSERT_OK(lnmlp_desc_set_shape(d, 2, 4, 4));
  lnmlp_plan* p = nullptr;
  EXPECT_OK(lnmlp_plan_create(d, &p));
  EXPECT_OK(lnmlp_plan_destroy(p));
  EXPECT_OK(lnmlp_desc_destroy(d));
}

TEST(PlanCreateErrors, ClampedActivationsOnlyAsThePair) {
  lnmlp_desc* d = nullptr;
  ASSERT_OK(lnmlp_desc_create(&d));
  ASSERT_OK(lnmlp_desc_set_shape(d, 2, 4, 4));
  const std::vector<std::vector<int32_t>> bad = {
      {LNMLP_ACT_CLAMPED_SILU},
      {LNMLP_ACT_CLAMPED_LINEAR},
      {LNMLP_ACT_CLAMPED_SILU, LNMLP_ACT_LINEAR},
      {LNMLP_ACT_SILU, LNMLP_ACT_CLAMPED_LINEAR},
      {LNMLP_ACT_CLAMPED_LINEAR, LNMLP_ACT_CLAMPED_SILU},
      {LNMLP_ACT_CLAMPED_SILU, LNMLP_ACT_CLAMPED_SILU},
  };
  for (const auto& acts : bad) {
    SCOPED_TRACE(::testing::PrintToString(acts));
    ASSERT_OK(lnmlp_desc_set_activations(d, static_cast<int32_t>(acts.size()), acts.data()));
    expect_create_fails(d, LNMLP_ERROR_INVALID_ARGUMENT, "clamped_silu");
  }
  const int32_t ok[2] = {LNMLP_ACT_CLAMPED_SILU, LNMLP_ACT_CLAMPED_LINEAR};
  ASSERT_OK(lnmlp_desc_set_activations(d, 2, ok));
  lnmlp_plan* p = nullptr;
  EXPECT_OK(lnmlp_plan_create(d, &p));
  EXPECT_OK(lnmlp_plan_destroy(p));
  EXPECT_OK(lnmlp_desc_destroy(d));
}

TEST(PlanCreateErrors, Nvfp4FormatAndRandomState) {
  lnmlp_desc* d = nullptr;
  ASSERT_OK(lnmlp_desc_create(&d));
  ASSERT_OK(lnmlp_desc_set_shape(d, 32, 32, 64));
  ASSERT_OK(lnmlp_desc_set_recipe(d, LNMLP_RECIPE_NVFP4));
  ASSERT_OK(lnmlp_desc_set_fp8_format(d, LNMLP_FP8_FORMAT_HYBRID));
  expect_create_fails(d, LNMLP_ERROR_INVALID_ARGUMENT, "E4M3");
  ASSERT_OK(lnmlp_desc_set_fp8_format(d, LNMLP_FP8_FORMAT_E4M3));
  lnmlp_plan* p = nullptr;
  ASSERT_OK(lnmlp_plan_create(d, &p));
  uint64_t seed = 7, offset = 8;
  EXPECT_FAILS(lnmlp_plan_get_rng_state(p, nullptr, &offset), LNMLP_ERROR_NULL_POINTER, "seed");
  EXPECT_FAILS(lnmlp_plan_get_rng_state(p, &seed, nullptr), LNMLP_ERROR_NULL_POINTER, "offset");
  EXPECT_EQ(seed, 7u);
  EXPECT_OK(lnmlp_plan_get_rng_state(p, &seed, &offset));
  EXPECT_EQ(seed, 0u);
  EXPECT_EQ(offset, 0u);
  EXPECT_OK(lnmlp_plan_set_rng_state(p, ~uint64_t{0}, uint64_t{1} << 63));
  EXPECT_OK(lnmlp_plan_get_rng_state(p, &seed, &offset));
  EXPECT_EQ(seed, ~uint64_t{0});
  EXPECT_EQ(offset, uint64_t{1} << 63);
  EXPECT_FAILS(lnmlp_plan_set_rng_state(nullptr, 1, 2), LNMLP_ERROR_NULL_POINTER, "plan");
  EXPECT_OK(lnmlp_plan_destroy(p));
  EXPECT_OK(lnmlp_desc_destroy(d));
}

TEST(PlanCreateErrors, BackendsAndDevices) {
  lnmlp_desc* d = nullptr;
  ASSERT_OK(lnmlp_desc_create(&d));
  ASSERT_OK(lnmlp_desc_set_shape(d, 2, 4, 4));
  // CUDA is a known backend, but not part of this build.
  int32_t cuda = -1;
  ASSERT_OK(lnmlp_query_support(LNMLP_BACKEND_CUDA, LNMLP_FEATURE_BACKEND, &cuda));
  if (cuda == 0) {
    const int32_t st = lnmlp_desc_set_backend(d, LNMLP_BACKEND_CUDA, 0);
    if (st == LNMLP_SUCCESS) {
      expect_create_fails(d, LNMLP_ERROR_NOT_SUPPORTED, "CUDA");
    } else {
      EXPECT_EQ(st, LNMLP_ERROR_NOT_SUPPORTED) << last_error();
      EXPECT_TRUE(names(last_error(), "CUDA")) << last_error();
    }
  }
  // The CPU backend has one device, 0 (refused by the setter or at plan creation).
  const int32_t st = lnmlp_desc_set_backend(d, LNMLP_BACKEND_CPU, 1);
  if (st == LNMLP_SUCCESS) {
    expect_create_fails(d, LNMLP_ERROR_INVALID_ARGUMENT, "device");
  } else {
    EXPECT_EQ(st, LNMLP_ERROR_INVALID_ARGUMENT);
    EXPECT_TRUE(names(last_error(), "device")) << last_error();
  }
  ASSERT_OK(lnmlp_desc_set_backend(d, LNMLP_BACKEND_CPU, 0));
  lnmlp_plan* p = nullptr;
  EXPECT_OK(lnmlp_plan_create(d, &p));
  EXPECT_OK(lnmlp_plan_destroy(p));
  EXPECT_OK(lnmlp_desc_destroy(d));
}

// ---------------------------------------------------------------------------------------------
// NULL handles, NULL out-pointers, dead and foreign handles
// ---------------------------------------------------------------------------------------------

// Every function taking a descriptor, called on `d`.
std::vector<std::pair<const char*, std::function<int32_t()>>> desc_calls(lnmlp_desc* d) {
  static const int32_t relu = LNMLP_ACT_RELU;
  return {
      {"set_shape", [d] { return lnmlp_desc_set_shape(d, 2, 4, 4); }},
      {"set_norm", [d] { return lnmlp_desc_set_norm(d, LNMLP_NORM_RMSNORM); }},
      {"set_zero_centered_gamma", [d] { return lnmlp_desc_set_zero_centered_gamma(d, 1); }},
      {"set_epsilon", [d] { return lnmlp_desc_set_epsilon(d, 1e-5f); }},
      {"set_activations", [d] { return lnmlp_desc_set_activations(d, 1, &relu); }},
      {"set_clamped_swiglu", [d] { return lnmlp_desc_set_clamped_swiglu(d, 7.0f, 1.702f, 1.0f); }},
      {"set_bias", [d] { return lnmlp_desc_set_bias(d, 1, 1); }},
      {"set_dtype", [d] { return lnmlp_desc_set_dtype(d, LNMLP_DTYPE_BF16); }},
      {"set_remat", [d] { return lnmlp_desc_set_remat(d, LNMLP_REMAT_SAVE_STATS); }},
      {"set_backend", [d] { return lnmlp_desc_set_backend(d, LNMLP_BACKEND_CPU, 0); }},
      {"set_num_threads", [d] { return lnmlp_desc_set_num_threads(d, 1); }},
      {"set_recipe", [d] { return lnmlp_desc_set_recipe(d, LNMLP_RECIPE_NONE); }},
      {"set_sharding", [d] { return lnmlp_desc_set_sharding(d, 1, 0, 0); }},
      {"set_external_workspace", [d] { return lnmlp_desc_set_external_workspace(d, 1); }},
      {"set_weight_layout", [d] { return lnmlp_desc_set_weight_layout(d, LNMLP_WEIGHT_LAYOUT_OUT_IN); }},
      {"set_gemm_math", [d] { return lnmlp_desc_set_gemm_math(d, LNMLP_GEMM_MATH_TF32); }},
      {"plan_create",
       [d] {
         lnmlp_plan* p = nullptr;
         const int32_t st = lnmlp_plan_create(d, &p);
         if (st == LNMLP_SUCCESS) lnmlp_plan_destroy(p);
         return st;
       }},
  };
}

// Every function taking a plan, called on `p` with otherwise plausible arguments.
std::vector<std::pair<const char*, std::function<int32_t()>>> plan_calls(lnmlp_plan* p, Block& b) {
  return {
      {"get_workspace_bytes", [p] { int64_t v = 0; return lnmlp_plan_get_workspace_bytes(p, &v); }},
      {"get_saved_bytes", [p] { int64_t v = 0; return lnmlp_plan_get_saved_bytes(p, &v); }},
      {"get_saved_bytes_per_token", [p] { int64_t v = 0; return lnmlp_plan_get_saved_bytes_per_token(p, &v); }},
      {"get_alignment", [p] { int64_t v = 0; return lnmlp_plan_get_alignment(p, &v); }},
      {"attach_workspace", [p, &b] { return lnmlp_plan_attach_workspace(p, b.dummy.data(), 256); }},
      {"forward", [p, &b] { return call_forward(p, b.fwd()); }},
      {"backward", [p, &b] { return call_backward(p, b.bwd()); }},
  };
}

const Cfg kSmall = {"small", 3, 8, 8, LNMLP_NORM_LAYERNORM, LNMLP_DTYPE_F32, LNMLP_REMAT_SAVE_ALL,
                    {LNMLP_ACT_RELU}, false, false, false};

TEST(Handles, NullHandles) {
  for (auto& [name, call] : desc_calls(nullptr)) {
    SCOPED_TRACE(name);
    EXPECT_FAILS(call(), LNMLP_ERROR_NULL_POINTER, "desc");
  }
  Block b(kSmall);
  b.fill_outputs(kSentinel);
  for (auto& [name, call] : plan_calls(nullptr, b)) {
    SCOPED_TRACE(name);
    EXPECT_FAILS(call(), LNMLP_ERROR_NULL_POINTER, "plan");
  }
  EXPECT_TRUE(b.outputs_untouched());
  // Destroying NULL does nothing.
  EXPECT_OK(lnmlp_desc_destroy(nullptr));
  EXPECT_OK(lnmlp_plan_destroy(nullptr));
}

TEST(Handles, NullOutPointers) {
  EXPECT_FAILS(lnmlp_desc_create(nullptr), LNMLP_ERROR_NULL_POINTER, "desc");
  lnmlp_desc* d = make_desc(kSmall);
  EXPECT_FAILS(lnmlp_plan_create(d, nullptr), LNMLP_ERROR_NULL_POINTER, "plan");
  lnmlp_plan* p = nullptr;
  ASSERT_OK(lnmlp_plan_create(d, &p));
  EXPECT_FAILS(lnmlp_plan_get_workspace_bytes(p, nullptr), LNMLP_ERROR_NULL_POINTER, "bytes");
  EXPECT_FAILS(lnmlp_plan_get_saved_bytes(p, nullptr), LNMLP_ERROR_NULL_POINTER, "bytes");
  EXPECT_FAILS(lnmlp_plan_get_saved_bytes_per_token(p, nullptr), LNMLP_ERROR_NULL_POINTER, "bytes");
  EXPECT_FAILS(lnmlp_plan_get_alignment(p, nullptr), LNMLP_ERROR_NULL_POINTER, "bytes");
  EXPECT_FAILS(lnmlp_query_support(LNMLP_BACKEND_CPU, LNMLP_FEATURE_BACKEND, nullptr), LNMLP_ERROR_NULL_POINTER,
               "supported");
  EXPECT_FAILS(lnmlp_get_build_info(nullptr), LNMLP_ERROR_NULL_POINTER, "info");
  // lnmlp_get_version skips NULL pointers.
  EXPECT_OK(lnmlp_get_version(nullptr, nullptr, nullptr, nullptr));
  EXPECT_OK(lnmlp_plan_destroy(p));
  EXPECT_OK(lnmlp_desc_destroy(d));
}

// Under ASan these prove the registry never dereferences a dead handle.
TEST(Handles, DescriptorUsedAfterDestroy) {
  lnmlp_desc* d = make_desc(kSmall);
  ASSERT_OK(lnmlp_desc_destroy(d));
  for (auto& [name, call] : desc_calls(d)) {
    SCOPED_TRACE(name);
    EXPECT_FAILS(call(), LNMLP_ERROR_INVALID_HANDLE, "descriptor");
  }
  EXPECT_FAILS(lnmlp_desc_destroy(d), LNMLP_ERROR_INVALID_HANDLE, "descriptor");  // twice
}

TEST(Handles, PlanUsedAfterDestroy) {
  Block b(kSmall);
  const Result before = b.run();
  lnmlp_plan* dead = nullptr;
  {
    lnmlp_desc* d = make_desc(kSmall);
    ASSERT_OK(lnmlp_plan_create(d, &dead));
    ASSERT_OK(lnmlp_desc_destroy(d));
    ASSERT_OK(lnmlp_plan_destroy(dead));
  }
  b.fill_outputs(kSentinel);
  for (auto& [name, call] : plan_calls(dead, b)) {
    SCOPED_TRACE(name);
    EXPECT_FAILS(call(), LNMLP_ERROR_INVALID_HANDLE, "plan");
  }
  EXPECT_TRUE(b.outputs_untouched());
  EXPECT_FAILS(lnmlp_plan_destroy(dead), LNMLP_ERROR_INVALID_HANDLE, "plan");  // twice
  EXPECT_TRUE(b.run() == before);  // the live plan is unaffected
}

// A handle is never reused: a destroyed handle stays dead even when a new object's memory lands
// where the old one was. Handles used to be addresses; in a Release build malloc reuses them at
// once, and a stale T=4 plan handle then ran a new T=4096 plan (so this test failed).
TEST(Handles, AreNeverReused) {
  std::set<const void*> seen;
  for (int i = 0; i < 200; ++i) {
    lnmlp_desc* d = make_desc(kSmall);
    lnmlp_plan* p = nullptr;
    ASSERT_OK(lnmlp_plan_create(d, &p));
    EXPECT_TRUE(seen.insert(d).second) << "a descriptor handle came back";
    EXPECT_TRUE(seen.insert(p).second) << "a plan handle came back";
    ASSERT_OK(lnmlp_plan_destroy(p));
    ASSERT_OK(lnmlp_desc_destroy(d));
    int64_t bytes = 0;
    EXPECT_FAILS(lnmlp_plan_get_saved_bytes(p, &bytes), LNMLP_ERROR_INVALID_HANDLE, "plan");
    EXPECT_FAILS(lnmlp_desc_set_epsilon(d, 1e-5f), LNMLP_ERROR_INVALID_HANDLE, "descriptor");
  }
}

// Getters racing lnmlp_plan_destroy: each call sees the live plan or INVALID_HANDLE, never freed
// memory (ASan and TSan reported a heap-use-after-free here while getters did not hold the plan).
TEST(Handles, GettersRacingDestroyAreSafe) {
  for (int round = 0; round < 20; ++round) {
    lnmlp_desc* d = make_desc(kSmall);
    lnmlp_plan* p = nullptr;
    ASSERT_OK(lnmlp_plan_create(d, &p));
    ASSERT_OK(lnmlp_desc_destroy(d));
    std::atomic<bool> go{false};
    std::atomic<int> unexpected{0};
    std::vector<std::thread> readers;
    for (int t = 0; t < 3; ++t)
      readers.emplace_back([&] {
        while (!go.load()) {
        }
        for (int i = 0; i < 300; ++i) {
          int64_t v = 0, rank = 0, dims[LNMLP_MAX_TENSOR_RANK] = {};
          int32_t dtype = 0;
          for (int32_t st : {lnmlp_plan_get_saved_bytes(p, &v), lnmlp_plan_get_workspace_bytes(p, &v),
                             lnmlp_plan_get_alignment(p, &v), lnmlp_plan_get_amax_history_length(p, &v),
                             lnmlp_plan_get_tensor_shape(p, LNMLP_TENSOR_W1, 1, &rank, dims, &dtype)})
            if (st != LNMLP_SUCCESS && st != LNMLP_ERROR_INVALID_HANDLE) unexpected.fetch_add(1);
        }
      });
    go.store(true);
    EXPECT_OK(lnmlp_plan_destroy(p));
    for (auto& r : readers) r.join();
    EXPECT_EQ(unexpected.load(), 0);
  }
}

TEST(Handles, ForeignAndMismatchedHandles) {
  Block b(kSmall);
  const Result before = b.run();
  lnmlp_desc* d = make_desc(kSmall);
  alignas(64) static unsigned char junk[4096];
  std::memset(junk, 0xEE, sizeof junk);
  lnmlp_plan* foreign_plan = reinterpret_cast<lnmlp_plan*>(junk);
  lnmlp_desc* foreign_desc = reinterpret_cast<lnmlp_desc*>(junk);
  lnmlp_plan* desc_as_plan = reinterpret_cast<lnmlp_plan*>(d);
  lnmlp_desc* plan_as_desc = reinterpret_cast<lnmlp_desc*>(b.plan);
  b.fill_outputs(kSentinel);
  for (lnmlp_plan* p : {foreign_plan, desc_as_plan}) {
    for (auto& [name, call] : plan_calls(p, b)) {
      SCOPED_TRACE(name);
      EXPECT_FAILS(call(), LNMLP_ERROR_INVALID_HANDLE, "plan");
    }
    EXPECT_FAILS(lnmlp_plan_destroy(p), LNMLP_ERROR_INVALID_HANDLE, "plan");
  }
  EXPECT_TRUE(b.outputs_untouched());
  for (lnmlp_desc* x : {foreign_desc, plan_as_desc}) {
    for (auto& [name, call] : desc_calls(x)) {
      SCOPED_TRACE(name);
      EXPECT_FAILS(call(), LNMLP_ERROR_INVALID_HANDLE, "descriptor");
    }
    EXPECT_FAILS(lnmlp_desc_destroy(x), LNMLP_ERROR_INVALID_HANDLE, "descriptor");
  }
  for (size_t i = 0; i < sizeof junk; ++i) ASSERT_EQ(junk[i], 0xEE) << "the library wrote into a foreign handle";
  EXPECT_OK(lnmlp_desc_destroy(d));
  EXPECT_TRUE(b.run() == before);
}

TEST(Handles, DescriptorChangesAfterPlanCreationDoNotAffectThePlan) {
  lnmlp_desc* d = make_desc(desc_cfg());
  Block b(desc_cfg(), d);
  ASSERT_NE(b.plan, nullptr);
  const Result before = b.run();
  int64_t ws_before = -1, per_token_before = -1;
  ASSERT_OK(lnmlp_plan_get_workspace_bytes(b.plan, &ws_before));
  ASSERT_OK(lnmlp_plan_get_saved_bytes_per_token(b.plan, &per_token_before));
  const int32_t relu = LNMLP_ACT_RELU;
  ASSERT_OK(lnmlp_desc_set_shape(d, 100, 64, 32));
  ASSERT_OK(lnmlp_desc_set_norm(d, LNMLP_NORM_RMSNORM));
  ASSERT_OK(lnmlp_desc_set_dtype(d, LNMLP_DTYPE_BF16));
  ASSERT_OK(lnmlp_desc_set_remat(d, LNMLP_REMAT_SAVE_ALL));
  ASSERT_OK(lnmlp_desc_set_activations(d, 1, &relu));
  ASSERT_OK(lnmlp_desc_set_bias(d, 0, 0));
  ASSERT_OK(lnmlp_desc_set_epsilon(d, 0.5f));
  ASSERT_OK(lnmlp_desc_set_zero_centered_gamma(d, 0));
  ASSERT_OK(lnmlp_desc_set_clamped_swiglu(d, 3.0f, 1.0f, 0.0f));
  ASSERT_OK(lnmlp_desc_set_external_workspace(d, 1));
  ASSERT_OK(lnmlp_desc_set_num_threads(d, 1));
  EXPECT_TRUE(b.run() == before);
  int64_t v = -1;
  ASSERT_OK(lnmlp_plan_get_saved_bytes(b.plan, &v));
  EXPECT_EQ(v, b.saved_bytes);
  ASSERT_OK(lnmlp_plan_get_workspace_bytes(b.plan, &v));
  EXPECT_EQ(v, ws_before);
  ASSERT_OK(lnmlp_plan_get_saved_bytes_per_token(b.plan, &v));
  EXPECT_EQ(v, per_token_before);
  ASSERT_OK(lnmlp_desc_destroy(d));
  EXPECT_TRUE(b.run() == before);
}

// ---------------------------------------------------------------------------------------------
// Workspace
// ---------------------------------------------------------------------------------------------

Cfg ws_cfg(bool external) {
  return {"ws", 5, 16, 12, LNMLP_NORM_LAYERNORM, LNMLP_DTYPE_BF16, LNMLP_REMAT_SAVE_STATS,
          {LNMLP_ACT_GELU, LNMLP_ACT_LINEAR}, true, true, external};
}

TEST(Workspace, ExternalWorkspaceLifecycle) {
  Block owned(ws_cfg(false));
  const Result expected = owned.run();

  lnmlp_desc* d = make_desc(ws_cfg(true));
  Block b(ws_cfg(false), d);  // cfg says owned so Block does not attach; the descriptor says external
  ASSERT_OK(lnmlp_desc_destroy(d));
  ASSERT_NE(b.plan, nullptr);
  b.c.ext_ws = true;
  ASSERT_GT(b.ws_bytes, 0);
  EXPECT_EQ(b.ws_bytes, owned.ws_bytes);

  // Not attached yet.
  b.fill_outputs(kSentinel);
  EXPECT_FAILS(call_forward(b.plan, b.fwd()), LNMLP_ERROR_NO_WORKSPACE, "lnmlp_plan_attach_workspace");
  EXPECT_FAILS(call_backward(b.plan, b.bwd()), LNMLP_ERROR_NO_WORKSPACE, "lnmlp_plan_attach_workspace");
  EXPECT_TRUE(b.outputs_untouched());

  Buf ws(static_cast<size_t>(b.ws_bytes));
  // Too small, NULL, misaligned: each refused, and still nothing attached.
  EXPECT_FAILS(lnmlp_plan_attach_workspace(b.plan, ws.data(), b.ws_bytes - 1), LNMLP_ERROR_WORKSPACE_TOO_SMALL,
               "workspace");
  EXPECT_FAILS(lnmlp_plan_attach_workspace(b.plan, ws.data(), 0), LNMLP_ERROR_WORKSPACE_TOO_SMALL, "workspace");
  EXPECT_FAILS(lnmlp_plan_attach_workspace(b.plan, ws.data(), -1), LNMLP_ERROR_INVALID_ARGUMENT, "bytes must be >= 0");
  EXPECT_FAILS(lnmlp_plan_attach_workspace(b.plan, nullptr, b.ws_bytes), LNMLP_ERROR_NULL_POINTER, "workspace");
  EXPECT_FAILS(lnmlp_plan_attach_workspace(b.plan, ws.data() + 1, b.ws_bytes), LNMLP_ERROR_MISALIGNED, "workspace");
  if (b.align > 1)
    EXPECT_FAILS(lnmlp_plan_attach_workspace(b.plan, ws.data() + b.align / 2, b.ws_bytes), LNMLP_ERROR_MISALIGNED,
                 "workspace");
  EXPECT_EQ(call_forward(b.plan, b.fwd()), LNMLP_ERROR_NO_WORKSPACE);
  EXPECT_TRUE(b.outputs_untouched());

  // Attached: the same bits as the plan that owns its workspace.
  ASSERT_OK(lnmlp_plan_attach_workspace(b.plan, ws.data(), b.ws_bytes));
  EXPECT_TRUE(b.run() == expected);

  // A failed re-attach keeps the previous workspace.
  EXPECT_EQ(lnmlp_plan_attach_workspace(b.plan, ws.data(), b.ws_bytes / 2), LNMLP_ERROR_WORKSPACE_TOO_SMALL);
  EXPECT_EQ(lnmlp_plan_attach_workspace(b.plan, ws.data() + 1, b.ws_bytes), LNMLP_ERROR_MISALIGNED);
  EXPECT_TRUE(b.run() == expected);

  // Attaching again replaces it (a larger one, aligned exactly to the reported alignment, is fine).
  Buf ws2(static_cast<size_t>(b.ws_bytes + 1024));
  ws2.fill(0x5A);
  ASSERT_OK(lnmlp_plan_attach_workspace(b.plan, ws2.data() + b.align, b.ws_bytes + 512));
  ws.fill(0x77);  // the old one is no longer used
  EXPECT_TRUE(b.run() == expected);
  EXPECT_TRUE(ws.all(0x77));
}

TEST(Workspace, AttachingToAnOwnedWorkspacePlanIsRefused) {
  Block b(ws_cfg(false));
  const Result before = b.run();
  Buf ws(static_cast<size_t>(b.ws_bytes) + 256);
  EXPECT_FAILS(lnmlp_plan_attach_workspace(b.plan, ws.data(), b.ws_bytes), LNMLP_ERROR_INVALID_ARGUMENT,
               "lnmlp_desc_set_external_workspace");
  EXPECT_TRUE(b.run() == before);
}

// ---------------------------------------------------------------------------------------------
// Status strings, last error, versions, queries
// ---------------------------------------------------------------------------------------------

TEST(Status, StringsForEveryStatus) {
  const std::pair<int32_t, const char*> all[] = {
      {LNMLP_SUCCESS, "LNMLP_SUCCESS"},
      {LNMLP_ERROR_INVALID_ARGUMENT, "LNMLP_ERROR_INVALID_ARGUMENT"},
      {LNMLP_ERROR_NULL_POINTER, "LNMLP_ERROR_NULL_POINTER"},
      {LNMLP_ERROR_SIZE_OVERFLOW, "LNMLP_ERROR_SIZE_OVERFLOW"},
      {LNMLP_ERROR_INVALID_HANDLE, "LNMLP_ERROR_INVALID_HANDLE"},
      {LNMLP_ERROR_NOT_SUPPORTED, "LNMLP_ERROR_NOT_SUPPORTED"},
      {LNMLP_ERROR_OUT_OF_MEMORY, "LNMLP_ERROR_OUT_OF_MEMORY"},
      {LNMLP_ERROR_WORKSPACE_TOO_SMALL, "LNMLP_ERROR_WORKSPACE_TOO_SMALL"},
      {LNMLP_ERROR_NO_WORKSPACE, "LNMLP_ERROR_NO_WORKSPACE"},
      {LNMLP_ERROR_MISALIGNED, "LNMLP_ERROR_MISALIGNED"},
      {LNMLP_ERROR_PLAN_BUSY, "LNMLP_ERROR_PLAN_BUSY"},
      {LNMLP_ERROR_BACKEND, "LNMLP_ERROR_BACKEND"},
      {LNMLP_ERROR_INTERNAL, "LNMLP_ERROR_INTERNAL"},
  };
  for (const auto& [code, name] : all) {
    ASSERT_NE(lnmlp_status_string(code), nullptr);
    EXPECT_STREQ(lnmlp_status_string(code), name);
  }
  for (int32_t bad : {-1, 13, 100, INT32_MIN, INT32_MAX}) {
    ASSERT_NE(lnmlp_status_string(bad), nullptr);
    EXPECT_STREQ(lnmlp_status_string(bad), "LNMLP_UNKNOWN_STATUS");
  }
}

TEST(Status, LastErrorIsNeverNullAndThreadLocal) {
  // A fresh thread starts with "".
  std::string fresh = "<unset>";
  std::thread([&] { fresh = lnmlp_last_error() ? lnmlp_last_error() : "<NULL>"; }).join();
  EXPECT_EQ(fresh, "");

  // A failure here...
  ASSERT_EQ(lnmlp_desc_set_shape(nullptr, 1, 1, 1), LNMLP_ERROR_NULL_POINTER);
  const std::string mine = last_error();
  ASSERT_FALSE(mine.empty());

  // ...is not seen by another thread, and the other thread's failure does not change it.
  std::string other_before, other_after;
  std::thread([&] {
    other_before = lnmlp_last_error();
    lnmlp_plan* p = nullptr;
    lnmlp_desc* d = nullptr;
    EXPECT_EQ(lnmlp_desc_create(&d), LNMLP_SUCCESS);
    EXPECT_EQ(lnmlp_plan_create(d, &p), LNMLP_ERROR_INVALID_ARGUMENT);  // no shape
    other_after = lnmlp_last_error();
    lnmlp_desc_destroy(d);
  }).join();
  EXPECT_EQ(other_before, "");
  EXPECT_NE(other_after, "");
  EXPECT_NE(other_after, mine);
  EXPECT_EQ(last_error(), mine);

  // Successful calls leave the message as it was.
  int32_t major = -1;
  lnmlp_desc* d = nullptr;
  ASSERT_EQ(lnmlp_get_version(&major, nullptr, nullptr, nullptr), LNMLP_SUCCESS);
  ASSERT_EQ(lnmlp_desc_create(&d), LNMLP_SUCCESS);
  ASSERT_EQ(lnmlp_desc_destroy(d), LNMLP_SUCCESS);
  EXPECT_EQ(last_error(), mine);

  // Many threads failing at once each read their own message.
  std::vector<std::thread> ts;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 8; ++t) {
    ts.emplace_back([t, &wrong] {
      for (int i = 0; i < 200; ++i) {
        const int64_t v = -(t * 1000 + i) - 1;
        lnmlp_desc_set_shape(nullptr, 1, 1, 1);  // some other failure in between
        lnmlp_desc* dd = nullptr;
        lnmlp_desc_create(&dd);
        if (lnmlp_desc_set_shape(dd, v, 1, 1) != LNMLP_ERROR_INVALID_ARGUMENT) ++wrong;
        const std::string msg = lnmlp_last_error(), num = " " + std::to_string(v);
        if (msg.size() < num.size() || msg.compare(msg.size() - num.size(), num.size(), num) != 0) ++wrong;
        lnmlp_desc_destroy(dd);
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST(Status, VersionMatchesTheHeader) {
  int32_t major = -1, minor = -1, patch = -1, abi = -1;
  ASSERT_OK(lnmlp_get_version(&major, &minor, &patch, &abi));
  EXPECT_EQ(major, LNMLP_VERSION_MAJOR);
  EXPECT_EQ(minor, LNMLP_VERSION_MINOR);
  EXPECT_EQ(patch, LNMLP_VERSION_PATCH);
  EXPECT_EQ(abi, LNMLP_ABI_VERSION);
  int32_t only_abi = -1;
  ASSERT_OK(lnmlp_get_version(nullptr, nullptr, nullptr, &only_abi));
  EXPECT_EQ(only_abi, LNMLP_ABI_VERSION);
}

TEST(Status, BuildInfo) {
  const char* info = nullptr;
  ASSERT_OK(lnmlp_get_build_info(&info));
  ASSERT_NE(info, nullptr);
  const std::string s(info);
  EXPECT_FALSE(s.empty());
  const std::string version = std::to_string(LNMLP_VERSION_MAJOR) + "." + std::to_string(LNMLP_VERSION_MINOR) + "." +
                              std::to_string(LNMLP_VERSION_PATCH);
  EXPECT_NE(s.find(version), std::string::npos) << s;
  const char* again = nullptr;
  ASSERT_OK(lnmlp_get_build_info(&again));
  EXPECT_EQ(info, again) << "the build info string is static";
}

// Before anything asks for the CUDA backend the build info says only whether the module was built
// (describing what it found would mean loading cuBLASLt); after a CUDA query it names the module's
// file and the cuBLASLt and NCCL it found, each checked against the copy this process has loaded
// (dlopen RTLD_NOLOAD by SONAME, the file through dladdr, the version from the library's own
// function). The first text stays valid. ctest runs each test in a process of its own, so the
// "before" is this process's first look.
TEST(Status, BuildInfoNamesTheLibrariesTheCudaModuleFound) {
  const char* before = nullptr;
  ASSERT_OK(lnmlp_get_build_info(&before));
  const std::string first(before);
  if (first.find("CUDA backend: not built") != std::string::npos) GTEST_SKIP() << "no CUDA module in this build";
  int32_t backend = 0, sharding = 0;
  ASSERT_OK(lnmlp_query_support(LNMLP_BACKEND_CUDA, LNMLP_FEATURE_BACKEND, &backend));
  ASSERT_OK(lnmlp_query_support(LNMLP_BACKEND_CUDA, LNMLP_FEATURE_SHARDING, &sharding));
  const char* after = nullptr;
  ASSERT_OK(lnmlp_get_build_info(&after));
  const std::string s(after);
  EXPECT_EQ(std::string(before), first) << "the earlier text is still valid and unchanged";

  const auto library = [](const char* soname, const char* function) -> std::pair<void*, std::string> {
    void* h = dlopen(soname, RTLD_NOW | RTLD_NOLOAD);
    if (h == nullptr) return {nullptr, ""};
    void* fn = dlsym(h, function);
    Dl_info info{};
    const std::string file = fn != nullptr && dladdr(fn, &info) != 0 && info.dli_fname ? info.dli_fname : "";
    dlclose(h);  // drops only the reference RTLD_NOLOAD took
    return {fn, file};
  };
  const auto version = [](long v) {
    return std::to_string(v / 10000) + "." + std::to_string((v / 100) % 100) + "." + std::to_string(v % 100);
  };
  const auto [lt_version_fn, lt_file] = library("libcublasLt.so.13", "cublasLtGetVersion");
  if (lt_version_fn == nullptr) {
    EXPECT_NE(s.find("the CUDA backend module could not be loaded"), std::string::npos) << s;
    EXPECT_EQ(backend, LNMLP_UNSUPPORTED);
    return;
  }
  Dl_info self{};
  ASSERT_NE(dladdr(reinterpret_cast<const void*>(&lnmlp_get_build_info), &self), 0);
  const std::string core(self.dli_fname);
  const std::string module = core.substr(0, core.rfind('/') + 1) + "liblnmlp_cuda.so.1";
  size_t (*lt_version)() = nullptr;
  std::memcpy(&lt_version, &lt_version_fn, sizeof lt_version);
  EXPECT_NE(s.find("CUDA backend: module " + module + " loaded, on cuBLASLt " +
                   version(static_cast<long>(lt_version())) + " (" + lt_file + "); "),
            std::string::npos)
      << s;

  const auto [nccl_version_fn, nccl_file] = library("libnccl.so.2", "ncclGetVersion");
  if (nccl_version_fn != nullptr) {
    int (*nccl_version)(int*) = nullptr;
    std::memcpy(&nccl_version, &nccl_version_fn, sizeof nccl_version);
    int v = 0;
    ASSERT_EQ(nccl_version(&v), 0);
    EXPECT_NE(s.find("; NCCL " + version(v) + " (" + nccl_file + "); MPI"), std::string::npos) << s;
  } else {
    EXPECT_TRUE(s.find("NCCL could not be loaded") != std::string::npos ||
                s.find("NCCL not built in") != std::string::npos)
        << s;
    EXPECT_EQ(sharding, LNMLP_UNSUPPORTED) << "sharding on the CUDA backend needs NCCL";
  }
  if (backend == LNMLP_UNSUPPORTED) {
    EXPECT_EQ(sharding, LNMLP_UNSUPPORTED) << "no device, no sharding";
  }
}

// It names the GEMM library and the kernel the library runs for fp32 (and bf16 where it has a bf16
// matmul): oneDNN's implementation names, which say the instruction set ("brg:avx512_core",
// "gemm:jit").
TEST(Status, BuildInfoNamesTheGemmKernels) {
  const char* info = nullptr;
  ASSERT_OK(lnmlp_get_build_info(&info));
  const std::string s(info);
  EXPECT_NE(s.find("CPU backend: oneDNN "), std::string::npos) << s;
  const size_t f32 = s.find("fp32 kernel ");
  ASSERT_NE(f32, std::string::npos) << s;
  const std::string kernel = s.substr(f32 + 12, s.find_first_of(",;)", f32) - f32 - 12);
  EXPECT_FALSE(kernel.empty()) << s;
  EXPECT_NE(kernel, "none") << "oneDNN has an fp32 matmul on every x86-64 CPU: " << s;
  const bool bf16_matmul = s.find("no bf16 matmul on this CPU") == std::string::npos;
  EXPECT_EQ(s.find("bf16 kernel ") != std::string::npos, bf16_matmul) << s;
}

// The build info names the ISA level the CPU kernels run at (src/cpu/isa.h); when a test run asks
// for a lower level (LNMLP_CPU_ISA, tests/CMakeLists.txt), that is the level running.
TEST(Status, BuildInfoNamesTheCpuKernelLevel) {
  const char* info = nullptr;
  ASSERT_OK(lnmlp_get_build_info(&info));
  const std::string s(info);
  EXPECT_NE(s.find("CPU kernels: "), std::string::npos) << s;
  const char* asked = std::getenv("LNMLP_CPU_ISA");
  if (asked != nullptr && (std::string(asked) == "x86-64" || std::string(asked) == "x86-64-v3")) {
    EXPECT_NE(s.find(std::string("CPU kernels: ") + asked + " ("), std::string::npos) << s;
  }
}

// The FP8 conversions take an element type, LNMLP_DTYPE_FP8_E4M3 or _E5M2, and nothing else: in
// particular not the LNMLP_FP8_FORMAT_* values (a recipe's choice), whose numbers differ, and
// not the I/O dtypes. The codes are the formats' own (OCP FP8): 1.0, the largest finite value,
// and saturation of what lies beyond it.
TEST(Fp8Conversions, ElementTypesOnlyAndTheFormatsCodes) {
  const float in[3] = {1.0f, 448.0f, 1e6f};
  uint8_t codes[3] = {0, 0, 0};
  for (int32_t not_fp8 : std::initializer_list<int32_t>{LNMLP_FP8_FORMAT_DEFAULT, LNMLP_FP8_FORMAT_HYBRID,
                                                        LNMLP_FP8_FORMAT_E4M3, LNMLP_DTYPE_F32, LNMLP_DTYPE_U8, 6}) {
    EXPECT_EQ(lnmlp_fp8_encode(not_fp8, in, 3, 1.0f, codes), LNMLP_ERROR_INVALID_ARGUMENT) << not_fp8;
    EXPECT_NE(std::string(lnmlp_last_error()).find("LNMLP_DTYPE_FP8_E4M3"), std::string::npos) << lnmlp_last_error();
    EXPECT_EQ(codes[0] | codes[1] | codes[2], 0) << "a refused call writes nothing";
    float out = -1.0f;
    EXPECT_EQ(lnmlp_fp8_decode(not_fp8, codes, 1, 1.0f, &out), LNMLP_ERROR_INVALID_ARGUMENT) << not_fp8;
    EXPECT_EQ(out, -1.0f);
  }
  EXPECT_OK(lnmlp_fp8_encode(LNMLP_DTYPE_FP8_E4M3, in, 3, 1.0f, codes));
  EXPECT_EQ(codes[0], 0x38);  // 1.0: exponent 7 (the bias), no mantissa
  EXPECT_EQ(codes[1], 0x7e);  // 448, E4M3's largest finite value (0x7f is NaN)
  EXPECT_EQ(codes[2], 0x7e);  // saturated
  EXPECT_OK(lnmlp_fp8_encode(LNMLP_DTYPE_FP8_E5M2, in, 3, 1.0f, codes));
  EXPECT_EQ(codes[0], 0x3c);  // 1.0: exponent 15 (the bias)
  EXPECT_EQ(codes[1], 0x5f);  // 448 = 1.75 * 2^8: exponent 23, mantissa 0b11
  EXPECT_EQ(codes[2], 0x7b);  // saturated to 57344, E5M2's largest finite value, never infinity
  float back[3] = {0, 0, 0};
  EXPECT_OK(lnmlp_fp8_decode(LNMLP_DTYPE_FP8_E5M2, codes, 3, 0.5f, back));
  EXPECT_EQ(back[0], 0.5f);
  EXPECT_EQ(back[1], 224.0f);
  EXPECT_EQ(back[2], 28672.0f);
}

TEST(Status, QuerySupport) {
  auto q = [](int32_t backend, int32_t feature) {
    int32_t v = -1;
    EXPECT_OK(lnmlp_query_support(backend, feature, &v));
    EXPECT_TRUE(v == LNMLP_UNSUPPORTED || v == LNMLP_SUPPORTED || v == LNMLP_SUPPORTED_EMULATED) << v;
    return v;
  };
  EXPECT_EQ(q(LNMLP_BACKEND_CPU, LNMLP_FEATURE_BACKEND), 1);
  EXPECT_EQ(q(LNMLP_BACKEND_CPU, LNMLP_FEATURE_DTYPE_F32), 1);
  EXPECT_EQ(q(LNMLP_BACKEND_CPU, LNMLP_FEATURE_DTYPE_BF16), 1);
  EXPECT_EQ(q(LNMLP_BACKEND_CPU, LNMLP_FEATURE_DTYPE_F16), 1);
  EXPECT_EQ(q(LNMLP_BACKEND_CPU, LNMLP_FEATURE_EXTERNAL_WORKSPACE), 1);
  // Every FP8 recipe runs on the CPU, emulated exactly (docs/fp8.md); so does sharding (docs/sharding.md).
  for (int32_t f : {LNMLP_FEATURE_RECIPE_DELAYED, LNMLP_FEATURE_RECIPE_CURRENT, LNMLP_FEATURE_RECIPE_BLOCK,
                    LNMLP_FEATURE_RECIPE_MXFP8, LNMLP_FEATURE_RECIPE_NVFP4})
    EXPECT_EQ(q(LNMLP_BACKEND_CPU, f), LNMLP_SUPPORTED_EMULATED) << f;
  // NVFP4 on CUDA: emulated on every GPU where the backend is usable (no FP4 GEMMs before sm_100).
  EXPECT_EQ(
      q(LNMLP_BACKEND_CUDA, LNMLP_FEATURE_RECIPE_NVFP4),
      q(LNMLP_BACKEND_CUDA, LNMLP_FEATURE_BACKEND) == LNMLP_SUPPORTED ? LNMLP_SUPPORTED_EMULATED : LNMLP_UNSUPPORTED);
  // Only FP8 recipes are ever emulated.
  for (int32_t f : std::initializer_list<int32_t>{LNMLP_FEATURE_BACKEND, LNMLP_FEATURE_DTYPE_F32,
                                                  LNMLP_FEATURE_SHARDING, LNMLP_FEATURE_EXTERNAL_WORKSPACE})
    for (int32_t backend : std::initializer_list<int32_t>{LNMLP_BACKEND_CPU, LNMLP_BACKEND_CUDA})
      EXPECT_NE(q(backend, f), LNMLP_SUPPORTED_EMULATED);
  EXPECT_EQ(q(LNMLP_BACKEND_CPU, LNMLP_FEATURE_SHARDING), 1);
  for (int32_t f = LNMLP_FEATURE_BACKEND; f <= LNMLP_FEATURE_RECIPE_NVFP4; ++f) q(LNMLP_BACKEND_CUDA, f);
  // A backend that is not usable supports nothing.
  if (q(LNMLP_BACKEND_CUDA, LNMLP_FEATURE_BACKEND) == 0) {
    for (int32_t f = LNMLP_FEATURE_BACKEND; f <= LNMLP_FEATURE_RECIPE_NVFP4; ++f) {
      EXPECT_EQ(q(LNMLP_BACKEND_CUDA, f), 0) << f;
    }
  }
  // Unknown values.
  int32_t v = 42;
  EXPECT_FAILS(lnmlp_query_support(2, LNMLP_FEATURE_BACKEND, &v), LNMLP_ERROR_INVALID_ARGUMENT, "backend");
  EXPECT_FAILS(lnmlp_query_support(-1, LNMLP_FEATURE_BACKEND, &v), LNMLP_ERROR_INVALID_ARGUMENT, "backend");
  EXPECT_FAILS(lnmlp_query_support(LNMLP_BACKEND_CPU, 11, &v), LNMLP_ERROR_INVALID_ARGUMENT, "feature");
  EXPECT_FAILS(lnmlp_query_support(LNMLP_BACKEND_CPU, -1, &v), LNMLP_ERROR_INVALID_ARGUMENT, "feature");
  EXPECT_EQ(v, 42) << "a failed query wrote its output";
}

// ---------------------------------------------------------------------------------------------
// Threads
// ---------------------------------------------------------------------------------------------

TEST(Threads, DistinctPlansOnFourThreadsAtOnce) {
  // Expected results, computed on this thread one plan at a time.
  std::vector<Result> expected;
  for (int t = 0; t < 4; ++t) {
    Block b(kConfigs[t], nullptr, 100 + t);
    expected.push_back(b.run());
  }
  std::atomic<int> failures{0};
  std::atomic<int> ready{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([t, &expected, &failures, &ready] {
      ++ready;
      while (ready.load() < 4) std::this_thread::yield();
      for (int round = 0; round < 3; ++round) {
        Block b(kConfigs[t], nullptr, 100 + t);  // created on this thread, concurrently with the others
        if (b.plan == nullptr) {
          ++failures;
          return;
        }
        for (int i = 0; i < 4; ++i)
          if (!(b.run() == expected[t])) ++failures;
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST(Threads, OnePlanFromTwoThreadsIsNeverCorrupted) {
  const Cfg c = kConfigs[0];
  Block shared(c);
  ASSERT_NE(shared.plan, nullptr);
  const Result expected = shared.run();

  std::atomic<int> ok{0}, busy{0}, bad{0};
  std::atomic<int> ready{0};
  auto worker = [&](uint32_t) {
    // Own buffers, same plan: inputs equal to `shared`'s (same seed), outputs private.
    Block mine(c);  // only for its buffers
    ++ready;
    while (ready.load() < 2) std::this_thread::yield();
    for (int i = 0; i < 150; ++i) {
      mine.fill_outputs(kSentinel);
      const int32_t f = call_forward(shared.plan, mine.fwd());
      if (f == LNMLP_ERROR_PLAN_BUSY) {
        ++busy;
        if (!mine.outputs_untouched()) ++bad;  // a busy call changed nothing
        if (!names(lnmlp_last_error(), "thread")) ++bad;
        continue;
      }
      if (f != LNMLP_SUCCESS || mine.y.copy() != expected.y) {
        ++bad;
        continue;
      }
      const int32_t g = call_backward(shared.plan, mine.bwd());
      if (g == LNMLP_ERROR_PLAN_BUSY) {
        ++busy;
        if (!mine.bwd_outputs_untouched()) ++bad;
        continue;
      }
      if (g != LNMLP_SUCCESS || mine.dw1.copy() != expected.dw1 || mine.dx.copy() != expected.dx ||
          mine.db1.copy() != expected.db1 || mine.dgamma.copy() != expected.dgamma)
        ++bad;
      else
        ++ok;
      // Queries and attach attempts on the shared plan meanwhile.
      int64_t v = 0;
      if (lnmlp_plan_get_saved_bytes(shared.plan, &v) != LNMLP_SUCCESS || v != shared.saved_bytes) ++bad;
    }
  };
  std::thread t1(worker, 1), t2(worker, 2);
  t1.join();
  t2.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_GT(ok.load(), 0);
  std::printf("[          ] shared plan: %d full runs succeeded, %d calls were PLAN_BUSY\n", ok.load(), busy.load());
  // Afterwards, single-threaded: exactly the expected bits.
  EXPECT_TRUE(shared.run() == expected);
}

TEST(Threads, DestroyWhileAnotherThreadRuns) {
  const Cfg c = kSmall;
  lnmlp_plan* plan = nullptr;
  {
    lnmlp_desc* d = make_desc(c);
    ASSERT_OK(lnmlp_plan_create(d, &plan));
    ASSERT_OK(lnmlp_desc_destroy(d));
  }
  Block bufs(c);
  std::atomic<bool> started{false};
  std::atomic<int> bad{0};
  std::thread runner([&] {
    for (int i = 0; i < 100000; ++i) {
      const int32_t st = call_forward(plan, bufs.fwd());
      started = true;
      if (st == LNMLP_ERROR_INVALID_HANDLE) return;  // destroyed: the registry says so
      if (st != LNMLP_SUCCESS) ++bad;
    }
  });
  while (!started.load()) std::this_thread::yield();
  int busy = 0;
  int32_t st;
  while ((st = lnmlp_plan_destroy(plan)) == LNMLP_ERROR_PLAN_BUSY) ++busy;
  EXPECT_EQ(st, LNMLP_SUCCESS) << last_error();
  runner.join();
  EXPECT_EQ(bad.load(), 0);
}

// ---------------------------------------------------------------------------------------------
// Numbers: one configuration against the float64 reference
// ---------------------------------------------------------------------------------------------

std::vector<double> as_doubles(const Buf& b, size_t n) {
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) {
    float f;
    std::memcpy(&f, b.data() + 4 * i, 4);
    v[i] = f;
  }
  return v;
}

TEST(Numerics, ForwardMatchesTheReference) {
  Cfg c = {"ref", 5, 32, 24, LNMLP_NORM_LAYERNORM, LNMLP_DTYPE_F32, LNMLP_REMAT_SAVE_ALL,
           {LNMLP_ACT_GELU, LNMLP_ACT_LINEAR}, true, true, false};
  c.eps = 1e-5f;
  Block b(c, nullptr, 7);
  ASSERT_NE(b.plan, nullptr);
  b.run();

  lnmlp_ref::Config rc;
  rc.tokens = c.T, rc.hidden = c.H, rc.ffn = c.F;
  rc.norm = lnmlp_ref::Norm::LayerNorm;
  rc.epsilon = c.eps;
  rc.acts = {LNMLP_ACT_GELU, LNMLP_ACT_LINEAR};
  rc.has_bias1 = rc.has_bias2 = true;
  const size_t T = c.T, H = c.H, AF = c.A() * c.F, F = c.F;
  lnmlp_ref::Params p;
  p.gamma = as_doubles(b.gamma, H);
  p.beta = as_doubles(b.beta, H);
  p.w1 = as_doubles(b.w1, H * AF);
  p.b1 = as_doubles(b.b1, AF);
  p.w2 = as_doubles(b.w2, F * H);
  p.b2 = as_doubles(b.b2, H);
  const std::vector<double> ref = lnmlp_ref::forward(rc, as_doubles(b.x, T * H), p);
  ASSERT_EQ(ref.size(), T * H);
  const std::vector<double> y = as_doubles(b.y, T * H);
  double max_ref = 0.0;
  for (double r : ref) max_ref = std::max(max_ref, std::abs(r));
  ASSERT_GT(max_ref, 0.1) << "degenerate test data";
  for (size_t i = 0; i < T * H; ++i)
    EXPECT_NEAR(y[i], ref[i], 1e-4 * (1.0 + std::abs(ref[i]))) << "y[" << i / H << "][" << i % H << "]";
}

}  // namespace
