#!/usr/bin/env bash
# The block's six GEMMs (forward and backward) through every candidate GEMM library on this
# machine, fp32 and bf16 inputs, 1 and 2 threads, T = 256, 1024, 4096, H = 1024, F = 4096 and
# the gated F = 2730 (GEMM1 out 2F): time, GFLOP/s, share of the measured fp32 FMA peak
# (bench/peak.cpp) and heap allocations per call (tests/alloc/alloc_counter.c). Results and the
# reading: docs/gemm-libraries.md. Libraries:
#   onednn-debian     oneDNN 2.6.3, Debian libdnnl-dev (OpenMP, libgomp)
#   onednn-pypi       oneDNN 3.13 from PyPI onednn-devel 2026.1 (TBB threading, SYCL CPU runtime)
#   onednn-pypi-gomp  oneDNN 3.2 from PyPI onednn-devel-cpu-gomp 2023.2 (OpenMP, libgomp)
#   openblas-pypi     OpenBLAS 0.3.34 from PyPI scipy-openblas32 (pthreads; fp32 only)
#   openblas-pypi-haswell  the same with OPENBLAS_CORETYPE=Haswell (its AVX2 kernels), as this
#                     workplace's environment sets it (run.sh unsets it for all other runs)
#   onednn-debian-avx2, onednn-pypi-gomp-avx2  those oneDNN builds with ONEDNN_MAX_CPU_ISA=AVX2:
#                     an AVX2-only CPU (Zen 3) imitated on an AVX-512 one; like
#                     openblas-pypi-haswell, their "% peak" is of the AVX2 FMA peak
#   mkl               oneMKL 2026.2 from PyPI mkl-devel, MKL_THREADING_LAYER=GNU (libgomp)
#   mkl-intel         the same with MKL_THREADING_LAYER=INTEL (Intel's libiomp5); not by default
#   blis              BLIS 0.9, Debian libblis-openmp-dev (fp32 only)
#   openblas-debian   OpenBLAS, Debian libopenblas-openmp-dev (fp32 only); not by default
# Installs what it needs: the Debian packages with apt-get, the PyPI ones into venvs under
# bench/six_gemms/build (once; about 2.8 GB, most of it the SYCL/OpenCL runtime onednn-devel
# pulls in, ~45 s). About 7 minutes on 2 cores; --quick: 2 threads, T = 256 and 1024, 3 reps.
#     bash bench/six_gemms/run.sh [--quick]
#     LIBS="mkl mkl-intel" THREADS_LIST="2" TOKENS=1024 REPS=7 bash bench/six_gemms/run.sh
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BENCH="$(dirname "${HERE}")"
REPO="$(dirname "${BENCH}")"
OUT="${HERE}/build"
mkdir -p "${OUT}"

QUICK=0
[[ "${1:-}" == "--quick" ]] && QUICK=1
LIBS="${LIBS:-onednn-debian onednn-pypi onednn-pypi-gomp openblas-pypi openblas-pypi-haswell onednn-debian-avx2 onednn-pypi-gomp-avx2 mkl blis}"
if ((QUICK)); then
  THREADS_LIST="${THREADS_LIST:-2}" TOKENS="${TOKENS:-256,1024}" REPS="${REPS:-3}"
else
  THREADS_LIST="${THREADS_LIST:-1 2}" TOKENS="${TOKENS:-256,1024,4096}" REPS="${REPS:-5}"
fi
REPS_LARGE="${REPS_LARGE:-3}"

# ---- Debian packages ----
PKGS=(libdnnl-dev)
[[ " ${LIBS} " == *" blis "* ]] && PKGS+=(libblis-openmp-dev)
[[ " ${LIBS} " == *" openblas-debian "* ]] && PKGS+=(libopenblas-openmp-dev)
missing=()
for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# ---- PyPI packages, each venv made once (a stamp file records what it holds) ----
venv() {  # venv DIR PACKAGE...
  local dir="$1"; shift
  if [[ ! -f "${dir}/.six_gemms_stamp" || "$(cat "${dir}/.six_gemms_stamp")" != "$*" ]]; then
    rm -rf "${dir}"
    python3 -m venv "${dir}"
    "${dir}/bin/pip" install -q "$@"
    echo "$*" >"${dir}/.six_gemms_stamp"
  fi
}
V="${OUT}/venv" VG="${OUT}/venv-gomp"
venv "${V}" onednn-devel==2026.1.0 scipy-openblas32==0.3.34.481.3 mkl-devel==2026.2.1 mkl-include==2026.2.1
[[ " ${LIBS} " == *" onednn-pypi-gomp "* ]] && venv "${VG}" onednn-devel-cpu-gomp==2023.2.0
SOB="$("${V}/bin/python" -c 'import scipy_openblas32 as s; print(s.get_lib_dir())')"
SOB_INC="$("${V}/bin/python" -c 'import scipy_openblas32 as s; print(s.get_include_dir())')"

