#!/usr/bin/env bash
# Builds, on this machine (no GPU needed: nvcc and cuBLASLt headers suffice), everything
# scripts/gpu-check.sh runs on a GPU machine, as one directory to carry there, so that the GPU
# machine builds nothing (it has no oneDNN, GoogleTest, MPI or internet):
#
#   build/gpu-build/   the CMake build tree (Release, -DLNMLP_NATIVE=OFF, MPI off); stays here
#   build/gpu.tar.gz   what travels: build/gpu/ packed (about 20 MiB; the device tool carries at
#                      most 64 MiB, and the directory alone is over 60); gpu-check.sh unpacks it
#   build/gpu/         the same, unpacked (scripts/gpu-check.sh --dry-run uses it here):
#       lib/           liblnmlp.so.2, liblnmlp_cuda.so.1, and what the GPU machine lacks: oneDNN
#                      (libdnnl.so.2), its libOpenCL.so.1 loader stub, libgomp.so.1
#       lib/compat/    libstdc++.so.6 and libgcc_s.so.1 of this build, used only where the GPU
#                      machine's own are older than the binaries need
#       bin/           lnmlp_gpu_kernel_tests, lnmlp_gpu_tests, lnmlp_gpu_sharding_tests (one-rank
#                      NCCL tests; NCCL itself, 218 MB, cannot travel), lnmlp-gpu-bench (stripped)
#       env.sh         sets LD_LIBRARY_PATH for them
#       MANIFEST       what was built, from which commit, with which CUDA
#
# MPI is pinned off: a liblnmlp linked to libmpi would not load on the GPU machine.
#
# Usage: bash scripts/build-gpu-carry.sh   (then carry build/gpu.tar.gz and run scripts/gpu-check.sh there)
set -euo pipefail
cd "$(dirname "$0")/.."
tree=build/gpu-build
carry=build/gpu

cmake -S . -B "$tree" -DCMAKE_BUILD_TYPE=Release -DLNMLP_NATIVE=OFF -DLNMLP_MPI=OFF -DLNMLP_BUILD_BENCH=ON \
  -DLNMLP_BUILD_TESTS=ON -DLNMLP_CUDA=ON ${LNMLP_CUDA_ARCHS:+-DCMAKE_CUDA_ARCHITECTURES="$LNMLP_CUDA_ARCHS"} >/dev/null
targets=(lnmlp lnmlp_cuda lnmlp_gpu_kernel_tests lnmlp_gpu_tests lnmlp-gpu-bench)
if grep -q "^LNMLP_NCCL_LIBRARY:.*=/" "$tree/CMakeCache.txt"; then targets+=(lnmlp_gpu_sharding_tests); fi
cmake --build "$tree" -j"$(nproc)" --target "${targets[@]}"

rm -rf "$carry"
mkdir -p "$carry/lib/compat" "$carry/bin"
cp -L "$tree/src/liblnmlp.so.2" "$tree/src/liblnmlp_cuda.so.1" "$carry/lib/"
cp "$tree/tests/gpu/lnmlp_gpu_kernel_tests" "$tree/tests/gpu/lnmlp_gpu_tests" "$tree/bench/gpu/lnmlp-gpu-bench" \
  "$carry/bin/"
if [ -x "$tree/tests/gpu/lnmlp_gpu_sharding_tests" ]; then cp "$tree/tests/gpu/lnmlp_gpu_sharding_tests" "$carry/bin/"; fi
if ldd "$tree/src/liblnmlp.so.2" | grep -q libmpi; then
  echo "build-gpu-carry: liblnmlp links MPI, which the GPU machine lacks" >&2
  exit 1
fi
# What the GPU machine lacks (no oneDNN there): the libraries liblnmlp needs beyond glibc/libstdc++.
for dep in libdnnl.so.2 libOpenCL.so.1 libgomp.so.1; do
  path=$(ldd "$tree/src/liblnmlp.so.2" | awk -v d="$dep" '$1 == d { print $3 }')
  if [ -n "$path" ]; then cp -L "$path" "$carry/lib/$dep"; fi
done
for dep in libstdc++.so.6 libgcc_s.so.1; do
  path=$(ldd "$tree/tests/gpu/lnmlp_gpu_tests" | awk -v d="$dep" '$1 == d { print $3 }')
  if [ -n "$path" ]; then cp -L "$path" "$carry/lib/compat/$dep"; fi
done
strip --strip-unneeded "$carry"/lib/*.so* "$carry"/lib/compat/*.so* "$carry"/bin/*
cat > "$carry/env.sh" <<'ENV'
# Sourced by scripts/gpu-check.sh: the carried libraries first (LD_LIBRARY_PATH may be unset).
_carry_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export LD_LIBRARY_PATH="$_carry_dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
ENV
{
  echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (+ uncommitted changes)')"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m)"
  echo "nvcc: $(grep -m1 CMAKE_CUDA_COMPILER_VERSION "$tree/CMakeFiles/"*/CMakeCUDACompiler.cmake 2>/dev/null | sed 's/.*"\(.*\)".*/\1/')"
  echo "CUDA architectures: $(grep -m1 '^CMAKE_CUDA_ARCHITECTURES' "$tree/CMakeCache.txt" | cut -d= -f2)"
  echo "NCCL at build time: $(grep -m1 '^LNMLP_NCCL_LIBRARY' "$tree/CMakeCache.txt" | cut -d= -f2)"
  (cd "$carry" && find . -type f | sort | xargs ls -l | awk '{ print $5, $9 }')
} > "$carry/MANIFEST"

rm -f "$carry.tar.gz"
tar -C "$(dirname "$carry")" -czf "$carry.tar.gz" "$(basename "$carry")"
size=$(stat -c %s "$carry.tar.gz")
echo "build-gpu-carry: $carry.tar.gz is $((size / 1048576)) MiB ($size bytes), of $carry:"
(cd "$carry" && du -ah . | sort -k2)
if [ "$size" -gt $((60 * 1048576)) ]; then
  echo "build-gpu-carry: $carry.tar.gz is over 60 MiB; it would not fit the carry limit" >&2
  exit 1
fi
