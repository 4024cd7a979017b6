# shellcheck shell=bash disable=SC2034  # sourced: the tables are read by gpu-check.sh and its test
# Sourced by scripts/gpu-check.sh: the check's time table, its shards of the GPU tests, and the
# functions that decide what a step's log means. Kept apart so that tests/gpu/gpu_check_lib_test.sh
# can feed them the logs a GPU machine gives, without a GPU.

# ---- time ------------------------------------------------------------------------------------
# A lent GPU gives 15 minutes that include the machine's start (a few minutes) and the transfers,
# and the check must fit twice in them (a rerun after a fix). So the whole check, unpacking the
# carried build included, has GPU_CHECK_BUDGET seconds, and each step a limit of its own, in the
# order the steps run. The limits add up to the budget less GPU_CHECK_RESERVE (unpacking, the
# library check, the summary), so that no step is starved by an earlier one running to its limit:
# gpu_check_limits_fit says so, and the lib test checks it.
GPU_CHECK_BUDGET=270
GPU_CHECK_RESERVE=20
GPU_CHECK_STEPS=(libraries kernels tests-basic tests-fp8 tests-numerics sync-rerun nccl memcheck bench peers)
declare -A GPU_CHECK_LIMIT=(
  [libraries]=0        # ldd only: inside the reserve
  [kernels]=20         # lnmlp_gpu_kernel_tests
  [tests-basic]=25     # lnmlp_gpu_tests, the shards below, most telling first
  [tests-fp8]=35
  [tests-numerics]=55  # about 220 configurations x 4 remat policies, each against the CPU backend
  [sync-rerun]=20      # the shards' failed tests again under LNMLP_CUDA_SYNC_CHECK=1 (at most
                       # GPU_CHECK_RERUN_MAX), so that a kernel's fault names the kernel
  [nccl]=20            # one-rank NCCL tests
  [memcheck]=30        # compute-sanitizer on a few tests (10-50x slower than without)
  [bench]=25           # lnmlp-gpu-bench --quick
  [peers]=20           # torch eager, JAX, then torch.compile (cold: it may not finish; eager and JAX
                       # have reported by then)
)
GPU_CHECK_RERUN_MAX=10
# The steps whose result is the check's verdict (summary.json's "ok", the exit status). The rerun
# explains failures the shards already counted; bench and peers only report figures: a failure or
# timeout there is shown, and does not fail the check.
GPU_CHECK_REPORT_STEPS=(sync-rerun bench peers)

gpu_check_limits_sum() {
  local s sum=0
  for s in "${GPU_CHECK_STEPS[@]}"; do sum=$((sum + GPU_CHECK_LIMIT[$s])); done
  echo "$sum"
}
gpu_check_limits_fit() {  # the limits, and the reserve, fit budget $1 (default GPU_CHECK_BUDGET)
  [ $(($(gpu_check_limits_sum) + GPU_CHECK_RESERVE)) -le "${1:-$GPU_CHECK_BUDGET}" ]
}
gpu_check_is_report_step() {
  local s
  for s in "${GPU_CHECK_REPORT_STEPS[@]}"; do [ "$s" = "$1" ] && return 0; done
  return 1
}

# ---- lnmlp_gpu_tests in shards ----------------------------------------------------------------
# Each shard is a process of its own with its own limit and log, so that a timeout or a crash in
# one still leaves the others' results. Every test of lnmlp_gpu_tests is in exactly one shard
# (tests/gpu/gpu_check_lib_test.sh checks it against the binary's list).
GPU_TESTS_SHARDS=(tests-basic tests-fp8 tests-numerics)
declare -A GPU_TESTS_FILTER=(
  # The host side, the error paths, the calls' options, threads and CUDA graphs: small and quick, and what
  # fails first when the module, cuBLASLt or the driver is wrong.
  [tests-basic]='CudaHost.*:CudaErrors.*:CudaFp8Errors.*:All/CudaCalls.*:CudaCallsEdges.*:CudaThreads.*:CudaGraph.*:CudaFp8Graph.*'
  # Every FP8 recipe against the CPU backend, the delayed state, fp32 weights under FP8.
  [tests-fp8]='All/CudaFp8VsCpu.*:CudaFp8State.*:CudaFp8Float32Weights.*'
  # Every norm, activation, bias, dtype and remat policy against the CPU backend.
  [tests-numerics]='All/CudaVsCpu.*'
)

# ---- reading logs ----------------------------------------------------------------------------
# What the GPU tests print when they skip for want of a usable GPU (the reason follows it).
GPU_CHECK_NO_GPU_PATTERN='no usable GPU|no CUDA device'

# pass, timeout or fail(rc N) from an exit status (timeout(1) exits 124; 137 is its KILL).
gpu_check_verdict() {
  case "$1" in
    0) echo pass ;;
    124 | 137) echo timeout ;;
    *) echo "fail(rc $1)" ;;
  esac
}

