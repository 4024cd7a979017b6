#!/usr/bin/env bash
# Builds, on this machine (no GPU needed: nvcc and cuBLASLt headers suffice), what
# scripts/gpu-check.sh runs on a GPU machine, as a small directory to carry there:
#
#   build/gpu-build/   the CMake build tree (Release, -DLNMLP_NATIVE=OFF -DLNMLP_BUILD_BENCH=ON); stays here
#   build/gpu/         what travels (well under 60 MiB):
#       lib/           liblnmlp.so.1, liblnmlp_cuda.so.1, and what the GPU machine lacks: oneDNN
#                      (libdnnl.so.2) and its libOpenCL.so.1 loader stub, libgomp.so.1
#       bin/           lnmlp_gpu_kernel_tests, lnmlp_gpu_tests, lnmlp-gpu-bench (stripped)
#       env.sh         sets LD_LIBRARY_PATH for them
#       MANIFEST       what was built, from which commit, with which CUDA
#
# Usage: bash scripts/build-gpu-carry.sh        (then carry build/gpu and run scripts/gpu-check.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
tree=build/gpu-build
carry=build/gpu

cmake -S . -B "$tree" -DCMAKE_BUILD_TYPE=Release -DLNMLP_NATIVE=OFF -DLNMLP_BUILD_BENCH=ON -DLNMLP_BUILD_TESTS=ON \
  -DLNMLP_CUDA=ON ${LNMLP_CUDA_ARCHS:+-DCMAKE_CUDA_ARCHITECTURES="$LNMLP_CUDA_ARCHS"} >/dev/null
cmake --build "$tree" -j"$(nproc)" --target lnmlp lnmlp_cuda lnmlp_gpu_kernel_tests lnmlp_gpu_tests lnmlp-gpu-bench

rm -rf "$carry"
mkdir -p "$carry/lib" "$carry/bin"
cp -L "$tree/src/liblnmlp.so.1" "$tree/src/liblnmlp_cuda.so.1" "$carry/lib/"
cp "$tree/tests/gpu/lnmlp_gpu_kernel_tests" "$tree/tests/gpu/lnmlp_gpu_tests" "$tree/bench/gpu/lnmlp-gpu-bench" "$carry/bin/"
# What the GPU machine lacks (no oneDNN there): the libraries liblnmlp needs beyond glibc/libstdc++.
for dep in libdnnl.so.2 libOpenCL.so.1 libgomp.so.1; do
  path=$(ldd "$tree/src/liblnmlp.so.1" | awk -v d="$dep" '$1 == d { print $3 }')
  if [ -n "$path" ]; then cp -L "$path" "$carry/lib/$dep"; fi
done
strip --strip-unneeded "$carry"/lib/*.so* "$carry"/bin/*
cat > "$carry/env.sh" <<'ENV'
# Sourced by scripts/gpu-check.sh: the carried libraries first.
_carry_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export LD_LIBRARY_PATH="$_carry_dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
ENV
{
  echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (+ uncommitted changes)')"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m)"
  echo "nvcc: $(grep -m1 CMAKE_CUDA_COMPILER_VERSION "$tree/CMakeFiles/"*/CMakeCUDACompiler.cmake 2>/dev/null | sed 's/.*"\(.*\)".*/\1/')"
  echo "CUDA architectures: $(grep -m1 '^CMAKE_CUDA_ARCHITECTURES' "$tree/CMakeCache.txt" | cut -d= -f2)"
  (cd "$carry" && find . -type f | sort | xargs ls -l | awk '{ print $5, $9 }')
} > "$carry/MANIFEST"

size=$(du -sb "$carry" | cut -f1)
echo "build-gpu-carry: $carry is $((size / 1048576)) MiB ($size bytes):"
(cd "$carry" && du -ah . | sort -k2)
if [ "$size" -gt $((60 * 1048576)) ]; then
  echo "build-gpu-carry: $carry is over 60 MiB; it would not fit the carry limit" >&2
  exit 1
fi
