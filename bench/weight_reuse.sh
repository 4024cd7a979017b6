#!/usr/bin/env bash
# What LNMLP_CALL_WEIGHTS_UNCHANGED saves: lnmlp-bench's "weights reused" line (the same step
# with the weight copies reused, interleaved with the plain step) for bf16 I/O, every FP8 recipe,
# T = 256 and 4096 (H 1024, F 4096, gelu), natively and with oneDNN capped at AVX2 (no bf16 GEMM:
# the widened bf16 weights are the copies). Run after the CMake build:
#   bash bench/weight_reuse.sh [path/to/lnmlp-bench]
set -euo pipefail
cd "$(dirname "$0")/.."
bench="${1:-build/release/bench/lnmlp-bench}"
printf "%-8s %-6s %-8s %12s %12s  %s\n" gemms T recipe "fwd+bwd ms" "reused ms" "saving"
for isa in native avx2; do
  for T in 256 4096; do
    for recipe in none delayed current block mxfp8; do
      [ "$isa" = avx2 ] && [ "$recipe" != none ] && continue
      iters=15
      [ "$T" = 4096 ] && iters=5
      env=()
      [ "$isa" = avx2 ] && env=(DNNL_MAX_CPU_ISA=AVX2)
      out=$(env "${env[@]}" "$bench" --tokens "$T" --dtype bf16 --recipe "$recipe" --iters "$iters" 2>/dev/null)
      total=$(echo "$out" | awk '/^forward \+ backward/ {print $4}')
      reused=$(echo "$out" | awk '/^weights reused/ {print $3}')
      saving=$(echo "$out" | sed -n 's/^weights reused.*saves //p')
      printf "%-8s %-6s %-8s %12s %12s  %s\n" "$isa" "$T" "$recipe" "$total" "$reused" "$saving"
    done
  done
done
