#!/usr/bin/env bash
# valgrind's memcheck over the release build: the C example (dlopen, forward, backward, checked
# against float64) and a plan's whole life in a loop (tests/valgrind/lifecycle_loop.c: every dtype,
# remat policy and FP8 recipe, one and two threads, own and attached workspaces, failing calls),
# and two application threads with a plan each at GEMM-sized shapes (tests/valgrind/concurrent_plans.c).
# Any invalid access, use of an uninitialised value, or memory definitely or indirectly lost fails,
# but for what tests/valgrind/onednn.supp suppresses, each with its reason.
# What the OpenMP runtime and oneDNN keep for the process's life (thread pools, JIT kernels,
# primitive caches) is "still reachable" or "possibly lost" and is not counted.
#
#   bash scripts/valgrind.sh [build dir, default build/release]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/release}
memcheck=(valgrind --tool=memcheck --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite,indirect
          --show-leak-kinds=definite,indirect --track-origins=yes --num-callers=30 --quiet
          --suppressions=tests/valgrind/onednn.supp)
echo "--- valgrind: examples/c/dlopen_example.c"
"${memcheck[@]}" "$build/tests/lnmlp_dlopen_example" "$build/src/liblnmlp.so"
echo "--- valgrind: tests/valgrind/lifecycle_loop.c"
"${memcheck[@]}" "$build/tests/lnmlp_lifecycle_loop" 1
echo "--- valgrind: tests/valgrind/concurrent_plans.c"
"${memcheck[@]}" "$build/tests/lnmlp_concurrent_plans"
echo "valgrind: 0 errors"
