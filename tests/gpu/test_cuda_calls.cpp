// ABI 2's calls on the CUDA backend, against the CPU backend: fewer tokens than the plan's,
// gradient accumulation, weights reused across calls, no tokens, and delayed scaling's state in
// caller device memory. (Skips without a GPU; runs on the CPU against the CUDA emulation too.)
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "cuda_test_util.h"
#include "tolerances.h"

using namespace lnmlp_gpu_test;

namespace {

constexpr int64_t kMaxTokens = 64;

lnmlp_ref::Config config(int64_t tokens, bool gated) {
  return lnmlp_ref::biased_config(tokens, 64, 96, swiglu_or_gelu(gated));
}

// The emulation's counts of device allocations and GEMMs made (cuda_emulation::counts); zeros on a
// GPU, where only the emulation can count them.
struct EmulationCounts {
  long device_allocations = 0;
  long gemms_made = 0;
};
EmulationCounts emulation_counts() {
#ifdef LNMLP_CUDA_EMULATED_RUNTIME
  const cuda_emulation::Counts c = cuda_emulation::counts();
  return {c.device_allocations, c.gemms_made};
#else
  return {};
#endif
}

// One plan on either backend, and the calls the tests make on it: its tensors in the backend's
// memory (uploaded once), its outputs read back into RunResult's host buffers.
class Calls {
 public:
  Calls(const Problem& pr, int32_t backend, int32_t recipe, const PlanCalls& calls,
        const std::vector<int64_t>& prepared_tokens = {}, int32_t remat = LNMLP_REMAT_SAVE_ALL)
      : pr_(pr),
        cuda_(backend == LNMLP_BACKEND_CUDA),
        calls_(calls),
        plan_(plan_ptr(make_plan(pr, remat, backend, 0, recipe, PlanSharding{}, calls, prepared_tokens))) {
    LNMLP_TEST_CHECK(lnmlp_plan_get_saved_bytes(plan_.get(), &saved_bytes_));
    saved_ = place_bytes(static_cast<size_t>(saved_bytes_));
    grad_type_ = calls.grad_dtype < 0 ? pr.dtype : calls.grad_dtype;
  }
  lnmlp_plan* get() const { return plan_.get(); }

  // Backward from now on in two calls: lnmlp_plan_backward_data, then lnmlp_plan_backward_weights.
  void split_backward() { split_ = true; }

  // The saved buffer's sections apart from now on (LNMLP_CALL_SAVED_SECTIONS): each section the
  // plan saves in memory of its own, of the section's bytes at the plan's most tokens.
  void sections_apart() {
    sections_.assign(LNMLP_SAVED_COUNT, nullptr);
    for (int32_t s = 0; s < LNMLP_SAVED_COUNT; ++s) {
      int64_t offset = -1, rank = 0, dims[LNMLP_MAX_TENSOR_RANK] = {0, 0, 0};
      int32_t type = 0;
      LNMLP_TEST_CHECK(lnmlp_plan_get_saved_section(plan_.get(), s, LNMLP_TOKENS_MAX, &offset, &rank, dims, &type));
      if (offset < 0) continue;
      int64_t bytes = type == LNMLP_DTYPE_U8 ? 1 : dtype_size(type);
      for (int64_t i = 0; i < rank; ++i) bytes *= dims[i];
      sections_[static_cast<size_t>(s)] = place_bytes(static_cast<size_t>(bytes));
    }
  }

  // The parameter gradients' buffers start as `initial` (accumulating plans add into them).
  void set_gradients(const RunResult& initial) { grads_ = initial; }

