#!/usr/bin/env bash
# scripts/gpu-check-lib.sh without a GPU: its time table fits the budget, every test of
# lnmlp_gpu_tests ($1) is in exactly one shard, and the logs a GPU machine gives (a sandboxed
# sanitizer, a shard cut short, a GPU the tests cannot use) get the status they should.
#
#   bash tests/gpu/gpu_check_lib_test.sh build/release/tests/gpu/lnmlp_gpu_tests
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/gpu-check-lib.sh
source "$here/../../scripts/gpu-check-lib.sh"
gpu_tests=${1:?usage: gpu_check_lib_test.sh path/to/lnmlp_gpu_tests}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
expect_eq() {  # name, got, expected
  if [ "$2" = "$3" ]; then echo "ok    $1"; else echo "FAIL  $1: got [$2], expected [$3]"; failures=$((failures + 1)); fi
}

# ---- the time table --------------------------------------------------------------------------
sum=$(gpu_check_limits_sum)
expect_eq "the steps' limits and the reserve fit the budget ($sum + $GPU_CHECK_RESERVE <= $GPU_CHECK_BUDGET)" \
  "$(gpu_check_limits_fit && echo fits)" fits
expect_eq "a smaller budget is told apart" "$(gpu_check_limits_fit $((sum + GPU_CHECK_RESERVE - 1)) || echo too-small)" too-small
# Two checks and a machine start of 4 minutes in a lent GPU's 15 minutes, with a minute left for
# transfers.
expect_eq "two checks fit 15 minutes with the machine's start" "$((2 * GPU_CHECK_BUDGET + 240 + 60 <= 900))" 1
for s in "${GPU_CHECK_STEPS[@]}"; do
  [ -n "${GPU_CHECK_LIMIT[$s]+set}" ] || expect_eq "step $s has a limit" missing present
done
expect_eq "bench is a report step" "$(gpu_check_is_report_step bench && echo yes)" yes
expect_eq "tests-numerics gates the check" "$(gpu_check_is_report_step tests-numerics || echo no)" no
expect_eq "the sync rerun explains, and does not gate" "$(gpu_check_is_report_step sync-rerun && echo yes)" yes

# ---- every GPU test in exactly one shard -----------------------------------------------------
list() {  # the full names of the tests a filter selects
  "$gpu_tests" --gtest_list_tests --gtest_filter="$1" |
    awk '/^[^ ]/ { suite = $1 } /^  / { print suite $1 }'
}
list '*' | sort > "$work/all"
: > "$work/sharded"
for shard in "${GPU_TESTS_SHARDS[@]}"; do
  list "${GPU_TESTS_FILTER[$shard]}" > "$work/$shard"
  n=$(wc -l < "$work/$shard")
  expect_eq "shard $shard selects tests" "$([ "$n" -gt 0 ] && echo yes)" yes
  cat "$work/$shard" >> "$work/sharded"
done
expect_eq "lnmlp_gpu_tests has tests" "$([ -s "$work/all" ] && echo yes)" yes
expect_eq "tests in no shard" "$(sort "$work/sharded" | comm -23 "$work/all" - | head -n 5 | tr '\n' ' ')" ""
expect_eq "tests in two shards" "$(sort "$work/sharded" | uniq -d | head -n 5 | tr '\n' ' ')" ""

# ---- memcheck's result -----------------------------------------------------------------------
memcheck() {  # a log's text, an exit status -> the status (the detail is checked where it matters)
  printf '%s\n' "$1" > "$work/memcheck.log"
  gpu_check_memcheck_result "$work/memcheck.log" "$2" | cut -f1
}
# A gVisor sandbox: the sanitizer cannot instrument the device, the tests then fail at their first
# allocation with error 999 and the summary counts no sanitizer error.
gvisor='========= COMPUTE-SANITIZER
========= Error: Device not supported. Please refer to the "Supported Devices" section of the documentation.
Running main() from ./googletest/src/gtest_main.cc
test_cuda_backend.cpp:88: Failure
CUDA error 999 (unknown error) at cudaMalloc
[  FAILED  ] CudaGraph.ForwardAndBackwardReplay (2 ms)
========= ERROR SUMMARY: 0 errors'
expect_eq "memcheck: sandboxed GPU" "$(memcheck "$gvisor" 1)" "skipped: sanitizer unsupported"
printf '%s\n' "$gvisor" > "$work/memcheck.log"
expect_eq "memcheck: sandboxed GPU, the sanitizer's line kept" \
  "$(gpu_check_memcheck_result "$work/memcheck.log" 1 | cut -f2 | grep -c 'Device not supported')" 1
