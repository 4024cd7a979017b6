// The saved buffer's sections apart (LNMLP_CALL_SAVED_SECTIONS): calls that take each section in a
// buffer of its own give the bits of calls with the one buffer -- every output, the FP8 state and
// each section's contents -- under every dtype, recipe and remat policy, over two steps; with
// backward in two calls; with fewer tokens than the plan's (sections the size of the call's); on
// the ranks of a sharded group. The sections of a call are against the float64 reference where
// they are plain tensors (the statistics and FFN1). And the API's refusals, which write nothing.
#include <gtest/gtest.h>

#include <cstring>
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

RunOptions options_of(const Case& k, bool apart) {
  RunOptions o = plan_case_options(k);
  o.external_workspace = true;
  o.steps = 2;
  o.saved_sections = apart;
  return o;
}

// Bit for bit: every output, the FP8 state and every section's contents.
void expect_same_run(const RunResult& apart, const RunResult& one) {
  EXPECT_TRUE(same_outputs(apart, one));
  EXPECT_EQ(apart.state, one.state);
  ASSERT_EQ(apart.section_contents.size(), one.section_contents.size());
  for (size_t s = 0; s < one.section_contents.size(); ++s)
    EXPECT_TRUE(apart.section_contents[s] == one.section_contents[s]) << "section " << s << " differs";
}

class SectionsApart : public ::testing::TestWithParam<Case> {};

TEST_P(SectionsApart, GiveTheOneBuffersBits) {
  const Case& k = GetParam();
  const Problem pr = plan_case_problem(k, 41);
  const RunResult apart = run_library(pr, options_of(k, true));
  const RunResult one = run_library(pr, options_of(k, false));
  expect_same_run(apart, one);

  // The statistics and FFN1 as saved apart, against the float64 reference (the rest of forward and
  // backward is held to it by the numerics suites, and the bits above equal theirs).
  const auto f = lnmlp_ref::forward_full(pr.cfg, pr.x, pr.p);
  const auto section = [&](int32_t s, int32_t dtype) {
    const std::vector<unsigned char>& bytes = apart.section_contents[static_cast<size_t>(s)];
    Buffer b(dtype, bytes.size() / static_cast<size_t>(dtype_size(dtype)));
    if (!bytes.empty()) std::memcpy(b.data(), bytes.data(), bytes.size());
    return b.to_doubles();
  };
  EXPECT_TRUE(within_tolerance("rstd", section(LNMLP_SAVED_RSTD, LNMLP_DTYPE_F32), f.rs, nullptr,
                               tolerance_for(LNMLP_DTYPE_F32)));
  if (!k.rms) {
    EXPECT_TRUE(within_tolerance("mean", section(LNMLP_SAVED_MEAN, LNMLP_DTYPE_F32), f.mu, nullptr,
                                 tolerance_for(LNMLP_DTYPE_F32)));
  }
  if (k.remat != LNMLP_REMAT_SAVE_STATS) {
    const Tolerance tol = k.recipe == LNMLP_RECIPE_NONE ? tolerance_for(k.dtype) : kTolFp8;
    EXPECT_TRUE(within_tolerance("ffn1", section(LNMLP_SAVED_FFN1, k.dtype), f.h, nullptr, tol));
  }
}

INSTANTIATE_TEST_SUITE_P(Plans, SectionsApart, ::testing::ValuesIn(plan_grid(LNMLP_REMAT_SAVE_STATS, true)),
                         NamedParam());

// Backward in two calls, the norm output saved, and calls with fewer tokens than the plan's most:
// each section the size of the call's.
TEST(SavedSectionsVariants, SplitBackwardNormOutputAndFewerTokens) {
  const std::initializer_list<int32_t> recipes = {LNMLP_RECIPE_NONE, LNMLP_RECIPE_DELAYED, LNMLP_RECIPE_MXFP8};
  for_each_bf16_plan(recipes, {LNMLP_REMAT_SAVE_ALL, LNMLP_REMAT_SAVE_STATS}, [](const Case& k) {
    const Problem pr = plan_case_problem(k, 43, 29);
    RunOptions apart = options_of(k, true), one = options_of(k, false);
    for (RunOptions* o : {&apart, &one}) {
      o->split_backward = true;
      o->norm_output = true;
      o->max_tokens = 64;
    }
    expect_same_run(run_library(pr, apart), run_library(pr, one));
  });
}