  // Forward + backward of `pr`'s tokens (at most the plan's), with `flags` on both; `fp8_state`:
  // a state array in the backend's memory, or NULL.
  RunResult step(const Problem& pr, int32_t flags = LNMLP_CALL_DEFAULT, void* fp8_state = nullptr) {
    const int64_t t = pr.cfg.tokens;
    const size_t H = static_cast<size_t>(pr.cfg.hidden);
    RunResult r = grads_;
    r.y = Buffer(pr.dtype, static_cast<size_t>(t) * H);
    r.dx = Buffer(pr.dtype, static_cast<size_t>(t) * H);
    r.dgamma = Buffer(pr.dtype, H);
    r.dbeta = Buffer(pr.dtype, H);
    void* x = place(pr.bx);
    void* dy = place(pr.bdy);
    void *gamma = place(pr.bgamma), *beta = place(pr.bbeta), *w1 = place(pr.bw1), *b1 = place(pr.bb1),
         *w2 = place(pr.bw2), *b2 = place(pr.bb2);
    void *y = place(r.y), *dx = place(r.dx), *dgamma = place(r.dgamma), *dbeta = place(r.dbeta);
    void *dw1 = place(r.dw1), *db1 = place(r.db1), *dw2 = place(r.dw2), *db2 = place(r.db2);
    const EmulationCounts before = emulation_counts();
    void* saved = saved_;
    if (!sections_.empty()) {
      saved = sections_.data();
      flags |= LNMLP_CALL_SAVED_SECTIONS;
    }
    const int32_t f =
        lnmlp_plan_forward(plan_.get(), t, x, gamma, beta, w1, b1, w2, b2, y, saved, fp8_state, flags, nullptr);
    if (f != LNMLP_SUCCESS) throw std::runtime_error(std::string("forward: ") + lnmlp_last_error());
    if (!split_) {
      const int32_t b = lnmlp_plan_backward(plan_.get(), t, dy, x, gamma, beta, w1, b1, w2, saved, dx, dgamma, dbeta,
                                            dw1, db1, dw2, db2, fp8_state, flags, nullptr);
      if (b != LNMLP_SUCCESS) throw std::runtime_error(std::string("backward: ") + lnmlp_last_error());
    } else {
      int64_t bytes = 0;
      LNMLP_TEST_CHECK(lnmlp_plan_get_deferred_bytes(plan_.get(), t, &bytes));
      void* deferred = place_bytes(static_cast<size_t>(bytes));
      const int32_t b = lnmlp_plan_backward_data(plan_.get(), t, dy, x, gamma, beta, w1, b1, w2, saved, dx, dgamma,
                                                 dbeta, db1, db2, deferred, fp8_state, flags, nullptr);
      if (b != LNMLP_SUCCESS) throw std::runtime_error(std::string("backward data: ") + lnmlp_last_error());
      const int32_t w = lnmlp_plan_backward_weights(plan_.get(), t, dy, saved, deferred, dw1, dw2, flags, nullptr);
      if (w != LNMLP_SUCCESS) throw std::runtime_error(std::string("backward weights: ") + lnmlp_last_error());
    }
    if (cuda_) CUDA_TEST_CHECK(cudaDeviceSynchronize());
    const EmulationCounts after = emulation_counts();
    last_step_.device_allocations = after.device_allocations - before.device_allocations;
    last_step_.gemms_made = after.gemms_made - before.gemms_made;
    read_back(r.y, y);
    read_back(r.dx, dx);
    read_back(r.dgamma, dgamma);
    read_back(r.dbeta, dbeta);
    for (auto [buf, p] : {std::pair{&r.dw1, dw1}, {&r.db1, db1}, {&r.dw2, dw2}, {&r.db2, db2}}) read_back(*buf, p);
    if (calls_.norm_output != 0 && sections_.empty()) {
      // The saved buffer's norm-output section (lnmlp_plan_get_saved_section), read back.
      int64_t offset = -1, rank = 0, dims[LNMLP_MAX_TENSOR_RANK] = {0, 0, 0};
      int32_t type = 0;
      LNMLP_TEST_CHECK(
          lnmlp_plan_get_saved_section(plan_.get(), LNMLP_SAVED_NORM_OUTPUT, t, &offset, &rank, dims, &type));
      r.norm_output = Buffer(type, static_cast<size_t>(dims[0] * dims[1]));
      if (cuda_) {
        read_back(r.norm_output, static_cast<char*>(saved_) + offset);
      } else {
        std::memcpy(r.norm_output.data(), static_cast<char*>(saved_) + offset, r.norm_output.bytes.size());
      }
    }
    grads_.dw1 = r.dw1;
    grads_.db1 = r.db1;
    grads_.dw2 = r.dw2;
    grads_.db2 = r.db2;
    return r;
  }

  // What the emulated runtime did inside the last step's forward and backward (zeros elsewhere).
  EmulationCounts last_step() const { return last_step_; }

  // Fresh parameter-gradient buffers of the plan's gradient dtype, holding `v` everywhere.
  RunResult gradients(double v) const {
    const auto& c = pr_.cfg;
    const size_t H = static_cast<size_t>(c.hidden), AF = c.acts.size() * static_cast<size_t>(c.ffn);
    RunResult g;
    g.dw1 = Buffer::from(std::vector<double>(H * AF, v), grad_type_);
    g.db1 = Buffer::from(std::vector<double>(AF, v), grad_type_);
    g.dw2 = Buffer::from(std::vector<double>(static_cast<size_t>(c.ffn) * H, v), grad_type_);
    g.db2 = Buffer::from(std::vector<double>(H, v), grad_type_);
    return g;
  }

  // Memory of the backend's kind: a device copy of b (kept while the plan lives), or b itself.
  void* place(const Buffer& b) {
    if (b.empty()) return nullptr;
    if (!cuda_) return const_cast<void*>(b.data());
    device_.emplace_back(b);
    return device_.back().get();
  }
  void* place_bytes(size_t n) {
    if (n == 0) return nullptr;
    if (!cuda_) {
      host_.emplace_back(static_cast<int64_t>(n), 256, 0xFF);
      return host_.back().get();
    }
    device_.emplace_back(n);
    return device_.back().get();
  }

 private:
  void read_back(Buffer& b, void* p) const {
    if (cuda_ && p != nullptr) CUDA_TEST_CHECK(cudaMemcpy(b.data(), p, b.bytes.size(), cudaMemcpyDeviceToHost));
  }

