#!/usr/bin/env bash
# The GPU check, on a machine with an NVIDIA GPU (each step has a timeout: at most 8 minutes in all on an H200):
#   0. the FP8 kernels against the CPU backend's quantizers, bit for bit (a failure names its kernel);
#   1. the GPU test suite (CUDA backend against the CPU backend, CUDA graphs, error paths);
#   2. compute-sanitizer --tool memcheck on a small configuration (a test filter);
#   3. lnmlp-gpu-bench (the block and its GEMMs alone, in the same run);
#   4. the framework peers (bench/gpu/torch_peer.py: PyTorch eager, torch.compile, JAX), if installed.
# Writes at most 9 flat files into ${OUT:-./gpu-check-out}: summary.json and one log per step.
#
# Binaries: LNMLP_GPU_BUILD (default build/gpu) made by scripts/build-gpu-carry.sh and carried
# here; if it is missing, this script builds one (that needs oneDNN, CUDA and GoogleTest here).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-./gpu-check-out}
mkdir -p "$out"
carry=${LNMLP_GPU_BUILD:-build/gpu}
t_start=$(date +%s)
log() { echo "[gpu-check $(($(date +%s) - t_start))s] $*" | tee -a "$out/gpu-check.log"; }
: > "$out/gpu-check.log"

if [ ! -x "$carry/bin/lnmlp_gpu_tests" ]; then
  log "no prebuilt $carry; building it here (scripts/build-gpu-carry.sh)"
  if ! bash scripts/build-gpu-carry.sh >> "$out/gpu-check.log" 2>&1; then
    log "build failed (see gpu-check.log); build $carry elsewhere with scripts/build-gpu-carry.sh and carry it"
  fi
fi
if [ -f "$carry/env.sh" ]; then
  # shellcheck disable=SC1091
  source "$carry/env.sh"
fi
# cuBLASLt 13 is not carried (500 MB): find the machine's (toolkit, or the pip wheels of torch/jax).
cublas_dirs=$(
  { ldconfig -p 2>/dev/null | awk '/libcublasLt\.so\.13/ { print $NF }' | xargs -r -n1 dirname
    ls -d /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-13*/lib64 2>/dev/null
    python3 - <<'PY' 2>/dev/null
import glob, site, sys
for base in site.getsitepackages() + [site.getusersitepackages()]:
    for d in glob.glob(base + "/nvidia/*/lib") + glob.glob(base + "/nvidia/cu13/lib"):
        print(d)
PY
  } | while read -r d; do [ -e "$d/libcublasLt.so.13" ] && echo "$d"; done | awk '!seen[$0]++' | head -n 1)
if [ -n "$cublas_dirs" ]; then
  export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$cublas_dirs"
  log "libcublasLt.so.13 from $cublas_dirs"
else
  log "libcublasLt.so.13 not found on this machine; the CUDA module will not load"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/nvidia-smi.txt" 2>&1 || true
log "GPU: $(head -n1 "$out/nvidia-smi.txt")"
log "ldd lnmlp_cuda: $(ldd "$carry/lib/liblnmlp_cuda.so.1" 2>&1 | grep -E 'not found|cublasLt' | tr '\n' ' ')"

status_of() { if [ "$1" -eq 0 ]; then echo pass; elif [ "$1" -eq 124 ]; then echo timeout; else echo "fail($1)"; fi; }

# 0. Kernel tests.
kernels_rc=0
if [ -x "$carry/bin/lnmlp_gpu_kernel_tests" ]; then
  log "0/4 lnmlp_gpu_kernel_tests"
  timeout 60 "$carry/bin/lnmlp_gpu_kernel_tests" --gtest_brief=1 > "$out/gpu-kernel-tests.log" 2>&1
  kernels_rc=$?
  grep -q "no CUDA device" "$out/gpu-kernel-tests.log" && kernels_rc=3
  log "   $(status_of $kernels_rc): $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/gpu-kernel-tests.log" | tr '\n' ' ')"
fi

