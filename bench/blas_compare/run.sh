#!/usr/bin/env bash
# Reproduces docs/blas-choice.md:   bash bench/blas_compare/run.sh
# Installs the Debian packages if missing, builds one binary per library,
# measures machine peak, then times the 6 GEMMs of the LN+MLP block
# (fwd+bwd) for each library/configuration and prints a summary table.
# Runtime: ~6-9 minutes on a 2-core Sapphire/Emerald Rapids VM (longer when other
# processes compete for the CPUs: disturbed samples are retried, see "clean" column).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
B="${HERE}/build"
THREADS="${THREADS:-2}"
RUNS="${RUNS:-5}"

PKGS=(libopenblas-openmp-dev libopenblas-pthread-dev libblis-openmp-dev libdnnl-dev)
missing=()
for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  echo "[run] installing: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
echo "[run] packages:"; dpkg-query -W "${PKGS[@]}" | sed 's/^/    /'

bash "${HERE}/build.sh" >/dev/null
echo "[run] built: $(ls "${B}" | tr '\n' ' ')"

echo "[run] env found: OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE-unset} OPENBLAS_L2_SIZE=${OPENBLAS_L2_SIZE-unset} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS-unset} BLIS_ARCH_TYPE=${BLIS_ARCH_TYPE-unset} OMP_NUM_THREADS=${OMP_NUM_THREADS-unset} OMP_WAIT_POLICY=${OMP_WAIT_POLICY-unset}"
# Clean, explicit threading environment for every run.
unset OPENBLAS_CORETYPE OPENBLAS_NUM_THREADS BLIS_NUM_THREADS BLIS_ARCH_TYPE OMP_WAIT_POLICY GOMP_SPINCOUNT || true
export OMP_NUM_THREADS="${THREADS}" OMP_PROC_BIND=false
echo "[run] CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-) (family 6 model $(grep -m1 '^model\s' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')), $(nproc) cpus"

busy() { awk '/^cpu /{print $2+$3+$4+$7+$8}' /proc/stat; }
BUSY0=$(busy); T0=$(date +%s)
times > "${B}/times0.txt"   # builtin in *this* shell (a pipeline would run it in a subshell)
echo "[run] loadavg before: $(cut -d' ' -f1-3 /proc/loadavg)  (other processes on this VM add noise)"
"${B}/bc_peak" | tee "${B}/peak.txt"
PEAKLINE=$(grep '^PEAK|' "${B}/peak.txt")
getp() { echo "${PEAKLINE}" | tr '|' '\n' | grep "^$1=" | cut -d= -f2; }
PF32=$(getp fp32_2t); PBF16=$(getp bf16_2t); PAMX=$(getp amx_2t)
if [[ "${THREADS}" == 1 ]]; then PF32=$(getp fp32_1t); PBF16=$(getp bf16_1t); PAMX=$(getp amx_1t); fi
PEAKARGS=(--peak-fp32 "${PF32}" --peak-bf16 "${PBF16}" --peak-amx "${PAMX}" --threads "${THREADS}" --runs "${RUNS}")
echo "[run] fractions below use the ${THREADS}-thread peaks: fp32 ${PF32}, avx512_bf16 ${PBF16}, AMX ${PAMX} GFLOP/s"
echo "[run] %bf16pk is vs the AVX512-BF16 (vdpbf16ps) peak; AMX peak is much higher, see %AMXpk"