  Problem pr_;
  bool cuda_;
  PlanCalls calls_;
  PlanPtr plan_;
  int64_t saved_bytes_ = 0;
  void* saved_ = nullptr;
  int32_t grad_type_ = LNMLP_DTYPE_F32;
  RunResult grads_;
  bool split_ = false;
  std::vector<void*> sections_;  // sections_apart(): the array of them, in the backend's memory
  EmulationCounts last_step_;
  std::vector<DeviceBuffer> device_;
  std::vector<AlignedMemory> host_;
};

void expect_close(const RunResult& got, const RunResult& want, const Tolerance& tol, const char* what) {
  const auto a = named(got), b = named(want);
  for (size_t i = 0; i < a.size(); ++i) {
    if (b[i].buf->empty()) continue;
    EXPECT_TRUE(within_tolerance(a[i].name, a[i].buf->to_doubles(), b[i].buf->to_doubles(), nullptr, tol)) << what;
  }
}

struct Case {
  const char* name;
  int32_t dtype;
  int32_t recipe;
  int64_t tokens;  // per-tensor FP8 GEMMs need multiples of 16
  bool gated;
};

const Case kCases[] = {
    {"bf16_swiglu", LNMLP_DTYPE_BF16, LNMLP_RECIPE_NONE, 37, true},
    {"f32_gelu", LNMLP_DTYPE_F32, LNMLP_RECIPE_NONE, 37, false},
    {"f16_gelu", LNMLP_DTYPE_F16, LNMLP_RECIPE_NONE, 1, false},
    {"bf16_current", LNMLP_DTYPE_BF16, LNMLP_RECIPE_CURRENT, 32, true},
    {"bf16_block", LNMLP_DTYPE_BF16, LNMLP_RECIPE_BLOCK, 48, false},
};

Tolerance tolerance(const Case& k) {
  return k.recipe == LNMLP_RECIPE_NONE ? gpu_vs_cpu_tolerance(k.dtype) : kTolFp8Backends;
}

class CudaCalls : public ::testing::TestWithParam<Case> {};

// The norm output (lnmlp_desc_set_norm_output) of a CUDA plan: the CPU backend's within the
// backends' tolerance, and under FP8 (which runs the norm again over the statistics) bit for bit
// the unquantized CUDA plan's.
TEST_P(CudaCalls, TheNormOutputMatchesTheCpuBackend) {
  SKIP_WITHOUT_GPU();
  const Case& k = GetParam();
  const Problem pr = make_problem(config(k.tokens, k.gated), k.dtype, 23);
  PlanCalls calls{kMaxTokens};
  calls.norm_output = 1;
  Calls cuda(pr, LNMLP_BACKEND_CUDA, k.recipe, calls), cpu(pr, LNMLP_BACKEND_CPU, k.recipe, calls);
  Calls plain(pr, LNMLP_BACKEND_CUDA, LNMLP_RECIPE_NONE, calls);
  for (Calls* c : {&cuda, &cpu, &plain}) c->set_gradients(c->gradients(0.0));
  const RunResult got = cuda.step(pr), want = cpu.step(pr), unquantized = plain.step(pr);
  ASSERT_EQ(got.norm_output.size(), static_cast<size_t>(k.tokens * pr.cfg.hidden));
  EXPECT_TRUE(within_tolerance("norm output", got.norm_output.to_doubles(), want.norm_output.to_doubles(), nullptr,
                               gpu_vs_cpu_tolerance(k.dtype)));
  EXPECT_TRUE(same_bits("norm output", got.norm_output, unquantized.norm_output));
}

// A call with fewer tokens than the CUDA plan's computes what the CPU backend computes for them.
TEST_P(CudaCalls, FewerTokensThanThePlansMatchTheCpuBackend) {
  SKIP_WITHOUT_GPU();
  const Case& k = GetParam();
  const Problem pr = make_problem(config(k.tokens, k.gated), k.dtype, 21);
  Calls cuda(pr, LNMLP_BACKEND_CUDA, k.recipe, PlanCalls{kMaxTokens});
  Calls cpu(pr, LNMLP_BACKEND_CPU, k.recipe, PlanCalls{});
  cuda.set_gradients(cuda.gradients(0.0));
  cpu.set_gradients(cpu.gradients(0.0));
  expect_close(cuda.step(pr), cpu.step(pr), tolerance(k), "CUDA (64-token plan) against CPU");
}

// Micro-batches of different sizes accumulate into fp32 gradients as on the CPU backend.
TEST_P(CudaCalls, GradientAccumulationMatchesTheCpuBackend) {
  SKIP_WITHOUT_GPU();
  const Case& k = GetParam();
  const PlanCalls calls{kMaxTokens, 1, LNMLP_DTYPE_F32};
  const Problem first = make_problem(config(k.tokens, k.gated), k.dtype, 31);
  Calls cuda(first, LNMLP_BACKEND_CUDA, k.recipe, calls), cpu(first, LNMLP_BACKEND_CPU, k.recipe, calls);
  cuda.set_gradients(cuda.gradients(0.25));
  cpu.set_gradients(cpu.gradients(0.25));
  RunResult got, want;
  for (int64_t t : {k.tokens, k.recipe == LNMLP_RECIPE_NONE ? int64_t{5} : int64_t{16}}) {
    const Problem mb = with_parameters(make_problem(config(t, k.gated), k.dtype, 40 + static_cast<uint64_t>(t)), first);
    got = cuda.step(mb);
    want = cpu.step(mb);
  }
  expect_close(got, want, tolerance(k), "accumulated, CUDA against CPU");
}

// Reused weight copies give the bits of new ones; a flag over changed weights proves they are used.
TEST_P(CudaCalls, ReusedWeightsGiveTheBitsOfNewOnes) {
  SKIP_WITHOUT_GPU();
  const Case& k = GetParam();
  const Problem pr = make_problem(config(k.tokens, k.gated), k.dtype, 51);
  Calls fresh(pr, LNMLP_BACKEND_CUDA, k.recipe, PlanCalls{kMaxTokens});
  Calls reusing(pr, LNMLP_BACKEND_CUDA, k.recipe, PlanCalls{kMaxTokens});
  fresh.set_gradients(fresh.gradients(0.0));
  reusing.set_gradients(reusing.gradients(0.0));
  RunResult first;
  for (int s = 0; s < 3; ++s) {
    const RunResult a = fresh.step(pr);
    const RunResult b = reusing.step(pr, s == 0 ? LNMLP_CALL_DEFAULT : LNMLP_CALL_WEIGHTS_UNCHANGED);
    EXPECT_TRUE(same_outputs(b, a)) << "step " << s;
    first = b;
  }
  if (k.recipe == LNMLP_RECIPE_NONE) return;  // the GEMMs read the weights themselves
  Problem changed = pr;
  std::vector<double> w1 = pr.bw1.to_doubles();
  for (double& v : w1) v *= 0.5;
  changed.bw1 = Buffer::from(w1, pr.dtype);
  EXPECT_EQ(reusing.step(changed, LNMLP_CALL_WEIGHTS_UNCHANGED).y.bytes, first.y.bytes)
      << "the flagged call did not use the kept copies";
}

// Backward in two calls (TransformerEngine's delay_wgrad_compute) gives one call's bits, under
// every remat policy and over two steps (delayed scaling, run beside current scaling: its state
// moving on), and the CPU backend's two calls within the backends' tolerance.
TEST_P(CudaCalls, BackwardInTwoCallsGivesTheBitsOfOne) {
  SKIP_WITHOUT_GPU();
  const Case& k = GetParam();
  const Problem pr = make_problem(config(k.tokens, k.gated), k.dtype, 71);
  std::vector<int32_t> recipes{k.recipe};
  if (k.recipe == LNMLP_RECIPE_CURRENT) recipes.push_back(LNMLP_RECIPE_DELAYED);
  for (const int32_t recipe : recipes)
    for (const int32_t remat : {LNMLP_REMAT_SAVE_ALL, LNMLP_REMAT_SAVE_FFN1, LNMLP_REMAT_SAVE_STATS}) {
      SCOPED_TRACE("recipe " + std::to_string(recipe) + ", remat " + std::to_string(remat));
      Calls one(pr, LNMLP_BACKEND_CUDA, recipe, PlanCalls{kMaxTokens}, {}, remat);
      Calls two(pr, LNMLP_BACKEND_CUDA, recipe, PlanCalls{kMaxTokens}, {}, remat);
      Calls cpu(pr, LNMLP_BACKEND_CPU, recipe, PlanCalls{}, {}, remat);
      two.split_backward();
      cpu.split_backward();
      for (Calls* c : {&one, &two, &cpu}) c->set_gradients(c->gradients(0.0));
      for (int s = 0; s < 2; ++s) {
        const RunResult a = one.step(pr), b = two.step(pr);
        const auto na = named(a), nb = named(b);
        for (size_t i = 0; i < na.size(); ++i)
          EXPECT_TRUE(same_bits(na[i].name, *nb[i].buf, *na[i].buf)) << "step " << s;
        expect_close(b, cpu.step(pr), tolerance(k), "two calls, CUDA against CPU");
      }
    }
}

// The saved buffer's sections apart (LNMLP_CALL_SAVED_SECTIONS) give the one buffer's bits, under
// every remat policy, over two steps, with backward whole (and, recomputing GEMM1, in two calls).
TEST_P(CudaCalls, SectionsApartGiveTheBitsOfOneBuffer) {
  SKIP_WITHOUT_GPU();
  const Case& k = GetParam();
  const Problem pr = make_problem(config(k.tokens, k.gated), k.dtype, 73);
  const std::pair<int32_t, bool> runs[] = {
      {LNMLP_REMAT_SAVE_ALL, false}, {LNMLP_REMAT_SAVE_FFN1, false}, {LNMLP_REMAT_SAVE_STATS, true}};
  for (const auto& [remat, split] : runs) {
    SCOPED_TRACE("remat " + std::to_string(remat) + (split ? ", backward in two calls" : ""));
    Calls one(pr, LNMLP_BACKEND_CUDA, k.recipe, PlanCalls{kMaxTokens}, {}, remat);
    Calls apart(pr, LNMLP_BACKEND_CUDA, k.recipe, PlanCalls{kMaxTokens}, {}, remat);
    apart.sections_apart();
    for (Calls* c : {&one, &apart}) {
      c->set_gradients(c->gradients(0.0));
      if (split) c->split_backward();
    }
    for (int s = 0; s < 2; ++s) {
      const RunResult a = one.step(pr), b = apart.step(pr);
      EXPECT_TRUE(same_outputs(b, a)) << "step " << s;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, CudaCalls, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

// No tokens: backward's parameter gradients are zeros (written on the stream).
TEST(CudaCallsEdges, NoTokens) {
  SKIP_WITHOUT_GPU();
  const Problem pr = make_problem(config(16, true), LNMLP_DTYPE_BF16, 61);
  Calls cuda(pr, LNMLP_BACKEND_CUDA, LNMLP_RECIPE_CURRENT, PlanCalls{kMaxTokens});
  cuda.set_gradients(cuda.gradients(3.0));
  const RunResult r = cuda.step(with_parameters(make_problem(config(0, true), LNMLP_DTYPE_BF16, 61), pr));
  for (const Buffer* b : {&r.dgamma, &r.dbeta, &r.dw1, &r.db1, &r.dw2, &r.db2})
    for (unsigned char c : b->bytes) ASSERT_EQ(c, 0) << "a parameter gradient of a call with no tokens is not zero";
}

// FP8 tensor cores need multiples of 16 tokens: another count is refused, changing nothing, and a
// plan asked to prepare one is not made.
TEST(CudaCallsEdges, PerTensorFp8NeedsMultiplesOf16Tokens) {
  SKIP_WITHOUT_GPU();
  const Problem pr = make_problem(config(33, false), LNMLP_DTYPE_BF16, 71);
  Calls cuda(pr, LNMLP_BACKEND_CUDA, LNMLP_RECIPE_CURRENT, PlanCalls{kMaxTokens});
  cuda.set_gradients(cuda.gradients(0.0));
  try {
    cuda.step(pr);
    FAIL() << "33 tokens were accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of 16"), std::string::npos) << e.what();
  }
  try {
    make_plan(pr, LNMLP_REMAT_SAVE_ALL, LNMLP_BACKEND_CUDA, 0, LNMLP_RECIPE_CURRENT, PlanSharding{},
              PlanCalls{kMaxTokens}, {16, 33});
    FAIL() << "a plan preparing 33 tokens was made";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("a prepared token count (lnmlp_desc_set_prepared_tokens) is 33"),
              std::string::npos)
        << e.what();
  }
}

// NVFP4 on FP4 tensor cores (sm_100 or newer; in the emulation LNMLP_EMULATION_SM=100) needs
// multiples of 32 tokens: 48 is refused, changing nothing, and 32 then computes what the CPU
// backend computes. Skips on a GPU without FP4 GEMMs, where NVFP4 is emulated and takes any count.
TEST(CudaCallsEdges, NativeNvfp4NeedsMultiplesOf32Tokens) {
  SKIP_WITHOUT_GPU();
  int32_t support = -1;
  ASSERT_EQ(lnmlp_query_support(LNMLP_BACKEND_CUDA, LNMLP_FEATURE_RECIPE_NVFP4, &support), LNMLP_SUCCESS);
  if (support != LNMLP_SUPPORTED) GTEST_SKIP() << "no FP4 GEMMs on this GPU: NVFP4 is emulated";
  const Problem pr = make_problem(config(48, true), LNMLP_DTYPE_BF16, 73);
  Calls cuda(pr, LNMLP_BACKEND_CUDA, LNMLP_RECIPE_NVFP4, PlanCalls{kMaxTokens});
  cuda.set_gradients(cuda.gradients(0.0));
  try {
    cuda.step(pr);
    FAIL() << "48 tokens were accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("FP4 tensor cores, which need a multiple of 32"), std::string::npos)
        << e.what();
  }
  const Problem pr32 = make_problem(config(32, true), LNMLP_DTYPE_BF16, 73);
  Calls cpu(pr32, LNMLP_BACKEND_CPU, LNMLP_RECIPE_NVFP4, PlanCalls{});
  cpu.set_gradients(cpu.gradients(0.0));
  expect_close(cuda.step(pr32), cpu.step(pr32), kTolFp4Backends, "CUDA (native NVFP4) against CPU at 32 tokens");
}

// A token count whose GEMMs would need more fp32 staging than the plan's own GEMMs (a result type
// or bias epilogue cuBLASLt refuses at that count only) is refused at the call, before anything
// runs, and the plan's own count still runs right afterwards; a plan that prepared the count at
// creation sized its staging for it and runs it. cuBLASLt's support depends on types
// and epilogues, not on sizes, so only the emulation can force this
// (LNMLP_EMULATION_NO_FUSED_OUTPUT_BELOW_M); elsewhere the test skips.
TEST(CudaCallsEdges, ACountNeedingMoreStagingThanThePlanHoldsIsRefused) {
  SKIP_WITHOUT_GPU();
  const char* below = std::getenv("LNMLP_EMULATION_NO_FUSED_OUTPUT_BELOW_M");
  constexpr int64_t kSmall = 16;
  if (below == nullptr || std::atoll(below) <= kSmall || std::atoll(below) > kMaxTokens)
    GTEST_SKIP() << "needs the emulation's LNMLP_EMULATION_NO_FUSED_OUTPUT_BELOW_M in (" << kSmall << ", " << kMaxTokens
                 << "]";
  const Problem full = make_problem(config(kMaxTokens, false), LNMLP_DTYPE_BF16, 91);
  Calls cuda(full, LNMLP_BACKEND_CUDA, LNMLP_RECIPE_NONE, PlanCalls{kMaxTokens});
  Calls cpu(full, LNMLP_BACKEND_CPU, LNMLP_RECIPE_NONE, PlanCalls{});
  cuda.set_gradients(cuda.gradients(0.0));
  cpu.set_gradients(cpu.gradients(0.0));
  try {
    cuda.step(with_parameters(make_problem(config(kSmall, false), LNMLP_DTYPE_BF16, 92), full));
    FAIL() << kSmall << " tokens were accepted without the staging their GEMMs need";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("fp32 staging"), std::string::npos) << e.what();
  }
  expect_close(cuda.step(full), cpu.step(full), gpu_vs_cpu_tolerance(LNMLP_DTYPE_BF16), "the plan's count after");
  // Prepared at plan creation, the count's staging is part of the plan's: the call runs.
  const Problem small = with_parameters(make_problem(config(kSmall, false), LNMLP_DTYPE_BF16, 92), full);
  Calls cuda_prepared(full, LNMLP_BACKEND_CUDA, LNMLP_RECIPE_NONE, PlanCalls{kMaxTokens}, {kSmall});
  Calls cpu_small(small, LNMLP_BACKEND_CPU, LNMLP_RECIPE_NONE, PlanCalls{});
  cuda_prepared.set_gradients(cuda_prepared.gradients(0.0));
  cpu_small.set_gradients(cpu_small.gradients(0.0));
  expect_close(cuda_prepared.step(small), cpu_small.step(small), gpu_vs_cpu_tolerance(LNMLP_DTYPE_BF16),
               "a prepared count that needs more staging");
}

