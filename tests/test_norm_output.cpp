// The norm output a plan gives (lnmlp_desc_set_norm_output) and where the saved buffer's sections
// are (lnmlp_plan_get_saved_section): under every recipe and remat policy, the norm output is the
// float64 reference's norm rounded to the I/O dtype, bit for bit the unquantized SAVE_ALL plan's,
// and asking for it changes no other result.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "plan_grid.h"
#include "sharding_util.h"
#include "test_util.h"
#include "tolerances.h"

using namespace lnmlp_test;

namespace {

using Case = PlanCase;

Problem problem_of(const Case& k, int64_t tokens = 37) { return plan_case_problem(k, 29, tokens); }

RunOptions options_of(const Case& k, bool norm_output) {
  RunOptions o = plan_case_options(k);
  o.backward = k.remat != LNMLP_REMAT_FORWARD_ONLY;
  o.norm_output = norm_output;
  return o;
}

class NormOutput : public ::testing::TestWithParam<Case> {};

TEST_P(NormOutput, IsTheRoundedNormAndChangesNothingElse) {
  const Case& k = GetParam();
  const Problem pr = problem_of(k);
  const RunResult with = run_library(pr, options_of(k, true));
  const RunResult without = run_library(pr, options_of(k, false));

  // Against the float64 reference's norm (one rounding to D of an fp32 computation).
  const auto f = lnmlp_ref::forward_full(pr.cfg, pr.x, pr.p);
  ASSERT_EQ(with.norm_output.dtype, k.dtype);
  ASSERT_EQ(with.norm_output.size(), f.n.size());
  EXPECT_TRUE(within_tolerance("norm output", with.norm_output.to_doubles(), f.n, nullptr, tolerance_for(k.dtype)));

  // The values an unquantized SAVE_ALL plan saves, whatever the recipe and policy (the FP8 plans
  // run the norm again over the statistics: it must give the same bits).
  const Case plain{k.dtype, LNMLP_RECIPE_NONE, LNMLP_REMAT_SAVE_ALL, k.rms};
  const RunResult base = run_library(pr, options_of(plain, false));
  ASSERT_FALSE(base.norm_output.empty()) << "an unquantized SAVE_ALL plan saves the norm output anyway";
  EXPECT_TRUE(same_bits("norm output", with.norm_output, base.norm_output));

  // Nothing else moves: y, every gradient, the FP8 state.
  EXPECT_TRUE(same_outputs(with, without));
  EXPECT_EQ(with.state, without.state);

  // The saved bytes: e*H more per token, unless the plan saved the norm output in D already.
  const bool had_it = k.recipe == LNMLP_RECIPE_NONE && k.remat == LNMLP_REMAT_SAVE_ALL;
  EXPECT_EQ(without.norm_output.empty(), !had_it);
  EXPECT_EQ(with.saved_bytes_per_token - without.saved_bytes_per_token, had_it ? 0 : dtype_size(k.dtype) * 48);
}

// Every section lies inside the call's saved bytes, at a 256-byte-aligned offset, without
// overlapping another; together they are the saved bytes less padding.
TEST_P(NormOutput, SectionsTileTheSavedBuffer) {
  const Case& k = GetParam();
  for (const bool norm_output : {false, true}) {
    SCOPED_TRACE(norm_output ? "with the norm output" : "without");
    const RunResult r = run_library(problem_of(k), options_of(k, norm_output));
    std::vector<std::pair<int64_t, int64_t>> spans;
    for (size_t s = 0; s < r.section_offsets.size(); ++s) {
      if (r.section_offsets[s] < 0) {
        EXPECT_EQ(r.section_bytes[s], 0) << "section " << s;
        continue;
      }
      EXPECT_EQ(r.section_offsets[s] % 256, 0) << "section " << s;
      EXPECT_LE(r.section_offsets[s] + r.section_bytes[s], r.call_saved_bytes) << "section " << s;
      spans.emplace_back(r.section_offsets[s], r.section_offsets[s] + r.section_bytes[s]);
    }
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i) EXPECT_LE(spans[i - 1].second, spans[i].first);
    EXPECT_EQ(spans.empty(), r.call_saved_bytes == 0);
    if (!spans.empty()) {
      EXPECT_GT(spans.back().second + 256, r.call_saved_bytes);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Plans, NormOutput, ::testing::ValuesIn(plan_grid(LNMLP_REMAT_FORWARD_ONLY)), NamedParam());

// Sequence parallelism: every rank's section holds the whole group's rows (all-gathered), the
// one-process plan's norm output; tensor parallelism: every rank's is the whole norm output.
TEST(NormOutputSharded, EveryRankHoldsTheGroupsRows) {
  for (const int32_t recipe : {LNMLP_RECIPE_NONE, LNMLP_RECIPE_DELAYED, LNMLP_RECIPE_BLOCK})
    for (const bool sp : {false, true}) {
      SCOPED_TRACE(std::string("recipe ") + std::to_string(recipe) + (sp ? ", sequence parallel" : ", tensor"));
      const Case k{LNMLP_DTYPE_BF16, recipe, LNMLP_REMAT_SAVE_STATS, false};
      const Problem pr = problem_of(k, 36);
      const RunResult one = run_library(pr, options_of(k, true));
      for (const RunResult& rank : run_group_in_process(pr, options_of(k, true), 2, sp))
        EXPECT_TRUE(same_bits("norm output", rank.norm_output, one.norm_output));
    }
}

// The API: bad arguments get a clear status and write nothing.
TEST(NormOutputApi, BadArgumentsAreRefused) {
  lnmlp_desc* d = nullptr;
  ASSERT_EQ(lnmlp_desc_create(&d), LNMLP_SUCCESS);
  EXPECT_EQ(lnmlp_desc_set_norm_output(d, 2), LNMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(lnmlp_last_error()).find("enabled must be 0 or 1"), std::string::npos);
  EXPECT_EQ(lnmlp_desc_set_norm_output(nullptr, 1), LNMLP_ERROR_NULL_POINTER);
  ASSERT_EQ(lnmlp_desc_set_shape(d, 8, 16, 24), LNMLP_SUCCESS);
  ASSERT_EQ(lnmlp_desc_set_norm_output(d, 1), LNMLP_SUCCESS);
  lnmlp_plan* p = nullptr;
  ASSERT_EQ(lnmlp_plan_create(d, &p), LNMLP_SUCCESS);
  int64_t offset = 7, rank = 7, dims[LNMLP_MAX_TENSOR_RANK] = {7, 7, 7};
  int32_t type = 7;
  const auto untouched = [&] { return offset == 7 && rank == 7 && dims[0] == 7 && type == 7; };
  EXPECT_EQ(lnmlp_plan_get_saved_section(p, LNMLP_SAVED_COUNT, 8, &offset, &rank, dims, &type),
            LNMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(lnmlp_last_error()).find("unknown section"), std::string::npos);
  EXPECT_EQ(lnmlp_plan_get_saved_section(p, -1, 8, &offset, &rank, dims, &type), LNMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(lnmlp_plan_get_saved_section(p, LNMLP_SAVED_NORM_OUTPUT, 9, &offset, &rank, dims, &type),
            LNMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(lnmlp_plan_get_saved_section(p, LNMLP_SAVED_NORM_OUTPUT, 8, nullptr, &rank, dims, &type),
            LNMLP_ERROR_NULL_POINTER);
  EXPECT_EQ(lnmlp_plan_get_saved_section(nullptr, LNMLP_SAVED_NORM_OUTPUT, 8, &offset, &rank, dims, &type),
            LNMLP_ERROR_NULL_POINTER);
  EXPECT_TRUE(untouched());
  // A valid query: [tokens, H] in the I/O dtype, for the plan's most tokens and for fewer.
  ASSERT_EQ(lnmlp_plan_get_saved_section(p, LNMLP_SAVED_NORM_OUTPUT, LNMLP_TOKENS_MAX, &offset, &rank, dims, &type),
            LNMLP_SUCCESS);
  EXPECT_EQ(rank, 2);
  EXPECT_EQ(dims[0], 8);
  EXPECT_EQ(dims[1], 16);
  EXPECT_EQ(dims[2], 0);
  EXPECT_EQ(type, LNMLP_DTYPE_F32);
  ASSERT_EQ(lnmlp_plan_get_saved_section(p, LNMLP_SAVED_NORM_OUTPUT, 3, &offset, &rank, dims, &type), LNMLP_SUCCESS);
  EXPECT_EQ(dims[0], 3);
  // A section this plan (unquantized SAVE_ALL) does not have.
  ASSERT_EQ(lnmlp_plan_get_saved_section(p, LNMLP_SAVED_NORM_OUTPUT_CODES, 3, &offset, &rank, dims, &type),
            LNMLP_SUCCESS);
  EXPECT_EQ(offset, -1);
  EXPECT_EQ(rank, -1);
  lnmlp_plan_destroy(p);
  lnmlp_desc_destroy(d);
}

}  // namespace
