#!/usr/bin/env bash
# The GPU check: runs on a machine with an NVIDIA GPU what scripts/build-gpu-carry.sh built
# elsewhere (this script builds nothing), in about 5 minutes at most, so that a rerun fits a lent
# GPU's time. Steps, each under a timeout and all under one budget (LNMLP_GPU_CHECK_BUDGET, 300 s):
#   libraries  every carried binary loads (the carried libraries, the machine's cuBLASLt 13);
#   kernels    lnmlp_gpu_kernel_tests: each kernel against src/numerics on the host, so that a
#              failure names its kernel (first, before anything runs a whole plan);
#   tests      lnmlp_gpu_tests: the CUDA backend against the CPU backend, CUDA graphs, stream
#              ordering, error paths;
#   nccl       the one-rank NCCL tests (lnmlp_gpu_sharding_tests), where the machine has
#              libnccl.so.2 (218 MB: it cannot travel in the carry);
#   memcheck   compute-sanitizer --tool memcheck on a small set of the tests;
#   bench      lnmlp-gpu-bench --quick (the block and its GEMMs alone, in one run);
#   peers      bench/gpu/torch_peer.py --quick (PyTorch eager, torch.compile, JAX), where installed.
# Writes into ${OUT:-./gpu-check-out}: summary.json (always, also when a step fails or the script
# is interrupted), gpu-check.log, one log per step, and the carried build's MANIFEST (the commit
# it was built from).
#
#   OUT=dir bash scripts/gpu-check.sh             on the GPU machine (carry build/gpu.tar.gz there)
#   OUT=dir bash scripts/gpu-check.sh --dry-run   here, without a GPU: every step that can run
#                                                 without one runs, the rest say "skipped: no GPU";
#                                                 exit status 0 when nothing failed (CI runs it)
#
# The carried build: LNMLP_GPU_BUILD (default build/gpu), or its archive build/gpu.tar.gz, which
# is unpacked beside it. LD_LIBRARY_PATH may be unset.
set -uo pipefail
cd "$(dirname "$0")/.."

dry_run=0
for a in "$@"; do
  case "$a" in
    --dry-run) dry_run=1 ;;
    *) echo "usage: OUT=dir bash scripts/gpu-check.sh [--dry-run]" >&2; exit 2 ;;
  esac
done
out=${OUT:-./gpu-check-out}
mkdir -p "$out"
carry=${LNMLP_GPU_BUILD:-build/gpu}
budget=${LNMLP_GPU_CHECK_BUDGET:-300}
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
t_start=$(date +%s)
elapsed() { echo $(($(date +%s) - t_start)); }
: > "$out/gpu-check.log"
log() { echo "[gpu-check $(elapsed)s] $*" | tee -a "$out/gpu-check.log"; }

