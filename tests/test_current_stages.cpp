// Current scaling in stages (lnmlp.h's LNMLP_CALL_AMAX_*): the amaxes a staged call measures are
// its tensors' (the inputs' exactly, the norm output's the float64 reference's within its
// tolerance); a forward and a backward run in stages on their own amaxes give the whole calls'
// bits; given amaxes are the scales used; two halves of the tokens whose amaxes are max-reduced
// between the stages give the whole call's y; the API refuses what does not fit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "test_util.h"
#include "tolerances.h"

using namespace lnmlp_test;

namespace {

constexpr float kUnset = -1.0f;  // an entry no call has written (amaxes are >= 0)

Problem problem(int32_t dtype, int64_t tokens = 40) {
  return make_problem(lnmlp_ref::biased_config(tokens, 48, 64, {LNMLP_ACT_SILU, LNMLP_ACT_LINEAR}), dtype, 41);
}

RunOptions current(int32_t remat = LNMLP_REMAT_SAVE_ALL) {
  RunOptions o;
  o.recipe = LNMLP_RECIPE_CURRENT;
  o.remat = remat;
  return o;
}

int32_t given(std::initializer_list<int32_t> quantizers) {
  int32_t f = 0;
  for (int32_t q : quantizers) f |= LNMLP_CALL_AMAX_GIVEN_LN_OUT << q;
  return f;
}
const int32_t kForwardGiven =
    given({LNMLP_QUANTIZER_LN_OUT, LNMLP_QUANTIZER_W1, LNMLP_QUANTIZER_ACT_OUT, LNMLP_QUANTIZER_W2});
const int32_t kBackwardGiven = given({LNMLP_QUANTIZER_DY, LNMLP_QUANTIZER_DH});

// One plan's calls on a problem's tensors (rows first..first+tokens of x and dy), with flags and
// an amax array.
struct Calls {
  const Problem& pr;
  Plan plan;
  int64_t saved_bytes = 0;
  Calls(const Problem& p, const RunOptions& o) : pr(p), plan(p, o) {
    LNMLP_TEST_CHECK(lnmlp_plan_get_saved_bytes(plan.get(), &saved_bytes));
  }
  const char* row(const Buffer& b, int64_t first) const {
    return static_cast<const char*>(b.data()) + first * pr.cfg.hidden * dtype_size(pr.dtype);
  }
  int32_t forward(int64_t first, int64_t tokens, Buffer& y, AlignedMemory& saved, float* amax, int32_t flags) {
    return lnmlp_plan_forward(plan.get(), tokens, row(pr.bx, first), pr.bgamma.data(), pr.bbeta.data(), pr.bw1.data(),
                              pr.bb1.data(), pr.bw2.data(), pr.bb2.data(), y.data(), saved.get(), amax, flags, nullptr);
  }
  int32_t backward(int64_t first, int64_t tokens, const AlignedMemory& saved, RunResult& g, float* amax,
                   int32_t flags) {
    return lnmlp_plan_backward(plan.get(), tokens, row(pr.bdy, first), row(pr.bx, first), pr.bgamma.data(),
                               pr.bbeta.data(), pr.bw1.data(), pr.bb1.data(), pr.bw2.data(), saved.get(), g.dx.data(),
                               g.dgamma.data(), g.dbeta.data(), g.dw1.data(), g.db1.data(), g.dw2.data(), g.db2.data(),
                               amax, flags, nullptr);
  }
  RunResult buffers(int64_t tokens) const { return output_buffers(pr, tokens); }
};

double max_abs(const Buffer& b) {
  double m = 0.0;
  for (double v : b.to_doubles()) m = std::max(m, std::fabs(v));
  return m;
}

std::vector<float> unset_amaxes() { return std::vector<float>(LNMLP_QUANTIZER_COUNT, kUnset); }

class CurrentStages : public ::testing::TestWithParam<std::pair<int32_t, int32_t>> {};

TEST_P(CurrentStages, MeasureTheTensorsAndGiveTheWholeCallsBits) {
  const auto [dtype, remat] = GetParam();
  const Problem pr = problem(dtype);
  const int64_t T = pr.cfg.tokens;
  Calls c(pr, current(remat));
  AlignedMemory saved_whole(c.saved_bytes, 256, 0xFF), saved(c.saved_bytes, 256, 0xFF);
  RunResult whole = c.buffers(T), staged = c.buffers(T);
  ASSERT_EQ(c.forward(0, T, whole.y, saved_whole, nullptr, 0), LNMLP_SUCCESS) << lnmlp_last_error();
  ASSERT_EQ(c.backward(0, T, saved_whole, whole, nullptr, 0), LNMLP_SUCCESS) << lnmlp_last_error();

  // Forward, stage 1: ln_out's, W1's and W2's amaxes, and nothing else.
  std::vector<float> amax = unset_amaxes();
  ASSERT_EQ(c.forward(0, T, staged.y, saved, amax.data(), LNMLP_CALL_AMAX_MEASURE), LNMLP_SUCCESS)
      << lnmlp_last_error();
  EXPECT_EQ(amax[LNMLP_QUANTIZER_W1], max_abs(pr.bw1));  // the inputs' exactly
  EXPECT_EQ(amax[LNMLP_QUANTIZER_W2], max_abs(pr.bw2));
  const auto f = lnmlp_ref::forward_full(pr.cfg, pr.x, pr.p);
  double ln_max = 0.0;
  for (double v : f.n) ln_max = std::max(ln_max, std::fabs(v));
  EXPECT_NEAR(amax[LNMLP_QUANTIZER_LN_OUT], ln_max, 1e-5 * ln_max);  // fp32 against float64
  for (int32_t q : {LNMLP_QUANTIZER_ACT_OUT, LNMLP_QUANTIZER_DY, LNMLP_QUANTIZER_DH}) EXPECT_EQ(amax[q], kUnset);
  // Stage 2: act_out's.
  const int32_t first = given({LNMLP_QUANTIZER_LN_OUT, LNMLP_QUANTIZER_W1, LNMLP_QUANTIZER_W2});
  ASSERT_EQ(c.forward(0, T, staged.y, saved, amax.data(), LNMLP_CALL_AMAX_MEASURE | first), LNMLP_SUCCESS);
  EXPECT_GT(amax[LNMLP_QUANTIZER_ACT_OUT], 0.0f);
  EXPECT_EQ(amax[LNMLP_QUANTIZER_DY], kUnset);
  // All given: the whole forward's bits (MEASURE then changes nothing).
  for (const int32_t flags : {kForwardGiven, kForwardGiven | LNMLP_CALL_AMAX_MEASURE}) {
    staged.y.poison();
    ASSERT_EQ(c.forward(0, T, staged.y, saved, amax.data(), flags), LNMLP_SUCCESS) << lnmlp_last_error();
    EXPECT_TRUE(same_bits("y", staged.y, whole.y));
    EXPECT_EQ(std::memcmp(saved.get(), saved_whole.get(), static_cast<size_t>(c.saved_bytes)), 0) << "saved";
  }

  // Backward: dy's amax, then dh's, then the whole backward's bits.
  ASSERT_EQ(c.backward(0, T, saved, staged, amax.data(), LNMLP_CALL_AMAX_MEASURE), LNMLP_SUCCESS) << lnmlp_last_error();
  EXPECT_EQ(amax[LNMLP_QUANTIZER_DY], max_abs(pr.bdy));
  EXPECT_EQ(amax[LNMLP_QUANTIZER_DH], kUnset);
  ASSERT_EQ(c.backward(0, T, saved, staged, amax.data(), LNMLP_CALL_AMAX_MEASURE | given({LNMLP_QUANTIZER_DY})),
            LNMLP_SUCCESS);
  EXPECT_GT(amax[LNMLP_QUANTIZER_DH], 0.0f);
  ASSERT_EQ(c.backward(0, T, saved, staged, amax.data(), kBackwardGiven), LNMLP_SUCCESS) << lnmlp_last_error();
  const auto a = named(staged), b = named(whole);
  for (size_t i = 1; i < a.size(); ++i) EXPECT_TRUE(same_bits(a[i].name, *a[i].buf, *b[i].buf));
}

INSTANTIATE_TEST_SUITE_P(Plans, CurrentStages,
                         ::testing::Values(std::pair{LNMLP_DTYPE_BF16, LNMLP_REMAT_SAVE_ALL},
                                           std::pair{LNMLP_DTYPE_F32, LNMLP_REMAT_SAVE_STATS},
                                           std::pair{LNMLP_DTYPE_F16, LNMLP_REMAT_SAVE_FFN1}),
                         [](const auto& i) {
                           return std::string(i.param.first == LNMLP_DTYPE_BF16  ? "bf16"
                                              : i.param.first == LNMLP_DTYPE_F32 ? "f32"
                                                                                 : "f16") +
                                  "_remat" + std::to_string(i.param.second);
                         });

// Given amaxes are the ones the scales come from: four times the tensors' own moves y's bits (the
// scales a quarter) and keeps it within the FP8 tolerance of the float64 reference.
TEST(CurrentStagesGiven, AreTheScalesUsed) {
  const Problem pr = problem(LNMLP_DTYPE_BF16);
  const int64_t T = pr.cfg.tokens;
  Calls c(pr, current());
  AlignedMemory saved(c.saved_bytes, 256, 0xFF);
  RunResult own = c.buffers(T), larger = c.buffers(T);
  std::vector<float> amax = unset_amaxes();
  ASSERT_EQ(c.forward(0, T, own.y, saved, amax.data(), LNMLP_CALL_AMAX_MEASURE), LNMLP_SUCCESS);
  const int32_t first = given({LNMLP_QUANTIZER_LN_OUT, LNMLP_QUANTIZER_W1, LNMLP_QUANTIZER_W2});
  ASSERT_EQ(c.forward(0, T, own.y, saved, amax.data(), LNMLP_CALL_AMAX_MEASURE | first), LNMLP_SUCCESS);
  ASSERT_EQ(c.forward(0, T, own.y, saved, amax.data(), kForwardGiven), LNMLP_SUCCESS);
  for (float& v : amax) v *= 4.0f;
  ASSERT_EQ(c.forward(0, T, larger.y, saved, amax.data(), kForwardGiven), LNMLP_SUCCESS);
  EXPECT_FALSE(same_bits("y", larger.y, own.y)) << "the given amaxes were not used";
  const auto y_ref = lnmlp_ref::forward(pr.cfg, pr.x, pr.p);
  EXPECT_TRUE(within_tolerance("y with 4x amaxes", larger.y.to_doubles(), y_ref, nullptr, kTolFp8));
}

// Data parallelism done by the caller: two halves of the tokens, each its own call, with their
// amaxes max-reduced between the stages, quantize with the whole call's scales: each half's y is
// the whole call's rows (within the bf16 rounding of GEMMs of another height), where halves
// measuring their own amaxes are not.
TEST(CurrentStagesGiven, TwoHalvesWithReducedAmaxesGiveTheWholeCallsY) {
  const Problem pr = problem(LNMLP_DTYPE_F32, 64);
  const int64_t T = 64, half = 32;
  Calls whole_call(pr, current()), halves(pr, current());
  AlignedMemory saved(whole_call.saved_bytes, 256, 0xFF);
  RunResult whole = whole_call.buffers(T);
  ASSERT_EQ(whole_call.forward(0, T, whole.y, saved, nullptr, 0), LNMLP_SUCCESS);
  std::vector<float> group = unset_amaxes();
  int32_t flags = LNMLP_CALL_AMAX_MEASURE;
  std::vector<RunResult> parts = {halves.buffers(half), halves.buffers(half)};
  float ln_amax[2] = {0.0f, 0.0f};  // each half's own
  for (int stage = 0; stage < 3; ++stage) {
    std::vector<float> reduced = group;
    for (int h = 0; h < 2; ++h) {
      std::vector<float> mine = group;
      ASSERT_EQ(halves.forward(h * half, half, parts[h].y, saved, mine.data(), flags), LNMLP_SUCCESS)
          << lnmlp_last_error();
      if (stage == 0) ln_amax[h] = mine[LNMLP_QUANTIZER_LN_OUT];
      for (size_t q = 0; q < mine.size(); ++q) reduced[q] = std::max(reduced[q], mine[q]);
    }
    group = reduced;
    flags = stage == 0
                ? LNMLP_CALL_AMAX_MEASURE | given({LNMLP_QUANTIZER_LN_OUT, LNMLP_QUANTIZER_W1, LNMLP_QUANTIZER_W2})
                : kForwardGiven;
  }
  std::vector<double> joined = parts[0].y.to_doubles(), second = parts[1].y.to_doubles();
  joined.insert(joined.end(), second.begin(), second.end());
  EXPECT_TRUE(within_tolerance("halves' y", joined, whole.y.to_doubles(), nullptr, kTolF32));
  // The half whose norm output's amax is below the group's, on its own scales: not the whole call's.
  ASSERT_NE(ln_amax[0], ln_amax[1]);
  const int low = ln_amax[0] < ln_amax[1] ? 0 : 1;
  Buffer alone(pr.dtype, static_cast<size_t>(half) * pr.H());
  ASSERT_EQ(halves.forward(low * half, half, alone, saved, nullptr, 0), LNMLP_SUCCESS);
  EXPECT_FALSE(
      within_tolerance("a half on its own scales", alone.to_doubles(), parts[low].y.to_doubles(), nullptr, kTolF32));
}

TEST(CurrentStagesApi, WhatDoesNotFitIsRefusedAndChangesNothing) {
  const Problem pr = problem(LNMLP_DTYPE_BF16);
  const int64_t T = pr.cfg.tokens;
  Calls cur(pr, current());
  RunOptions delayed_options;
  delayed_options.recipe = LNMLP_RECIPE_DELAYED;
  Calls delayed(pr, delayed_options), plain(pr, RunOptions{});
  AlignedMemory saved(std::max(cur.saved_bytes, delayed.saved_bytes), 256, 0xFF);
  Buffer y(pr.dtype, static_cast<size_t>(T) * pr.H());
  std::vector<float> amax = unset_amaxes();
  EXPECT_EQ(plain.forward(0, T, y, saved, amax.data(), LNMLP_CALL_AMAX_MEASURE), LNMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(lnmlp_last_error()).find("LNMLP_RECIPE_CURRENT"), std::string::npos) << lnmlp_last_error();
  EXPECT_EQ(plain.forward(0, T, y, saved, nullptr, LNMLP_CALL_AMAX_GIVEN_W1), LNMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(delayed.forward(0, T, y, saved, nullptr, LNMLP_CALL_AMAX_MEASURE), LNMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(cur.forward(0, T, y, saved, nullptr, LNMLP_CALL_AMAX_MEASURE), LNMLP_ERROR_NULL_POINTER);
  EXPECT_EQ(cur.forward(0, T, y, saved, amax.data(), LNMLP_CALL_DEFAULT), LNMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(cur.forward(0, T, y, saved, amax.data(), 4), LNMLP_ERROR_INVALID_ARGUMENT);  // no such flag
  EXPECT_EQ(cur.forward(0, T, y, saved, reinterpret_cast<float*>(reinterpret_cast<char*>(amax.data()) + 1),
                        LNMLP_CALL_AMAX_MEASURE),
            LNMLP_ERROR_MISALIGNED);
  for (float v : amax) EXPECT_EQ(v, kUnset);
  // No tokens: nothing measured.
  EXPECT_EQ(cur.forward(0, 0, y, saved, amax.data(), LNMLP_CALL_AMAX_MEASURE), LNMLP_SUCCESS) << lnmlp_last_error();
  for (float v : amax) EXPECT_EQ(v, kUnset);
}

}  // namespace
