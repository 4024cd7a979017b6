// FP8 plans through the public C API: every recipe near the float64 reference (and measurably
// quantized), recomputation giving the saved codes' bits, the saved bytes per token, and the
// delayed-scaling state: its update from tensors whose amax is known exactly, zero and non-finite
// amaxes, export / import / resume, and bad state inputs that change nothing.
// The exact arithmetic of each recipe is checked against an independent NumPy + ml_dtypes
// simulation in bindings/python/tests/test_fp8_recipes.py.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "lnmlp.h"
#include "reference.h"
#include "test_util.h"
#include "tolerances.h"

namespace lnmlp_test {
namespace {

#define ASSERT_OK(call) ASSERT_EQ((call), LNMLP_SUCCESS) << lnmlp_last_error()
#define EXPECT_OK(call) EXPECT_EQ((call), LNMLP_SUCCESS) << lnmlp_last_error()

constexpr int32_t kRecipes[] = {LNMLP_RECIPE_DELAYED, LNMLP_RECIPE_CURRENT, LNMLP_RECIPE_BLOCK, LNMLP_RECIPE_MXFP8};
// With NVFP4, whose values against the float64 reference are FP4's, not FP8's (its exact check:
// bindings/python/tests/test_nvfp4_recipe.py).
constexpr int32_t kAllRecipes[] = {LNMLP_RECIPE_DELAYED, LNMLP_RECIPE_CURRENT, LNMLP_RECIPE_BLOCK, LNMLP_RECIPE_MXFP8,
                                   LNMLP_RECIPE_NVFP4};
constexpr int32_t kDtypes[] = {LNMLP_DTYPE_F32, LNMLP_DTYPE_BF16, LNMLP_DTYPE_F16};

// Partial blocks everywhere: T, H, F and A*F are not multiples of 32 or 128.
lnmlp_ref::Config gated_config() { return lnmlp_ref::biased_config(130, 96, 200, {LNMLP_ACT_SILU, LNMLP_ACT_LINEAR}); }

std::string label(int32_t recipe, int32_t dtype) {
  static const char* names[] = {"none", "delayed", "current", "block", "mxfp8", "nvfp4"};
  return std::string(names[recipe]) + "/" + dtype_label(dtype);
}

TEST(Fp8Plan, EveryRecipeIsNearTheFloat64ReferenceAndQuantizes) {
  const lnmlp_ref::Config c = gated_config();
  for (int32_t dtype : kDtypes) {
    const Problem pr = make_problem(c, dtype, 11);
    const auto y = lnmlp_ref::forward(c, pr.x, pr.p);
    const auto g = lnmlp_ref::backward(c, pr.x, pr.p, pr.dy);
    RunOptions o;
    const RunResult plain = run_library(pr, o);
    for (int32_t recipe : kRecipes) {
      SCOPED_TRACE(label(recipe, dtype));
      o.recipe = recipe;
      const RunResult r = run_library(pr, o);
      const std::vector<std::pair<const char*, std::pair<const Buffer*, const std::vector<double>*>>> outs = {
          {"y", {&r.y, &y}},         {"dx", {&r.dx, &g.dx}},   {"dgamma", {&r.dgamma, &g.dgamma}},
          {"dbeta", {&r.dbeta, &g.dbeta}}, {"dW1", {&r.dw1, &g.dw1}}, {"db1", {&r.db1, &g.db1}},
          {"dW2", {&r.dw2, &g.dw2}}, {"db2", {&r.db2, &g.db2}}};
      for (const auto& [name, pair] : outs)
        EXPECT_TRUE(within_tolerance(name, pair.first->to_doubles(), *pair.second, nullptr, kTolFp8));
      // FP8 must show: y differs from the unquantized plan by far more than bf16 rounding does
      // (well below 1% here; FP8 gives about 7%).
      const Comparison d = compare(r.y.to_doubles(), plain.y.to_doubles());
      EXPECT_GT(d.normalised(), 0.02) << "y looks unquantized";
    }
  }
}

TEST(Fp8Plan, RecomputationGivesTheBitsOfSaveAll) {
  const lnmlp_ref::Config c = gated_config();
  for (int32_t dtype : {LNMLP_DTYPE_F32, LNMLP_DTYPE_BF16}) {
    const Problem pr = make_problem(c, dtype, 12);
    for (int32_t recipe : kAllRecipes) {
      SCOPED_TRACE(label(recipe, dtype));
      RunOptions o;
      o.recipe = recipe;
      o.num_threads = 2;
      const RunResult all = run_library(pr, o);
      for (int32_t remat : {LNMLP_REMAT_SAVE_FFN1, LNMLP_REMAT_SAVE_STATS}) {
        o.remat = remat;
        const RunResult r = run_library(pr, o);
        for (size_t i = 0; i < named(all).size(); ++i)
          EXPECT_TRUE(same_bits(named(all)[i].name, *named(all)[i].buf, *named(r)[i].buf)) << "remat " << remat;
      }
      o.remat = LNMLP_REMAT_FORWARD_ONLY;
      o.backward = false;
      EXPECT_TRUE(same_bits("y", all.y, run_library(pr, o).y));
    }
  }
}

TEST(Fp8Plan, SavedBytesPerTokenHoldCodesAndScales) {
  const lnmlp_ref::Config c = gated_config();
  const int64_t H = c.hidden, F = c.ffn, AF = 2 * F;
  for (int32_t dtype : kDtypes) {
    const int64_t e = dtype_size(dtype);
    const Problem pr = make_problem(c, dtype, 13);
    for (int32_t recipe : kAllRecipes) {
      SCOPED_TRACE(label(recipe, dtype));
      RunOptions o;
      o.recipe = recipe;
      o.backward = false;
      // layernorm: mean + rstd; ln_out and act_out as 1-byte codes; h in the I/O dtype.
      int64_t all = 8 + H + F + AF * e;
      if (recipe == LNMLP_RECIPE_BLOCK) all += ((H + F) * 4 + 127) / 128;  // an fp32 scale per 128 tokens
      if (recipe == LNMLP_RECIPE_MXFP8) all += (H + F + 31) / 32;         // an E8M0 byte per 32 tokens
      if (recipe == LNMLP_RECIPE_NVFP4)  // codes of half a byte, an E4M3 byte per 16 tokens
        all += (H + F + 1) / 2 - (H + F) + (H + F + 15) / 16;
      EXPECT_EQ(run_library(pr, o).saved_bytes_per_token, all);
      o.remat = LNMLP_REMAT_SAVE_FFN1;
      EXPECT_EQ(run_library(pr, o).saved_bytes_per_token, 8 + AF * e);
      o.remat = LNMLP_REMAT_SAVE_STATS;
      EXPECT_EQ(run_library(pr, o).saved_bytes_per_token, 8);
    }
    RunOptions none;
    none.backward = false;
    EXPECT_EQ(run_library(pr, none).saved_bytes_per_token, 8 + (H + AF + F) * e);
  }
}

// ---- delayed scaling's state --------------------------------------------------------------------

// A DELAYED plan with its inputs, run step by step with caller-chosen dy.
class DelayedBlock {
 public:
  DelayedBlock(const Problem& pr, int32_t history, int32_t margin, int32_t algo) : pr_(pr) {
    RunOptions o;
    o.recipe = LNMLP_RECIPE_DELAYED;
    o.amax_history_len = history;
    o.margin = margin;
    o.amax_algo = algo;
    plan_ = std::make_unique<Plan>(pr, o);
    int64_t bytes = 0;
    LNMLP_TEST_CHECK(lnmlp_plan_get_saved_bytes(plan_->get(), &bytes));
    saved_ = AlignedMemory(bytes, plan_->alignment(), 0);
  }
  lnmlp_plan* get() const { return plan_->get(); }