# ---- results, and the summary written whatever happens ----------------------------------------
steps=(libraries kernels tests nccl memcheck bench peers)
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
all_ok() {
  local s
  for s in "${steps[@]}"; do
    case "${status[$s]}" in fail* | timeout*) return 1 ;; esac
  done
  return 0
}
write_summary() {
  local ok=false s first=1
  all_ok && ok=true
  {
    printf '{\n "dry_run": %s,\n "gpu": %s,\n' "$([ $dry_run -eq 1 ] && echo true || echo false)" "$(json_string "$gpu_name")"
    printf ' "carried_build": %s,\n "tree_commit": %s,\n' "$(json_string "$built_from")" "$(json_string "$tree_commit")"
    printf ' "seconds": %d,\n "ok": %s,\n "steps": {' "$(elapsed)" "$ok"
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
  write_summary
  log "summary.json: $(all_ok && echo ok || echo 'NOT ok'); files in $out: $(ls "$out" | tr '\n' ' ')"
}
trap finish EXIT
trap 'log "interrupted"; exit 130' INT TERM

skip_all_from() {  # marks every step not yet run as skipped, with the reason $1
  local s
  for s in "${steps[@]}"; do [ "${status[$s]}" = "not run" ] && status[$s]="skipped: $1"; done
}

# Runs step $1's command (the rest of the arguments) under min($2 s, what is left of the budget),
# its output into $out/$1.log; sets rc and the step's seconds. Returns 1 (and marks the step) when
# the budget is spent.
rc=0
run_step() {
  local name=$1 limit=$2
  shift 2
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
verdict() {  # pass, timeout or fail(rc) from rc
  if [ "$rc" -eq 0 ]; then echo pass; elif [ "$rc" -eq 124 ]; then echo "timeout"; else echo "fail(rc $rc)"; fi
}
gtest_counts() {  # "N passed, M skipped, K failed" from a GoogleTest log's summary lines
  local p s f
  p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$1" 2>/dev/null | tail -n1)
  s=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$1" 2>/dev/null | tail -n1)
  f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$1" 2>/dev/null | tail -n1)
  echo "${p:-0} passed, ${s:-0} skipped, ${f:-0} failed$(grep -m1 -E 'no usable GPU|no CUDA device' "$1" 2>/dev/null | sed 's/^[^:]*: */; /' | cut -c1-240)"
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
if run_step kernels 40 "$carry/bin/lnmlp_gpu_kernel_tests" --gtest_brief=1; then
  detail[kernels]=$(gtest_counts "$out/kernels.log")
  status[kernels]=$(verdict)
  if [ "$rc" -eq 0 ] && grep -q "no CUDA device" "$out/kernels.log"; then
    if [ $have_gpu -eq 1 ]; then status[kernels]="fail(the GPU is not usable by the tests)"; else status[kernels]="skipped: no GPU"; fi
  fi
fi
log "   ${status[kernels]}: ${detail[kernels]}"

# ---- tests -----------------------------------------------------------------------------------
log "tests: lnmlp_gpu_tests"
if run_step tests 100 "$carry/bin/lnmlp_gpu_tests" --gtest_brief=1; then
  detail[tests]=$(gtest_counts "$out/tests.log")
  status[tests]=$(verdict)
  # With a GPU, tests that skipped for want of one are a failure of the check (the module did not
  # load, cuBLASLt is missing, the driver is too old): the reason is in the log.
  if [ "$rc" -eq 0 ] && grep -q "no usable GPU" "$out/tests.log"; then
    if [ $have_gpu -eq 1 ]; then status[tests]="fail(the CUDA backend is not usable)"; else status[tests]="pass; GPU tests skipped: no GPU"; fi
  fi
fi
log "   ${status[tests]}: ${detail[tests]}"

# ---- nccl ------------------------------------------------------------------------------------
if [ ! -x "$carry/bin/lnmlp_gpu_sharding_tests" ]; then
  status[nccl]="skipped: the carried build has no NCCL tests (no NCCL where it was built)"
elif [ -z "$nccl_dir" ]; then
  status[nccl]="skipped: libnccl.so.2 is not on this machine, and it cannot travel (218 MB, 187 MB compressed)"
else
  log "nccl: lnmlp_gpu_sharding_tests (one rank; two-rank tests need two GPUs and skip otherwise)"
  if LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$nccl_dir" run_step nccl 40 "$carry/bin/lnmlp_gpu_sharding_tests" --gtest_brief=1; then
    detail[nccl]="NCCL from $nccl_dir; $(gtest_counts "$out/nccl.log")"
    status[nccl]=$(verdict)
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
  if run_step memcheck 75 "$sanitizer" --tool memcheck --error-exitcode 9 "$carry/bin/lnmlp_gpu_tests" --gtest_brief=1 \
    --gtest_filter="$memcheck_filter"; then
    detail[memcheck]=$(grep -E 'ERROR SUMMARY' "$out/memcheck.log" | tail -n1)
    status[memcheck]=$(verdict)
    if [ -z "${detail[memcheck]}" ] && [ "$rc" -ne 124 ]; then
      # The sanitizer did not get to run the tests (it refused this GPU or driver): not a result.
      status[memcheck]="skipped: compute-sanitizer could not run here"
      detail[memcheck]=$(grep -m1 -iE 'error|unsupported|not supported|failed' "$out/memcheck.log" | cut -c1-300)
    fi
  fi
fi
log "   memcheck: ${status[memcheck]} ${detail[memcheck]}"

# ---- bench -----------------------------------------------------------------------------------
if [ $have_gpu -eq 0 ]; then
  status[bench]="skipped: no GPU"
else
  log "bench: lnmlp-gpu-bench --quick"
  if run_step bench 60 "$carry/bin/lnmlp-gpu-bench" --quick --iters 5 --warmup 2; then
    status[bench]=$(verdict)
    grep -v '^{' "$out/bench.log" | tee -a "$out/gpu-check.log"
  fi
fi
log "   bench: ${status[bench]}"

# ---- peers -----------------------------------------------------------------------------------
if [ $have_gpu -eq 0 ]; then
  status[peers]="skipped: no GPU"
elif ! command -v python3 >/dev/null 2>&1; then
  status[peers]="skipped: no python3 on this machine"
else
  log "peers: bench/gpu/torch_peer.py --quick"
  # The frameworks bring their own CUDA libraries: not the carried ones.
  if LD_LIBRARY_PATH="" run_step peers 40 python3 bench/gpu/torch_peer.py --quick --iters 5 --warmup 2; then
    status[peers]=$(verdict)
    grep -v '^{' "$out/peers.log" | tee -a "$out/gpu-check.log"
  fi
fi
log "   peers: ${status[peers]}"

all_ok