# ---- build: one binary per library ----
ML=/usr/lib/x86_64-linux-gnu MI=/usr/include/x86_64-linux-gnu
FLAGS=(-std=c++17 -O2 -fopenmp -Wall -Wextra)
gcc -O2 -c "${REPO}/tests/alloc/alloc_counter.c" -o "${OUT}/alloc_counter.o"
g++ -O2 -march=native -fopenmp -c "${BENCH}/peak.cpp" -o "${OUT}/peak.o"
g++ -O2 -march=haswell -fopenmp -c "${BENCH}/peak.cpp" -o "${OUT}/peak_avx2.o"  # the AVX2 FMA peak, for the *-avx2 rows
COMMON=("${HERE}/six_gemms.cpp" "${OUT}/peak.o" "${OUT}/alloc_counter.o")
rpath() { echo "-L$1" "-Wl,--disable-new-dtags,-rpath,$1"; }  # RPATH: also for the libraries' own dependencies
build() {  # build LIB
  local o="${OUT}/six_gemms_$1"
  case "$1" in
    onednn-debian) g++ "${FLAGS[@]}" -DSIX_GEMMS_ONEDNN "${COMMON[@]}" -o "$o" -ldnnl
      g++ "${FLAGS[@]}" -DSIX_GEMMS_ONEDNN "${HERE}/six_gemms.cpp" "${OUT}/peak_avx2.o" "${OUT}/alloc_counter.o" \
        -o "${OUT}/six_gemms_peak-avx2" -ldnnl ;;
    *-avx2) [[ -x "${OUT}/six_gemms_${1%-avx2}" ]] || build "${1%-avx2}" ;;
    onednn-pypi) g++ "${FLAGS[@]}" -DSIX_GEMMS_ONEDNN -I"${V}/include" "${COMMON[@]}" -o "$o" $(rpath "${V}/lib") -ldnnl -ltbb ;;
    onednn-pypi-gomp) g++ "${FLAGS[@]}" -DSIX_GEMMS_ONEDNN -I"${VG}/include" "${COMMON[@]}" -o "$o" $(rpath "${VG}/lib") -ldnnl ;;
    openblas-pypi | openblas-pypi-haswell)
      [[ -x "${OUT}/six_gemms_openblas-pypi" ]] && [[ "$1" == openblas-pypi-haswell ]] && return
      g++ "${FLAGS[@]}" -DSIX_GEMMS_SCIPY_OPENBLAS -I"${SOB_INC}" "${COMMON[@]}" -o "${OUT}/six_gemms_openblas-pypi" $(rpath "${SOB}") -lscipy_openblas ;;
    mkl | mkl-intel)
      [[ -x "${OUT}/six_gemms_mkl" ]] && [[ "$1" == mkl-intel ]] && return
      g++ "${FLAGS[@]}" -DSIX_GEMMS_MKL -I"${V}/include" "${COMMON[@]}" -o "${OUT}/six_gemms_mkl" $(rpath "${V}/lib") -l:libmkl_rt.so.3 ;;
    blis) g++ "${FLAGS[@]}" -DSIX_GEMMS_CBLAS="\"BLIS $(dpkg-query -W -f='${Version}' libblis-openmp-dev) (Debian, OpenMP)\"" \
            -I/usr/include/blis "${COMMON[@]}" -o "$o" $(rpath "${ML}/blis-openmp") -lblis ;;
    openblas-debian) g++ "${FLAGS[@]}" -DSIX_GEMMS_CBLAS="\"OpenBLAS $(dpkg-query -W -f='${Version}' libopenblas-openmp-dev) (Debian, OpenMP)\"" \
            -I"${MI}/openblas-openmp" "${COMMON[@]}" -o "$o" $(rpath "${ML}/openblas-openmp") -lopenblas ;;
    *) echo "unknown library $1" >&2; exit 2 ;;
  esac
}
rm -f "${OUT}"/six_gemms_*
build onednn-debian  # also measures the peak
for lib in ${LIBS}; do build "${lib}"; done

# ---- run ----
LOG="${OUT}/results.txt"
: >"${LOG}"
unset OPENBLAS_CORETYPE OPENBLAS_NUM_THREADS OPENBLAS_L2_SIZE MKL_NUM_THREADS MKL_THREADING_LAYER MKL_CBWR \
  BLIS_NUM_THREADS BLIS_ARCH_TYPE OMP_WAIT_POLICY GOMP_SPINCOUNT ONEDNN_VERBOSE DNNL_VERBOSE || true
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), family $(grep -m1 '^cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')," \
  "model $(grep -m1 '^model\s' /proc/cpuinfo | cut -d: -f2 | tr -d ' '), $(nproc) CPUs;" \
  "flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512f|avx512_bf16|amx_tile|amx_bf16)$' | tr '\n' ' ')" | tee -a "${LOG}"