# 1. GPU tests.
log "1/4 lnmlp_gpu_tests"
timeout 150 "$carry/bin/lnmlp_gpu_tests" --gtest_brief=1 > "$out/gpu-tests.log" 2>&1
tests_rc=$?
tests_summary=$(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/gpu-tests.log" | tr '\n' ' ' | sed 's/"/'"'"'/g')
# On a GPU machine, tests that skipped for want of a GPU are a failure of the check (the module did
# not load, cuBLASLt is missing, the driver is too old): the reason is in the log.
if grep -q "no usable GPU" "$out/gpu-tests.log"; then
  tests_rc=3
  tests_summary="$tests_summary; skipped: $(grep -m1 'no usable GPU' "$out/gpu-tests.log" | sed 's/"/'"'"'/g')"
fi
log "   $(status_of $tests_rc): $tests_summary"

# 2. memcheck on a small configuration.
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-13*/bin/compute-sanitizer 2>/dev/null | head -n1)
if [ -n "$sanitizer" ]; then
  log "2/4 compute-sanitizer memcheck"
  timeout 120 "$sanitizer" --tool memcheck --error-exitcode 9 \
    "$carry/bin/lnmlp_gpu_tests" --gtest_brief=1 \
    --gtest_filter='All/CudaVsCpu.EveryRematPolicyMatchesTheCpuBackend/bf16_layernorm_gelu_b1_b2_T37:All/CudaVsCpu.EveryRematPolicyMatchesTheCpuBackend/f16_rmsnorm_clamped_swiglu_b1_T37:CudaGraph.*:CudaErrors.*:All/CudaFp8VsCpu.ForwardAndGradientsMatchTheCpuBackend/delayed_bf16_swiglu_T256_H128_F192:All/CudaFp8VsCpu.ForwardAndGradientsMatchTheCpuBackend/mxfp8_bf16_swiglu_T200_H144_F176:CudaFp8Graph.*' \
    > "$out/memcheck.log" 2>&1
  memcheck_rc=$?
else
  echo "compute-sanitizer not found" > "$out/memcheck.log"
  memcheck_rc=127
fi
memcheck_summary=$(grep -E 'ERROR SUMMARY' "$out/memcheck.log" | tail -n1)
log "   $(status_of $memcheck_rc): $memcheck_summary"

# 3. The GPU benchmark.
log "3/4 lnmlp-gpu-bench"
timeout 150 "$carry/bin/lnmlp-gpu-bench" --quick --iters 5 --warmup 2 > "$out/gpu-bench.log" 2>&1
bench_rc=$?
log "   $(status_of $bench_rc)"
cat "$out/gpu-bench.log" | grep -v '^{' | tee -a "$out/gpu-check.log"

# 4. Framework peers (short: hidden 4096 only).
log "4/4 torch_peer.py --quick"
timeout 75 python3 bench/gpu/torch_peer.py --quick --iters 5 --warmup 2 > "$out/peers.log" 2>&1
peers_rc=$?
log "   $(status_of $peers_rc)"
grep -v '^{' "$out/peers.log" | tee -a "$out/gpu-check.log"

# Summary.
python3 - "$out" "$tests_rc" "$memcheck_rc" "$bench_rc" "$peers_rc" "$tests_summary" "$memcheck_summary" \
  "$(($(date +%s) - t_start))" "$kernels_rc" <<'PY'
import json, sys
out, t_rc, m_rc, b_rc, p_rc, t_sum, m_sum, secs, k_rc = sys.argv[1:]
def lines(name):
    try:
        return [json.loads(l) for l in open(f"{out}/{name}") if l.startswith("{")]
    except OSError:
        return []
gpu = open(f"{out}/nvidia-smi.txt").read().strip()
summary = {
    "gpu": gpu,
    "gpu_kernel_tests": {"rc": int(k_rc)},
    "gpu_tests": {"rc": int(t_rc), "summary": t_sum.strip()},
    "memcheck": {"rc": int(m_rc), "summary": m_sum.strip()},
    "bench": {"rc": int(b_rc), "cases": lines("gpu-bench.log")},
    "peers": {"rc": int(p_rc), "cases": lines("peers.log")},
    "seconds": int(secs),
    "ok": int(k_rc) == 0 and int(t_rc) == 0 and int(m_rc) == 0 and int(b_rc) == 0,
}
json.dump(summary, open(f"{out}/summary.json", "w"), indent=1)
print("summary.json:", "ok" if summary["ok"] else "NOT ok")
PY
log "done; files in $out: $(ls "$out" | tr '\n' ' ')"
[ "$kernels_rc" -eq 0 ] && [ "$tests_rc" -eq 0 ] && [ "$memcheck_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