// What a call allocates (lnmlp_desc_set_prepared_tokens): with the plan's count or a prepared one
// a CUDA call makes no GEMM (on a GPU: no cuBLASLt descriptor, layout or algorithm query, which
// allocate host memory) and allocates no device memory; another count makes its GEMMs in its
// first call, and still allocates no device memory (a count whose GEMMs would need more is
// refused instead: the test above). Unquantized, per-tensor and block-scaled plans; the counts
// are the emulation's (cudaMalloc calls and GEMM constructions), so elsewhere the test skips.
TEST(CudaCallsEdges, APreparedCountMakesNothingInACall) {
  SKIP_WITHOUT_GPU();
#ifndef LNMLP_CUDA_EMULATED_RUNTIME
  GTEST_SKIP() << "counts the CUDA emulation's cudaMalloc calls and GEMM constructions";
#endif
  constexpr int64_t kPrepared = 32, kNew = 48;  // multiples of 16, as per-tensor FP8 GEMMs need
  for (int32_t recipe : {LNMLP_RECIPE_NONE, LNMLP_RECIPE_CURRENT, LNMLP_RECIPE_BLOCK}) {
    SCOPED_TRACE("recipe " + std::to_string(recipe));
    const Problem full = make_problem(config(kMaxTokens, true), LNMLP_DTYPE_BF16, 95);
    // Plan creation alone is where both happen (the counters count).
    const EmulationCounts before = emulation_counts();
    const PlanPtr created = plan_ptr(make_plan(full, LNMLP_REMAT_SAVE_ALL, LNMLP_BACKEND_CUDA, 0, recipe,
                                               PlanSharding{}, PlanCalls{kMaxTokens}, {kPrepared}));
    EXPECT_GT(emulation_counts().device_allocations, before.device_allocations);
    EXPECT_GT(emulation_counts().gemms_made, before.gemms_made);
    Calls cuda(full, LNMLP_BACKEND_CUDA, recipe, PlanCalls{kMaxTokens}, {kPrepared});
    cuda.set_gradients(cuda.gradients(0.0));
    // (tokens, whether the call makes GEMMs): the new count only in its first call.
    for (auto [tokens, makes] : {std::pair{kMaxTokens, false}, {kPrepared, false}, {kNew, true}, {kNew, false}}) {
      SCOPED_TRACE("a call with " + std::to_string(tokens) + " tokens");
      cuda.step(with_parameters(make_problem(config(tokens, true), LNMLP_DTYPE_BF16, 96), full));
      EXPECT_EQ(cuda.last_step().device_allocations, 0);
      if (makes) EXPECT_GT(cuda.last_step().gemms_made, 0) << "a count neither the plan's nor prepared makes its GEMMs";
      else EXPECT_EQ(cuda.last_step().gemms_made, 0);
    }
  }
}

