#!/usr/bin/env bash
# The CPU backend's FP8 operand passes alone (fp8_operands.cpp): quantize and decode, ns per
# element, at each x86-64 ISA level of the CPU kernels this CPU runs (x86-64-v3: AVX2, arithmetic
# decode; x86-64-v4: AVX-512, decode by table lookup), 1 and all threads. A few seconds.
#     bash bench/fp8_operands/run.sh
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$(dirname "${HERE}")")"
OUT="${HERE}/build"
mkdir -p "${OUT}"
for level in x86-64-v3 x86-64-v4; do
  if ! gcc -march="${level}" -dM -E - </dev/null >/dev/null 2>&1; then continue; fi
  feature=$([ "${level}" = x86-64-v4 ] && echo avx512bw || echo avx2)
  if ! grep -qw "${feature}" /proc/cpuinfo; then
    echo "${level}: this CPU lacks it, skipped"
    continue
  fi
  ns="bench_${level//-/_}"
  g++ -O3 -std=c++17 -march="${level}" -fopenmp -fno-math-errno -DLNMLP_CPU_ISA="${ns}" \
    -I"${REPO}/src" -I"${REPO}/include" "${HERE}/fp8_operands.cpp" -o "${OUT}/fp8_operands_${ns}"
  "${OUT}/fp8_operands_${ns}" "${level}" "$(nproc)"
done
