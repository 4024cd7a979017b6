#!/usr/bin/env bash
# The GPU check: runs on a machine with an NVIDIA GPU what scripts/build-gpu-carry.sh built
# elsewhere (this script builds nothing), in 270 s at most, unpacking included, so that two runs
# (the check and a rerun after a fix) and the machine's start fit a lent GPU's 15 minutes. Steps,
# each under a limit of its own and all under one budget (scripts/gpu-check-lib.sh has the table;
# LNMLP_GPU_CHECK_BUDGET overrides the budget):
#   libraries  every carried binary loads (the carried libraries, the machine's cuBLASLt 13);
#   kernels    lnmlp_gpu_kernel_tests: each kernel against src/numerics on the host, so that a
#              failure names its kernel (first, before anything runs a whole plan);
#   tests-*    lnmlp_gpu_tests in three shards, one process each, so that a timeout or a crash
#              still leaves the others' results: tests-basic (host side, error paths, the calls'
#              options, CUDA graphs), tests-fp8 (every recipe against the CPU backend),
#              tests-numerics (every configuration against the CPU backend); cuBLASLt logs its
#              errors and heuristic status into cublaslt-<shard>-<pid>.log, so that a refused GEMM
#              says why;
#   sync-rerun the tests the shards saw fail (or crash in), at most GPU_CHECK_RERUN_MAX, again with
#              LNMLP_CUDA_SYNC_CHECK=1: every launch waits for its stream, so that a kernel's fault
#              is reported naming the kernel rather than a later call (its detail quotes the line);
#   nccl       the one-rank NCCL tests (lnmlp_gpu_sharding_tests), where the machine has
#              libnccl.so.2 (218 MB: it cannot travel in the carry);
#   memcheck   compute-sanitizer --tool memcheck on a small set of the tests ("skipped: sanitizer
#              unsupported" where it cannot instrument this GPU, as in gVisor sandboxes);
#   bench      lnmlp-gpu-bench --quick (the block and its GEMMs alone, in one run);
#   peers      bench/gpu/torch_peer.py --quick (PyTorch eager, JAX, torch.compile), where installed.
# sync-rerun explains, bench and peers report figures: their failure or timeout does not fail the
# check.
# Writes into ${OUT:-./gpu-check-out}: summary.json (always, also when a step fails or the script
# is interrupted), gpu-check.log, one log per step (each kept under 2 MiB), and the carried
# build's MANIFEST (the commit it was built from).
#
#   OUT=dir bash scripts/gpu-check.sh             on the GPU machine (carry build/gpu.tar.gz there)
#   OUT=dir bash scripts/gpu-check.sh --dry-run   here, without a GPU: every step that can run
#                                                 without one runs, the rest say "skipped: no GPU";
#                                                 exit status 0 when nothing failed (CI runs it)
#   OUT=dir bash scripts/gpu-check.sh --sync-check   every step with LNMLP_CUDA_SYNC_CHECK=1 (a
#                                                 rerun that hunts a fault; slower)
#
# The carried build: LNMLP_GPU_BUILD (default build/gpu), or its archive build/gpu.tar.gz, which
# is unpacked beside it. LD_LIBRARY_PATH may be unset.
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/gpu-check-lib.sh
source scripts/gpu-check-lib.sh

dry_run=0
sync_check=0
for a in "$@"; do
  case "$a" in
    --dry-run) dry_run=1 ;;
    --sync-check) sync_check=1 ;;
    *) echo "usage: OUT=dir bash scripts/gpu-check.sh [--dry-run] [--sync-check]" >&2; exit 2 ;;
  esac
done
[ $sync_check -eq 1 ] && export LNMLP_CUDA_SYNC_CHECK=1
out=${OUT:-./gpu-check-out}
mkdir -p "$out"
carry=${LNMLP_GPU_BUILD:-build/gpu}
budget=${LNMLP_GPU_CHECK_BUDGET:-$GPU_CHECK_BUDGET}
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
t_start=$(date +%s)
elapsed() { echo $(($(date +%s) - t_start)); }
: > "$out/gpu-check.log"
log() { echo "[gpu-check $(elapsed)s] $*" | tee -a "$out/gpu-check.log"; }
gpu_check_limits_fit "$budget" ||
  log "note: the steps' limits ($(gpu_check_limits_sum) s) and the reserve (${GPU_CHECK_RESERVE} s) exceed the ${budget} s budget: the last steps get what is left"

