#!/usr/bin/env bash
# The block's six fp32 GEMMs through oneDNN, OpenBLAS and BLIS on this machine (docs/cpu-backend.md,
# "CPUs without AVX-512"), at T=4096 and, for the small-batch alignment effect of oneDNN's AVX2
# sgemm driver, at T=256 with the weights 64-byte aligned and at a 16-byte offset. Installs the
# Debian libraries it compares if missing. About 2 minutes on 2 cores.
#     bash bench/six_gemms/run.sh
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${HERE}/build"
mkdir -p "${OUT}"
PKGS=(libdnnl-dev libopenblas-openmp-dev libblis-openmp-dev)
missing=()
for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
ML=/usr/lib/x86_64-linux-gnu MI=/usr/include/x86_64-linux-gnu
FLAGS=(-std=c++17 -O2 -fopenmp -Wall -Wextra)
g++ "${FLAGS[@]}" -DSIX_GEMMS_ONEDNN "${HERE}/six_gemms.cpp" -o "${OUT}/six_gemms_onednn" -ldnnl
g++ "${FLAGS[@]}" -DSIX_GEMMS_CBLAS="\"OpenBLAS cblas_sgemm\"" -I"${MI}/openblas-openmp" "${HERE}/six_gemms.cpp" -o "${OUT}/six_gemms_openblas" \
  -L"${ML}/openblas-openmp" -Wl,-rpath,"${ML}/openblas-openmp" -lopenblas
g++ "${FLAGS[@]}" -DSIX_GEMMS_CBLAS="\"BLIS cblas_sgemm\"" -I/usr/include/blis "${HERE}/six_gemms.cpp" -o "${OUT}/six_gemms_blis" \
  -L"${ML}/blis-openmp" -Wl,-rpath,"${ML}/blis-openmp" -lblis
export OMP_NUM_THREADS="${THREADS:-2}"
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE || true
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), ${OMP_NUM_THREADS} threads"
for lib in onednn openblas blis; do "${OUT}/six_gemms_${lib}" 4096; done
for lib in onednn openblas; do
  for off in 0 16; do "${OUT}/six_gemms_${lib}" 256 "${off}"; done
done
