// Amaxes in stages (lnmlp.h's LNMLP_CALL_AMAX_*), current scaling's and NVFP4's: the amaxes a
// staged call measures are its tensors' (the inputs' exactly, the norm output's the float64
// reference's within its tolerance); a forward and a backward run in stages on their own amaxes
// give the whole calls' bits; given amaxes are the scales used; two halves of the tokens whose
// amaxes are max-reduced between the stages give the whole call's y (NVFP4: and the whole call's
// amaxes exactly, and its gradients); the API refuses what does not fit.
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

// The staged calls of a forward and a backward, the group's amaxes max-reduced over `parts`
// (one call each, rows parts[i].first.., parts[i].second tokens) between the stages: the amax
// array the last calls are given, of `floats` floats (one per quantizer, NVFP4 two). backward: run
// backward's stages too (forward's amaxes given in each of its calls), every backward call at
// random state (7, 0); `placed`: each part placed among the whole tokens
// (lnmlp_plan_set_rng_place), else at (0, 0, 0, 1).
std::vector<float> staged_amaxes(Calls& c, const std::vector<std::pair<int64_t, int64_t>>& parts,
                                 std::vector<RunResult>& out, std::vector<AlignedMemory>& saved, size_t floats,
                                 bool backward, bool placed = false) {
  int64_t whole_tokens = 0;
  for (const auto& part : parts) whole_tokens += part.second;
  const int32_t first = given({LNMLP_QUANTIZER_LN_OUT, LNMLP_QUANTIZER_W1, LNMLP_QUANTIZER_W2});
  const std::vector<int32_t> forward_stages = {LNMLP_CALL_AMAX_MEASURE, LNMLP_CALL_AMAX_MEASURE | first, kForwardGiven};
  const std::vector<int32_t> backward_stages = {kForwardGiven | LNMLP_CALL_AMAX_MEASURE,
                                                kForwardGiven | LNMLP_CALL_AMAX_MEASURE | given({LNMLP_QUANTIZER_DY}),
                                                kForwardGiven | kBackwardGiven};
  std::vector<float> group(floats, kUnset);
  const auto run = [&](const std::vector<int32_t>& stages, bool forward) {
    for (const int32_t flags : stages) {
      std::vector<float> reduced = group;
      for (size_t i = 0; i < parts.size(); ++i) {
        std::vector<float> mine = group;
        const auto [row, tokens] = parts[i];
        if (forward) {
          ASSERT_EQ(c.forward(row, tokens, out[i].y, saved[i], mine.data(), flags), LNMLP_SUCCESS)
              << lnmlp_last_error();
        } else {
          LNMLP_TEST_CHECK(lnmlp_plan_set_rng_state(c.plan.get(), 7, 0));
          LNMLP_TEST_CHECK(placed ? lnmlp_plan_set_rng_place(c.plan.get(), row, whole_tokens, 0, 1)
                                  : lnmlp_plan_set_rng_place(c.plan.get(), 0, 0, 0, 1));
          ASSERT_EQ(c.backward(row, tokens, saved[i], out[i], mine.data(), flags), LNMLP_SUCCESS) << lnmlp_last_error();
        }
        for (size_t k = 0; k < mine.size(); ++k) reduced[k] = std::max(reduced[k], mine[k]);
      }
      group = reduced;
    }
  };
  run(forward_stages, true);
  if (backward) run(backward_stages, false);
  return group;
}