// A kernel that faults while it runs is named by the call that launched it under
// LNMLP_CUDA_SYNC_CHECK (every launch waits for its stream); without it the fault surfaces later,
// at the first wait for the device, which cannot say which kernel it was. Only the emulation can
// fault a kernel on purpose (LNMLP_EMULATION_FAULT_IN; a real fault poisons the process), so
// elsewhere the test skips.
TEST(CudaCallsEdges, AKernelsFaultIsNamedUnderTheSyncCheck) {
  SKIP_WITHOUT_GPU();
  const char* kernel = std::getenv("LNMLP_EMULATION_FAULT_IN");
  if (kernel == nullptr) GTEST_SKIP() << "needs the emulation's LNMLP_EMULATION_FAULT_IN";
  const char* sync = std::getenv("LNMLP_CUDA_SYNC_CHECK");
  const bool sync_check = sync != nullptr && *sync != '\0' && std::string(sync) != "0";
  const Problem pr = make_problem(config(kMaxTokens, false), LNMLP_DTYPE_BF16, 93);
  Calls cuda(pr, LNMLP_BACKEND_CUDA, LNMLP_RECIPE_NONE, PlanCalls{kMaxTokens});
  cuda.set_gradients(cuda.gradients(0.0));
  try {
    cuda.step(pr);
    FAIL() << "a step in which " << kernel << " faulted succeeded";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("illegal memory access"), std::string::npos) << what;
    if (sync_check) {
      EXPECT_NE(what.find(std::string(kernel) + " failed while running: cudaErrorIllegalAddress"), std::string::npos)
          << what;
    } else {
      EXPECT_EQ(what.find(kernel), std::string::npos) << "reported late, yet naming the kernel: " << what;
    }
  }
}