  // Forward, then backward with dy; returns every output.
  RunResult step(const Buffer& dy) {
    const int64_t T = pr_.cfg.tokens;
    RunResult r = output_buffers(pr_, T);
    LNMLP_TEST_CHECK(lnmlp_plan_forward(get(), T, pr_.bx.data(), pr_.bgamma.data(), pr_.bbeta.data(), pr_.bw1.data(),
                                        pr_.bb1.data(), pr_.bw2.data(), pr_.bb2.data(), r.y.data(), saved_.get(),
                                        nullptr, LNMLP_CALL_DEFAULT, nullptr));
    LNMLP_TEST_CHECK(lnmlp_plan_backward(get(), T, dy.data(), pr_.bx.data(), pr_.bgamma.data(), pr_.bbeta.data(),
                                         pr_.bw1.data(), pr_.bb1.data(), pr_.bw2.data(), saved_.get(), r.dx.data(),
                                         r.dgamma.data(), r.dbeta.data(), r.dw1.data(), r.db1.data(), r.dw2.data(),
                                         r.db2.data(), nullptr, LNMLP_CALL_DEFAULT, nullptr));
    return r;
  }

  std::pair<float, std::vector<float>> state(int32_t q) const {
    int64_t len = 0;
    LNMLP_TEST_CHECK(lnmlp_plan_get_amax_history_length(get(), &len));
    std::vector<float> h(static_cast<size_t>(len));
    float scale = 0.0f;
    LNMLP_TEST_CHECK(lnmlp_plan_get_quantizer_state(get(), q, &scale, h.data(), len));
    return {scale, h};
  }

