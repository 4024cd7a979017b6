// CPU thread counts: a plan never runs more threads than the cores the process may use. Asking for
// far more (lnmlp_desc_set_num_threads(d, 50000), or OMP_NUM_THREADS=100000 behind the default)
// used to make libgomp print "Thread creation failed" and exit the process, or crash, on the first
// forward. CTest also runs this file's tests under OMP_NUM_THREADS=100000
// (lnmlp_threads_with_huge_omp_num_threads), where the default count is the one asked for.
#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>

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
  lnmlp_ref::Config c;
  c.tokens = 40;
  c.hidden = 32;
  c.ffn = 48;
  c.acts = {LNMLP_ACT_SILU, LNMLP_ACT_LINEAR};
  c.has_bias1 = c.has_bias2 = true;
  return make_problem(c, LNMLP_DTYPE_F32, 21);
}

// Clamped to the cores: the bits of a plan asking for exactly that many.
TEST(Threads, ACountAboveTheCoresRunsOnTheCores) {
  const Problem pr = problem();
  RunOptions huge, cores;
  huge.num_threads = 50000;
  cores.num_threads = usable_cores();
  const RunResult a = run_library(pr, huge), b = run_library(pr, cores);
  const auto x = named(a), y = named(b);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_TRUE(same_bits(x[i].name, *x[i].buf, *y[i].buf));
}

// The default count (0: OpenMP's, which OMP_NUM_THREADS sets) runs and is right.
TEST(Threads, TheDefaultCountRunsAndIsRight) {
  const Problem pr = problem();
  RunOptions o;
  o.num_threads = 0;
  const RunResult r = run_library(pr, o);
  const Tolerance tol = tolerance_for(pr.dtype);
  const auto g = lnmlp_ref::backward(pr.cfg, pr.x, pr.p, pr.dy);
  EXPECT_TRUE(within_tolerance("y", r.y.to_doubles(), lnmlp_ref::forward(pr.cfg, pr.x, pr.p), nullptr, tol));
  EXPECT_TRUE(within_tolerance("dx", r.dx.to_doubles(), g.dx, nullptr, tol));
  EXPECT_TRUE(within_tolerance("dW1", r.dw1.to_doubles(), g.dw1, nullptr, tol));
}

}  // namespace