expect_eq "memcheck: clean" "$(memcheck '[  PASSED  ] 9 tests.
========= ERROR SUMMARY: 0 errors' 0)" pass
expect_eq "memcheck: errors found" "$(memcheck '========= Invalid __global__ write of size 4 bytes
========= ERROR SUMMARY: 3 errors' 9)" "fail(rc 9)"
expect_eq "memcheck: never ran the tests" "$(memcheck '========= Error: Target application terminated before first instrumented API call' 1)" \
  "skipped: compute-sanitizer could not run here"
expect_eq "memcheck: cut by its limit" "$(memcheck '[ RUN      ] CudaGraph.ForwardAndBackwardReplay' 124)" timeout

# ---- GoogleTest logs -------------------------------------------------------------------------
printf '%s\n' '[==========] Running 3 tests from 1 test suite.' '[ RUN      ] S.a' '[       OK ] S.a (5 ms)' \
  '[ RUN      ] S.b' 'x.cpp:3: Failure' '[  FAILED  ] S.b (1 ms)' '[ RUN      ] S.c' > "$work/cut.log"
expect_eq "counts of a shard cut short" "$(gpu_check_gtest_counts "$work/cut.log")" \
  "1 passed, 0 skipped, 1 failed; cut short after 2 tests, in S.c"
printf '%s\n' '[==========] 3 tests from 1 test suite ran. (9 ms total)' '[  PASSED  ] 2 tests.' \
  '[  SKIPPED ] 1 test, listed below:' '[  SKIPPED ] S.c' > "$work/done.log"
expect_eq "counts of a whole run" "$(gpu_check_gtest_counts "$work/done.log")" "2 passed, 1 skipped, 0 failed"
expect_eq "the tests to rerun: the failed one and the one cut" "$(gpu_check_failed_tests "$work/cut.log" | paste -sd: -)" "S.b:S.c"
expect_eq "no test to rerun after a clean run" "$(gpu_check_failed_tests "$work/done.log")" ""
printf '%s\n' '[ RUN      ] All/P.x/f32_T37' 'x.cpp:9: Failure' \
  '[  FAILED  ] All/P.x/f32_T37, where GetParam() = 4-byte object <25-00 00-00> (3 ms)' \
  '[==========] 1 test from 1 test suite ran. (3 ms total)' '[  FAILED  ] 1 test, listed below:' \
  '[  FAILED  ] All/P.x/f32_T37, where GetParam() = 4-byte object <25-00 00-00>' ' 1 FAILED TEST' > "$work/param.log"
expect_eq "a failed parameterized test, once, by its name" "$(gpu_check_failed_tests "$work/param.log" | paste -sd: -)" \
  "All/P.x/f32_T37"
printf '%s\n' 'lnmlp_gpu_tests: no usable GPU: no CUDA device' '[  PASSED  ] 0 tests.' > "$work/nogpu.log"
expect_eq "tests skipped on a machine with a GPU" "$(gpu_check_tests_status "$work/nogpu.log" 0 1)" \
  "fail(the GPU is not usable by the tests)"
expect_eq "tests skipped without a GPU" "$(gpu_check_tests_status "$work/nogpu.log" 0 0)" "pass; GPU tests skipped: no GPU"
expect_eq "a crash" "$(gpu_check_tests_status "$work/cut.log" 139 1)" "fail(rc 139)"
expect_eq "a timeout's KILL" "$(gpu_check_verdict 137)" timeout

# ---- logs kept small -------------------------------------------------------------------------
head -c 3145728 /dev/zero | tr '\0' 'x' > "$work/big.log"
gpu_check_trim_log "$work/big.log" 2097152
expect_eq "a 3 MiB log trimmed near 2 MiB" "$(($(stat -c %s "$work/big.log") < 2097152 + 100))" 1
expect_eq "the trimmed log says what was cut" "$(grep -c 'bytes cut here' "$work/big.log")" 1

if [ "$failures" -ne 0 ]; then
  echo "gpu_check_lib_test: $failures failed"
  exit 1
fi
echo "gpu_check_lib_test: all passed"