# ---- results, and the summary written whatever happens ----------------------------------------
steps=("${GPU_CHECK_STEPS[@]}")
declare -A status detail seconds
for s in "${steps[@]}"; do status[$s]="not run"; detail[$s]=""; seconds[$s]=0; done
gpu_name="none"
built_from="unknown"
tree_commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)

json_string() {  # a JSON string literal of $1 (quotes, backslashes and control characters escaped)
  local s=$1
  s=${s//\\/\\\\}
  s=${s//\"/\\\"}
  s=$(printf '%s' "$s" | tr '\000-\037' ' ')
  printf '"%s"' "$s"
}
json_lines() {  # the JSON object lines of a log, as a JSON array
  local first=1
  printf '['
  if [ -f "$1" ]; then
    while IFS= read -r line; do
      case "$line" in
        '{'*'}') if [ $first -eq 0 ]; then printf ','; fi; printf '\n  %s' "$line"; first=0 ;;
      esac
    done < "$1"
  fi
  printf ']'
}
# Whether every step of kind $1 (check: the verdict's steps; report: bench and peers) passed or
# skipped.
steps_ok() {
  local s
  for s in "${steps[@]}"; do
    if gpu_check_is_report_step "$s"; then [ "$1" = report ] || continue; else [ "$1" = check ] || continue; fi
    case "${status[$s]}" in fail* | timeout*) return 1 ;; esac
  done
  return 0
}
all_ok() { steps_ok check; }
write_summary() {
  local ok=false report_ok=false s first=1
  all_ok && ok=true
  steps_ok report && report_ok=true
  {
    printf '{\n "dry_run": %s,\n "sync_check": %s,\n "gpu": %s,\n' "$([ $dry_run -eq 1 ] && echo true || echo false)" \
      "$([ $sync_check -eq 1 ] && echo true || echo false)" "$(json_string "$gpu_name")"
    printf ' "carried_build": %s,\n "tree_commit": %s,\n' "$(json_string "$built_from")" "$(json_string "$tree_commit")"
    printf ' "seconds": %d,\n "budget_seconds": %d,\n "ok": %s,\n "report_ok": %s,\n' "$(elapsed)" "$budget" "$ok" "$report_ok"
    printf ' "report_steps": [%s],\n "steps": {' \
      "$(for s in "${GPU_CHECK_REPORT_STEPS[@]}"; do json_string "$s"; printf ', '; done | sed 's/, $//')"
    for s in "${steps[@]}"; do
      if [ $first -eq 0 ]; then printf ','; fi
      first=0
      printf '\n  %s: {"status": %s, "seconds": %d, "detail": %s}' "$(json_string "$s")" \
        "$(json_string "${status[$s]}")" "${seconds[$s]}" "$(json_string "${detail[$s]}")"
    done
    printf '\n },\n "bench_cases": '
    json_lines "$out/bench.log"
    printf ',\n "peer_cases": '
    json_lines "$out/peers.log"
    printf '\n}\n'
  } > "$out/summary.json"
}
finish() {
  local f
  for f in "$out"/*.log; do [ -f "$f" ] && gpu_check_trim_log "$f"; done
  write_summary
  log "summary.json: $(all_ok && echo ok || echo 'NOT ok'); files in $out: $(ls "$out" | tr '\n' ' ')"
}
trap finish EXIT
trap 'log "interrupted"; exit 130' INT TERM

skip_all_from() {  # marks every step not yet run as skipped, with the reason $1
  local s
  for s in "${steps[@]}"; do [ "${status[$s]}" = "not run" ] && status[$s]="skipped: $1"; done
}

# Runs step $1's command (the rest of the arguments) under min(its limit in GPU_CHECK_LIMIT, what is
# left of the budget), its output into $out/$1.log; sets rc and the step's seconds. Returns 1 (and
# marks the step) when the budget is spent.
rc=0
run_step() {
  local name=$1 limit=${GPU_CHECK_LIMIT[$1]}
  shift
  local left=$((budget - $(elapsed) - 5))
  if [ "$left" -lt 10 ]; then
    status[$name]="skipped: the check's ${budget}s budget is spent"
    return 1
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0
  t0=$(date +%s)
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  rc=$?
  seconds[$name]=$(($(date +%s) - t0))
  return 0
}
# ---- the carried build -----------------------------------------------------------------------
if [ ! -x "$carry/bin/lnmlp_gpu_tests" ] && [ -f "$carry.tar.gz" ]; then
  log "unpacking $carry.tar.gz"
  tar -C "$(dirname "$carry")" -xzf "$carry.tar.gz" || log "could not unpack $carry.tar.gz"
fi
if [ ! -x "$carry/bin/lnmlp_gpu_tests" ]; then
  log "no carried build at $carry: run scripts/build-gpu-carry.sh on a build machine and carry build/gpu.tar.gz"
  status[libraries]="fail(no carried build at $carry)"
  skip_all_from "no carried build"
  exit 1
fi
cp "$carry/MANIFEST" "$out/MANIFEST" 2>/dev/null
built_from=$(head -n1 "$carry/MANIFEST" 2>/dev/null || echo unknown)
log "carried build: $built_from; this tree: $tree_commit"
case "$built_from" in
  "commit $tree_commit"*) ;;
  *) [ "$tree_commit" != unknown ] && log "note: the carried build is not from this tree's commit" ;;
esac
# shellcheck disable=SC1091
source "$carry/env.sh"

# ---- the GPU ---------------------------------------------------------------------------------
have_gpu=0
if [ $dry_run -eq 1 ]; then
  gpu_name="none (dry run)"
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L > "$out/nvidia-smi.txt" 2>&1 && grep -q '^GPU ' "$out/nvidia-smi.txt"; then
  have_gpu=1
  gpu_name=$(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>/dev/null | head -n1)
  [ -n "$gpu_name" ] || gpu_name=$(head -n1 "$out/nvidia-smi.txt")
else
  gpu_name="none (nvidia-smi found no GPU)"
fi
log "GPU: $gpu_name"

# A library's directory on this machine: the loader's cache, the CUDA toolkit, pip wheels (torch's
# and jax's nvidia-* packages).
find_lib_dir() {
  local name=$1
  {
    ldconfig -p 2>/dev/null | awk -v n="$name" '$1 == n { print $NF }' | xargs -r -n1 dirname
    ls -d /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
      /usr/local/cuda-1[2-9]*/lib64 /usr/local/cuda-1[2-9]*/lib /usr/lib/x86_64-linux-gnu 2>/dev/null
    for py in python3 python; do
      command -v "$py" >/dev/null 2>&1 || continue
      "$py" - <<'PY' 2>/dev/null
import glob, site
bases = site.getsitepackages() + [site.getusersitepackages()]
for b in bases:
    for d in glob.glob(b + "/nvidia/*/lib") + glob.glob(b + "/nvidia/cu1*/lib"):
        print(d)
PY
      break
    done
  } | while read -r d; do [ -e "$d/$name" ] && echo "$d"; done | awk '!seen[$0]++' | head -n1
}

