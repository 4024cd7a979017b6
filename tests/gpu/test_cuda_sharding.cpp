// Sharded CUDA plans over NCCL (lnmlp_comm_create_nccl; docs/design.md, "Sharding", docs/sharding.md).
//
//  - One rank: a plan given a one-rank NCCL communicator (ncclCommInitAll over device 0) runs every
//    collective of the sharded data flow (GEMM2 in fp32 then the group sum, the gathers, the group
//    sums of dgamma/dbeta/db2 under sequence parallelism) and must equal the unsharded CUDA plan.
//  - Two ranks (when the machine has two GPUs): rank r on device r in its own thread, over
//    ncclCommInitAll's two communicators; the assembled group result against the unsharded plan,
//    replicated outputs bit-identical on both ranks, delayed-scaling state identical on both.
//  - The communicator checks that need a real NCCL communicator.
// Unquantized (f32, bf16) and FP8 (CURRENT, DELAYED per tensor; BLOCK emulated), with and without
// sequence parallelism. Everything skips without a GPU (or without NCCL in the module).
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cmath>
#include <thread>

#include "cuda_test_util.h"
#include "sharding_util.h"
#include "tolerances.h"

namespace lnmlp_gpu_test {
namespace {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

// Skips unless the CUDA backend can shard here (a GPU, and the module built with NCCL).
#define SKIP_WITHOUT_NCCL()                                                                    \
  do {                                                                                         \
    SKIP_WITHOUT_GPU();                                                                        \
    int32_t yes_ = 0;                                                                          \
    ASSERT_EQ(lnmlp_query_support(LNMLP_BACKEND_CUDA, LNMLP_FEATURE_SHARDING, &yes_), 0);      \
    if (yes_ != 1) GTEST_SKIP() << "the CUDA module was built without NCCL: sharding skipped"; \
  } while (0)

// ncclCommInitAll over devices 0 .. P-1, and an lnmlp communicator for each.
class NcclGroup {
 public:
  explicit NcclGroup(int P) : nccl_(static_cast<size_t>(P)), comms_(static_cast<size_t>(P), nullptr) {
    std::vector<int> devs(static_cast<size_t>(P));
    for (int r = 0; r < P; ++r) devs[static_cast<size_t>(r)] = r;
    const ncclResult_t st = ncclCommInitAll(nccl_.data(), P, devs.data());
    if (st != ncclSuccess) throw std::runtime_error(std::string("ncclCommInitAll: ") + ncclGetErrorString(st));
    for (size_t r = 0; r < nccl_.size(); ++r) LNMLP_TEST_CHECK(lnmlp_comm_create_nccl(&nccl_[r], &comms_[r]));
  }
  ~NcclGroup() {
    for (lnmlp_comm* c : comms_) lnmlp_comm_destroy(c);
    for (ncclComm_t c : nccl_) ncclCommDestroy(c);
  }
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;
  lnmlp_comm* comm(int r) const { return comms_[static_cast<size_t>(r)]; }
  const ncclComm_t* nccl(int r) const { return &nccl_[static_cast<size_t>(r)]; }

 private:
  std::vector<ncclComm_t> nccl_;
  std::vector<lnmlp_comm*> comms_;
};

// A one-rank non-blocking NCCL communicator (ncclConfig_t.blocking = 0) on device 0, whose calls
// may return ncclInProgress while NCCL is still enqueueing (lnmlp waits for the state to settle).
class NonBlockingNccl {
 public:
  NonBlockingNccl() {
    ncclUniqueId id;
    check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    CUDA_TEST_CHECK(cudaSetDevice(0));
    ncclResult_t st = ncclCommInitRankConfig(&nccl_, 1, id, 0, &config);
    while (st == ncclInProgress) check(ncclCommGetAsyncError(nccl_, &st), "ncclCommGetAsyncError");
    check(st, "ncclCommInitRankConfig (non-blocking)");
    LNMLP_TEST_CHECK(lnmlp_comm_create_nccl(&nccl_, &comm_));
  }
  ~NonBlockingNccl() {
    lnmlp_comm_destroy(comm_);
    if (nccl_ != nullptr) ncclCommDestroy(nccl_);
  }
  NonBlockingNccl(const NonBlockingNccl&) = delete;
  NonBlockingNccl& operator=(const NonBlockingNccl&) = delete;
  lnmlp_comm* comm() const { return comm_; }

