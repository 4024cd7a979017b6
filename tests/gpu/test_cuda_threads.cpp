// Threads on the CUDA backend, as tests/test_api.cpp's Threads tests on the CPU: distinct plans on
// four threads at once give each plan's single-threaded bits; one plan called from two threads
// either runs a whole call or refuses it with LNMLP_ERROR_PLAN_BUSY, changing nothing (a CUDA
// plan's GEMM descriptors, pass state and workspace are one call's at a time); a plan destroyed
// while another thread runs it is refused until that call returns. (Skips without a GPU; runs on
// the CPU against the CUDA emulation too.)
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "cuda_test_util.h"

using namespace lnmlp_gpu_test;

namespace {

constexpr int64_t kTokens = 64;

Problem problem(int32_t dtype, bool gated, bool rmsnorm, uint64_t seed) {
  const auto norm = rmsnorm ? lnmlp_ref::Norm::RmsNorm : lnmlp_ref::Norm::LayerNorm;
  return make_problem(lnmlp_ref::biased_config(kTokens, 64, 96, swiglu_or_gelu(gated), norm), dtype, seed);
}

// A non-blocking stream of its own, as a framework's.
class Stream {
 public:
  Stream() { CUDA_TEST_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(s_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

int64_t saved_bytes(lnmlp_plan* p) {
  int64_t n = 0;
  LNMLP_TEST_CHECK(lnmlp_plan_get_saved_bytes(p, &n));
  return n;
}

// Forward + backward of `pr` on plan p, on `stream`, read back.
RunResult step(lnmlp_plan* p, const Problem& pr, const Stream& stream) {
  const DeviceInputs in(pr);
  const DeviceOutputs out(pr, saved_bytes(p));
  LNMLP_TEST_CHECK(device_forward(p, in, out, stream.get()));
  LNMLP_TEST_CHECK(device_backward(p, in, out, stream.get()));
  CUDA_TEST_CHECK(cudaStreamSynchronize(stream.get()));
  return to_host(pr, out, true);
}

bool same(const RunResult& a, const RunResult& b) {
  const auto na = named(a), nb = named(b);
  for (size_t i = 0; i < na.size(); ++i)
    if (!same_bits(na[i].name, *na[i].buf, *nb[i].buf)) return false;
  return true;
}

bool all_poison(const DeviceBuffer& b) {  // DeviceBuffer::poison's bytes, every one
  for (unsigned char c : b.to_host())
    if (c != 0xFF) return false;
  return true;
}

TEST(CudaThreads, DistinctPlansOnFourThreadsAtOnce) {
  SKIP_WITHOUT_GPU();
  struct Case {
    Problem pr;
    int32_t recipe;
  };
  const std::vector<Case> cases = {{problem(LNMLP_DTYPE_BF16, true, false, 201), LNMLP_RECIPE_NONE},
                                   {problem(LNMLP_DTYPE_F32, false, true, 202), LNMLP_RECIPE_NONE},
                                   {problem(LNMLP_DTYPE_BF16, false, false, 203), LNMLP_RECIPE_CURRENT},
                                   {problem(LNMLP_DTYPE_F16, true, true, 204), LNMLP_RECIPE_NONE}};
  // Each plan's bits, one plan at a time on this thread.
  std::vector<RunResult> expected;
  for (const Case& c : cases) {
    PlanPtr p = plan_ptr(make_plan(c.pr, LNMLP_REMAT_SAVE_ALL, LNMLP_BACKEND_CUDA, 0, c.recipe));
    expected.push_back(step(p.get(), c.pr, Stream()));
  }
  std::atomic<int> failures{0}, ready{0};
  std::vector<std::string> errors(cases.size());
  std::vector<std::thread> threads;
  for (size_t t = 0; t < cases.size(); ++t)
    threads.emplace_back([&, t] {
      ++ready;
      while (ready.load() < static_cast<int>(cases.size())) std::this_thread::yield();
      try {
        for (int round = 0; round < 2; ++round) {
          // Created on this thread, while the others create and run theirs.
          PlanPtr p = plan_ptr(make_plan(cases[t].pr, LNMLP_REMAT_SAVE_ALL, LNMLP_BACKEND_CUDA, 0, cases[t].recipe));
          const Stream stream;
          if (!same(step(p.get(), cases[t].pr, stream), expected[t])) ++failures;
        }
      } catch (const std::exception& e) {
        errors[t] = e.what();
        ++failures;
      }
    });
  for (auto& t : threads) t.join();
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  EXPECT_EQ(failures.load(), 0);
}

TEST(CudaThreads, OnePlanFromTwoThreadsIsNeverCorrupted) {
  SKIP_WITHOUT_GPU();
  const Problem pr = problem(LNMLP_DTYPE_BF16, true, false, 211);
  PlanPtr shared = plan_ptr(make_plan(pr, LNMLP_REMAT_SAVE_ALL, LNMLP_BACKEND_CUDA));
  const RunResult expected = step(shared.get(), pr, Stream());
  const int64_t saved = saved_bytes(shared.get());
  std::atomic<int> ok{0}, busy{0}, bad{0}, ready{0};
  auto worker = [&] {
    // Its own inputs (equal to the others') and outputs, and its own stream; the same plan.
    const DeviceInputs in(pr);
    const DeviceOutputs out(pr, saved);
    const Stream stream;
    ++ready;
    while (ready.load() < 2) std::this_thread::yield();
    for (int i = 0; i < 12; ++i) {
      for (const DeviceBuffer* b : {&out.y, &out.dx, &out.dw1, &out.db1, &out.dgamma}) b->poison();
      const int32_t f = device_forward(shared.get(), in, out, stream.get());
      if (f == LNMLP_ERROR_PLAN_BUSY) {
        ++busy;
        CUDA_TEST_CHECK(cudaStreamSynchronize(stream.get()));
        if (!all_poison(out.y)) ++bad;  // a refused call changed nothing
        if (std::string(lnmlp_last_error()).find("thread") == std::string::npos) ++bad;
        continue;
      }
      if (f != LNMLP_SUCCESS) {
        ++bad;
        continue;
      }
      const int32_t g = device_backward(shared.get(), in, out, stream.get());
      CUDA_TEST_CHECK(cudaStreamSynchronize(stream.get()));
      if (g == LNMLP_ERROR_PLAN_BUSY) {
        ++busy;
        if (!all_poison(out.dx) || !all_poison(out.dw1)) ++bad;
        continue;
      }
      if (g != LNMLP_SUCCESS || !same(to_host(pr, out, true), expected)) ++bad;
      else ++ok;
    }
  };
  std::thread t1(worker), t2(worker);
  t1.join();
  t2.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_GT(ok.load(), 0);
  std::printf("[          ] shared CUDA plan: %d full runs succeeded, %d calls were PLAN_BUSY\n", ok.load(),
              busy.load());
  EXPECT_TRUE(same(step(shared.get(), pr, Stream()), expected));  // afterwards, the same bits
}

TEST(CudaThreads, DestroyWhileAnotherThreadRuns) {
  SKIP_WITHOUT_GPU();
  const Problem pr = problem(LNMLP_DTYPE_BF16, false, true, 221);
  lnmlp_plan* plan = make_plan(pr, LNMLP_REMAT_SAVE_ALL, LNMLP_BACKEND_CUDA);
  const DeviceInputs in(pr);
  const DeviceOutputs out(pr, saved_bytes(plan));
  std::atomic<bool> started{false};
  std::atomic<int> bad{0};
  std::thread runner([&] {
    const Stream stream;
    for (int i = 0; i < 100000; ++i) {
      const int32_t st = device_forward(plan, in, out, stream.get());
      started = true;
      if (st == LNMLP_ERROR_INVALID_HANDLE) break;  // destroyed: the registry says so
      if (st != LNMLP_SUCCESS) ++bad;
    }
    cudaStreamSynchronize(stream.get());
  });
  while (!started.load()) std::this_thread::yield();
  int32_t st;
  while ((st = lnmlp_plan_destroy(plan)) == LNMLP_ERROR_PLAN_BUSY) std::this_thread::yield();
  EXPECT_EQ(st, LNMLP_SUCCESS) << lnmlp_last_error();
  runner.join();
  EXPECT_EQ(bad.load(), 0);
}

}  // namespace