// A stream of another device is refused at the call, naming both devices, before anything is
// enqueued (the output is untouched), not by a late "invalid resource handle"; the plan's own
// device's streams still run. Needs two devices: a machine with two GPUs, or the emulation's
// LNMLP_EMULATION_DEVICES=2; elsewhere the test skips.
TEST(CudaCallsEdges, AStreamOfAnotherDeviceIsRefused) {
  SKIP_WITHOUT_GPU();
  int devices = 0;
  CUDA_TEST_CHECK(cudaGetDeviceCount(&devices));
  if (devices < 2) GTEST_SKIP() << "needs two CUDA devices (the emulation's LNMLP_EMULATION_DEVICES=2)";
  cudaStream_t other = nullptr, own = nullptr;
  CUDA_TEST_CHECK(cudaSetDevice(1));
  CUDA_TEST_CHECK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  CUDA_TEST_CHECK(cudaSetDevice(0));
  CUDA_TEST_CHECK(cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking));
  const Problem pr = make_problem(config(kMaxTokens, false), LNMLP_DTYPE_BF16, 94);
  PlanPtr plan = plan_ptr(make_plan(pr, LNMLP_REMAT_SAVE_ALL, LNMLP_BACKEND_CUDA));
  int64_t saved = 0;
  LNMLP_TEST_CHECK(lnmlp_plan_get_saved_bytes(plan.get(), &saved));
  const DeviceInputs in(pr);
  const DeviceOutputs out(pr, saved);
  EXPECT_EQ(device_forward(plan.get(), in, out, other), LNMLP_ERROR_INVALID_ARGUMENT);
  const std::string why = lnmlp_last_error();
  EXPECT_NE(why.find("stream belongs to CUDA device 1, but this plan runs on device 0"), std::string::npos) << why;
  for (unsigned char c : out.y.to_host()) ASSERT_EQ(c, 0xFF) << "a refused call wrote y";
  EXPECT_EQ(device_forward(plan.get(), in, out, own), LNMLP_SUCCESS) << lnmlp_last_error();
  CUDA_TEST_CHECK(cudaStreamSynchronize(own));
  CUDA_TEST_CHECK(cudaStreamDestroy(own));
  CUDA_TEST_CHECK(cudaStreamDestroy(other));
}

