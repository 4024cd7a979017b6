#!/usr/bin/env bash
# Every test: set up, then build and run the C/C++ suite in Release (with the dlopen example, the
# Julia and ABI checks, and lnmlp.jax's XLA FFI library), the GPU check rehearsed without a GPU (where nvcc is), the style check of
# the last change (scripts/check-style.sh), the Python binding's suite and its pip-install check,
# the Rust crates and the SWIG Java binding against that build, valgrind's memcheck
# (scripts/valgrind.sh), the C/C++ suite again under AddressSanitizer + UndefinedBehaviorSanitizer,
# the concurrency and sharding tests under ThreadSanitizer (scripts/tsan.sh), and each libFuzzer
# harness for 60 s (scripts/fuzz.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

echo "=== release: build ==="
cmake --preset release >/dev/null
cmake --build --preset release -j"$(nproc)"
# Where nvcc exists (CI has one, but no GPU), the CUDA backend module must have been built, with
# -Werror; its GPU tests skip without a GPU.
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  test -f build/release/src/liblnmlp_cuda.so.1 || { echo "nvcc is present but the CUDA module was not built" >&2; exit 1; }
fi
# Where python3 imports jax (scripts/setup.sh installs it), lnmlp.jax's XLA FFI library must
# have been built; tests/test_jax.py then runs in the Python suite.
if python3 -c "import jax.ffi" >/dev/null 2>&1; then
  test -f build/release/src/liblnmlp_xla.so || { echo "jax is installed but liblnmlp_xla.so was not built" >&2; exit 1; }
fi
echo "=== release: test ==="
ctest --preset release
# The GPU check rehearsed without a GPU: the build a GPU machine gets (scripts/build-gpu-carry.sh)
# loads with LD_LIBRARY_PATH unset, its test binaries run (their GPU tests skip), and
# scripts/gpu-check.sh writes its summary and says "skipped: no GPU" for the rest.
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "=== gpu check: the carried build, rehearsed without a GPU ==="
  bash scripts/build-gpu-carry.sh > build/gpu-carry.log 2>&1 || { tail -n 40 build/gpu-carry.log; exit 1; }
  rm -rf build/gpu-check-dry-run
  env -u LD_LIBRARY_PATH OUT=build/gpu-check-dry-run bash scripts/gpu-check.sh --dry-run
fi
echo "=== style: clang-format and clang-tidy on what the last change touched ==="
bash scripts/check-style.sh

echo "=== python: binding tests ==="
# setup.sh installed jax and torch: their tests must run, not skip.
LNMLP_REQUIRE_TORCH=1 bash bindings/python/run_tests.sh
echo "=== python: pip install ./bindings/python, seed example ==="
bash bindings/python/check_install.sh

echo "=== rust: cargo test --offline, cargo doc ==="
LNMLP_LIB_DIR="$PWD/build/release/src" bash bindings/rust/run_tests.sh
echo "=== swig: the Java binding ==="
LNMLP_LIB_DIR="$PWD/build/release/src" bash bindings/swig/run_tests.sh

echo "=== valgrind: memcheck of the C example and a plan's life in a loop ==="
bash scripts/valgrind.sh build/release

echo "=== asan: build ==="
cmake --preset asan >/dev/null
cmake --build --preset asan -j"$(nproc)"
echo "=== asan: test ==="
ctest --preset asan

echo "=== tsan: the concurrency and sharding tests under ThreadSanitizer ==="
bash scripts/tsan.sh
echo "=== fuzz: each libFuzzer harness for 60 s (ASan + UBSan) ==="
bash scripts/fuzz.sh 60