# "N passed, M skipped, K failed" from a GoogleTest log: its summary lines, or, when the run was
# cut before them (a timeout, a crash), its per-test lines, with "(cut short after N tests)".
gpu_check_gtest_counts() {
  local log=$1 p s f why
  p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$log" 2>/dev/null | tail -n1)
  s=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$log" 2>/dev/null | tail -n1)
  f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$log" 2>/dev/null | tail -n1)
  why=$(grep -m1 -E "$GPU_CHECK_NO_GPU_PATTERN" "$log" 2>/dev/null | sed 's/^[^:]*: */; /' | cut -c1-240)
  if [ -z "$p$s$f" ] && [ -f "$log" ] && ! grep -q '^\[==========\] .* ran\.' "$log"; then
    p=$(grep -c '^\[       OK \] ' "$log")
    s=$(grep -c '^\[  SKIPPED \] .*(' "$log")
    f=$(grep -c '^\[  FAILED  \] .*(' "$log")
    local last
    last=$(grep '^\[ RUN      \] ' "$log" | tail -n1 | sed 's/^\[ RUN      \] //')
    why="$why; cut short after $((p + s + f)) tests${last:+, in $last}"
  fi
  echo "${p:-0} passed, ${s:-0} skipped, ${f:-0} failed$why"
}

# The tests a GoogleTest log shows failing, one per line: each "[  FAILED  ] name" (the list under
# the summary repeats them: once each), and the test a crash or a timeout cut (the last
# "[ RUN      ]" with no result after it). Nothing when none failed.
gpu_check_failed_tests() {
  local log=$1
  [ -f "$log" ] || return 0
  {
    sed -n 's/^\[  FAILED  \] \([^ ,]*\).*/\1/p' "$log" | grep -v '^[0-9]*$'
    awk '/^\[ RUN      \] / { test = $4; open = 1 }
         /^\[       OK \] |^\[  FAILED  \] |^\[  SKIPPED \] / { open = 0 }
         END { if (open) print test }' "$log"
  } | awk 'NF && !seen[$0]++'
}

# The status of a GPU test step from its log and exit status: the verdict, except that tests
# which skipped for want of a GPU fail the check on a machine that has one (the module did not
# load, cuBLASLt is missing, the driver is too old: the reason is in the log) and are a pass
# without one. $3: 1 where the machine has a GPU.
gpu_check_tests_status() {
  local log=$1 rc=$2 have_gpu=$3
  if [ "$rc" -eq 0 ] && grep -q -E "$GPU_CHECK_NO_GPU_PATTERN" "$log" 2>/dev/null; then
    if [ "$have_gpu" -eq 1 ]; then echo "fail(the GPU is not usable by the tests)"; else echo "pass; GPU tests skipped: no GPU"; fi
    return
  fi
  gpu_check_verdict "$rc"
}

# compute-sanitizer's result from its log and exit status, as "status<TAB>detail". A sanitizer
# that cannot instrument this GPU is no result either way: in sandboxed machines (gVisor) it says
# "Device not supported" and the tests then fail with CUDA error 999 at the first allocation, so
# such a log is "skipped: sanitizer unsupported" whatever the tests did. A log without the
# sanitizer's ERROR SUMMARY (it never ran the tests) is skipped too.
gpu_check_memcheck_result() {
  local log=$1 rc=$2 line
  line=$(grep -m1 -iE 'device (is )?not supported|not supported on this (device|platform)|unsupported (device|gpu)' "$log" 2>/dev/null | cut -c1-300)
  if [ -n "$line" ]; then
    printf 'skipped: sanitizer unsupported\t%s\n' "$line"
    return
  fi
  line=$(grep -E 'ERROR SUMMARY' "$log" 2>/dev/null | tail -n1)
  if [ -z "$line" ]; then
    case "$rc" in
      124 | 137) printf 'timeout\t%s\n' "no ERROR SUMMARY before the step's limit" ;;
      *) printf 'skipped: compute-sanitizer could not run here\t%s\n' \
           "$(grep -m1 -iE 'error|unsupported|not supported|failed' "$log" 2>/dev/null | cut -c1-300)" ;;
    esac
    return
  fi
  printf '%s\t%s\n' "$(gpu_check_verdict "$rc")" "$line"
}

# Keeps a log small enough to come back from the GPU machine: over $2 bytes (default 2 MiB), its
# first and last halves of that, with a line saying what was cut.
gpu_check_trim_log() {
  local f=$1 max=${2:-2097152} size
  size=$(stat -c %s "$f" 2>/dev/null || echo 0)
  [ "$size" -le "$max" ] && return 0
  local half=$((max / 2))
  { head -c "$half" "$f"; printf '\n[gpu-check: %d bytes cut here]\n' $((size - 2 * half)); tail -c "$half" "$f"; } > "$f.trim" &&
    mv "$f.trim" "$f"
}