 private:
  const Problem& pr_;
  std::unique_ptr<Plan> plan_;
  AlignedMemory saved_;
};

float max_abs(const std::vector<double>& v) {
  double m = 0.0;
  for (double e : v) m = std::max(m, std::fabs(e));
  return static_cast<float>(m);  // the inputs are exact in fp32 (rounded to the dtype)
}

Buffer scaled_dy(const Problem& pr, double s) {
  std::vector<double> v = pr.dy;
  for (auto& e : v) e *= s;
  return Buffer::from(v, pr.dtype);
}

TEST(Fp8State, DelayedScalingFollowsTheInputsAmaxExactly) {
  const lnmlp_ref::Config c = gated_config();
  const Problem pr = make_problem(c, LNMLP_DTYPE_F32, 21);
  DelayedBlock b(pr, 3, 1, LNMLP_AMAX_ALGO_MAX);
  // Before any pass: scale 1, zeros.
  auto [s0, h0] = b.state(LNMLP_QUANTIZER_DY);
  EXPECT_EQ(s0, 1.0f);
  EXPECT_EQ(h0, std::vector<float>(3, 0.0f));

  const float w1 = max_abs(pr.p.w1), w2 = max_abs(pr.p.w2);
  const float dys[4] = {max_abs(pr.dy) * 2.0f, max_abs(pr.dy) * 0.5f, max_abs(pr.dy) * 0.25f, max_abs(pr.dy) * 0.125f};
  const double factors[4] = {2.0, 0.5, 0.25, 0.125};
  std::vector<float> hist;
  for (int step = 0; step < 4; ++step) {
    b.step(scaled_dy(pr, factors[step]));
    hist.insert(hist.begin(), dys[step]);
    if (hist.size() > 3) hist.pop_back();
    // dy: newest first, scale = (57344 / max(history)) / 2^margin, E5M2 under HYBRID.
    const auto [s, h] = b.state(LNMLP_QUANTIZER_DY);
    std::vector<float> expect = hist;
    expect.resize(3, 0.0f);
    EXPECT_EQ(h, expect) << "step " << step;
    const float m = *std::max_element(hist.begin(), hist.end());
    EXPECT_EQ(s, (57344.0f / m) / 2.0f) << "step " << step;
    // The weights do not change: every entry is their amax; E4M3.
    const auto [sw1, hw1] = b.state(LNMLP_QUANTIZER_W1);
    EXPECT_EQ(hw1[0], w1);
    EXPECT_EQ(sw1, (448.0f / w1) / 2.0f);
    const auto [sw2, hw2] = b.state(LNMLP_QUANTIZER_W2);
    EXPECT_EQ(hw2[0], w2);
    EXPECT_EQ(sw2, (448.0f / w2) / 2.0f);
    // Computed tensors: recorded, positive.
    for (int32_t q : {LNMLP_QUANTIZER_LN_OUT, LNMLP_QUANTIZER_ACT_OUT, LNMLP_QUANTIZER_DH}) {
      const auto [sq, hq] = b.state(q);
      EXPECT_GT(hq[0], 0.0f) << q;
      EXPECT_GT(sq, 0.0f) << q;
    }
  }
}

TEST(Fp8State, MostRecentUsesTheNewestAmax) {
  const Problem pr = make_problem(gated_config(), LNMLP_DTYPE_F32, 22);
  DelayedBlock b(pr, 4, 0, LNMLP_AMAX_ALGO_MOST_RECENT);
  b.step(scaled_dy(pr, 4.0));
  b.step(scaled_dy(pr, 1.0));
  const auto [s, h] = b.state(LNMLP_QUANTIZER_DY);
  EXPECT_EQ(h[0], max_abs(pr.dy));
  EXPECT_EQ(s, 57344.0f / max_abs(pr.dy));
}

TEST(Fp8State, ZeroAndNonFiniteAmaxKeepTheScale) {
  const Problem pr = make_problem(gated_config(), LNMLP_DTYPE_F32, 23);
  DelayedBlock b(pr, 2, 0, LNMLP_AMAX_ALGO_MOST_RECENT);
  b.step(pr.bdy);
  const float before = b.state(LNMLP_QUANTIZER_DY).first;
  EXPECT_EQ(before, 57344.0f / max_abs(pr.dy));

  b.step(scaled_dy(pr, 0.0));  // amax 0
  auto [s, h] = b.state(LNMLP_QUANTIZER_DY);
  EXPECT_EQ(h[0], 0.0f);
  EXPECT_EQ(s, before);

  std::vector<double> bad = pr.dy;
  bad[5] = std::numeric_limits<double>::quiet_NaN();
  b.step(Buffer::from(bad, LNMLP_DTYPE_F32));  // amax NaN
  std::tie(s, h) = b.state(LNMLP_QUANTIZER_DY);
  EXPECT_TRUE(std::isnan(h[0]));
  EXPECT_EQ(s, before);

  bad[5] = std::numeric_limits<double>::infinity();
  b.step(Buffer::from(bad, LNMLP_DTYPE_F32));  // amax inf
  std::tie(s, h) = b.state(LNMLP_QUANTIZER_DY);
  EXPECT_TRUE(std::isinf(h[0]));
  EXPECT_EQ(s, before);
}

std::vector<unsigned char> export_state(lnmlp_plan* p) {
  int64_t n = 0;
  LNMLP_TEST_CHECK(lnmlp_plan_get_state_bytes(p, &n));
  std::vector<unsigned char> blob(static_cast<size_t>(n));
  LNMLP_TEST_CHECK(lnmlp_plan_export_state(p, blob.data(), n));
  return blob;
}

TEST(Fp8State, ExportImportResumesBitExactly) {
  const Problem pr = make_problem(gated_config(), LNMLP_DTYPE_BF16, 24);
  DelayedBlock a(pr, 5, 0, LNMLP_AMAX_ALGO_MAX);
  a.step(scaled_dy(pr, 3.0));
  a.step(scaled_dy(pr, 0.5));
  const auto blob = export_state(a.get());
  EXPECT_EQ(blob.size(), 24u + 6u * (1u + 5u) * 4u);

  DelayedBlock b(pr, 5, 0, LNMLP_AMAX_ALGO_MAX);
  ASSERT_OK(lnmlp_plan_import_state(b.get(), blob.data(), static_cast<int64_t>(blob.size())));
  EXPECT_EQ(export_state(b.get()), blob);
  const RunResult ra = a.step(pr.bdy), rb = b.step(pr.bdy);
  for (size_t i = 0; i < named(ra).size(); ++i)
    EXPECT_TRUE(same_bits(named(ra)[i].name, *named(ra)[i].buf, *named(rb)[i].buf));
  EXPECT_EQ(export_state(a.get()), export_state(b.get()));

  // And a fresh plan differs (the state matters).
  DelayedBlock fresh(pr, 5, 0, LNMLP_AMAX_ALGO_MAX);
  EXPECT_FALSE(same_bits("y", ra.y, fresh.step(pr.bdy).y));
}

TEST(Fp8State, BadStateInputsAreRejectedAndChangeNothing) {
  const Problem pr = make_problem(gated_config(), LNMLP_DTYPE_F32, 25);
  DelayedBlock b(pr, 4, 0, LNMLP_AMAX_ALGO_MAX);
  b.step(pr.bdy);
  const auto good = export_state(b.get());
  constexpr int32_t I = LNMLP_ERROR_INVALID_ARGUMENT;
  auto import = [&](std::vector<unsigned char> blob) {
    return lnmlp_plan_import_state(b.get(), blob.data(), static_cast<int64_t>(blob.size()));
  };
  std::vector<unsigned char> bad = good;
  bad[0] = 'X';
  EXPECT_EQ(import(bad), I);
  bad = good;
  bad[8] = 2;  // version
  EXPECT_EQ(import(bad), I);
  bad = good;
  bad[12] = LNMLP_RECIPE_CURRENT;  // recipe
  EXPECT_EQ(import(bad), I);
  bad = good;
  bad[16] = 5;  // history length
  EXPECT_EQ(import(bad), I);
  bad = good;
  bad.pop_back();
  EXPECT_EQ(import(bad), I);
  bad = good;
  const float neg = -1.0f, nan = std::nanf(""), zero = 0.0f;
  std::memcpy(bad.data() + 24 + 4, &neg, 4);  // quantizer 0, history[0]
  EXPECT_EQ(import(bad), I);
  bad = good;
  std::memcpy(bad.data() + 24, &nan, 4);  // quantizer 0's scale
  EXPECT_EQ(import(bad), I);
  std::memcpy(bad.data() + 24, &zero, 4);
  EXPECT_EQ(import(bad), I);
  EXPECT_EQ(lnmlp_plan_import_state(b.get(), nullptr, 100), LNMLP_ERROR_NULL_POINTER);
  std::vector<unsigned char> small(10);
  EXPECT_EQ(lnmlp_plan_export_state(b.get(), small.data(), 10), I);

  float hist[4] = {1, 2, 3, 4}, scale = 0;
  EXPECT_EQ(lnmlp_plan_set_quantizer_state(b.get(), 6, 1.0f, hist, 4), I);
  EXPECT_EQ(lnmlp_plan_set_quantizer_state(b.get(), 0, 1.0f, hist, 3), I);
  EXPECT_EQ(lnmlp_plan_set_quantizer_state(b.get(), 0, std::numeric_limits<float>::infinity(), hist, 4), I);
  hist[2] = -3;
  EXPECT_EQ(lnmlp_plan_set_quantizer_state(b.get(), 0, 1.0f, hist, 4), I);
  EXPECT_EQ(lnmlp_plan_get_quantizer_state(b.get(), 0, &scale, hist, 5), I);
  EXPECT_EQ(lnmlp_plan_get_quantizer_state(b.get(), 0, nullptr, hist, 4), LNMLP_ERROR_NULL_POINTER);
  EXPECT_EQ(export_state(b.get()), good) << "a rejected call changed the state";

  // A good per-quantizer write lands exactly.
  const float h2[4] = {5, 0, std::numeric_limits<float>::infinity(), std::nanf("")};
  ASSERT_OK(lnmlp_plan_set_quantizer_state(b.get(), LNMLP_QUANTIZER_DH, 0.25f, h2, 4));
  float got[4];
  ASSERT_OK(lnmlp_plan_get_quantizer_state(b.get(), LNMLP_QUANTIZER_DH, &scale, got, 4));
  EXPECT_EQ(scale, 0.25f);
  EXPECT_EQ(std::memcmp(got, h2, sizeof got), 0);
}

TEST(Fp8State, StatelessRecipesHaveNoState) {
  const Problem pr = make_problem(gated_config(), LNMLP_DTYPE_F32, 26);
  for (int32_t recipe : {LNMLP_RECIPE_NONE, LNMLP_RECIPE_CURRENT, LNMLP_RECIPE_BLOCK, LNMLP_RECIPE_MXFP8}) {
    RunOptions o;
    o.recipe = recipe;
    Plan p(pr, o);
    int64_t len = -1;
    int64_t bytes = -1;
    float scale = 0;
    ASSERT_OK(lnmlp_plan_get_amax_history_length(p.get(), &len));
    EXPECT_EQ(len, 0);
    ASSERT_OK(lnmlp_plan_get_state_bytes(p.get(), &bytes));
    EXPECT_EQ(bytes, 0);
    EXPECT_OK(lnmlp_plan_export_state(p.get(), nullptr, 0));
    EXPECT_OK(lnmlp_plan_import_state(p.get(), nullptr, 0));
    EXPECT_EQ(lnmlp_plan_get_quantizer_state(p.get(), 0, &scale, nullptr, 0), LNMLP_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(lnmlp_last_error()).find("no quantizer state"), std::string::npos);
  }
}

}  // namespace
}  // namespace lnmlp_test