// LNMLP_GEMM_MATH_TF32: an fp32 plan's GEMMs read their inputs as TF32, so the results differ from
// the exact plan's bits and stay within TF32's bound of the CPU backend, which ignores the flag
// (its bits are the exact plan's).
TEST(CudaCallsEdges, Tf32GemmsAreWithinTf32OfTheCpuBackend) {
  SKIP_WITHOUT_GPU();
  const Problem pr = make_problem(config(kMaxTokens, true), LNMLP_DTYPE_F32, 95);
  const PlanCalls exact{kMaxTokens}, tf32{kMaxTokens, 0, -1, LNMLP_GEMM_MATH_TF32};
  Calls cuda_exact(pr, LNMLP_BACKEND_CUDA, LNMLP_RECIPE_NONE, exact),
      cuda_tf32(pr, LNMLP_BACKEND_CUDA, LNMLP_RECIPE_NONE, tf32);
  Calls cpu_exact(pr, LNMLP_BACKEND_CPU, LNMLP_RECIPE_NONE, exact),
      cpu_tf32(pr, LNMLP_BACKEND_CPU, LNMLP_RECIPE_NONE, tf32);
  for (Calls* c : {&cuda_exact, &cuda_tf32, &cpu_exact, &cpu_tf32}) c->set_gradients(c->gradients(0.0));
  const RunResult want = cpu_exact.step(pr), rounded = cuda_tf32.step(pr), plain = cuda_exact.step(pr);
  EXPECT_FALSE(same_bits("y", rounded.y, plain.y)) << "the TF32 plan computed the exact plan's y";
  expect_close(rounded, want, kTolTf32, "TF32 against the CPU backend");
  const RunResult cpu_allowed = cpu_tf32.step(pr);
  const auto a = named(cpu_allowed), b = named(want);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(same_bits(a[i].name, *a[i].buf, *b[i].buf)) << "CPU, TF32 allowed";
}