# ---- libraries -------------------------------------------------------------------------------
cublas_dir=$(find_lib_dir libcublasLt.so.13)
if [ -n "$cublas_dir" ]; then
  export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$cublas_dir"
  log "libcublasLt.so.13 from $cublas_dir"
fi
nccl_dir=$(find_lib_dir libnccl.so.2)
missing() {  # what the loader cannot resolve for the carried files (libnccl aside)
  local f
  for f in "$carry"/lib/*.so* "$carry"/bin/*; do
    ldd "$f" 2>&1 | grep -E 'not found' | grep -v libnccl | sed "s|^|$(basename "$f"): |"
  done
}
t0=$(date +%s)
miss=$(missing)
if echo "$miss" | grep -q "GLIBCXX\|GCC_\|CXXABI"; then
  log "this machine's libstdc++ is older than the build's: using the carried one (lib/compat)"
  export LD_LIBRARY_PATH="$carry/lib/compat:$LD_LIBRARY_PATH"
  miss=$(missing)
fi
seconds[libraries]=$(($(date +%s) - t0))
if [ -z "$miss" ]; then
  status[libraries]=pass
  detail[libraries]="cuBLASLt from ${cublas_dir:-nowhere}; NCCL from ${nccl_dir:-nowhere}"
else
  status[libraries]="fail(unresolved libraries)"
  detail[libraries]=$(echo "$miss" | sort -u | head -n 8 | tr '\n' ';')
  [ -n "$cublas_dir" ] || detail[libraries]="libcublasLt.so.13 is not on this machine; ${detail[libraries]}"
fi
log "libraries: ${status[libraries]} ${detail[libraries]}"

# ---- kernels ---------------------------------------------------------------------------------
log "kernels: lnmlp_gpu_kernel_tests"
if run_step kernels "$carry/bin/lnmlp_gpu_kernel_tests"; then
  detail[kernels]=$(gpu_check_gtest_counts "$out/kernels.log")
  status[kernels]=$(gpu_check_tests_status "$out/kernels.log" "$rc" "$have_gpu")
  [ "${status[kernels]}" = "pass; GPU tests skipped: no GPU" ] && status[kernels]="skipped: no GPU"
fi
log "   ${status[kernels]}: ${detail[kernels]}"

# ---- tests, in shards ------------------------------------------------------------------------
# Without --gtest_brief, so that a shard cut short still shows which tests passed. cuBLASLt's
# errors and heuristic status (log mask 1 + 8; not its per-call trace) go to a file per process.
for shard in "${GPU_TESTS_SHARDS[@]}"; do
  log "$shard: lnmlp_gpu_tests --gtest_filter=${GPU_TESTS_FILTER[$shard]}"
  if CUBLASLT_LOG_MASK=9 CUBLASLT_LOG_FILE="$out/cublaslt-$shard-%i.log" \
    run_step "$shard" "$carry/bin/lnmlp_gpu_tests" --gtest_filter="${GPU_TESTS_FILTER[$shard]}"; then
    detail[$shard]=$(gpu_check_gtest_counts "$out/$shard.log")
    status[$shard]=$(gpu_check_tests_status "$out/$shard.log" "$rc" "$have_gpu")
  fi
  log "   ${status[$shard]}: ${detail[$shard]}"
done

# ---- sync-rerun (explains; does not gate) ---------------------------------------------------
rerun=$(for shard in "${GPU_TESTS_SHARDS[@]}"; do gpu_check_failed_tests "$out/$shard.log"; done |
  awk '!seen[$0]++' | head -n "$GPU_CHECK_RERUN_MAX" | paste -sd: -)
if [ -z "$rerun" ]; then
  status[sync-rerun]="skipped: no test failed"
else
  log "sync-rerun: LNMLP_CUDA_SYNC_CHECK=1 lnmlp_gpu_tests --gtest_filter=$rerun"
  if LNMLP_CUDA_SYNC_CHECK=1 CUBLASLT_LOG_MASK=9 CUBLASLT_LOG_FILE="$out/cublaslt-sync-rerun-%i.log" \
    run_step sync-rerun "$carry/bin/lnmlp_gpu_tests" --gtest_filter="$rerun"; then
    status[sync-rerun]=$(gpu_check_verdict "$rc")
    named=$(grep -m1 -E 'failed while running|the launch of' "$out/sync-rerun.log" | cut -c1-400)
    detail[sync-rerun]="$(gpu_check_gtest_counts "$out/sync-rerun.log")${named:+; $named}"
  fi
fi
log "   sync-rerun: ${status[sync-rerun]} ${detail[sync-rerun]}"

# ---- nccl ------------------------------------------------------------------------------------
if [ ! -x "$carry/bin/lnmlp_gpu_sharding_tests" ]; then
  status[nccl]="skipped: the carried build has no NCCL tests (no NCCL where it was built)"
elif [ -z "$nccl_dir" ]; then
  status[nccl]="skipped: libnccl.so.2 is not on this machine, and it cannot travel (218 MB, 187 MB compressed)"
else
  log "nccl: lnmlp_gpu_sharding_tests (one rank; two-rank tests need two GPUs and skip otherwise)"
  if LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$nccl_dir" run_step nccl "$carry/bin/lnmlp_gpu_sharding_tests"; then
    detail[nccl]="NCCL from $nccl_dir; $(gpu_check_gtest_counts "$out/nccl.log")"
    status[nccl]=$(gpu_check_verdict "$rc")
    if [ "$rc" -eq 0 ] && [ $have_gpu -eq 0 ]; then status[nccl]="skipped: no GPU"; fi
  fi
fi
log "   nccl: ${status[nccl]} ${detail[nccl]}"

# ---- memcheck --------------------------------------------------------------------------------
memcheck_filter='All/CudaVsCpu.EveryRematPolicyMatchesTheCpuBackend/bf16_layernorm_gelu_b1_b2_T37:All/CudaVsCpu.EveryRematPolicyMatchesTheCpuBackend/f16_rmsnorm_clamped_swiglu_b1_T37:CudaGraph.*:CudaErrors.*:All/CudaFp8VsCpu.ForwardAndGradientsMatchTheCpuBackend/delayed_bf16_swiglu_T256_H128_F192:All/CudaFp8VsCpu.ForwardAndGradientsMatchTheCpuBackend/block_bf16_swiglu_T256_H128_F192:All/CudaFp8VsCpu.ForwardAndGradientsMatchTheCpuBackend/mxfp8_bf16_swiglu_T200_H144_F176:CudaFp8Graph.*'
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-1[2-9]*/bin/compute-sanitizer 2>/dev/null | head -n1)
if [ $have_gpu -eq 0 ]; then
  status[memcheck]="skipped: no GPU"