// Sharded: every rank's calls with the sections apart give its calls' bits with the one buffer.
TEST(SavedSectionsSharded, EveryRankGivesItsOneBuffersBits) {
  for (const int32_t recipe : {LNMLP_RECIPE_NONE, LNMLP_RECIPE_CURRENT})
    for (const bool sp : {false, true}) {
      SCOPED_TRACE(std::string("recipe ") + std::to_string(recipe) + (sp ? ", sequence parallel" : ", tensor"));
      const Case k{LNMLP_DTYPE_F32, recipe, LNMLP_REMAT_SAVE_ALL, false};
      const Problem pr = plan_case_problem(k, 47, 36);
      const std::vector<RunResult> apart = run_group_in_process(pr, options_of(k, true), 2, sp);
      const std::vector<RunResult> one = run_group_in_process(pr, options_of(k, false), 2, sp);
      ASSERT_EQ(apart.size(), one.size());
      for (size_t r = 0; r < one.size(); ++r) {
        SCOPED_TRACE("rank " + std::to_string(r));
        expect_same_run(apart[r], one[r]);
      }
    }
}

// Bad sections get a clear status and the call writes nothing: not y, not a section, not dx.
TEST(SavedSectionsApi, BadSectionsAreRefusedAndWriteNothing) {
  const Case k{LNMLP_DTYPE_BF16, LNMLP_RECIPE_NONE, LNMLP_REMAT_SAVE_ALL, false};
  const Problem pr = plan_case_problem(k, 53);
  const int64_t T = pr.cfg.tokens;
  RunOptions o;
  o.remat = k.remat;
  Plan plan(pr, o);
  lnmlp_test::SavedSections parts(plan.get(), T, plan.alignment());
  // SAVE_ALL, unquantized, LayerNorm: the statistics, the norm output, FFN1 and the activation output.
  for (int32_t s = 0; s < LNMLP_SAVED_COUNT; ++s)
    EXPECT_EQ(parts.pointers[static_cast<size_t>(s)] != nullptr, s <= LNMLP_SAVED_ACT_OUT) << "section " << s;
  Buffer y(pr.dtype, static_cast<size_t>(T) * pr.H()), dx(pr.dtype, static_cast<size_t>(T) * pr.H());
  Buffer dg(pr.dtype, pr.H()), db(pr.dtype, pr.H()), dw1(pr.dtype, pr.H() * pr.AF()), db1(pr.dtype, pr.AF()),
      dw2(pr.dtype, pr.F() * pr.H()), db2(pr.dtype, pr.H());
  for (Buffer* b : {&y, &dx, &dg, &db, &dw1, &db1, &dw2, &db2}) b->poison();
  const Buffer y_before = y, dx_before = dx;

  const auto forward = [&](void* const* sections, int64_t t = -1) {
    return lnmlp_plan_forward(plan.get(), t < 0 ? T : t, pr.bx.data(), pr.bgamma.data(), pr.bbeta.data(), pr.bw1.data(),
                              pr.bb1.data(), pr.bw2.data(), pr.bb2.data(), y.data(), const_cast<void**>(sections),
                              nullptr, LNMLP_CALL_SAVED_SECTIONS, nullptr);
  };
  const auto backward = [&](void* const* sections) {
    return lnmlp_plan_backward(plan.get(), T, pr.bdy.data(), pr.bx.data(), pr.bgamma.data(), pr.bbeta.data(),
                               pr.bw1.data(), pr.bb1.data(), pr.bw2.data(), sections, dx.data(), dg.data(), db.data(),
                               dw1.data(), db1.data(), dw2.data(), db2.data(), nullptr, LNMLP_CALL_SAVED_SECTIONS,
                               nullptr);
  };
  const auto expect_refused = [&](int32_t status, const std::vector<void*>& sections, const char* named) {
    EXPECT_EQ(forward(sections.data()), status) << lnmlp_last_error();
    EXPECT_NE(std::string(lnmlp_last_error()).find(named), std::string::npos) << lnmlp_last_error();
    EXPECT_EQ(backward(sections.data()), status) << lnmlp_last_error();
  };
  std::vector<void*> bad = parts.pointers;
  bad[LNMLP_SAVED_FFN1] = nullptr;  // a section the plan saves, missing
  expect_refused(LNMLP_ERROR_NULL_POINTER, bad, "LNMLP_SAVED_FFN1");
  bad = parts.pointers;
  AlignedMemory stray(4096, 256, 0);
  bad[LNMLP_SAVED_FP8_SCALES] = stray.get();  // a section the plan does not save, given
  expect_refused(LNMLP_ERROR_INVALID_ARGUMENT, bad, "LNMLP_SAVED_FP8_SCALES");
  bad = parts.pointers;
  bad[LNMLP_SAVED_RSTD] = static_cast<char*>(parts.pointers[LNMLP_SAVED_RSTD]) + 4;  // misaligned
  expect_refused(LNMLP_ERROR_MISALIGNED, bad, "LNMLP_SAVED_RSTD");
  bad = parts.pointers;
  bad[LNMLP_SAVED_ACT_OUT] = bad[LNMLP_SAVED_FFN1];  // two sections in the same memory
  EXPECT_EQ(forward(bad.data()), LNMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(lnmlp_last_error()).find("overlaps"), std::string::npos) << lnmlp_last_error();
  bad = parts.pointers;
  bad[LNMLP_SAVED_ACT_OUT] = static_cast<char*>(bad[LNMLP_SAVED_FFN1]) + 256;  // inside FFN1's memory
  EXPECT_EQ(forward(bad.data()), LNMLP_ERROR_INVALID_ARGUMENT) << lnmlp_last_error();
  // No array at all, where the plan saves sections.
  EXPECT_EQ(forward(nullptr), LNMLP_ERROR_NULL_POINTER);
  EXPECT_EQ(backward(nullptr), LNMLP_ERROR_NULL_POINTER);
  EXPECT_TRUE(same_bits("y", y, y_before));
  EXPECT_TRUE(same_bits("dx", dx, dx_before));
  for (size_t s = 0; s < parts.memory.size(); ++s) {
    const auto* p = static_cast<const unsigned char*>(parts.memory[s].get());
    for (int64_t i = 0; i < parts.memory[s].bytes; ++i) ASSERT_EQ(p[i], 0xFF) << "section " << s << " written";
  }

  // The good calls succeed; with no tokens the array may be NULL, as the one buffer may.
  ASSERT_EQ(forward(parts.pointers.data()), LNMLP_SUCCESS) << lnmlp_last_error();
  ASSERT_EQ(backward(parts.pointers.data()), LNMLP_SUCCESS) << lnmlp_last_error();
  EXPECT_EQ(forward(nullptr, 0), LNMLP_SUCCESS) << lnmlp_last_error();
}

}  // namespace

