#!/usr/bin/env bash
# Builds one benchmark executable per library (OpenBLAS and BLIS both export
# cblas_sgemm, so they must not be linked into the same binary).
# Output: bench/blas_compare/build/bc_{peak,openblas_omp,openblas_pth,blis_omp,dnnl}
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${HERE}/build"
mkdir -p "${OUT}"
SRC="${HERE}/blas_compare.cpp"
CXX="${CXX:-g++}"
ML=/usr/lib/x86_64-linux-gnu
MI=/usr/include/x86_64-linux-gnu
# -mamx-* only matter for the AMX peak loop (the binary checks nothing else).
CXXFLAGS=(-std=c++17 -O3 -march=native -mamx-tile -mamx-bf16 -mavx512bf16 -fopenmp -Wall -Wno-unused-function)

echo "[build] peak"
"${CXX}" "${CXXFLAGS[@]}" -DBC_PEAK "${SRC}" -o "${OUT}/bc_peak"

# OpenBLAS and BLIS: link each variant's directory explicitly (not the update-alternatives
# symlink) and pin it with an rpath, so both variants can be measured regardless of which one the
# alternatives system currently selects.
#   build_variants NAME DEFINE EXTRA_LIBS
build_variants() {
  local name=$1 define=$2 extra=$3 v d tag
  for v in openmp pthread; do
    d="${ML}/${name}-${v}"
    if [[ -e "${d}/lib${name}.so" ]]; then
      tag=$([[ $v == openmp ]] && echo omp || echo pth)
      echo "[build] ${name}-${v}"
      "${CXX}" "${CXXFLAGS[@]}" "-D${define}" -DBC_VARIANT="\"(${v})\"" -I"${MI}/${name}-${v}" \
        "${SRC}" -o "${OUT}/bc_${name}_${tag}" -L"${d}" -Wl,-rpath,"${d}" "-l${name}" "${extra}"
    else
      echo "[build] skip ${name}-${v} (not installed)"
    fi
  done
}
build_variants openblas BC_OPENBLAS -ldl
build_variants blis BC_BLIS -lm

if [[ -e /usr/include/oneapi/dnnl/dnnl.hpp ]]; then
  echo "[build] onednn"
  "${CXX}" "${CXXFLAGS[@]}" -DBC_DNNL -DBC_VARIANT="\"(matmul)\"" "${SRC}" -o "${OUT}/bc_dnnl" -ldnnl
fi
ls -1 "${OUT}"
