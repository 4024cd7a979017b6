// ABI 2's calls: each forward / backward takes its own token count (0 .. the plan's), the shape
// query sizes every tensor of a call, and delayed scaling's state may live in caller memory.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "test_util.h"
#include "tolerances.h"

using namespace lnmlp_test;

namespace {

constexpr int64_t kMaxTokens = 48;

struct Case {
  const char* name;
  int32_t dtype;
  lnmlp_ref::Norm norm;
  std::vector<int> acts;
  bool bias;
  int32_t remat;
  int32_t recipe;
};

lnmlp_ref::Config config_of(const Case& k, int64_t tokens) {
  lnmlp_ref::Config c = lnmlp_ref::biased_config(tokens, 32, 48, k.acts, k.norm);
  c.has_bias1 = c.has_bias2 = k.bias;
  return c;
}

RunOptions options_of(const Case& k) {
  RunOptions o;
  o.remat = k.remat;
  o.recipe = k.recipe;
  o.num_threads = 2;  // a fixed count: the CPU backend's results are bitwise repeatable at one
  o.steps = k.recipe == LNMLP_RECIPE_DELAYED ? 3 : 1;
  o.amax_history_len = 4;
  return o;
}

const Case kCases[] = {
    {"f32_layernorm_gelu_bias",
     LNMLP_DTYPE_F32,
     lnmlp_ref::Norm::LayerNorm,
     {LNMLP_ACT_GELU},
     true,
     LNMLP_REMAT_SAVE_ALL,
     LNMLP_RECIPE_NONE},
    {"bf16_rmsnorm_swiglu_ffn1",
     LNMLP_DTYPE_BF16,
     lnmlp_ref::Norm::RmsNorm,
     {LNMLP_ACT_SILU, LNMLP_ACT_LINEAR},
     false,
     LNMLP_REMAT_SAVE_FFN1,
     LNMLP_RECIPE_NONE},
    {"f16_layernorm_relu_stats",
     LNMLP_DTYPE_F16,
     lnmlp_ref::Norm::LayerNorm,
     {LNMLP_ACT_RELU},
     true,
     LNMLP_REMAT_SAVE_STATS,
     LNMLP_RECIPE_NONE},
    {"bf16_delayed",
     LNMLP_DTYPE_BF16,
     lnmlp_ref::Norm::LayerNorm,
     {LNMLP_ACT_GELU},
     true,
     LNMLP_REMAT_SAVE_ALL,
     LNMLP_RECIPE_DELAYED},
    {"f32_current_geglu",
     LNMLP_DTYPE_F32,
     lnmlp_ref::Norm::RmsNorm,
     {LNMLP_ACT_GELU, LNMLP_ACT_LINEAR},
     true,
     LNMLP_REMAT_SAVE_ALL,
     LNMLP_RECIPE_CURRENT},
    {"bf16_block",
     LNMLP_DTYPE_BF16,
     lnmlp_ref::Norm::LayerNorm,
     {LNMLP_ACT_SILU},
     true,
     LNMLP_REMAT_SAVE_ALL,
     LNMLP_RECIPE_BLOCK},
    {"f32_mxfp8",
     LNMLP_DTYPE_F32,
     lnmlp_ref::Norm::LayerNorm,
     {LNMLP_ACT_RELU},
     false,
     LNMLP_REMAT_SAVE_ALL,
     LNMLP_RECIPE_MXFP8},
};

class TokensPerCall : public ::testing::TestWithParam<Case> {};

// A problem of t tokens (drawn from seed + t) run on a plan made for kMaxTokens, with `prepared`
// counts, gives every output and the FP8 state bit for bit as a plan made for exactly t.
void expect_bits_of_exact_plan(const Case& k, int64_t t, uint64_t seed, std::vector<int64_t> prepared) {
  SCOPED_TRACE("tokens " + std::to_string(t));
  const Problem pr = make_problem(config_of(k, t), k.dtype, seed + static_cast<uint64_t>(t));
  RunOptions o = options_of(k);
  const RunResult exact = run_library(pr, o);
  o.max_tokens = kMaxTokens;
  o.prepared_tokens = std::move(prepared);
  const RunResult call = run_library(pr, o);
  EXPECT_TRUE(same_outputs(call, exact));
  EXPECT_EQ(call.state, exact.state) << "the delayed-scaling state differs";
}

// A call with t tokens on a plan made for kMaxTokens gives the bits a plan made for exactly t
// gives: t = 1, a prime, and the maximum.
TEST_P(TokensPerCall, ACallComputesWhatAPlanMadeForItsTokensComputes) {
  for (int64_t t : {int64_t{1}, int64_t{37}, kMaxTokens}) expect_bits_of_exact_plan(GetParam(), t, 1000, {});
}

// A count the plan made its GEMMs for at creation (lnmlp_desc_set_prepared_tokens) runs those GEMMs:
// the bits of a plan made for exactly that count, whichever prepared count the call has (1, a
// prime, a count given twice) and for a count not prepared beside them.
TEST_P(TokensPerCall, PreparedCountsComputeWhatAPlanMadeForThemComputes) {
  for (int64_t t : {int64_t{1}, int64_t{37}, int64_t{20}})
    expect_bits_of_exact_plan(GetParam(), t, 2000, {37, 1, 37, 16});
}

// And a call with fewer tokens is right, not merely the same as another plan.
TEST_P(TokensPerCall, AShortCallMatchesTheFloat64Reference) {
  const Case& k = GetParam();
  if (k.recipe != LNMLP_RECIPE_NONE) GTEST_SKIP() << "FP8 plans are checked against the reference in test_fp8_plan";
  const Problem pr = make_problem(config_of(k, 13), k.dtype, 7);
  RunOptions o = options_of(k);
  o.max_tokens = kMaxTokens;
  EXPECT_TRUE(matches_reference(pr, run_library(pr, o), tolerance_for(k.dtype), {"y", "dx", "dW1", "dW2", "dgamma"}));
}

INSTANTIATE_TEST_SUITE_P(All, TokensPerCall, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

// Few tokens on two threads: every count from 1 to 17 and both sides of the CPU backend's switch to
// column-sliced GEMMs at 128 rows (src/cpu/gemm_onednn.cpp, SplitGemm's few-rows rule; H and A*F
// are wide enough to be sliced, and not multiples of the slices), each a plan made for exactly
// that many tokens, f32 and bf16, against float64. With LNMLP_TEST_WEIGHT_LAYOUT=out_in (the
// suite's weights_out_in run) the weights are stored [n, k], which the rule leaves whole.
TEST(FewTokens, EveryCountUpTo17AndAcrossTheSliceSwitchMatchesFloat64) {
  std::vector<int64_t> counts;
  for (int64_t t = 1; t <= 17; ++t) counts.push_back(t);
  for (int64_t t : {127, 128, 129}) counts.push_back(t);
  for (int32_t dtype : {LNMLP_DTYPE_F32, LNMLP_DTYPE_BF16})
    for (int64_t tokens : counts) {
      SCOPED_TRACE(std::string(dtype_label(dtype)) + ", " + std::to_string(tokens) + " tokens");
      const Problem pr = make_problem(lnmlp_ref::biased_config(tokens, 272, 300, {LNMLP_ACT_GELU}), dtype, 90 + tokens);
      RunOptions o;
      o.num_threads = 2;
      EXPECT_TRUE(matches_reference(pr, run_library(pr, o), tolerance_for(dtype), {"y", "dx", "dW1", "dW2"}));
    }
}

// Packed weights (src/cpu/gemm.h, packed_b_bytes): calls flagged LNMLP_CALL_WEIGHTS_UNCHANGED read
// W1 and W2 from a copy in the GEMM library's own layout, which the first flagged call makes. Two
// flagged steps per plan (the second reads the first's copy), at every count from 1 to 17 and
// across 128, for each representation the copy is made from: the weights themselves (f32, bf16),
// their widened copies (f16) and their decoded FP8 copies (current scaling), against float64.
TEST(PackedWeights, FlaggedCallsAtEveryCountUpTo17MatchFloat64) {
  std::vector<int64_t> counts;
  for (int64_t t = 1; t <= 17; ++t) counts.push_back(t);
  for (int64_t t : {127, 128, 129}) counts.push_back(t);
  struct Kind {
    int32_t dtype, recipe;
  };
  for (const Kind k : {Kind{LNMLP_DTYPE_F32, LNMLP_RECIPE_NONE}, Kind{LNMLP_DTYPE_BF16, LNMLP_RECIPE_NONE},
                       Kind{LNMLP_DTYPE_F16, LNMLP_RECIPE_NONE}, Kind{LNMLP_DTYPE_BF16, LNMLP_RECIPE_CURRENT}})
    for (int64_t tokens : counts) {
      SCOPED_TRACE(std::string(dtype_label(k.dtype)) + (k.recipe != LNMLP_RECIPE_NONE ? " current scaling" : "") +
                   ", " + std::to_string(tokens) + " tokens");
      const Problem pr =
          make_problem(lnmlp_ref::biased_config(tokens, 272, 300, {LNMLP_ACT_GELU}), k.dtype, 7 + tokens);
      RunOptions o;
      o.num_threads = 2;
      o.recipe = k.recipe;
      o.steps = 2;
      o.weights_unchanged = true;
      const Tolerance tol = k.recipe != LNMLP_RECIPE_NONE ? kTolFp8 : tolerance_for(k.dtype);
      EXPECT_TRUE(matches_reference(pr, run_library(pr, o), tol, {"y", "dx", "dW1", "dW2"}));
    }
}

// One plan, its tensors, and calls of any token count on it.
struct Fixture {
  Problem pr;
  RunOptions o;
  std::unique_ptr<Plan> plan;
  AlignedMemory saved;

  Fixture(const Case& k, int64_t max_tokens)
      : pr(make_problem(config_of(k, max_tokens), k.dtype, 3)), o(options_of(k)) {
    plan = std::make_unique<Plan>(pr, o);
    int64_t bytes = 0;
    LNMLP_TEST_CHECK(lnmlp_plan_get_saved_bytes(plan->get(), &bytes));
    saved = AlignedMemory(bytes, plan->alignment(), 0xFF);
  }
  int32_t forward(int64_t t, void* y, void* state = nullptr, int32_t flags = LNMLP_CALL_DEFAULT) {
    return lnmlp_plan_forward(plan->get(), t, t > 0 ? pr.bx.data() : nullptr, pr.bgamma.data(), pr.bbeta.data(),
                              pr.bw1.data(), pr.bb1.data(), pr.bw2.data(), pr.bb2.data(), y,
                              t > 0 ? saved.get() : nullptr, state, flags, nullptr);
  }
  int32_t backward(int64_t t, void* dx, RunResult& g, void* state = nullptr, int32_t flags = LNMLP_CALL_DEFAULT) {
    return lnmlp_plan_backward(plan->get(), t, t > 0 ? pr.bdy.data() : nullptr, t > 0 ? pr.bx.data() : nullptr,
                               pr.bgamma.data(), pr.bbeta.data(), pr.bw1.data(), pr.bb1.data(), pr.bw2.data(),
                               t > 0 ? saved.get() : nullptr, dx, g.dgamma.data(), g.dbeta.data(), g.dw1.data(),
                               g.db1.data(), g.dw2.data(), g.db2.data(), state, flags, nullptr);
  }
  // Forward and backward of all the plan's tokens with `flags` (backward's: bwd_flags, or the same
  // when -1); y, dx and the gradients.
  RunResult step(int32_t flags, int32_t bwd_flags = -1) {
    const int64_t t = pr.cfg.tokens;
    RunResult r = gradients();
    r.y = Buffer(pr.dtype, static_cast<size_t>(t * pr.cfg.hidden));
    r.dx = Buffer(pr.dtype, static_cast<size_t>(t * pr.cfg.hidden));
    LNMLP_TEST_CHECK(forward(t, r.y.data(), nullptr, flags));
    LNMLP_TEST_CHECK(backward(t, r.dx.data(), r, nullptr, bwd_flags < 0 ? flags : bwd_flags));
    return r;
  }
  // Poisoned parameter-gradient buffers.
  RunResult gradients() const {
    const auto& c = pr.cfg;
    const size_t H = static_cast<size_t>(c.hidden), AF = c.acts.size() * static_cast<size_t>(c.ffn);
    RunResult g;
    g.dgamma = Buffer(pr.dtype, H);
    if (c.norm == lnmlp_ref::Norm::LayerNorm) g.dbeta = Buffer(pr.dtype, H);
    g.dw1 = Buffer(pr.dtype, H * AF);
    if (c.has_bias1) g.db1 = Buffer(pr.dtype, AF);
    g.dw2 = Buffer(pr.dtype, static_cast<size_t>(c.ffn) * H);
    if (c.has_bias2) g.db2 = Buffer(pr.dtype, H);
    for (Buffer* b : {&g.dgamma, &g.dbeta, &g.dw1, &g.db1, &g.dw2, &g.db2}) b->poison();
    return g;
  }
  std::vector<unsigned char> state_blob() const {
    int64_t bytes = 0;
    LNMLP_TEST_CHECK(lnmlp_plan_get_state_bytes(plan->get(), &bytes));
    std::vector<unsigned char> blob(static_cast<size_t>(bytes));
    if (bytes > 0) LNMLP_TEST_CHECK(lnmlp_plan_export_state(plan->get(), blob.data(), bytes));
    return blob;
  }
};

bool all_zero(const Buffer& b) {
  for (unsigned char c : b.bytes)
    if (c != 0) return false;
  return true;
}

const Case kDelayed = kCases[3];

// A mixture-of-experts expert that received no tokens: forward touches nothing, backward gives
// zero parameter gradients, and the FP8 state stays as it was.
TEST(TokensPerCallEdges, NoTokens) {
  Fixture f(kDelayed, 16);
  const std::vector<unsigned char> before = f.state_blob();
  ASSERT_EQ(f.forward(0, nullptr), LNMLP_SUCCESS) << lnmlp_last_error();
  RunResult g = f.gradients();
  ASSERT_EQ(f.backward(0, nullptr, g), LNMLP_SUCCESS) << lnmlp_last_error();
  for (const Buffer* b : {&g.dgamma, &g.dbeta, &g.dw1, &g.db1, &g.dw2, &g.db2})
    EXPECT_TRUE(all_zero(*b)) << "a parameter gradient of a call with no tokens is not zero";
  EXPECT_EQ(f.state_blob(), before);
}

// Forward writes every byte of the call's saved bytes, the regions' padding included: two
// forwards into buffers poisoned differently leave the same bytes (37 tokens: every region padded).
TEST_P(TokensPerCall, ForwardWritesTheWholeSavedBuffer) {
  Fixture f(GetParam(), kMaxTokens);
  const int64_t t = 37;
  int64_t rank = 0, dims[LNMLP_MAX_TENSOR_RANK] = {};
  int32_t dtype = 0;
  ASSERT_EQ(lnmlp_plan_get_tensor_shape(f.plan->get(), LNMLP_TENSOR_SAVED, t, &rank, dims, &dtype), LNMLP_SUCCESS);
  Buffer y(f.pr.dtype, static_cast<size_t>(t * f.pr.cfg.hidden));
  std::vector<std::vector<unsigned char>> got;
  const std::vector<unsigned char> state = f.state_blob();  // both forwards start from it (delayed)
  for (unsigned char poison : {0x00, 0xFF}) {
    if (!state.empty()) {
      ASSERT_EQ(lnmlp_plan_import_state(f.plan->get(), state.data(), static_cast<int64_t>(state.size())),
                LNMLP_SUCCESS);
    }
    std::memset(f.saved.get(), poison, static_cast<size_t>(f.saved.bytes));
    ASSERT_EQ(f.forward(t, y.data()), LNMLP_SUCCESS) << lnmlp_last_error();
    const auto* b = static_cast<const unsigned char*>(f.saved.get());
    got.emplace_back(b, b + dims[0]);
  }
  EXPECT_EQ(got[0], got[1]) << "saved bytes the forward did not write";
}

TEST(TokensPerCallEdges, ATokenCountOutsideThePlansIsRefusedAndChangesNothing) {
  Fixture f(kCases[0], 16);
  const int64_t H = f.pr.cfg.hidden;
  for (int64_t t : {int64_t{-1}, int64_t{17}, int64_t{1} << 40}) {
    SCOPED_TRACE("tokens " + std::to_string(t));
    Buffer y(f.pr.dtype, 16 * static_cast<size_t>(H));
    y.poison();
    const Buffer untouched = y;
    EXPECT_EQ(f.forward(t, y.data()), LNMLP_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(lnmlp_last_error()).find("tokens must be in [0, 16]"), std::string::npos)
        << lnmlp_last_error();
    EXPECT_EQ(y.bytes, untouched.bytes);
    RunResult g = f.gradients();
    const RunResult g0 = g;
    Buffer dx(f.pr.dtype, 16 * static_cast<size_t>(H));
    EXPECT_EQ(f.backward(t, dx.data(), g), LNMLP_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(g.dw1.bytes, g0.dw1.bytes);
  }
  Buffer y(f.pr.dtype, 16 * static_cast<size_t>(H));
  EXPECT_EQ(f.forward(16, y.data(), nullptr, 2), LNMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(lnmlp_last_error()).find("flags"), std::string::npos);
}

// ---- the shape query ----

struct QueriedShape {
  int64_t rank = 0;
  std::vector<int64_t> dims;
  int32_t dtype = 0;
};

QueriedShape query(const lnmlp_plan* plan, int32_t tensor, int64_t tokens) {
  QueriedShape s;
  int64_t dims[LNMLP_MAX_TENSOR_RANK] = {7, 7, 7};
  LNMLP_TEST_CHECK(lnmlp_plan_get_tensor_shape(plan, tensor, tokens, &s.rank, dims, &s.dtype));
  for (int64_t i = 0; i < s.rank; ++i) s.dims.push_back(dims[i]);
  for (int64_t i = s.rank < 0 ? 0 : s.rank; i < LNMLP_MAX_TENSOR_RANK; ++i)
    if (dims[i] != 0) throw std::runtime_error("an unused dimension is not 0");
  return s;
}

TEST(ShapeQuery, EveryTensorOfALayerNormGatedPlanWithBiases) {
  const Case k{"q",  LNMLP_DTYPE_BF16,     lnmlp_ref::Norm::LayerNorm, {LNMLP_ACT_SILU, LNMLP_ACT_LINEAR},
               true, LNMLP_REMAT_SAVE_ALL, LNMLP_RECIPE_NONE};
  Fixture f(k, 40);
  const lnmlp_plan* p = f.plan->get();
  using V = std::vector<int64_t>;
  for (int32_t t : {LNMLP_TENSOR_X, LNMLP_TENSOR_Y, LNMLP_TENSOR_DY, LNMLP_TENSOR_DX}) {
    EXPECT_EQ(query(p, t, 5).dims, (V{5, 32}));
    EXPECT_EQ(query(p, t, LNMLP_TOKENS_MAX).dims, (V{40, 32}));
    EXPECT_EQ(query(p, t, 0).dims, (V{0, 32}));
    EXPECT_EQ(query(p, t, 5).dtype, LNMLP_DTYPE_BF16);
  }
  for (int32_t t : {LNMLP_TENSOR_GAMMA, LNMLP_TENSOR_BETA, LNMLP_TENSOR_B2, LNMLP_TENSOR_DGAMMA, LNMLP_TENSOR_DBETA,
                    LNMLP_TENSOR_DB2})
    EXPECT_EQ(query(p, t, 5).dims, (V{32}));
  // The weights in the plan's layout: in x out [H, A, F] and [F, H], or out x in [A, F, H] and [H, F].
  const bool out_in = f.pr.weight_layout == LNMLP_WEIGHT_LAYOUT_OUT_IN;
  for (int32_t t : {LNMLP_TENSOR_W1, LNMLP_TENSOR_DW1})
    EXPECT_EQ(query(p, t, 5).dims, out_in ? (V{2, 48, 32}) : (V{32, 2, 48}));
  EXPECT_EQ(query(p, LNMLP_TENSOR_B1, 5).dims, (V{2, 48}));
  for (int32_t t : {LNMLP_TENSOR_W2, LNMLP_TENSOR_DW2})
    EXPECT_EQ(query(p, t, 5).dims, out_in ? (V{32, 48}) : (V{48, 32}));
  EXPECT_EQ(query(p, LNMLP_TENSOR_FP8_STATE, 5).rank, -1);
  // The saved buffer of a call is what a plan made for its tokens saves.
  int64_t most = 0;
  LNMLP_TEST_CHECK(lnmlp_plan_get_saved_bytes(p, &most));
  EXPECT_EQ(query(p, LNMLP_TENSOR_SAVED, LNMLP_TOKENS_MAX).dims, (V{most}));
  EXPECT_EQ(query(p, LNMLP_TENSOR_SAVED, 5).dtype, LNMLP_DTYPE_U8);
  for (int64_t t : {1, 13, 40}) {
    Fixture exact(k, t);
    int64_t bytes = 0;
    LNMLP_TEST_CHECK(lnmlp_plan_get_saved_bytes(exact.plan->get(), &bytes));
    EXPECT_EQ(query(p, LNMLP_TENSOR_SAVED, t).dims, (V{bytes})) << "tokens " << t;
  }
}

TEST(ShapeQuery, AbsentTensorsAndDelayedState) {
  Case k = kDelayed;
  k.norm = lnmlp_ref::Norm::RmsNorm;
  k.bias = false;
  Fixture f(k, 8);
  const lnmlp_plan* p = f.plan->get();
  for (int32_t t :
       {LNMLP_TENSOR_BETA, LNMLP_TENSOR_DBETA, LNMLP_TENSOR_B1, LNMLP_TENSOR_DB1, LNMLP_TENSOR_B2, LNMLP_TENSOR_DB2})
    EXPECT_EQ(query(p, t, 8).rank, -1) << "tensor " << t;
  const QueriedShape s = query(p, LNMLP_TENSOR_FP8_STATE, 8);
  EXPECT_EQ(s.dims, (std::vector<int64_t>{LNMLP_QUANTIZER_COUNT, 1 + 4}));
  EXPECT_EQ(s.dtype, LNMLP_DTYPE_F32);
}

TEST(ShapeQuery, BadArgumentsAreRefused) {
  Fixture f(kCases[0], 8);
  const lnmlp_plan* p = f.plan->get();
  int64_t rank = 0;
  int32_t dtype = 0;
  int64_t dims[LNMLP_MAX_TENSOR_RANK];
  EXPECT_EQ(lnmlp_plan_get_tensor_shape(p, LNMLP_TENSOR_COUNT, 8, &rank, dims, &dtype), LNMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(lnmlp_plan_get_tensor_shape(p, -1, 8, &rank, dims, &dtype), LNMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(lnmlp_plan_get_tensor_shape(p, LNMLP_TENSOR_X, 9, &rank, dims, &dtype), LNMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(lnmlp_plan_get_tensor_shape(p, LNMLP_TENSOR_X, -2, &rank, dims, &dtype), LNMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(lnmlp_plan_get_tensor_shape(p, LNMLP_TENSOR_X, 8, nullptr, dims, &dtype), LNMLP_ERROR_NULL_POINTER);
  EXPECT_EQ(lnmlp_plan_get_tensor_shape(p, LNMLP_TENSOR_X, 8, &rank, nullptr, &dtype), LNMLP_ERROR_NULL_POINTER);
  EXPECT_EQ(lnmlp_plan_get_tensor_shape(nullptr, LNMLP_TENSOR_X, 8, &rank, dims, &dtype), LNMLP_ERROR_NULL_POINTER);
}

// ---- caller-owned FP8 state ----

// Passed to each call or attached, a caller's array gives the bits of the plan's own state, and
// ends holding the same state.
TEST(CallerOwnedFp8State, PerCallAndAttachedGiveThePlansOwnResults) {
  for (int64_t t : {int64_t{13}, kMaxTokens}) {
    SCOPED_TRACE("tokens " + std::to_string(t));
    const Problem pr = make_problem(config_of(kDelayed, t), kDelayed.dtype, 11);
    RunOptions o = options_of(kDelayed);
    o.max_tokens = kMaxTokens;
    const RunResult own = run_library(pr, o);
    for (auto where : {RunOptions::State::PerCall, RunOptions::State::Attached}) {
      o.state = where;
      const RunResult caller = run_library(pr, o);
      EXPECT_TRUE(same_outputs(caller, own));
      EXPECT_EQ(caller.state, own.state);
    }
  }
}

// A per-call state leaves the plan's own untouched; detaching returns to the plan's own.
TEST(CallerOwnedFp8State, ThePlansOwnStateIsUntouchedAndComesBack) {
  Fixture f(kDelayed, 16);
  const std::vector<unsigned char> fresh = f.state_blob();
  std::vector<float> mine(static_cast<size_t>(LNMLP_QUANTIZER_COUNT * 5), 0.0f);
  for (int q = 0; q < LNMLP_QUANTIZER_COUNT; ++q) mine[static_cast<size_t>(q * 5)] = 1.0f;
  Buffer y(f.pr.dtype, 16 * 32);
  ASSERT_EQ(f.forward(16, y.data(), mine.data()), LNMLP_SUCCESS) << lnmlp_last_error();
  EXPECT_EQ(f.state_blob(), fresh) << "a call given its own state changed the plan's";
  EXPECT_GT(mine[1], 0.0f) << "the ln_out quantizer did not record its amax in the caller's state";
  ASSERT_EQ(lnmlp_plan_attach_fp8_state(f.plan->get(), mine.data()), LNMLP_SUCCESS);
  EXPECT_NE(f.state_blob(), fresh);
  float scale = 0.0f;
  std::vector<float> history(4);
  ASSERT_EQ(lnmlp_plan_set_quantizer_state(f.plan->get(), LNMLP_QUANTIZER_W1, 2.0f, history.data(), 4), LNMLP_SUCCESS);
  EXPECT_EQ(mine[5], 2.0f) << "set_quantizer_state did not write the attached array";
  ASSERT_EQ(lnmlp_plan_attach_fp8_state(f.plan->get(), nullptr), LNMLP_SUCCESS);
  EXPECT_EQ(f.state_blob(), fresh);
  ASSERT_EQ(lnmlp_plan_get_quantizer_state(f.plan->get(), LNMLP_QUANTIZER_W1, &scale, nullptr, 0), LNMLP_SUCCESS);
  EXPECT_EQ(scale, 1.0f);
}

TEST(CallerOwnedFp8State, MisuseIsRefused) {
  Fixture current(kCases[4], 16);
  std::vector<float> state(64, 1.0f);
  Buffer y(current.pr.dtype, 16 * 32);
  EXPECT_EQ(current.forward(16, y.data(), state.data()), LNMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(lnmlp_last_error()).find("keeps no quantizer state"), std::string::npos);
  EXPECT_EQ(lnmlp_plan_attach_fp8_state(current.plan->get(), state.data()), LNMLP_ERROR_INVALID_ARGUMENT);

  Fixture delayed(kDelayed, 16);
  void* odd = reinterpret_cast<char*>(state.data()) + 1;
  EXPECT_EQ(delayed.forward(16, y.data(), odd), LNMLP_ERROR_MISALIGNED);
  EXPECT_EQ(lnmlp_plan_attach_fp8_state(delayed.plan->get(), odd), LNMLP_ERROR_MISALIGNED);
}

// ---- weights reused across calls (LNMLP_CALL_WEIGHTS_UNCHANGED) ----

// With unchanged weights, reusing the kept copies gives the bits of making them again (delayed
// scaling aside: its reused copies keep their first scale): over several steps, each forward and
// backward flagged after the first forward.
TEST_P(TokensPerCall, ReusedWeightCopiesGiveTheBitsOfNewOnes) {
  const Case& k = GetParam();
  if (k.recipe == LNMLP_RECIPE_DELAYED) GTEST_SKIP() << "delayed scaling's reused copies keep their first scale";
  Fixture fresh(k, 24), reusing(k, 24), forward_only(k, 24);
  constexpr int32_t kSame = LNMLP_CALL_WEIGHTS_UNCHANGED;
  for (int s = 0; s < 3; ++s) {
    SCOPED_TRACE("step " + std::to_string(s));
    const RunResult a = fresh.step(LNMLP_CALL_DEFAULT);
    const RunResult b = reusing.step(s == 0 ? LNMLP_CALL_DEFAULT : kSame, kSame);
    // Forward reusing, backward making its own copies (from the scales forward saved).
    const RunResult c = forward_only.step(s == 0 ? LNMLP_CALL_DEFAULT : kSame, LNMLP_CALL_DEFAULT);
    const auto na = named(a), nb = named(b), nc = named(c);
    for (size_t i = 0; i < na.size(); ++i) {
      EXPECT_TRUE(same_bits(na[i].name, *nb[i].buf, *na[i].buf)) << "reused in forward and backward";
      EXPECT_TRUE(same_bits(na[i].name, *nc[i].buf, *na[i].buf)) << "reused in forward only";
    }
  }
}

// A tensor's values halved (exactly, in every dtype).
Buffer halved(const Buffer& b) {
  std::vector<double> v = b.to_doubles();
  for (double& e : v) e *= 0.5;
  return Buffer::from(v, b.dtype);
}

// The flag makes a call read the kept copies, not the weights: weights changed behind the flag's
// back leave a plan with copies (f16, FP8) computing with the old ones, while a call without the
// flag, or a plan whose GEMMs read the weights themselves, sees the new ones.
TEST(WeightReuse, TheFlagReadsTheKeptCopies) {
  const Case current = kCases[4], f32 = kCases[0];
  for (const Case& k : {current, f32}) {
    SCOPED_TRACE(k.name);
    Fixture f(k, 16);
    const RunResult before = f.step(LNMLP_CALL_DEFAULT);
    // Other weights, in other memory (the first call's stays alive and unchanged, so a plan
    // that kept only its address would compute with the old values).
    const Buffer original = std::move(f.pr.bw1);
    f.pr.bw1 = halved(original);
    const RunResult flagged = f.step(LNMLP_CALL_WEIGHTS_UNCHANGED);
    const bool copies = k.recipe != LNMLP_RECIPE_NONE;
    EXPECT_EQ(flagged.y.bytes == before.y.bytes, copies) << "y";
    const RunResult fresh = f.step(LNMLP_CALL_DEFAULT);
    EXPECT_NE(fresh.y.bytes, before.y.bytes);
  }
}

// Copies live in the workspace: attaching another one makes the next flagged call make them again.
TEST(WeightReuse, AnotherWorkspaceMakesTheCopiesAgain) {
  Case k = kCases[4];
  Fixture f(k, 16);
  f.o.external_workspace = true;
  f.plan = std::make_unique<Plan>(f.pr, f.o);
  int64_t bytes = 0;
  LNMLP_TEST_CHECK(lnmlp_plan_get_workspace_bytes(f.plan->get(), &bytes));
  const RunResult before = f.step(LNMLP_CALL_DEFAULT);
  AlignedMemory other(bytes, 64, 0xFF);
  LNMLP_TEST_CHECK(lnmlp_plan_attach_workspace(f.plan->get(), other.get(), bytes));
  f.pr.bw1 = halved(f.pr.bw1);
  const RunResult flagged = f.step(LNMLP_CALL_WEIGHTS_UNCHANGED);
  EXPECT_NE(flagged.y.bytes, before.y.bytes) << "the flagged call used copies from the old workspace";
}

// The flagged calls read the packed copy, not the weights: weights changed behind the flag's back
// leave them computing with the old ones, and a call without the flag sees the new ones. A plan
// made for 32 tokens, calls of 5 (the copy does not depend on the count).
TEST(PackedWeights, TheFlaggedCallsReadThePackedCopy) {
  const char* info = nullptr;
  LNMLP_TEST_CHECK(lnmlp_get_build_info(&info));
  if (std::string(info).find("weights packed") == std::string::npos)
    GTEST_SKIP() << "this CPU's GEMMs read the weights as they are: " << info;
  for (int32_t dtype : {LNMLP_DTYPE_F32, LNMLP_DTYPE_BF16}) {
    SCOPED_TRACE(dtype_label(dtype));
    // Packed where oneDNN runs its brgemm kernels for the type (src/cpu/gemm_onednn.cpp).
    if (dtype == LNMLP_DTYPE_BF16 && std::string(info).find("bf16 kernel brg") == std::string::npos) continue;
    Case k = kCases[0];
    k.dtype = dtype;
    Fixture f(k, 32);
    Buffer y0(f.pr.dtype, 5 * 32), y1(f.pr.dtype, 5 * 32), y2(f.pr.dtype, 5 * 32);
    ASSERT_EQ(f.forward(5, y0.data(), nullptr, LNMLP_CALL_WEIGHTS_UNCHANGED), LNMLP_SUCCESS) << lnmlp_last_error();
    const Buffer original = std::move(f.pr.bw1);
    f.pr.bw1 = halved(original);
    ASSERT_EQ(f.forward(5, y1.data(), nullptr, LNMLP_CALL_WEIGHTS_UNCHANGED), LNMLP_SUCCESS) << lnmlp_last_error();
    EXPECT_EQ(y1.bytes, y0.bytes) << "the flagged call read the changed weights, not its packed copy";
    ASSERT_EQ(f.forward(5, y2.data()), LNMLP_SUCCESS) << lnmlp_last_error();
    EXPECT_NE(y2.bytes, y0.bytes) << "the call without the flag did not read the changed weights";
  }
}

}  // namespace