namespace lnmlp_test {
namespace {

// A blocked recipe's scale sections exist at every token count of a SAVE_ALL plan, 0 included (0
// bytes there; NVFP4's 4, its global amax), as its code sections do; a per-tensor recipe has none.
TEST(SavedSectionsApi, BlockScaleSectionsExistAtEveryTokenCount) {
  for (const int32_t recipe : {LNMLP_RECIPE_CURRENT, LNMLP_RECIPE_BLOCK, LNMLP_RECIPE_MXFP8, LNMLP_RECIPE_NVFP4}) {
    SCOPED_TRACE("recipe " + std::to_string(recipe));
    const Case k{LNMLP_DTYPE_BF16, recipe, LNMLP_REMAT_SAVE_ALL, false};
    const Problem pr = plan_case_problem(k, 59);
    RunOptions o;
    o.recipe = recipe;
    Plan plan(pr, o);
    for (const int64_t tokens : {int64_t{0}, int64_t{1}, pr.cfg.tokens}) {
      for (const int32_t s : {LNMLP_SAVED_NORM_OUTPUT_SCALES, LNMLP_SAVED_ACT_OUT_SCALES}) {
        int64_t offset = -9, rank = -9, dims[LNMLP_MAX_TENSOR_RANK] = {-9, -9, -9};
        int32_t dtype = -9;
        ASSERT_EQ(lnmlp_plan_get_saved_section(plan.get(), s, tokens, &offset, &rank, dims, &dtype), LNMLP_SUCCESS)
            << lnmlp_last_error();
        if (recipe == LNMLP_RECIPE_CURRENT) {
          EXPECT_EQ(offset, -1);
          EXPECT_EQ(rank, -1);
          continue;
        }
        EXPECT_GE(offset, 0) << "section " << s << " at " << tokens << " tokens";
        EXPECT_EQ(rank, 1);
        EXPECT_EQ(dtype, LNMLP_DTYPE_U8);
        if (tokens == 0) EXPECT_EQ(dims[0], recipe == LNMLP_RECIPE_NVFP4 ? 4 : 0);
        else EXPECT_GT(dims[0], 4);
      }
    }
  }
}

}  // namespace
}  // namespace lnmlp_test