SUMS="${B}/summary.txt"; : > "${SUMS}"
INTER="${B}/interplay.txt"; : > "${INTER}"
# run_one LABEL BINARY [ENV=VAL ...] [-- extra args]
run_one() {
  local label="$1" bin="$2"; shift 2
  local envs=() extra=()
  while (($#)); do
    if [[ "$1" == "--" ]]; then shift; extra=("$@"); break; fi
    envs+=("$1"); shift
  done
  echo; echo "################ ${label}  (${envs[*]:-default env})"
  local out; out=$(env "${envs[@]}" "${B}/${bin}" "${PEAKARGS[@]}" "${extra[@]}" 2>&1) || true
  echo "${out}" | grep -v -E '^(SUMMARY|INTERPLAY)\|'
  echo "${out}" | grep '^SUMMARY|' | sed "s/^SUMMARY|[^|]*|/${label}|/" >> "${SUMS}" || true
  echo "${out}" | grep '^INTERPLAY|' | sed "s/^INTERPLAY|[^|]*|/${label}|/" >> "${INTER}" || true
}

# Autodetected cores are 5-10x slower (see doc): 3 runs, 1 warm-up, to save time.
run_one "OpenBLAS-omp autodetect"   bc_openblas_omp -- --quick --runs 3
run_one "OpenBLAS-omp SkylakeX"     bc_openblas_omp OPENBLAS_CORETYPE=SkylakeX
run_one "OpenBLAS-omp Cooperlake"   bc_openblas_omp OPENBLAS_CORETYPE=Cooperlake
run_one "OpenBLAS-pth SkylakeX"     bc_openblas_pth OPENBLAS_CORETYPE=SkylakeX
run_one "BLIS-omp autodetect"       bc_blis_omp -- --runs 3
run_one "BLIS-omp skx(ARCH_TYPE=0)" bc_blis_omp BLIS_ARCH_TYPE=0
echo; echo "################ oneDNN verbose (small verification shapes only; shows ISA + implementation)"
ONEDNN_VERBOSE=1 BC_VERIFY_ONLY=1 "${B}/bc_dnnl" "${PEAKARGS[@]}" 2>&1 | grep -E '^onednn_verbose,(info,cpu|create|exec)' | grep -E 'info|f32:|bf16' | head -8
run_one "oneDNN matmul"             bc_dnnl
# The VM is shared and noisy (peak drifts by 20-30% over minutes): repeat the fp32
# contenders in interleaved rounds so they see similar conditions.
for r in 2; do
  run_one "r${r} OpenBLAS-omp SkylakeX" bc_openblas_omp OPENBLAS_CORETYPE=SkylakeX BC_ONLY_FP32=1
  run_one "r${r} BLIS-omp skx"          bc_blis_omp BLIS_ARCH_TYPE=0 BC_ONLY_FP32=1
  run_one "r${r} oneDNN matmul"         bc_dnnl BC_ONLY_FP32=1
done
run_one "OpenBLAS-pth SkylakeX, OMP_WAIT_POLICY=passive" bc_openblas_pth OPENBLAS_CORETYPE=SkylakeX OMP_WAIT_POLICY=passive BC_ONLY_INTERPLAY=1

echo
echo "==================== SUMMARY: total of the 6 GEMMs (fwd+bwd), T=4096 H=1024, ${THREADS} threads, median of ${RUNS} ===================="
printf "%-27s %-5s %-13s %10s %9s %8s %7s %12s %s\n" "library / setting" "prec" "config" "total ms" "GFLOP/s" "%peak" "%AMXpk" "sum(min) ms" "check"
while IFS='|' read -r lbl prec cfg ms gf mn chk; do
  if [[ "${ms}" == NA ]]; then
    printf "%-27s %-5s %-13s %10s %9s %8s %7s %12s %s\n" "${lbl}" "${prec}" "${cfg}" "n/a" "n/a" "" "" "" "not available"
  else
    pk=$([[ ${prec} == fp32 ]] && echo "${PF32}" || echo "${PBF16}")
    apk=$([[ ${prec} == bf16 ]] && awk -v g="${gf}" -v p="${PAMX}" 'BEGIN{printf "%.1f%%", 100*g/p}' || echo "")
    printf "%-27s %-5s %-13s %10s %9s %7.1f%% %7s %12s %s\n" "${lbl}" "${prec}" "${cfg}" "${ms}" "${gf}" \
      "$(awk -v g="${gf}" -v p="${pk}" 'BEGIN{print 100*g/p}')" "${apk}" "${mn}" "${chk}"
  fi
done < "${SUMS}"
echo "(total ms = sum of per-GEMM medians; GFLOP/s from that; sum(min) = sum of per-GEMM best runs, a noise-free-ish lower bound)"
echo "(%peak: fp32 rows vs AVX-512 FMA peak ${PF32} GF/s; bf16 rows vs AVX512-BF16 vdpbf16ps peak ${PBF16} GF/s -- AMX rows exceed 100% because AMX peak (${PAMX}) is higher)"
echo
echo "==================== OpenMP interplay (medians, ms) ===================="
printf "%-48s %11s %11s %11s %11s\n" "library / setting" "ourOMP idle" "ourOMP aftG" "GEMM idle" "GEMM aftOMP"
while IFS='|' read -r lbl b a gb ga; do
  printf "%-48s %11s %11s %11s %11s\n" "${lbl}" "${b}" "${a}" "${gb}" "${ga}"
done < "${INTER}"
echo "(ourOMP = 4M-element SiLU in '#pragma omp parallel for'; GEMM = 1024^3 sgemm; 'aftX' = started right after X returned)"
echo "[run] loadavg after: $(cut -d' ' -f1-3 /proc/loadavg)"
BUSY1=$(busy); T1=$(date +%s); HZ=$(getconf CLK_TCK)
times > "${B}/times.txt"
cpu_of() { tail -1 "$1" | tr 'ms' '  ' | awk '{print $1*60+$2+$3*60+$4}'; }
cu=$(awk -v a="$(cpu_of "${B}/times.txt")" -v b="$(cpu_of "${B}/times0.txt")" 'BEGIN{print a-b}'); cs=0
awk -v b=$((BUSY1-BUSY0)) -v hz="${HZ}" -v cu="${cu}" -v cs="${cs}" -v w=$((T1-T0)) -v n="$(nproc)" \
  'BEGIN{o=b/hz-(cu+cs); if(o<0)o=0; printf "[run] CPU time used by OTHER processes on this machine during the run: %.0f s of %d s x %d cpus (%.0f%%)\n", o, w, n, 100*o/(w*n)}'
