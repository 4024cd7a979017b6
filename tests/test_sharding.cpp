// Sharded plans (docs/design.md, "Sharding") over the callback communicator, with P ranks as P threads of
// this process (tests/sharding_util.h): the group's assembled outputs and gradients equal the
// unsharded plan's and the float64 reference's within the dtype's tolerance (tests/tolerances.h;
// sharding only reorders fp32 sums: GEMM2's and dn's partial sums over F/P, dgamma/dbeta/db2's
// over T/P rows), and the replicated outputs are bit-identical on every rank. Also the checks at
// plan creation and the refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <utility>

#include "sharding_util.h"

namespace lnmlp_test {
namespace {

struct Case {
  lnmlp_ref::Norm norm;
  std::vector<int> acts;
  int32_t dtype;
  bool bias;
  bool sp;
  int P;
  int32_t remat;
};

std::string case_name(const Case& c) {
  std::string s = c.norm == lnmlp_ref::Norm::LayerNorm ? "ln" : "rms";
  s += c.acts.size() == 2 ? "_swiglu" : "_gelu";
  s += std::string("_") + dtype_label(c.dtype) + (c.bias ? "_bias" : "_nobias") + (c.sp ? "_sp" : "_tp");
  s += "_P" + std::to_string(c.P) + "_remat" + std::to_string(c.remat);
  return s;
}

std::vector<Case> cases() {
  std::vector<Case> v;
  int i = 0;
  for (auto norm : {lnmlp_ref::Norm::LayerNorm, lnmlp_ref::Norm::RmsNorm})
    for (const auto& acts : {std::vector<int>{LNMLP_ACT_GELU}, std::vector<int>{LNMLP_ACT_SILU, LNMLP_ACT_LINEAR}})
      for (int32_t dtype : {LNMLP_DTYPE_F32, LNMLP_DTYPE_BF16, LNMLP_DTYPE_F16})
        for (bool bias : {false, true})
          for (bool sp : {false, true}) {
            const int32_t remat = i % 4 == 3 ? LNMLP_REMAT_FORWARD_ONLY : i % 4;  // every policy
            v.push_back({norm, acts, dtype, bias, sp, 2, remat});
            if (i % 4 == 1) v.push_back({norm, acts, dtype, bias, sp, 3, (i / 4) % 3});  // P = 3 on a quarter
            ++i;
          }
  return v;
}

// The largest normalised errors seen, per dtype, printed at the end (the closing note).
std::map<std::string, double>& worst() {
  static std::map<std::string, double> m;
  return m;
}

// compare_group's verdict as test failures, its largest errors kept under `key`.
void expect_group_matches(const GroupComparison& c, const std::string& key) {
  EXPECT_TRUE(c.failures.empty()) << c.failures;
  double& w1 = worst()[key + " vs unsharded plan"];
  double& w2 = worst()[key + " vs float64 reference"];
  w1 = std::max(w1, c.worst_vs_plan);
  w2 = std::max(w2, c.worst_vs_ref);
}

class Sharding : public ::testing::TestWithParam<Case> {};

TEST_P(Sharding, GroupEqualsUnshardedPlanAndReference) {
  const Case& k = GetParam();
  lnmlp_ref::Config cfg = lnmlp_ref::biased_config(12, 40, 24, k.acts, k.norm);  // T divisible by 2 and 3
  cfg.has_bias1 = cfg.has_bias2 = k.bias;
  const Problem pr = make_problem(cfg, k.dtype, hash_name(case_name(k)));
  RunOptions o;
  o.remat = k.remat;
  o.backward = k.remat != LNMLP_REMAT_FORWARD_ONLY;
  const RunResult single = run_library(pr, o);

  int collectives = 0;
  const std::vector<RunResult> ranks = run_group_in_process(pr, o, k.P, k.sp, &collectives);
  std::string mismatch;
  const RunResult got = assemble(pr, ranks, k.sp, &mismatch);
  EXPECT_TRUE(mismatch.empty()) << mismatch;

  const Tolerance tol = tolerance_for(k.dtype);
  expect_group_matches(compare_group(pr, got, single, o.backward, tol, tol), dtype_label(k.dtype));
  EXPECT_GT(collectives, 0);
}

INSTANTIATE_TEST_SUITE_P(Group, Sharding, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return case_name(i.param); });

class PrintWorst : public ::testing::Environment {
 public:
  void TearDown() override {
    for (const auto& [k, v] : worst()) std::printf("largest normalised error, %s: %.3g\n", k.c_str(), v);
  }
};
const auto* const kPrintWorst = ::testing::AddGlobalTestEnvironment(new PrintWorst);

// ---- FP8: every recipe sharded, against the unsharded plan and the reference ----

struct Fp8Case {
  int32_t recipe;
  bool sp;
  bool gated;
  int32_t dtype;
  int32_t remat;
};

std::string fp8_name(const Fp8Case& c) {
  static const char* const names[] = {"none", "delayed", "current", "block", "mxfp8", "nvfp4"};
  return std::string(names[c.recipe]) + (c.gated ? "_swiglu_" : "_gelu_") + dtype_label(c.dtype) +
         (c.sp ? "_sp" : "_tp") + "_remat" + std::to_string(c.remat);
}

std::vector<Fp8Case> fp8_cases() {
  std::vector<Fp8Case> v;
  int i = 0;
  for (int32_t recipe : {LNMLP_RECIPE_DELAYED, LNMLP_RECIPE_CURRENT, LNMLP_RECIPE_BLOCK, LNMLP_RECIPE_MXFP8})
    for (bool sp : {false, true})
      for (bool gated : {false, true}) {
        v.push_back({recipe, sp, gated, i % 2 == 0 ? LNMLP_DTYPE_BF16 : LNMLP_DTYPE_F32, i % 3});
        ++i;
      }
  return v;
}

// The floats of an exported state blob (after the 24-byte header: magic, version, recipe, length, count).
std::vector<float> state_floats(const std::vector<unsigned char>& blob) {
  std::vector<float> f(blob.size() > 24 ? (blob.size() - 24) / 4 : 0);
  if (!f.empty()) std::memcpy(f.data(), blob.data() + 24, f.size() * 4);
  return f;
}

class ShardingFp8 : public ::testing::TestWithParam<Fp8Case> {};

TEST_P(ShardingFp8, GroupEqualsUnshardedPlanAndReference) {
  const Fp8Case& k = GetParam();
  constexpr int P = 2;
  // F/P = 128: each shard is whole blocks of every recipe (see kTolFp8Sharded)
  const lnmlp_ref::Config cfg = lnmlp_ref::biased_config(
      32, 64, 256, swiglu_or_gelu(k.gated), k.gated ? lnmlp_ref::Norm::RmsNorm : lnmlp_ref::Norm::LayerNorm);
  const Problem pr = make_problem(cfg, k.dtype, hash_name(fp8_name(k)));
  RunOptions o;
  o.remat = k.remat;
  o.recipe = k.recipe;
  o.amax_history_len = 4;
  o.steps = k.recipe == LNMLP_RECIPE_DELAYED ? 3 : 1;  // delayed: scales from the recorded history
  const RunResult single = run_library(pr, o);

  const std::vector<RunResult> ranks = run_group_in_process(pr, o, P, k.sp);
  std::string mismatch;
  const RunResult got = assemble(pr, ranks, k.sp, &mismatch);
  EXPECT_TRUE(mismatch.empty()) << mismatch;

  // Delayed scaling: the same state, bit for bit, on every rank, and the unsharded plan's values.
  EXPECT_EQ(ranks[0].state, ranks[1].state);
  const auto st = state_floats(ranks[0].state), st_ref = state_floats(single.state);
  ASSERT_EQ(st.size(), st_ref.size());
  for (size_t i = 0; i < st.size(); ++i) EXPECT_NEAR(st[i], st_ref[i], 1e-4 * std::fabs(st_ref[i])) << "state float " << i;

  expect_group_matches(compare_group(pr, got, single, true, kTolFp8Sharded, kTolFp8),
                       fp8_name(k).substr(0, fp8_name(k).find('_')));
}

INSTANTIATE_TEST_SUITE_P(Recipes, ShardingFp8, ::testing::ValuesIn(fp8_cases()),
                         [](const ::testing::TestParamInfo<Fp8Case>& i) { return fp8_name(i.param); });

// ---- FP8, blocked recipes with shards that are not a whole number of blocks ----
//
// F = 240: F/P = 120 (P = 2) and 80 (P = 3), neither a multiple of BLOCK's 128 nor of MXFP8's 32,
// so each shard of W1, W2, act_out and dh ends in a partial block, and the unsharded plan's block
// boundaries (at multiples of the block in the full F) fall inside the shards. The gated cases
// also put the [H, A, F/P] halves' boundary at a column that is not a block boundary. The scales
// of MXFP8 (E8M0) and of BLOCK by default are powers of 2, which commute with FP8 rounding, so
// other blocks change only the subnormal range and the group stays within kTolFp8Sharded of the
// unsharded plan (measured: at most ~2e-3 over 12 seeds). BLOCK without power-of-2 scales would
// differ by a whole FP8 rounding (0.03-0.04, the bound itself): plan creation refuses it unless
// F/P is whole blocks (ShardingPlan.BlockWithoutPowerOf2ScalesNeedsWholeBlocks), and the
// "nopow2" cases here run it with F = 768 (F/P = 384 or 256, whole blocks) for contrast.

struct Fp8BlockedCase {
  int32_t recipe;
  int32_t power_2_scale;  // BLOCK: -1 the default (yes), 0 no
  int P;
  bool sp;
  bool gated;
  int32_t dtype;
  int32_t remat;
  int64_t ffn() const { return power_2_scale == 0 ? 768 : 240; }
};

std::string fp8_blocked_name(const Fp8BlockedCase& c) {
  return std::string(c.recipe == LNMLP_RECIPE_BLOCK ? "block" : "mxfp8") + (c.power_2_scale == 0 ? "_nopow2" : "") +
         "_P" + std::to_string(c.P) + "_F" + std::to_string(c.ffn()) + (c.gated ? "_swiglu_" : "_gelu_") +
         dtype_label(c.dtype) + (c.sp ? "_sp" : "_tp") + "_remat" + std::to_string(c.remat);
}

std::vector<Fp8BlockedCase> fp8_blocked_cases() {
  std::vector<Fp8BlockedCase> v;
  int i = 0;
  const std::pair<int32_t, int32_t> recipes[] = {
      {LNMLP_RECIPE_BLOCK, -1}, {LNMLP_RECIPE_MXFP8, -1}, {LNMLP_RECIPE_BLOCK, 0}};
  for (const auto& [recipe, p2] : recipes)
    for (int P : {2, 3})
      for (bool sp : {false, true}) {
        v.push_back({recipe, p2, P, sp, i % 2 == 1, i % 3 == 0 ? LNMLP_DTYPE_F32 : LNMLP_DTYPE_BF16, i % 3});
        ++i;
      }
  return v;
}

class ShardingFp8Blocked : public ::testing::TestWithParam<Fp8BlockedCase> {};

TEST_P(ShardingFp8Blocked, PartialBlocksGroupEqualsUnshardedPlanAndReference) {
  const Fp8BlockedCase& k = GetParam();
  // T divisible by 2 and 3; F 240: F/P = 120 or 80, a partial block at the end of every shard (see above)
  const lnmlp_ref::Config cfg = lnmlp_ref::biased_config(
      48, 64, k.ffn(), swiglu_or_gelu(k.gated), k.gated ? lnmlp_ref::Norm::RmsNorm : lnmlp_ref::Norm::LayerNorm);
  const int64_t block = k.recipe == LNMLP_RECIPE_BLOCK ? 128 : 32;
  if (k.power_2_scale == 0)
    ASSERT_EQ((cfg.ffn / k.P) % block, 0);
  else
    ASSERT_NE((cfg.ffn / k.P) % block, 0);
  const Problem pr = make_problem(cfg, k.dtype, hash_name(fp8_blocked_name(k)));
  RunOptions o;
  o.remat = k.remat;
  o.recipe = k.recipe;
  o.power_2_scale = k.power_2_scale;
  const RunResult single = run_library(pr, o);

  const std::vector<RunResult> ranks = run_group_in_process(pr, o, k.P, k.sp);
  std::string mismatch;
  const RunResult got = assemble(pr, ranks, k.sp, &mismatch);
  EXPECT_TRUE(mismatch.empty()) << mismatch;

  const std::string key = fp8_blocked_name(k).substr(0, fp8_blocked_name(k).find("_P")) +
                          (k.power_2_scale == 0 ? ", whole blocks" : ", partial blocks");
  expect_group_matches(compare_group(pr, got, single, true, kTolFp8Sharded, kTolFp8), key);
}

INSTANTIATE_TEST_SUITE_P(Recipes, ShardingFp8Blocked, ::testing::ValuesIn(fp8_blocked_cases()),
                         [](const ::testing::TestParamInfo<Fp8BlockedCase>& i) { return fp8_blocked_name(i.param); });

// ---- plan creation: what must agree, and the refusals ----

// A NaN in one rank's W1 shard makes every rank's W1 amax NaN (the group's max-reduction
// propagates it as a local amax does), and every rank records the same state.
// ABI 2's tokens per call, per rank: a group whose plans were made for more tokens than the call
// has gives, rank by rank, the bits of a group made for exactly the call's tokens (with and
// without sequence parallelism, where a rank's call has its T/P rows).
TEST(ShardingTokensPerCall, AGroupCallComputesWhatAGroupMadeForItsTokensComputes) {
  // 10 tokens, the call's, the group's: 5 rows per rank under sequence parallelism
  const lnmlp_ref::Config cfg = lnmlp_ref::biased_config(10, 32, 48, swiglu_or_gelu(true));
  for (int32_t recipe : {LNMLP_RECIPE_NONE, LNMLP_RECIPE_DELAYED}) {
    for (bool sp : {false, true}) {
      SCOPED_TRACE(std::string("recipe ") + std::to_string(recipe) + (sp ? ", sequence parallel" : ""));
      const Problem pr = make_problem(cfg, LNMLP_DTYPE_BF16, 77);
      RunOptions o;
      o.recipe = recipe;
      o.amax_history_len = 4;
      o.steps = 2;
      const std::vector<RunResult> exact = run_group_in_process(pr, o, 2, sp);
      o.max_tokens = 32;
      const std::vector<RunResult> call = run_group_in_process(pr, o, 2, sp);
      // And with the call's count prepared at plan creation: a rank's rows under sequence parallelism.
      o.prepared_tokens = {sp ? 5 : 10};
      const std::vector<RunResult> prepared = run_group_in_process(pr, o, 2, sp);
      for (size_t r = 0; r < 2; ++r) {
        for (const RunResult* run : {&call[r], &prepared[r]}) {
          EXPECT_TRUE(same_outputs(*run, exact[r])) << "rank " << r;
          EXPECT_EQ(run->state, exact[r].state) << "rank " << r;
        }
      }
    }
  }
}

TEST(ShardingFp8State, ANaNAmaxOnOneRankReachesEveryRank) {
  const Problem pr = nan_in_last_shard_problem();
  const RunOptions o = nan_in_last_shard_options();
  const std::vector<RunResult> ranks = run_group_in_process(pr, o, 2, false);
  for (size_t r = 0; r < ranks.size(); ++r) {
    EXPECT_TRUE(std::isnan(newest_amax(ranks[r].state, LNMLP_QUANTIZER_W1))) << "rank " << r;
    EXPECT_GT(newest_amax(ranks[r].state, LNMLP_QUANTIZER_W2), 0.0f) << "rank " << r;
    EXPECT_EQ(ranks[r].state, ranks[0].state) << "rank " << r;
  }
}

TEST(ShardingPlan, ChecksTheCommunicatorAndTheDivisibility) {
  InProcessGroup group(2);
  {
    ShardDesc d(8, 6);
    ASSERT_EQ(lnmlp_desc_set_sharding(d.d, 2, 1, 0), LNMLP_SUCCESS);
    EXPECT_EQ(d.create(), LNMLP_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(lnmlp_last_error()).find("lnmlp_desc_set_communicator"), std::string::npos);
    ASSERT_EQ(lnmlp_desc_set_communicator(d.d, group.comm(0)), LNMLP_SUCCESS);  // rank 0, not 1
    EXPECT_EQ(d.create(), LNMLP_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(lnmlp_last_error()).find("make them agree"), std::string::npos);
    ASSERT_EQ(lnmlp_desc_set_communicator(d.d, group.comm(1)), LNMLP_SUCCESS);
    EXPECT_EQ(d.create(), LNMLP_SUCCESS);
  }
  {
    ShardDesc d(8, 7);  // F odd
    lnmlp_desc_set_sharding(d.d, 2, 0, 0);
    lnmlp_desc_set_communicator(d.d, group.comm(0));
    EXPECT_EQ(d.create(), LNMLP_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(lnmlp_last_error()).find("ffn (7) must be divisible by group_size (2)"), std::string::npos);
  }
  {
    ShardDesc d(7, 8);  // T odd: fine without sequence parallelism, refused with it
    lnmlp_desc_set_sharding(d.d, 2, 0, 0);
    lnmlp_desc_set_communicator(d.d, group.comm(0));
    EXPECT_EQ(d.create(), LNMLP_SUCCESS);
    lnmlp_desc_set_sharding(d.d, 2, 0, 1);
    EXPECT_EQ(d.create(), LNMLP_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(lnmlp_last_error()).find("tokens (7"), std::string::npos);
  }
  {
    ShardDesc d(8, 8);  // a prepared count is a call's: at most T / P = 4 rows under sequence parallelism
    lnmlp_desc_set_sharding(d.d, 2, 0, 1);
    lnmlp_desc_set_communicator(d.d, group.comm(0));
    const int64_t five = 5, four = 4;
    ASSERT_EQ(lnmlp_desc_set_prepared_tokens(d.d, 1, &five), LNMLP_SUCCESS);
    EXPECT_EQ(d.create(), LNMLP_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(lnmlp_last_error())
                  .find("(5, lnmlp_desc_set_prepared_tokens) is more than a call of this "
                        "plan takes (4 rows per rank"),
              std::string::npos)
        << lnmlp_last_error();
    ASSERT_EQ(lnmlp_desc_set_prepared_tokens(d.d, 1, &four), LNMLP_SUCCESS);
    EXPECT_EQ(d.create(), LNMLP_SUCCESS);
  }
  {
    ShardDesc d(8, 8);  // the CUDA backend shards over NCCL only (tests/test_sharding_nccl.cpp)
    lnmlp_desc_set_sharding(d.d, 2, 0, 0);
    lnmlp_desc_set_communicator(d.d, group.comm(0));
    lnmlp_desc_set_backend(d.d, LNMLP_BACKEND_CUDA, 0);
    EXPECT_EQ(d.create(), LNMLP_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(lnmlp_last_error()).find("lnmlp_comm_create_nccl"), std::string::npos);
  }
  int32_t yes = 0;
  ASSERT_EQ(lnmlp_query_support(LNMLP_BACKEND_CPU, LNMLP_FEATURE_SHARDING, &yes), LNMLP_SUCCESS);
  EXPECT_EQ(yes, 1);
}

// ---- NVFP4: its global amaxes max-reduced over the group, its random streams the whole tensor's ----
//
// With F/P whole 16-element blocks every rank quantizes its columns of act_out and dh (and its
// tiles of W1, W2) as the unsharded plan does (the group's amaxes, the blocks' own scales), and
// draws the unsharded plan's random bits for them (fp8_recipe.h's nvfp4_rounding): what differs is
// the order of fp32 sums, which can move an intermediate across an E2M1 boundary in a few elements
// (kTolFp8Sharded's reasoning, its bound). Stochastic rounding on, the Hadamard transform on, and
// the 2-D weights on and off.

struct Nvfp4ShardCase {
  bool sp, gated, two_d;
  int32_t dtype, remat;
};

std::string nvfp4_shard_name(const Nvfp4ShardCase& c) {
  return std::string(c.gated ? "swiglu_" : "gelu_") + dtype_label(c.dtype) + (c.sp ? "_sp" : "_tp") +
         (c.two_d ? "_2d" : "_1d") + "_remat" + std::to_string(c.remat);
}

class ShardingNvfp4 : public ::testing::TestWithParam<Nvfp4ShardCase> {};

TEST_P(ShardingNvfp4, GroupEqualsUnshardedPlan) {
  const Nvfp4ShardCase& k = GetParam();
  constexpr int P = 2;
  // F/P = 48: three 16-blocks per shard and A half; T = 40: a partial Hadamard block of 8 tokens.
  const lnmlp_ref::Config cfg = lnmlp_ref::biased_config(
      40, 64, 96, swiglu_or_gelu(k.gated), k.gated ? lnmlp_ref::Norm::RmsNorm : lnmlp_ref::Norm::LayerNorm);
  const Problem pr = make_problem(cfg, k.dtype, hash_name(nvfp4_shard_name(k)));
  RunOptions o;
  o.remat = k.remat;
  o.recipe = LNMLP_RECIPE_NVFP4;
  o.nvfp4_disable_2d = !k.two_d;
  const RunResult single = run_library(pr, o);
  const std::vector<RunResult> ranks = run_group_in_process(pr, o, P, k.sp);
  std::string mismatch;
  const RunResult got = assemble(pr, ranks, k.sp, &mismatch);
  EXPECT_TRUE(mismatch.empty()) << mismatch;
  expect_group_matches(compare_group(pr, got, single, true, kTolFp8Sharded, kTolFp4), "nvfp4");
}

std::vector<Nvfp4ShardCase> nvfp4_shard_cases() {
  return {{false, false, true, LNMLP_DTYPE_F32, LNMLP_REMAT_SAVE_ALL},
          {true, true, true, LNMLP_DTYPE_BF16, LNMLP_REMAT_SAVE_FFN1},
          {false, true, false, LNMLP_DTYPE_BF16, LNMLP_REMAT_SAVE_STATS},
          {true, false, false, LNMLP_DTYPE_F32, LNMLP_REMAT_SAVE_ALL}};
}

INSTANTIATE_TEST_SUITE_P(Recipes, ShardingNvfp4, ::testing::ValuesIn(nvfp4_shard_cases()),
                         [](const ::testing::TestParamInfo<Nvfp4ShardCase>& i) { return nvfp4_shard_name(i.param); });

TEST(ShardingPlan, Nvfp4NeedsWholeBlocks) {
  auto create = [&](int64_t F, int P) {
    ShardDesc d(6, F);
    lnmlp_desc_set_recipe(d.d, LNMLP_RECIPE_NVFP4);
    lnmlp_desc_set_sharding(d.d, P, 0, 0);
    InProcessGroup g(P);
    lnmlp_desc_set_communicator(d.d, g.comm(0));
    return d.create();
  };
  EXPECT_EQ(create(40, 2), LNMLP_ERROR_INVALID_ARGUMENT);
  const std::string msg = lnmlp_last_error();
  EXPECT_NE(msg.find("NVFP4 shards only whole 16-element blocks"), std::string::npos) << msg;
  EXPECT_NE(msg.find("ffn / group_size = 40 / 2 = 20"), std::string::npos) << msg;
  EXPECT_EQ(create(64, 2), LNMLP_SUCCESS) << lnmlp_last_error();
  EXPECT_EQ(create(96, 3), LNMLP_SUCCESS) << lnmlp_last_error();
}

TEST(ShardingPlan, BlockWithoutPowerOf2ScalesNeedsWholeBlocks) {
  auto create = [&](int64_t F, int P, int32_t recipe, int32_t power_2_scale) {
    ShardDesc d(6, F);
    lnmlp_desc_set_recipe(d.d, recipe);
    lnmlp_desc_set_scaling_options(d.d, power_2_scale, 0.0f);
    lnmlp_desc_set_sharding(d.d, P, 0, 0);
    InProcessGroup g(P);
    lnmlp_desc_set_communicator(d.d, g.comm(0));
    return d.create();
  };
  // F / P = 120 or 80: partial blocks. Refused without power-of-2 scales, with a message saying what to change.
  for (int P : {2, 3}) {
    EXPECT_EQ(create(240, P, LNMLP_RECIPE_BLOCK, 0), LNMLP_ERROR_INVALID_ARGUMENT) << "P = " << P;
    const std::string msg = lnmlp_last_error();
    EXPECT_NE(msg.find("without power-of-2 scales shards only whole 128-element blocks"), std::string::npos) << msg;
    EXPECT_NE(msg.find("ffn / group_size = 240 / " + std::to_string(P)), std::string::npos) << msg;
    EXPECT_NE(msg.find("keep power-of-2 scales"), std::string::npos) << msg;
    // Power-of-2 scales (BLOCK's default, or asked for) and MXFP8 shard partial blocks.
    EXPECT_EQ(create(240, P, LNMLP_RECIPE_BLOCK, -1), LNMLP_SUCCESS) << lnmlp_last_error();
    EXPECT_EQ(create(240, P, LNMLP_RECIPE_BLOCK, 1), LNMLP_SUCCESS) << lnmlp_last_error();
    EXPECT_EQ(create(240, P, LNMLP_RECIPE_MXFP8, -1), LNMLP_SUCCESS) << lnmlp_last_error();
    // Whole blocks (F / P = 384 or 256) without power-of-2 scales are fine.
    EXPECT_EQ(create(768, P, LNMLP_RECIPE_BLOCK, 0), LNMLP_SUCCESS) << lnmlp_last_error();
  }
  // Unsharded, any F.
  ShardDesc d(6, 240);
  lnmlp_desc_set_recipe(d.d, LNMLP_RECIPE_BLOCK);
  lnmlp_desc_set_scaling_options(d.d, 0, 0.0f);
  EXPECT_EQ(d.create(), LNMLP_SUCCESS) << lnmlp_last_error();
}

TEST(ShardingPlan, CommunicatorArgumentsAndLifetime) {
  lnmlp_comm* c = nullptr;
  EXPECT_EQ(lnmlp_comm_create_callbacks(nullptr, &c), LNMLP_ERROR_NULL_POINTER);
  lnmlp_comm_callbacks t{};
  t.group_size = 2;
  t.rank = 0;
  EXPECT_EQ(lnmlp_comm_create_callbacks(&t, &c), LNMLP_ERROR_INVALID_ARGUMENT) << "no struct_size";
  EXPECT_NE(std::string(lnmlp_last_error()).find("struct_size"), std::string::npos) << lnmlp_last_error();
  t.struct_size = sizeof t + 8;  // a table from a newer header, which this library does not know
  EXPECT_EQ(lnmlp_comm_create_callbacks(&t, &c), LNMLP_ERROR_INVALID_ARGUMENT);
  t.struct_size = sizeof t;
  EXPECT_EQ(lnmlp_comm_create_callbacks(&t, &c), LNMLP_ERROR_NULL_POINTER);  // no functions
  t.rank = 2;
  EXPECT_EQ(lnmlp_comm_create_callbacks(&t, &c), LNMLP_ERROR_INVALID_ARGUMENT);
  t.rank = 0;
  t.group_size = int64_t{1} << 31;  // beyond int32_t
  EXPECT_EQ(lnmlp_comm_create_callbacks(&t, &c), LNMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(c, nullptr);
  EXPECT_EQ(lnmlp_comm_destroy(nullptr), LNMLP_SUCCESS);
  EXPECT_EQ(lnmlp_comm_create_mpi(nullptr, &c), LNMLP_ERROR_NULL_POINTER);
  // lnmlp_comm_create_nccl: tests/test_sharding_nccl.cpp.

  // A plan keeps its communicator: destroying the handle first is fine.
  InProcessGroup group(1);
  ShardDesc d(4, 4);
  ASSERT_EQ(lnmlp_desc_set_communicator(d.d, group.comm(0)), LNMLP_SUCCESS);
  EXPECT_EQ(d.create(), LNMLP_SUCCESS);
  int dummy = 0;
  EXPECT_EQ(lnmlp_desc_set_communicator(d.d, reinterpret_cast<lnmlp_comm*>(&dummy)), LNMLP_ERROR_INVALID_HANDLE);
}

}  // namespace
}  // namespace lnmlp_test