 private:
  static void check(ncclResult_t st, const char* what) {
    if (st != ncclSuccess && st != ncclInProgress)
      throw std::runtime_error(std::string(what) + ": " + ncclGetErrorString(st));
  }
  ncclComm_t nccl_ = nullptr;
  lnmlp_comm* comm_ = nullptr;
};

struct Case {
  const char* name;
  lnmlp_ref::Norm norm;
  std::vector<int> acts;
  int32_t dtype;
  bool bias;
  int32_t recipe;
  int32_t remat;
};

std::vector<Case> cases() {
  const auto LN = lnmlp_ref::Norm::LayerNorm, RMS = lnmlp_ref::Norm::RmsNorm;
  const std::vector<int> gelu{LNMLP_ACT_GELU}, swiglu{LNMLP_ACT_SILU, LNMLP_ACT_LINEAR};
  return {
      {"f32_ln_gelu_bias_saveall", LN, gelu, LNMLP_DTYPE_F32, true, LNMLP_RECIPE_NONE, LNMLP_REMAT_SAVE_ALL},
      {"bf16_rms_swiglu_savestats", RMS, swiglu, LNMLP_DTYPE_BF16, false, LNMLP_RECIPE_NONE, LNMLP_REMAT_SAVE_STATS},
      {"bf16_ln_swiglu_bias_saveffn1", LN, swiglu, LNMLP_DTYPE_BF16, true, LNMLP_RECIPE_NONE, LNMLP_REMAT_SAVE_FFN1},
      {"fp8_current_ln_gelu_bias_saveall", LN, gelu, LNMLP_DTYPE_BF16, true, LNMLP_RECIPE_CURRENT,
       LNMLP_REMAT_SAVE_ALL},
      {"fp8_delayed_rms_swiglu_savestats", RMS, swiglu, LNMLP_DTYPE_BF16, false, LNMLP_RECIPE_DELAYED,
       LNMLP_REMAT_SAVE_STATS},
      {"fp8_block_ln_gelu_bias_saveall", LN, gelu, LNMLP_DTYPE_BF16, true, LNMLP_RECIPE_BLOCK, LNMLP_REMAT_SAVE_ALL},
  };
}

Problem problem_for(const Case& k) {
  const bool fp8 = k.recipe != LNMLP_RECIPE_NONE;
  // T/2 = 32: FP8 GEMM dimensions are multiples of 16; FP8's F/2 = 128: whole 128-blocks for BLOCK
  lnmlp_ref::Config cfg = lnmlp_ref::biased_config(64, 64, fp8 ? 256 : 96, k.acts, k.norm);
  cfg.has_bias1 = cfg.has_bias2 = k.bias;
  return make_problem(cfg, k.dtype, hash_name(k.name));
}

struct RankResult {
  RunResult r;
  std::vector<unsigned char> state;
};

// One rank's forward + backward (`steps` times) on device `device`, on a stream of its own; the
// outputs are the rank's shards (ShardGeometry).
RankResult run_rank(const Problem& shard, const ShardGeometry& g, const Case& k, int device, const PlanSharding& s,
                    int steps) {
  CUDA_TEST_CHECK(cudaSetDevice(device));
  PlanPtr p = plan_ptr(make_plan(shard, k.remat, LNMLP_BACKEND_CUDA, device, k.recipe, s));
  const int64_t saved_bytes = saved_bytes_of(p.get());
  const DeviceInputs in(shard);
  const DeviceOutputs out(shard, saved_bytes);  // sized for the group's shape: large enough
  cudaStream_t stream = nullptr;
  CUDA_TEST_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (int i = 0; i < steps; ++i) {
    LNMLP_TEST_CHECK(device_forward(p.get(), in, out, stream));
    LNMLP_TEST_CHECK(device_backward(p.get(), in, out, stream));
  }
  CUDA_TEST_CHECK(cudaStreamSynchronize(stream));
  CUDA_TEST_CHECK(cudaStreamDestroy(stream));
  const int32_t dt = shard.dtype;
  const size_t rows = g.rows(), H = g.H, AF = g.A * g.fl(), F = g.fl();
  RankResult rr;
  RunResult& r = rr.r;
  auto fetch = [&](Buffer& b, const DeviceBuffer& d, size_t n) {
    if (d.get() == nullptr) return;
    b = Buffer(dt, n);
    CUDA_TEST_CHECK(cudaMemcpy(b.data(), d.get(), b.bytes.size(), cudaMemcpyDeviceToHost));
  };
  fetch(r.y, out.y, rows * H);
  fetch(r.dx, out.dx, rows * H);
  fetch(r.dgamma, out.dgamma, H);
  fetch(r.dbeta, out.dbeta, H);
  fetch(r.dw1, out.dw1, H * AF);
  fetch(r.db1, out.db1, AF);
  fetch(r.dw2, out.dw2, F * H);
  fetch(r.db2, out.db2, H);
  r.dw1 = weight_in_out(r.dw1, H, AF, shard.weight_layout);  // as assemble() and the reference have them
  r.dw2 = weight_in_out(r.dw2, F, H, shard.weight_layout);
  int64_t state_bytes = 0;
  LNMLP_TEST_CHECK(lnmlp_plan_get_state_bytes(p.get(), &state_bytes));
  rr.state.resize(static_cast<size_t>(state_bytes));
  if (state_bytes > 0) LNMLP_TEST_CHECK(lnmlp_plan_export_state(p.get(), rr.state.data(), state_bytes));
  return rr;
}

// P ranks, rank r on device r in its own thread over `group`, each running its shard of pr.
std::vector<RankResult> run_ranks(const Problem& pr, const Case& k, const NcclGroup& group, int P, bool sp, int steps) {
  std::vector<RankResult> ranks(static_cast<size_t>(P));
  std::vector<std::string> errors(static_cast<size_t>(P));
  std::vector<std::thread> threads;
  for (int r = 0; r < P; ++r)
    threads.emplace_back([&, r] {
      try {
        ranks[static_cast<size_t>(r)] = run_rank(shard_problem(pr, P, r, sp), geometry(pr, P, r, sp), k, r,
                                                 {P, r, sp ? 1 : 0, group.comm(r)}, steps);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < P; ++r)
    if (!errors[static_cast<size_t>(r)].empty())
      throw std::runtime_error("rank " + std::to_string(r) + ": " + errors[static_cast<size_t>(r)]);
  return ranks;
}

// The unsharded CUDA plan on device 0 (P = 1, no communicator).
RankResult run_unsharded(const Problem& pr, const Case& k, int steps) {
  return run_rank(pr, geometry(pr, 1, 0, false), k, 0, PlanSharding{}, steps);
}

bool fp8_unsupported(const Case& k, std::string* why) {
  if (k.recipe == LNMLP_RECIPE_NONE) return false;
  // Per-tensor recipes need FP8 tensor cores (sm_89+): plan creation says so on older GPUs.
  lnmlp_desc* d = nullptr;
  lnmlp_desc_create(&d);
  lnmlp_desc_set_shape(d, 64, 64, 256);
  lnmlp_desc_set_dtype(d, LNMLP_DTYPE_BF16);
  lnmlp_desc_set_backend(d, LNMLP_BACKEND_CUDA, 0);
  lnmlp_desc_set_recipe(d, k.recipe);
  lnmlp_plan* p = nullptr;
  const int32_t st = lnmlp_plan_create(d, &p);
  if (st != LNMLP_SUCCESS) *why = lnmlp_last_error();
  lnmlp_plan_destroy(p);
  lnmlp_desc_destroy(d);
  return st == LNMLP_ERROR_NOT_SUPPORTED;
}

void compare(const Case& k, const RunResult& got, const RunResult& want, const char* what) {
  const Tolerance tol = k.recipe == LNMLP_RECIPE_NONE ? tolerance_for(k.dtype) : kTolFp8Sharded;
  const auto a = named(got), b = named(want);
  for (size_t i = 0; i < a.size(); ++i) {
    if (b[i].buf->empty()) continue;
    EXPECT_TRUE(within_tolerance(a[i].name, a[i].buf->to_doubles(), b[i].buf->to_doubles(), nullptr, tol)) << what;
  }
}

// A case with or without sequence parallelism: skipped where NCCL or the recipe cannot run.
class CudaSharding : public ::testing::TestWithParam<std::tuple<Case, bool>> {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_NCCL();
    std::string why;
    if (fp8_unsupported(k, &why)) GTEST_SKIP() << why;
  }
  const Case& k = std::get<0>(GetParam());
  const bool sp = std::get<1>(GetParam());
  const int steps = k.recipe == LNMLP_RECIPE_DELAYED ? 3 : 1;  // delayed: scales from the recorded history
};

TEST_P(CudaSharding, OneRankNcclEqualsUnshardedPlan) {
  const Problem pr = problem_for(k);
  const RankResult single = run_unsharded(pr, k, steps);
  NcclGroup group(1);
  const RankResult one = run_rank(pr, geometry(pr, 1, 0, sp), k, 0, {1, 0, sp ? 1 : 0, group.comm(0)}, steps);
  compare(k, one.r, single.r, "one-rank NCCL plan against the unsharded plan");
  // The amaxes are the unsharded plan's exactly (a one-rank maximum; GEMM1, dact and dn are the
  // same GEMMs), so the delayed-scaling state is too.
  EXPECT_EQ(one.state, single.state) << "the delayed-scaling state differs from the unsharded plan's";
}

TEST_P(CudaSharding, TwoRanksEqualUnshardedPlan) {
  if (device_count() < 2) GTEST_SKIP() << "one GPU: the two-rank NCCL group needs two";
  const Problem pr = problem_for(k);
  const RankResult single = run_unsharded(pr, k, steps);
  constexpr int P = 2;
  NcclGroup group(P);
  const std::vector<RankResult> ranks = run_ranks(pr, k, group, P, sp, steps);
  std::vector<RunResult> results;
  for (const auto& rr : ranks) results.push_back(rr.r);
  std::string mismatch;
  const RunResult got = assemble(pr, results, sp, &mismatch);
  EXPECT_TRUE(mismatch.empty()) << mismatch;
  compare(k, got, single.r, "two NCCL ranks against the unsharded plan");
  EXPECT_EQ(ranks[0].state, ranks[1].state) << "the delayed-scaling state differs between the ranks";
}

INSTANTIATE_TEST_SUITE_P(Nccl, CudaSharding, ::testing::Combine(::testing::ValuesIn(cases()), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<Case, bool>>& i) {
                           return std::string(std::get<0>(i.param).name) + (std::get<1>(i.param) ? "_sp" : "_tp");
                         });

// A plan over a non-blocking communicator: every collective (the gathers, the reduce-scatters,
// the sums and the amax maximum of delayed scaling, with and without sequence parallelism) goes
// through ncclInProgress's protocol and must give the unsharded plan's results.
TEST(CudaShardingNonBlocking, OneRankEqualsUnshardedPlan) {
  SKIP_WITHOUT_NCCL();
  const Case k{
      "nonblocking_delayed", lnmlp_ref::Norm::RmsNorm, {LNMLP_ACT_SILU, LNMLP_ACT_LINEAR}, LNMLP_DTYPE_BF16, true,
      LNMLP_RECIPE_DELAYED,  LNMLP_REMAT_SAVE_STATS};
  std::string why;
  if (fp8_unsupported(k, &why)) GTEST_SKIP() << why;
  const Problem pr = problem_for(k);
  const RankResult single = run_unsharded(pr, k, 3);
  NonBlockingNccl nb;
  for (bool sp : {false, true}) {
    const RankResult one = run_rank(pr, geometry(pr, 1, 0, sp), k, 0, {1, 0, sp ? 1 : 0, nb.comm()}, 3);
    compare(k, one.r, single.r, sp ? "non-blocking NCCL, sequence parallel" : "non-blocking NCCL");
    EXPECT_EQ(one.state, single.state);
  }
}

// A NaN in rank 1's W1 shard makes both ranks' W1 amax NaN (lnmlp max-reduces the amaxes' bits,
// NCCL's float maximum need not propagate a NaN).
TEST(CudaShardingFp8, ANaNAmaxOnOneRankReachesEveryRank) {
  SKIP_WITHOUT_NCCL();
  if (device_count() < 2) GTEST_SKIP() << "one GPU: the two-rank NCCL group needs two";
  const Problem pr = nan_in_last_shard_problem();
  const Case k{"nan_delayed", pr.cfg.norm, pr.cfg.acts, pr.dtype, false, LNMLP_RECIPE_DELAYED, LNMLP_REMAT_SAVE_ALL};
  std::string why;
  if (fp8_unsupported(k, &why)) GTEST_SKIP() << why;
  constexpr int P = 2;
  NcclGroup group(P);
  const std::vector<RankResult> ranks = run_ranks(pr, k, group, P, false, 1);
  for (int r = 0; r < P; ++r)
    EXPECT_TRUE(std::isnan(newest_amax(ranks[static_cast<size_t>(r)].state, LNMLP_QUANTIZER_W1))) << "rank " << r;
}

// ---- what needs a real NCCL communicator to check ----

TEST(CudaShardingPlan, CommunicatorChecks) {
  SKIP_WITHOUT_NCCL();
  NcclGroup group(1);
  auto create = [&](int32_t backend, int32_t P, int32_t rank) {
    lnmlp_desc* d = nullptr;
    lnmlp_desc_create(&d);
    lnmlp_desc_set_shape(d, 8, 16, 16);
    lnmlp_desc_set_backend(d, backend, 0);
    lnmlp_desc_set_sharding(d, P, rank, 0);
    lnmlp_desc_set_communicator(d, group.comm(0));
    lnmlp_plan* p = nullptr;
    const int32_t st = lnmlp_plan_create(d, &p);
    lnmlp_plan_destroy(p);
    lnmlp_desc_destroy(d);
    return st;
  };
  // A CPU plan refuses an NCCL communicator, whatever the group size.
  EXPECT_EQ(create(LNMLP_BACKEND_CPU, 1, 0), LNMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(lnmlp_last_error()).find("the CPU backend shards over an MPI or callback"), std::string::npos)
      << lnmlp_last_error();
  // Group size and rank must agree with the communicator's.
  EXPECT_EQ(create(LNMLP_BACKEND_CUDA, 2, 1), LNMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(lnmlp_last_error()).find("make them agree"), std::string::npos) << lnmlp_last_error();
  EXPECT_EQ(create(LNMLP_BACKEND_CUDA, 1, 0), LNMLP_SUCCESS) << lnmlp_last_error();
  // A NULL ncclComm_t behind a valid pointer.
  ncclComm_t null_comm = nullptr;
  lnmlp_comm* c = nullptr;
  EXPECT_EQ(lnmlp_comm_create_nccl(&null_comm, &c), LNMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(c, nullptr);
  // The plan keeps the communicator alive after the handle is destroyed.
  lnmlp_comm* own = nullptr;
  ASSERT_EQ(lnmlp_comm_create_nccl(group.nccl(0), &own), LNMLP_SUCCESS);
  lnmlp_desc* d = nullptr;
  lnmlp_desc_create(&d);
  lnmlp_desc_set_shape(d, 8, 16, 16);
  lnmlp_desc_set_backend(d, LNMLP_BACKEND_CUDA, 0);
  lnmlp_desc_set_communicator(d, own);
  lnmlp_comm_destroy(own);
  lnmlp_plan* p = nullptr;
  EXPECT_EQ(lnmlp_plan_create(d, &p), LNMLP_SUCCESS) << lnmlp_last_error();
  lnmlp_desc_destroy(d);
  lnmlp_plan_destroy(p);
}

TEST(CudaShardingPlan, CommunicatorOnAnotherDeviceIsRefused) {
  SKIP_WITHOUT_NCCL();
  if (device_count() < 2) GTEST_SKIP() << "needs two GPUs";
  NcclGroup group(2);
  lnmlp_desc* d = nullptr;
  lnmlp_desc_create(&d);
  lnmlp_desc_set_shape(d, 8, 16, 16);
  lnmlp_desc_set_backend(d, LNMLP_BACKEND_CUDA, 0);  // rank 1's communicator is on device 1
  lnmlp_desc_set_sharding(d, 2, 1, 0);
  lnmlp_desc_set_communicator(d, group.comm(1));
  lnmlp_plan* p = nullptr;
  EXPECT_EQ(lnmlp_plan_create(d, &p), LNMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(lnmlp_last_error()).find("is on CUDA device 1 but the plan is on device 0"), std::string::npos)
      << lnmlp_last_error();
  lnmlp_desc_destroy(d);
}

}  // namespace
}  // namespace lnmlp_gpu_test