// LNMLP_GEMM_MATH_FP8_FAST_ACCUMULATION: a per-tensor FP8 plan's forward GEMMs accumulate in the
// tensor cores' precision; the results stay within the FP8 backends' bound of the CPU backend.
// (The emulation computes the fast mode exactly: which GEMMs get it is CudaHost's test.)
TEST(CudaCallsEdges, FastFp8AccumulationStaysWithinTheFp8Bound) {
  SKIP_WITHOUT_GPU();
  const Problem pr = make_problem(config(kMaxTokens, true), LNMLP_DTYPE_BF16, 96);
  const PlanCalls fast{kMaxTokens, 0, -1, LNMLP_GEMM_MATH_FP8_FAST_ACCUMULATION};
  Calls cuda(pr, LNMLP_BACKEND_CUDA, LNMLP_RECIPE_CURRENT, fast);
  Calls cpu(pr, LNMLP_BACKEND_CPU, LNMLP_RECIPE_CURRENT, PlanCalls{kMaxTokens});
  cuda.set_gradients(cuda.gradients(0.0));
  cpu.set_gradients(cpu.gradients(0.0));
  expect_close(cuda.step(pr), cpu.step(pr), kTolFp8Backends, "fast FP8 accumulation against the CPU backend");
}

// Delayed scaling's state in caller device memory, per call: the bits of the plan's own state.
TEST(CudaCallsEdges, CallerOwnedDeviceStateMatchesThePlansOwn) {
  SKIP_WITHOUT_GPU();
  const Problem pr = make_problem(config(32, true), LNMLP_DTYPE_BF16, 81);
  Calls own(pr, LNMLP_BACKEND_CUDA, LNMLP_RECIPE_DELAYED, PlanCalls{kMaxTokens});
  Calls caller(pr, LNMLP_BACKEND_CUDA, LNMLP_RECIPE_DELAYED, PlanCalls{kMaxTokens});
  own.set_gradients(own.gradients(0.0));
  caller.set_gradients(caller.gradients(0.0));
  int64_t length = 0;
  LNMLP_TEST_CHECK(lnmlp_plan_get_amax_history_length(caller.get(), &length));
  std::vector<float> fresh(static_cast<size_t>(LNMLP_QUANTIZER_COUNT * (1 + length)), 0.0f);
  for (int q = 0; q < LNMLP_QUANTIZER_COUNT; ++q) fresh[static_cast<size_t>(q * (1 + length))] = 1.0f;
  DeviceBuffer state(fresh.data(), fresh.size() * sizeof(float));
  for (int s = 0; s < 3; ++s) {
    const RunResult a = own.step(pr);
    const RunResult b = caller.step(pr, LNMLP_CALL_DEFAULT, state.get());
    EXPECT_TRUE(same_outputs(b, a)) << "step " << s;
  }
  // The caller's array, attached, exports as the plan's own state does.
  LNMLP_TEST_CHECK(lnmlp_plan_attach_fp8_state(caller.get(), state.get()));
  int64_t bytes = 0;
  LNMLP_TEST_CHECK(lnmlp_plan_get_state_bytes(own.get(), &bytes));
  std::vector<unsigned char> a(static_cast<size_t>(bytes)), b(static_cast<size_t>(bytes));
  LNMLP_TEST_CHECK(lnmlp_plan_export_state(own.get(), a.data(), bytes));
  LNMLP_TEST_CHECK(lnmlp_plan_export_state(caller.get(), b.data(), bytes));
  EXPECT_EQ(a, b);
}

}  // namespace
