// Backward in two calls (lnmlp_plan_backward_data, then lnmlp_plan_backward_weights:
// TransformerEngine's delay_wgrad_compute): dW1 and dW2 against the float64 reference, and the two
// calls together the bits of lnmlp_plan_backward under every dtype, recipe and remat policy, over
// two steps (so delayed scaling's state moves on), with the workspace scribbled over between the
// calls; sharded with and without sequence parallelism; fewer tokens than the plan's; the
// deferred buffer's size; and the API's refusals.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "plan_grid.h"
#include "sharding_util.h"
#include "test_util.h"
#include "tolerances.h"

using namespace lnmlp_test;

namespace {

using Case = PlanCase;

Problem problem_of(const Case& k, int64_t tokens = 37) { return plan_case_problem(k, 31, tokens); }

RunOptions options_of(const Case& k, bool split) {
  RunOptions o = plan_case_options(k);
  o.external_workspace = true;
  o.split_backward = split;
  o.steps = 2;
  return o;
}

class BackwardSplit : public ::testing::TestWithParam<Case> {};

TEST_P(BackwardSplit, GivesTheWholeBackwardsBits) {
  const Case& k = GetParam();
  const Problem pr = problem_of(k);
  const RunResult split = run_library(pr, options_of(k, true));
  const RunResult whole = run_library(pr, options_of(k, false));

  // The weight gradients against the float64 reference (the other outputs come from the data call
  // as they come from backward, which the numerics tests hold to the reference).
  const Tolerance tol = k.recipe == LNMLP_RECIPE_NONE ? tolerance_for(k.dtype) : kTolFp8;
  EXPECT_TRUE(matches_reference(pr, split, tol, {"dW1", "dW2"}));

  // Bit for bit what one backward call gives: every output and the FP8 state.
  EXPECT_TRUE(same_outputs(split, whole));
  EXPECT_EQ(split.state, whole.state);
  EXPECT_GT(split.deferred_bytes, 0);
}

INSTANTIATE_TEST_SUITE_P(Plans, BackwardSplit, ::testing::ValuesIn(plan_grid(LNMLP_REMAT_SAVE_STATS)), NamedParam());

// The norm output saved (so an unquantized plan's weights call reads ln from the saved buffer),
// out x in weights, and calls with fewer tokens than the plan's most.
TEST(BackwardSplitVariants, NormOutputWeightLayoutAndFewerTokens) {
  const std::initializer_list<int32_t> recipes = {LNMLP_RECIPE_NONE, LNMLP_RECIPE_CURRENT, LNMLP_RECIPE_MXFP8};
  for_each_bf16_plan(recipes, {LNMLP_REMAT_SAVE_FFN1, LNMLP_REMAT_SAVE_STATS}, [](const Case& k) {
    Problem pr = problem_of(k, 29);
    pr.weight_layout = LNMLP_WEIGHT_LAYOUT_OUT_IN;
    set_weights(pr, k.dtype);
    RunOptions split = options_of(k, true), whole = options_of(k, false);
    for (RunOptions* o : {&split, &whole}) {
      o->norm_output = true;
      o->max_tokens = 64;
    }
    EXPECT_TRUE(same_outputs(run_library(pr, split), run_library(pr, whole)));
  });
}

// Sharded: every rank's two calls give its backward's bits (the data call runs the collectives;
// the weights call runs none, so the ranks make it one after another here).
TEST(BackwardSplitSharded, EveryRankGivesItsBackwardsBits) {
  for (const int32_t recipe : {LNMLP_RECIPE_NONE, LNMLP_RECIPE_DELAYED, LNMLP_RECIPE_BLOCK})
    for (const bool sp : {false, true}) {
      SCOPED_TRACE(std::string("recipe ") + std::to_string(recipe) + (sp ? ", sequence parallel" : ", tensor"));
      const Case k{LNMLP_DTYPE_BF16, recipe, LNMLP_REMAT_SAVE_STATS, false};
      const Problem pr = problem_of(k, 36);
      const std::vector<RunResult> split = run_group_in_process(pr, options_of(k, true), 2, sp);
      const std::vector<RunResult> whole = run_group_in_process(pr, options_of(k, false), 2, sp);
      ASSERT_EQ(split.size(), whole.size());
      for (size_t r = 0; r < split.size(); ++r) {
        EXPECT_TRUE(same_outputs(split[r], whole[r])) << "rank " << r;
        EXPECT_EQ(split[r].state, whole[r].state);
      }
    }
}

constexpr int64_t kSmallTokens = 37;

// A plan made for `recipe` and `remat` (bf16, LayerNorm, both biases, T 37, H 48, F 40, silu x linear).
struct SmallPlan {
  Problem pr;
  lnmlp_plan* plan = nullptr;
  SmallPlan(int32_t recipe, int32_t remat) : pr(problem_of({LNMLP_DTYPE_BF16, recipe, remat, false})) {
    RunOptions o;
    o.recipe = recipe;
    o.remat = remat;
    holder = std::make_unique<Plan>(pr, o);
    plan = holder->get();
  }
  std::unique_ptr<Plan> holder;
};

int64_t deferred_bytes(lnmlp_plan* p, int64_t tokens) {
  int64_t bytes = -1;
  EXPECT_EQ(lnmlp_plan_get_deferred_bytes(p, tokens, &bytes), LNMLP_SUCCESS) << lnmlp_last_error();
  return bytes;
}

int64_t padded(int64_t bytes) { return (bytes + 255) / 256 * 256; }

// The deferred buffer holds what the saved buffer lacks, as the header says: worked out here from
// the shapes (T 37, H 48, A*F 80, F 40; bf16).
TEST(BackwardSplitApi, DeferredBytesAreWhatTheSavedBufferLacks) {
  const int64_t T = 37, H = 48, F = 40, AF = 80, e = 2;
  // Unquantized, SAVE_ALL: only dh (dy is the caller's).
  EXPECT_EQ(deferred_bytes(SmallPlan(LNMLP_RECIPE_NONE, LNMLP_REMAT_SAVE_ALL).plan, LNMLP_TOKENS_MAX),
            padded(T * AF * e));
  // SAVE_STATS: the norm and activation outputs too.
  EXPECT_EQ(deferred_bytes(SmallPlan(LNMLP_RECIPE_NONE, LNMLP_REMAT_SAVE_STATS).plan, LNMLP_TOKENS_MAX),
            padded(T * H * e) + padded(T * F * e) + padded(T * AF * e));
  // Delayed scaling, SAVE_ALL: the scales, dy's and dh's codes.
  EXPECT_EQ(deferred_bytes(SmallPlan(LNMLP_RECIPE_DELAYED, LNMLP_REMAT_SAVE_ALL).plan, LNMLP_TOKENS_MAX),
            padded(6 * 4) + padded(T * H) + padded(T * AF));
  // MXFP8, SAVE_STATS: codes and one E8M0 scale per 32 rows and column of all four.
  const int64_t tb = (T + 31) / 32;
  EXPECT_EQ(deferred_bytes(SmallPlan(LNMLP_RECIPE_MXFP8, LNMLP_REMAT_SAVE_STATS).plan, LNMLP_TOKENS_MAX),
            padded(T * H) + padded(tb * H) + padded(T * F) + padded(tb * F) + padded(T * H) + padded(tb * H) +
                padded(T * AF) + padded(tb * AF));
  // A call's: fewer tokens, fewer bytes; none, none.
  SmallPlan p(LNMLP_RECIPE_NONE, LNMLP_REMAT_SAVE_ALL);
  EXPECT_EQ(deferred_bytes(p.plan, 5), padded(5 * AF * e));
  EXPECT_EQ(deferred_bytes(p.plan, 0), 0);
  // A plan that does not train keeps nothing.
  EXPECT_EQ(deferred_bytes(SmallPlan(LNMLP_RECIPE_NONE, LNMLP_REMAT_FORWARD_ONLY).plan, LNMLP_TOKENS_MAX), 0);
  int64_t bytes = 0;
  EXPECT_EQ(lnmlp_plan_get_deferred_bytes(p.plan, 38, &bytes), LNMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(lnmlp_plan_get_deferred_bytes(p.plan, 0, nullptr), LNMLP_ERROR_NULL_POINTER);
  EXPECT_EQ(lnmlp_plan_get_deferred_bytes(nullptr, 0, &bytes), LNMLP_ERROR_NULL_POINTER);
}

// Bad arguments get a clear status and write nothing: not the outputs, not the deferred buffer,
// not the FP8 state.
TEST(BackwardSplitApi, BadArgumentsAreRefusedAndWriteNothing) {
  SmallPlan p(LNMLP_RECIPE_DELAYED, LNMLP_REMAT_SAVE_ALL);
  const Problem& pr = p.pr;
  const int64_t T = kSmallTokens;
  int64_t saved_bytes = 0;
  ASSERT_EQ(lnmlp_plan_get_saved_bytes(p.plan, &saved_bytes), LNMLP_SUCCESS);
  AlignedMemory saved(saved_bytes, 256, 0);
  Buffer y(pr.dtype, static_cast<size_t>(T) * pr.H());
  ASSERT_EQ(
      lnmlp_plan_forward(p.plan, T, pr.bx.data(), pr.bgamma.data(), pr.bbeta.data(), pr.bw1.data(), pr.bb1.data(),
                         pr.bw2.data(), pr.bb2.data(), y.data(), saved.get(), nullptr, LNMLP_CALL_DEFAULT, nullptr),
      LNMLP_SUCCESS);
  const int64_t need = deferred_bytes(p.plan, T);
  AlignedMemory deferred(need + 512, 256, 0x5A);
  Buffer dx(pr.dtype, static_cast<size_t>(T) * pr.H()), dg(pr.dtype, pr.H()), db(pr.dtype, pr.H()),
      db1(pr.dtype, pr.AF()), db2(pr.dtype, pr.H()), dw1(pr.dtype, pr.H() * pr.AF()), dw2(pr.dtype, pr.F() * pr.H());
  for (Buffer* b : {&dx, &dg, &db, &db1, &db2, &dw1, &dw2}) b->poison();
  const std::vector<Buffer> before{dx, dg, db, db1, db2, dw1, dw2};
  std::vector<unsigned char> state_before(1 << 16);
  int64_t state_bytes = 0;
  ASSERT_EQ(lnmlp_plan_get_state_bytes(p.plan, &state_bytes), LNMLP_SUCCESS);
  ASSERT_EQ(lnmlp_plan_export_state(p.plan, state_before.data(), state_bytes), LNMLP_SUCCESS);

  const auto data = [&](void* def, void* dxp, int32_t flags = LNMLP_CALL_DEFAULT, int64_t t = kSmallTokens) {
    return lnmlp_plan_backward_data(p.plan, t, pr.bdy.data(), pr.bx.data(), pr.bgamma.data(), pr.bbeta.data(),
                                    pr.bw1.data(), pr.bb1.data(), pr.bw2.data(), saved.get(), dxp, dg.data(), db.data(),
                                    db1.data(), db2.data(), def, nullptr, flags, nullptr);
  };
  const auto weights = [&](const void* def, void* dw1p, const void* sv, int64_t t = kSmallTokens) {
    return lnmlp_plan_backward_weights(p.plan, t, pr.bdy.data(), sv, def, dw1p, dw2.data(), LNMLP_CALL_DEFAULT,
                                       nullptr);
  };
  auto* base = static_cast<unsigned char*>(deferred.get());
  EXPECT_EQ(data(nullptr, dx.data()), LNMLP_ERROR_NULL_POINTER);
  EXPECT_NE(std::string(lnmlp_last_error()).find("deferred"), std::string::npos) << lnmlp_last_error();
  EXPECT_EQ(data(base + 16, dx.data()), LNMLP_ERROR_MISALIGNED);
  EXPECT_EQ(data(base, nullptr), LNMLP_ERROR_NULL_POINTER);
  EXPECT_EQ(data(base, dx.data(), 16), LNMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(data(base, dx.data(), LNMLP_CALL_DEFAULT, T + 1), LNMLP_ERROR_INVALID_ARGUMENT);
  // The deferred buffer overlapping saved (which the data call reads).
  EXPECT_EQ(data(saved.get(), dx.data()), LNMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(weights(nullptr, dw1.data(), saved.get()), LNMLP_ERROR_NULL_POINTER);
  EXPECT_EQ(weights(base, nullptr, saved.get()), LNMLP_ERROR_NULL_POINTER);
  EXPECT_EQ(weights(base, dw1.data(), nullptr), LNMLP_ERROR_NULL_POINTER);
  EXPECT_EQ(weights(base + 16, dw1.data(), saved.get()), LNMLP_ERROR_MISALIGNED);
  EXPECT_EQ(weights(base, dw1.data(), saved.get(), -1), LNMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(lnmlp_plan_backward_weights(nullptr, T, pr.bdy.data(), saved.get(), base, dw1.data(), dw2.data(),
                                        LNMLP_CALL_DEFAULT, nullptr),
            LNMLP_ERROR_NULL_POINTER);
  for (size_t i = 0; i < static_cast<size_t>(deferred.bytes); ++i)
    ASSERT_EQ(base[i], 0x5A) << "deferred byte " << i << " written";
  const std::vector<Buffer> after{dx, dg, db, db1, db2, dw1, dw2};
  for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(same_bits("an output", after[i], before[i]));
  std::vector<unsigned char> state_after(state_before.size());
  ASSERT_EQ(lnmlp_plan_export_state(p.plan, state_after.data(), state_bytes), LNMLP_SUCCESS);
  EXPECT_EQ(state_after, state_before);

  // A plan that does not train has neither call.
  SmallPlan inference(LNMLP_RECIPE_NONE, LNMLP_REMAT_FORWARD_ONLY);
  EXPECT_EQ(lnmlp_plan_backward_weights(inference.plan, T, pr.bdy.data(), saved.get(), base, dw1.data(), dw2.data(),
                                        LNMLP_CALL_DEFAULT, nullptr),
            LNMLP_ERROR_INVALID_ARGUMENT);

  // The good calls succeed; with no tokens the weights call zeroes dW1 and dW2.
  ASSERT_EQ(data(base, dx.data()), LNMLP_SUCCESS) << lnmlp_last_error();
  ASSERT_EQ(weights(base, dw1.data(), saved.get()), LNMLP_SUCCESS) << lnmlp_last_error();
  ASSERT_EQ(lnmlp_plan_backward_weights(p.plan, 0, nullptr, nullptr, nullptr, dw1.data(), dw2.data(),
                                        LNMLP_CALL_WEIGHTS_UNCHANGED, nullptr),
            LNMLP_SUCCESS)
      << lnmlp_last_error();
  for (const Buffer* b : {&dw1, &dw2})
    for (double v : b->to_doubles()) ASSERT_EQ(v, 0.0);
}

}  // namespace