// Data parallelism done by the caller: two halves of the tokens, each its own call, with their
// amaxes max-reduced between the stages, quantize with the whole call's scales: each half's y is
// the whole call's rows (within the bf16 rounding of GEMMs of another height), where halves
// measuring their own amaxes are not.
TEST(CurrentStagesGiven, TwoHalvesWithReducedAmaxesGiveTheWholeCallsY) {
  const Problem pr = problem(LNMLP_DTYPE_F32, 64);
  const int64_t T = 64, half = 32;
  Calls whole_call(pr, current()), halves(pr, current());
  std::vector<AlignedMemory> saved;
  for (int h = 0; h < 2; ++h) saved.emplace_back(whole_call.saved_bytes, 256, 0xFF);
  RunResult whole = whole_call.buffers(T);
  ASSERT_EQ(whole_call.forward(0, T, whole.y, saved[0], nullptr, 0), LNMLP_SUCCESS);
  std::vector<RunResult> parts = {halves.buffers(half), halves.buffers(half)};
  const std::vector<float> group =
      staged_amaxes(halves, {{0, half}, {half, half}}, parts, saved, LNMLP_QUANTIZER_COUNT, false);
  std::vector<double> joined = parts[0].y.to_doubles(), second = parts[1].y.to_doubles();
  joined.insert(joined.end(), second.begin(), second.end());
  EXPECT_TRUE(within_tolerance("halves' y", joined, whole.y.to_doubles(), nullptr, kTolF32));
  // The half whose norm output's amax is below the group's, on its own scales: not the whole call's.
  float ln_amax[2] = {0.0f, 0.0f};  // each half's own
  for (int h = 0; h < 2; ++h) {
    std::vector<float> own = unset_amaxes();
    ASSERT_EQ(halves.forward(h * half, half, parts[h].y, saved[h], own.data(), LNMLP_CALL_AMAX_MEASURE), LNMLP_SUCCESS);
    ln_amax[h] = own[LNMLP_QUANTIZER_LN_OUT];
  }
  ASSERT_NE(ln_amax[0], ln_amax[1]);
  ASSERT_EQ(std::max(ln_amax[0], ln_amax[1]), group[LNMLP_QUANTIZER_LN_OUT]);
  const int low = ln_amax[0] < ln_amax[1] ? 0 : 1;
  Buffer alone(pr.dtype, static_cast<size_t>(half) * pr.H());
  ASSERT_EQ(halves.forward(low * half, half, alone, saved[low], nullptr, 0), LNMLP_SUCCESS);
  const std::vector<double> rows = whole.y.to_doubles();
  const std::vector<double> whole_rows(rows.begin() + low * half * pr.H(), rows.begin() + (low + 1) * half * pr.H());
  EXPECT_FALSE(within_tolerance("a half on its own scales", alone.to_doubles(), whole_rows, nullptr, kTolF32));
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

// ---- NVFP4: two global amaxes per quantizer, float32 [LNMLP_QUANTIZER_COUNT][2] ----

RunOptions nvfp4(int32_t remat = LNMLP_REMAT_SAVE_ALL) {
  RunOptions o;
  o.recipe = LNMLP_RECIPE_NVFP4;  // TransformerEngine's defaults: RHT, stochastic rounding, 16x16 weights
  o.remat = remat;
  return o;
}

constexpr size_t kNvfp4Amaxes = 2 * LNMLP_QUANTIZER_COUNT;
float& rowwise_amax(std::vector<float>& a, int32_t q) { return a[2 * static_cast<size_t>(q)]; }
float& columnwise_amax(std::vector<float>& a, int32_t q) { return a[2 * static_cast<size_t>(q) + 1]; }

uint64_t rng_offset(const Calls& c) {
  uint64_t seed = 0, offset = 0;
  LNMLP_TEST_CHECK(lnmlp_plan_get_rng_state(c.plan.get(), &seed, &offset));
  return offset;
}

class Nvfp4Stages : public ::testing::TestWithParam<std::pair<int32_t, int32_t>> {};

TEST_P(Nvfp4Stages, MeasureTheTensorsAndGiveTheWholeCallsBits) {
  const auto [dtype, remat] = GetParam();
  const Problem pr = problem(dtype);  // 40 tokens: the Hadamard transform's last block of 16 is partial
  const int64_t T = pr.cfg.tokens;
  Calls c(pr, nvfp4(remat));
  AlignedMemory saved_whole(c.saved_bytes, 256, 0xFF), saved(c.saved_bytes, 256, 0xFF);
  RunResult whole = c.buffers(T), staged = c.buffers(T);
  constexpr uint64_t kSeed = 1234, kOffset = 5;
  ASSERT_EQ(c.forward(0, T, whole.y, saved_whole, nullptr, 0), LNMLP_SUCCESS) << lnmlp_last_error();
  LNMLP_TEST_CHECK(lnmlp_plan_set_rng_state(c.plan.get(), kSeed, kOffset));
  ASSERT_EQ(c.backward(0, T, saved_whole, whole, nullptr, 0), LNMLP_SUCCESS) << lnmlp_last_error();

  // Forward, stage 1: ln_out's, W1's and W2's amaxes (the weights' columnwise ones untransformed,
  // so the same), and nothing else.
  std::vector<float> amax(kNvfp4Amaxes, kUnset);
  ASSERT_EQ(c.forward(0, T, staged.y, saved, amax.data(), LNMLP_CALL_AMAX_MEASURE), LNMLP_SUCCESS)
      << lnmlp_last_error();
  for (const auto& [q, w] : {std::pair{LNMLP_QUANTIZER_W1, &pr.bw1}, std::pair{LNMLP_QUANTIZER_W2, &pr.bw2}}) {
    EXPECT_EQ(rowwise_amax(amax, q), max_abs(*w));
    EXPECT_EQ(columnwise_amax(amax, q), max_abs(*w));
  }
  const auto f = lnmlp_ref::forward_full(pr.cfg, pr.x, pr.p);
  double ln_max = 0.0;
  for (double v : f.n) ln_max = std::max(ln_max, std::fabs(v));
  EXPECT_NEAR(rowwise_amax(amax, LNMLP_QUANTIZER_LN_OUT), ln_max, 1e-5 * ln_max);  // fp32 against float64
  // The Hadamard-transformed copy's: each transformed block of 16 keeps its 2-norm, so its largest
  // entry is at most 4x the largest input, and here not the untransformed amax.
  const float ln_col = columnwise_amax(amax, LNMLP_QUANTIZER_LN_OUT);
  EXPECT_GT(ln_col, 0.0f);
  EXPECT_LE(ln_col, 4.0 * ln_max * (1 + 1e-5));
  EXPECT_NE(ln_col, rowwise_amax(amax, LNMLP_QUANTIZER_LN_OUT));
  for (int32_t q : {LNMLP_QUANTIZER_ACT_OUT, LNMLP_QUANTIZER_DY, LNMLP_QUANTIZER_DH})
    EXPECT_TRUE(rowwise_amax(amax, q) == kUnset && columnwise_amax(amax, q) == kUnset) << q;
  // Stage 2: act_out's.
  const int32_t first = given({LNMLP_QUANTIZER_LN_OUT, LNMLP_QUANTIZER_W1, LNMLP_QUANTIZER_W2});
  ASSERT_EQ(c.forward(0, T, staged.y, saved, amax.data(), LNMLP_CALL_AMAX_MEASURE | first), LNMLP_SUCCESS);
  EXPECT_GT(rowwise_amax(amax, LNMLP_QUANTIZER_ACT_OUT), 0.0f);
  EXPECT_GT(columnwise_amax(amax, LNMLP_QUANTIZER_ACT_OUT), 0.0f);
  EXPECT_EQ(rowwise_amax(amax, LNMLP_QUANTIZER_DY), kUnset);
  // All given: the whole forward's bits.
  for (const int32_t flags : {kForwardGiven, kForwardGiven | LNMLP_CALL_AMAX_MEASURE}) {
    staged.y.poison();
    ASSERT_EQ(c.forward(0, T, staged.y, saved, amax.data(), flags), LNMLP_SUCCESS) << lnmlp_last_error();
    EXPECT_TRUE(same_bits("y", staged.y, whole.y));
    EXPECT_EQ(std::memcmp(saved.get(), saved_whole.get(), static_cast<size_t>(c.saved_bytes)), 0) << "saved";
  }

  // Backward, forward's amaxes given in each call: dy's (exactly its maximum: no transform changes
  // the largest element's... only the rowwise one), then dh's, then the whole backward's bits. The
  // measuring calls leave the random state where it is; the last call moves it on.
  std::vector<float> forward_copy = amax;
  LNMLP_TEST_CHECK(lnmlp_plan_set_rng_state(c.plan.get(), kSeed, kOffset));
  ASSERT_EQ(c.backward(0, T, saved, staged, amax.data(), kForwardGiven | LNMLP_CALL_AMAX_MEASURE), LNMLP_SUCCESS)
      << lnmlp_last_error();
  EXPECT_EQ(rowwise_amax(amax, LNMLP_QUANTIZER_DY), max_abs(pr.bdy));
  EXPECT_GT(columnwise_amax(amax, LNMLP_QUANTIZER_DY), 0.0f);
  EXPECT_EQ(rowwise_amax(amax, LNMLP_QUANTIZER_DH), kUnset);
  for (int32_t q : {LNMLP_QUANTIZER_LN_OUT, LNMLP_QUANTIZER_W1, LNMLP_QUANTIZER_ACT_OUT, LNMLP_QUANTIZER_W2})
    EXPECT_TRUE(rowwise_amax(amax, q) == rowwise_amax(forward_copy, q) &&
                columnwise_amax(amax, q) == columnwise_amax(forward_copy, q))
        << "backward wrote forward's amax " << q;
  ASSERT_EQ(c.backward(0, T, saved, staged, amax.data(),
                       kForwardGiven | LNMLP_CALL_AMAX_MEASURE | given({LNMLP_QUANTIZER_DY})),
            LNMLP_SUCCESS);
  EXPECT_GT(rowwise_amax(amax, LNMLP_QUANTIZER_DH), 0.0f);
  EXPECT_GT(columnwise_amax(amax, LNMLP_QUANTIZER_DH), 0.0f);
  EXPECT_EQ(rng_offset(c), kOffset);
  ASSERT_EQ(c.backward(0, T, saved, staged, amax.data(), kForwardGiven | kBackwardGiven), LNMLP_SUCCESS)
      << lnmlp_last_error();
  EXPECT_EQ(rng_offset(c), kOffset + 1);
  const auto a = named(staged), b = named(whole);
  for (size_t i = 1; i < a.size(); ++i) EXPECT_TRUE(same_bits(a[i].name, *a[i].buf, *b[i].buf));
}

INSTANTIATE_TEST_SUITE_P(Plans, Nvfp4Stages,
                         ::testing::Values(std::pair{LNMLP_DTYPE_BF16, LNMLP_REMAT_SAVE_ALL},
                                           std::pair{LNMLP_DTYPE_F32, LNMLP_REMAT_SAVE_STATS}),
                         [](const auto& i) {
                           return std::string(i.param.first == LNMLP_DTYPE_BF16 ? "bf16" : "f32") + "_remat" +
                                  std::to_string(i.param.second);
                         });

// Data parallelism done by the caller, NVFP4: two halves of the tokens (whole Hadamard blocks of
// 16 each), their amaxes max-reduced between the stages, give the whole call's amaxes exactly, its
// y rows and its gradients: dx's rows, dW1 and dW2 the halves' sums, all within fp32 summation
// order -- with stochastic rounding, each half placed among the whole tokens
// (lnmlp_plan_set_rng_place), so that it draws the whole call's bits for its rows. Halves on their
// own amaxes do not. (Recomputing, backward quantizes ln_out and act_out again: with forward's
// group amaxes, given.)
class Nvfp4StagesGiven : public ::testing::TestWithParam<std::pair<int32_t, bool>> {};

TEST_P(Nvfp4StagesGiven, TwoHalvesWithReducedAmaxesGiveTheWholeCall) {
  const Problem pr = problem(LNMLP_DTYPE_F32, 64);
  const int64_t T = 64, half = 32;
  const auto [remat, stochastic] = GetParam();
  RunOptions o = nvfp4(remat);
  o.nvfp4_disable_sr = !stochastic;
  Calls whole_call(pr, o), halves(pr, o);
  std::vector<RunResult> whole = {whole_call.buffers(T)}, parts = {halves.buffers(half), halves.buffers(half)};
  std::vector<AlignedMemory> whole_saved, saved;
  whole_saved.emplace_back(whole_call.saved_bytes, 256, 0xFF);
  for (int h = 0; h < 2; ++h) saved.emplace_back(halves.saved_bytes, 256, 0xFF);
  const std::vector<float> whole_amaxes = staged_amaxes(whole_call, {{0, T}}, whole, whole_saved, kNvfp4Amaxes, true);
  const std::vector<float> group =
      staged_amaxes(halves, {{0, half}, {half, half}}, parts, saved, kNvfp4Amaxes, true, true);
  for (size_t k = 0; k < kNvfp4Amaxes; ++k) EXPECT_EQ(group[k], whole_amaxes[k]) << "amax " << k;
  // Rows: y and dx, the halves' joined. Parameter gradients: the halves' summed.
  const auto joined = [&](Buffer RunResult::*b) {
    std::vector<double> j = (parts[0].*b).to_doubles(), second = (parts[1].*b).to_doubles();
    j.insert(j.end(), second.begin(), second.end());
    return j;
  };
  const auto summed = [&](Buffer RunResult::*b) {
    std::vector<double> sum = (parts[0].*b).to_doubles(), second = (parts[1].*b).to_doubles();
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += second[i];
    return sum;
  };
  EXPECT_TRUE(within_tolerance("halves' y", joined(&RunResult::y), whole[0].y.to_doubles(), nullptr, kTolF32));
  EXPECT_TRUE(within_tolerance("halves' dx", joined(&RunResult::dx), whole[0].dx.to_doubles(), nullptr, kTolF32));
  for (const auto& [name, b] : {std::pair{"dgamma", &RunResult::dgamma}, std::pair{"dbeta", &RunResult::dbeta},
                                std::pair{"dw1", &RunResult::dw1}, std::pair{"db1", &RunResult::db1},
                                std::pair{"dw2", &RunResult::dw2}, std::pair{"db2", &RunResult::db2}})
    EXPECT_TRUE(within_tolerance(name, summed(b), (whole[0].*b).to_doubles(), nullptr, kTolF32));
  // A half on its own amaxes (the one whose norm output's amax is below the group's): not the
  // whole call's rows.
  std::vector<float> own(kNvfp4Amaxes, kUnset);
  int low = -1;
  for (int h = 0; h < 2 && low < 0; ++h) {
    ASSERT_EQ(halves.forward(h * half, half, parts[h].y, saved[h], own.data(), LNMLP_CALL_AMAX_MEASURE), LNMLP_SUCCESS);
    if (rowwise_amax(own, LNMLP_QUANTIZER_LN_OUT) < group[2 * LNMLP_QUANTIZER_LN_OUT]) low = h;
  }
  ASSERT_GE(low, 0);
  Buffer alone(pr.dtype, static_cast<size_t>(half) * pr.H());
  ASSERT_EQ(halves.forward(low * half, half, alone, saved[low], nullptr, 0), LNMLP_SUCCESS);
  const std::vector<double> rows = whole[0].y.to_doubles();
  const std::vector<double> whole_rows(rows.begin() + low * half * pr.H(), rows.begin() + (low + 1) * half * pr.H());
  EXPECT_FALSE(within_tolerance("a half on its own amaxes", alone.to_doubles(), whole_rows, nullptr, kTolF32));
}

INSTANTIATE_TEST_SUITE_P(RematAndRounding, Nvfp4StagesGiven,
                         ::testing::Values(std::pair{LNMLP_REMAT_SAVE_ALL, false},
                                           std::pair{LNMLP_REMAT_SAVE_STATS, false},
                                           std::pair{LNMLP_REMAT_SAVE_ALL, true},
                                           std::pair{LNMLP_REMAT_SAVE_STATS, true}),
                         [](const auto& i) {
                           return std::string(i.param.first == LNMLP_REMAT_SAVE_ALL ? "save_all" : "save_stats") +
                                  (i.param.second ? "_stochastic" : "_nearest");
                         });

TEST(Nvfp4StagesApi, TheArrayIsTwoPerQuantizer) {
  const Problem pr = problem(LNMLP_DTYPE_BF16);
  const int64_t T = pr.cfg.tokens;
  Calls c(pr, nvfp4());
  AlignedMemory saved(c.saved_bytes, 256, 0xFF);
  Buffer y(pr.dtype, static_cast<size_t>(T) * pr.H());
  EXPECT_EQ(c.forward(0, T, y, saved, nullptr, LNMLP_CALL_AMAX_MEASURE), LNMLP_ERROR_NULL_POINTER);
  EXPECT_NE(std::string(lnmlp_last_error()).find("[LNMLP_QUANTIZER_COUNT][2]"), std::string::npos)
      << lnmlp_last_error();
  std::vector<float> amax(kNvfp4Amaxes, kUnset);
  EXPECT_EQ(c.forward(0, T, y, saved, amax.data(), LNMLP_CALL_DEFAULT), LNMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(c.forward(0, 0, y, saved, amax.data(), LNMLP_CALL_AMAX_MEASURE), LNMLP_SUCCESS) << lnmlp_last_error();
  for (float v : amax) EXPECT_EQ(v, kUnset);  // no tokens: nothing measured
}

// lnmlp_plan_set_rng_place refuses a place that does not fit, and a backward whose tokens pass
// the whole tokens.
TEST(Nvfp4StagesApi, ThePlaceIsChecked) {
  const Problem pr = problem(LNMLP_DTYPE_BF16);  // 40 tokens, F = 64, SiLU-gated: A * F = 128
  const int64_t T = pr.cfg.tokens;
  Calls c(pr, nvfp4());
  lnmlp_plan* p = c.plan.get();
  EXPECT_EQ(lnmlp_plan_set_rng_place(nullptr, 0, 0, 0, 1), LNMLP_ERROR_NULL_POINTER);
  EXPECT_EQ(lnmlp_plan_set_rng_place(p, -1, 0, 0, 1), LNMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(lnmlp_plan_set_rng_place(p, 0, -1, 0, 1), LNMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(lnmlp_plan_set_rng_place(p, 40, 40, 0, 1), LNMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(lnmlp_plan_set_rng_place(p, 0, 0, 0, 0), LNMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(lnmlp_plan_set_rng_place(p, 0, 0, 2, 2), LNMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(lnmlp_plan_set_rng_place(p, 0, 0, -1, 2), LNMLP_ERROR_INVALID_ARGUMENT);
  // 2^42 tokens x 128 x 4 parts = 2^51 elements: past a stream's 2^48.
  EXPECT_EQ(lnmlp_plan_set_rng_place(p, 0, int64_t{1} << 42, 0, 4), LNMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(lnmlp_last_error()).find("2^48"), std::string::npos) << lnmlp_last_error();
  EXPECT_EQ(lnmlp_plan_set_rng_place(p, 0, int64_t{1} << 30, 3, 4), LNMLP_SUCCESS) << lnmlp_last_error();
  const Problem odd = make_problem(lnmlp_ref::biased_config(16, 48, 24, {LNMLP_ACT_GELU}), LNMLP_DTYPE_BF16, 41);
  Calls odd_calls(odd, nvfp4());
  EXPECT_EQ(lnmlp_plan_set_rng_place(odd_calls.plan.get(), 0, 0, 1, 2), LNMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(lnmlp_last_error()).find("multiple of 16"), std::string::npos) << lnmlp_last_error();
  EXPECT_EQ(lnmlp_plan_set_rng_place(odd_calls.plan.get(), 8, 16, 0, 1), LNMLP_SUCCESS) << lnmlp_last_error();

  // The call's 40 tokens from token 30 pass 60: refused before anything is written.
  AlignedMemory saved(c.saved_bytes, 256, 0xFF);
  RunResult r = c.buffers(T);
  ASSERT_EQ(c.forward(0, T, r.y, saved, nullptr, 0), LNMLP_SUCCESS) << lnmlp_last_error();
  ASSERT_EQ(lnmlp_plan_set_rng_place(p, 30, 60, 0, 1), LNMLP_SUCCESS);
  r.dx.poison();
  const std::vector<double> before = r.dx.to_doubles();
  EXPECT_EQ(c.backward(0, T, saved, r, nullptr, 0), LNMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(lnmlp_last_error()).find("lnmlp_plan_set_rng_place"), std::string::npos) << lnmlp_last_error();
  EXPECT_EQ(rng_offset(c), 0u);
  ASSERT_EQ(lnmlp_plan_set_rng_place(p, 20, 60, 0, 1), LNMLP_SUCCESS);
  EXPECT_EQ(c.backward(0, T, saved, r, nullptr, 0), LNMLP_SUCCESS) << lnmlp_last_error();
  EXPECT_EQ(rng_offset(c), 1u);
}

}  // namespace
