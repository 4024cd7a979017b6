// CPU thread counts: a plan never runs more threads than the cores the process may use. Asking for
// far more (lnmlp_desc_set_num_threads(d, 50000), or OMP_NUM_THREADS=100000 behind the default)
// used to make libgomp print "Thread creation failed" and exit the process, or crash, on the first
// forward. CTest also runs this file's tests under OMP_NUM_THREADS=100000
// (lnmlp_threads_with_huge_omp_num_threads), where the default count is the one asked for.
//
// fork(): a child of a process whose plans ran threads used to wait forever in its first forward
// (libgomp's pool threads do not exist in a child, src/cpu/fork_child.h); now it runs on its one
// thread.
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "test_util.h"
#include "tolerances.h"

using namespace lnmlp_test;

namespace {

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  return sched_getaffinity(0, sizeof(set), &set) == 0 ? std::max(1, CPU_COUNT(&set)) : 1;
}

Problem problem() {
  return make_problem(lnmlp_ref::biased_config(40, 32, 48, {LNMLP_ACT_SILU, LNMLP_ACT_LINEAR}), LNMLP_DTYPE_F32, 21);
}

// Clamped to the cores: the bits of a plan asking for exactly that many.
TEST(Threads, ACountAboveTheCoresRunsOnTheCores) {
  const Problem pr = problem();
  RunOptions huge, cores;
  huge.num_threads = 50000;
  cores.num_threads = usable_cores();
  const RunResult a = run_library(pr, huge), b = run_library(pr, cores);
  EXPECT_TRUE(same_outputs(a, b));
}

// The default count (0: OpenMP's, which OMP_NUM_THREADS sets) runs and is right.
TEST(Threads, TheDefaultCountRunsAndIsRight) {
  const Problem pr = problem();
  RunOptions o;
  o.num_threads = 0;
  EXPECT_TRUE(matches_reference(pr, run_library(pr, o), tolerance_for(pr.dtype), {"y", "dx", "dW1"}));
}

// Forward with `plan` on the problem's tokens: y, or an empty buffer when the call fails.
Buffer forward_y(const Plan& plan, const Problem& pr) {
  int64_t saved_bytes = 0;
  lnmlp_plan_get_saved_bytes(plan.get(), &saved_bytes);
  AlignedMemory saved(saved_bytes, plan.alignment(), 0);
  Buffer y(pr.dtype, static_cast<size_t>(pr.cfg.tokens * pr.cfg.hidden));
  const int32_t s = lnmlp_plan_forward(plan.get(), pr.cfg.tokens, pr.bx.data(), pr.bgamma.data(), pr.bbeta.data(),
                                       pr.bw1.data(), pr.bb1.data(), pr.bw2.data(), pr.bb2.data(), y.data(),
                                       saved.get(), nullptr, LNMLP_CALL_DEFAULT, nullptr);
  return s == LNMLP_SUCCESS ? y : Buffer();
}

// In the child: the same forward and backward on a plan made there, a forward on a plan the parent
// made and ran (its GEMMs made for two threads), and lnmlp_fp8_encode over an array large enough
// to be parallel. alarm() ends a deadlocked child with SIGALRM instead of hanging the test. CTest
// runs this with oneDNN at every ISA and held to AVX2 (its sgemm driver, whose GEMMs fix their
// thread count when they are made).
TEST(Fork, AChildRunsAfterTheParentRanThreads) {
  if (usable_cores() < 2) GTEST_SKIP() << "one usable core: the parent starts no thread team";
  const Problem pr = problem();
  RunOptions o;
  o.num_threads = 2;
  run_library(pr, o);  // starts OpenMP's thread pool
  const Plan kept(pr, o);
  ASSERT_FALSE(forward_y(kept, pr).empty());
  std::vector<float> big(size_t{1} << 20, 1.5f);
  std::vector<uint8_t> codes(big.size());
  ASSERT_EQ(lnmlp_fp8_encode(LNMLP_DTYPE_FP8_E4M3, big.data(), static_cast<int64_t>(big.size()), 1.0f, codes.data()),
            LNMLP_SUCCESS);
  std::fflush(nullptr);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    alarm(60);
    // Right, but not always the parent's bits: oneDNN's sgemm splits its sums by thread count.
    const RunResult child = run_library(pr, o);
    const Tolerance tol = tolerance_for(pr.dtype);
    int failures = 0;
    failures += !matches_reference(pr, child, tol, {"y", "dx", "dW1", "dW2"});
    RunResult again_on_parent_plan;
    again_on_parent_plan.y = forward_y(kept, pr);
    failures += again_on_parent_plan.y.empty() || !matches_reference(pr, again_on_parent_plan, tol, {"y"});
    std::vector<uint8_t> again(codes.size(), 0);
    if (lnmlp_fp8_encode(LNMLP_DTYPE_FP8_E4M3, big.data(), static_cast<int64_t>(big.size()), 1.0f, again.data()) !=
            LNMLP_SUCCESS ||
        again != codes)
      failures += 1;
    _exit(failures == 0 ? 0 : 3);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  if (WIFSIGNALED(status))
    FAIL() << "the child was killed by signal " << WTERMSIG(status)
           << (WTERMSIG(status) == SIGALRM ? " (SIGALRM: it hung for 60 s)" : "");
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child's results are wrong (its output above says which)";
}

}  // namespace
