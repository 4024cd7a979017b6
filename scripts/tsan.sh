#!/usr/bin/env bash
# ThreadSanitizer over the tests that run lnmlp from several threads at once: concurrent plans, one
# plan from two threads (PLAN_BUSY), destroy racing calls and getters, the handle registry, the
# sharded groups (P ranks as P threads exchanging through the in-process communicator), and the
# sliced GEMM (slices shared out to OpenMP threads; two of them at once from two threads).
#
# The `tsan` preset builds with clang and LLVM's OpenMP runtime (libomp), and the OpenMP tool
# Archer (libarcher, from Debian's libomp-14-dev) tells TSan about the runtime's barriers and
# fork/join, so what TSan reports is about lnmlp's code, not the runtime's thread pool. oneDNN
# (Debian's, not instrumented) calls the same libomp through its GOMP_* entry points.
#
#   bash scripts/tsan.sh         configure + build the preset's test programs, run them; exit 1 on a report
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --preset tsan >/dev/null
cmake --build --preset tsan -j"$(nproc)" --target lnmlp_api_tests lnmlp_call_tests lnmlp_sharding_tests lnmlp_gemm_tests

archer=$(ls /usr/lib/llvm-*/lib/libarcher.so 2>/dev/null | sort -V | tail -n 1)
if [ -z "$archer" ]; then
  echo "tsan: libarcher.so not found (Debian: libomp-14-dev)" >&2
  exit 1
fi
export OMP_TOOL_LIBRARIES="$archer"
# ignore_noninstrumented_modules: calls that libomp and oneDNN (not built with TSan) make to
# pthread functions are theirs, not lnmlp's (libomp initialises its locks on its pool threads).
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 history_size=4 ignore_noninstrumented_modules=1"
export ARCHER_OPTIONS="verbose=1"
export OMP_NUM_THREADS=2  # every test asks for >= 2 threads itself where it matters
bin=build/tsan/tests
run() {
  echo "--- tsan: $*"
  "$@" --gtest_brief=1
}
run "$bin/lnmlp_api_tests" --gtest_filter='Threads.*:Handles.*:Status.LastErrorIsNeverNullAndThreadLocal'
run "$bin/lnmlp_call_tests" --gtest_filter='Threads.*'
run "$bin/lnmlp_sharding_tests"
run "$bin/lnmlp_gemm_tests" --gtest_filter='SlicedGemmThreads.*:AllLayouts/SlicedGemm.*_f32in_f32out_*'
echo "tsan: no reports"