elif [ -z "$sanitizer" ]; then
  status[memcheck]="skipped: compute-sanitizer is not on this machine"
else
  log "memcheck: $sanitizer --tool memcheck"
  if run_step memcheck "$sanitizer" --tool memcheck --error-exitcode 9 "$carry/bin/lnmlp_gpu_tests" --gtest_brief=1 \
    --gtest_filter="$memcheck_filter"; then
    IFS=$'\t' read -r "status[memcheck]" "detail[memcheck]" < <(gpu_check_memcheck_result "$out/memcheck.log" "$rc")
  fi
fi
log "   memcheck: ${status[memcheck]} ${detail[memcheck]}"

# ---- bench (reports; does not gate) ----------------------------------------------------------
if [ $have_gpu -eq 0 ]; then
  status[bench]="skipped: no GPU"
else
  log "bench: lnmlp-gpu-bench --quick"
  if run_step bench "$carry/bin/lnmlp-gpu-bench" --quick --iters 5 --warmup 2; then
    status[bench]=$(gpu_check_verdict "$rc")
    grep -v '^{' "$out/bench.log" | tee -a "$out/gpu-check.log"
  fi
fi
log "   bench: ${status[bench]}"

# ---- peers (reports; does not gate) ----------------------------------------------------------
if [ $have_gpu -eq 0 ]; then
  status[peers]="skipped: no GPU"
elif ! command -v python3 >/dev/null 2>&1; then
  status[peers]="skipped: no python3 on this machine"
else
  log "peers: bench/gpu/torch_peer.py --quick"
  # The frameworks bring their own CUDA libraries: not the carried ones. Each case prints its line
  # as it finishes, so a timeout in torch.compile (last) keeps eager's and JAX's figures.
  if LD_LIBRARY_PATH="" run_step peers python3 bench/gpu/torch_peer.py --quick --iters 5 --warmup 2; then
    status[peers]=$(gpu_check_verdict "$rc")
    grep -v '^{' "$out/peers.log" | tee -a "$out/gpu-check.log"
  fi
fi
log "   peers: ${status[peers]}"

all_ok