declare -A PEAK PEAK_AVX2
for t in ${THREADS_LIST}; do
  line="$(OMP_NUM_THREADS=$t "${OUT}/six_gemms_onednn-debian" --peak --threads "$t")"
  echo "${line}" | tee -a "${LOG}"
  PEAK[$t]="$(echo "${line}" | sed -n 's/.* fp32=\([0-9.]*\).*/\1/p')"
  line="$(OMP_NUM_THREADS=$t "${OUT}/six_gemms_peak-avx2" --peak --threads "$t")"
  echo "${line}" | tee -a "${LOG}"
  PEAK_AVX2[$t]="$(echo "${line}" | sed -n 's/.* fp32=\([0-9.]*\).*/\1/p')"
done
run() {  # run LIB DTYPE THREADS [extra six_gemms arguments]
  local lib="$1" dtype="$2" t="$3"; shift 3
  local bin="${OUT}/six_gemms_${lib}" env=(OMP_NUM_THREADS="$t") peak="${PEAK[$t]}"
  case "${lib}" in
    *-avx2) bin="${OUT}/six_gemms_${lib%-avx2}" env+=(ONEDNN_MAX_CPU_ISA=AVX2) peak="${PEAK_AVX2[$t]}" ;;
    onednn-pypi) env+=(OCL_ICD_FILENAMES="${V}/lib/libintelocl.so") ;;  # the OpenCL CPU device SYCL needs
    openblas-pypi) env+=(OPENBLAS_NUM_THREADS="$t") ;;
    openblas-pypi-haswell) bin="${OUT}/six_gemms_openblas-pypi" env+=(OPENBLAS_NUM_THREADS="$t" OPENBLAS_CORETYPE=Haswell)
      peak="${PEAK_AVX2[$t]}" ;;
    mkl) env+=(MKL_THREADING_LAYER=GNU MKL_NUM_THREADS="$t") ;;
    mkl-intel) bin="${OUT}/six_gemms_mkl" env+=(MKL_THREADING_LAYER=INTEL MKL_NUM_THREADS="$t") ;;
    blis) env+=(BLIS_NUM_THREADS="$t") ;;
  esac
  env "${env[@]}" "${bin}" --threads "$t" --dtype "${dtype}" --tokens "${TOKENS}" --ffn 4096,2730g --reps "${REPS}" \
    --reps-large "${REPS_LARGE}" --peak-gflops "${peak}" --breakdown "$@" | sed "s/^/${lib}${TAG:-} /" | tee -a "${LOG}"
}
# CPU time other processes took during each run (all CPUs' busy time minus this run's own): a
# disturbed run shows up as "foreign CPU" well above 0 in its CHECK line; rerun it then.
HZ="$(getconf CLK_TCK)"
busy() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9}' /proc/stat; }
own() {  # sets OWN: CPU seconds of this shell's finished children (times, run in this shell)
  times >"${OUT}/.times"
  OWN="$(awk 'NR==2{split($1,a,"m"); split($2,b,"m"); print a[1]*60+a[2]+b[1]*60+b[2]}' "${OUT}/.times")"
}
checked() {  # checked LIB DTYPE THREADS [...]: run, then report other processes' CPU time
  local b0 o0 w0=${SECONDS}; own; o0="${OWN}"; b0="$(busy)"
  run "$@"
  local b1; b1="$(busy)"; own
  echo "CHECK $1${TAG:-} $2 threads=$3: foreign CPU $(awk -v b0="${b0}" -v b1="${b1}" -v o0="${o0}" -v o1="${OWN}" -v hz="${HZ}" \
    'BEGIN{f=(b1-b0)/hz-(o1-o0); printf "%.1f", f < 0 ? 0 : f}') s in $((SECONDS - w0)) s" | tee -a "${LOG}"
}
start=${SECONDS}
for lib in ${LIBS}; do
  for dtype in f32 bf16; do
    [[ "${dtype}" == bf16 && "${lib}" == openblas-pypi-haswell ]] && continue  # no bf16 GEMM in either
    for t in ${THREADS_LIST}; do checked "${lib}" "${dtype}" "$t"; done
  done
done
if ((!QUICK)); then  # the weight-alignment effect on small batches (src/cpu/gemm_onednn.cpp, OffsetWeightsGemm)
  t2="${THREADS_LIST##* }"
  for off in 0 16; do
    TAG="@weights+${off}B" TOKENS=256 checked onednn-debian f32 "${t2}" --offset "${off}" --ffn 4096
  done
fi
echo "benchmark time: $((SECONDS - start)) s" | tee -a "${LOG}"

# ---- summary table (markdown) ----
echo
echo "| library | dtype | threads | T | F | six GEMMs ms | GFLOP/s | % fp32 peak | heap allocs, six calls (KiB) |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
grep " RESULT " "${LOG}" | grep -v "^[^ ]*@" | awk '{
  lib = $1; delete kv
  for (i = 3; i <= NF && $i != "|"; ++i) { split($i, p, "="); kv[p[1]] = p[2] }
  if (kv["ms"] == "none") printf "| %s | %s | %s | %s | %s | none | | | |\n", lib, kv["dtype"], kv["threads"], kv["T"], kv["F"]
  else printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s (%s) |\n", lib, kv["dtype"], kv["threads"], kv["T"], kv["F"], kv["ms"], kv["gflops"], kv["peak"], kv["allocs"], kv["alloc_kib"]
}'
