#!/usr/bin/env bash
# Runs the Python binding's tests against the CMake-built library.
# Usage: bindings/python/run_tests.sh [pytest args...]   (from anywhere; after the CMake build)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
PYTHON="${PYTHON:-python3}"

if ! "$PYTHON" -c "import numpy, ml_dtypes, pytest" >/dev/null 2>&1; then
  "$PYTHON" -m pip install -q numpy ml_dtypes pytest
fi
# lnmlp.jax's tests (tests/test_jax.py) run where the build made liblnmlp_xla.so (CMake found jax);
# there they must not skip.
if [ -e "$repo/build/release/src/liblnmlp_xla.so" ]; then
  export LNMLP_REQUIRE_JAX="${LNMLP_REQUIRE_JAX:-1}"
fi
# mpi4py for the one MPI test (tests/test_sharding_mpi.py), when an MPI to build it against is
# here; without it that test skips.
if command -v mpicc >/dev/null 2>&1 && ! "$PYTHON" -c "import mpi4py" >/dev/null 2>&1; then
  "$PYTHON" -m pip install -q mpi4py || echo "run_tests.sh: could not install mpi4py; the MPI test will skip" >&2
fi
export LNMLP_LIBRARY="${LNMLP_LIBRARY:-$repo/build/release/src/liblnmlp.so}"
if [ ! -e "$LNMLP_LIBRARY" ]; then
  echo "run_tests.sh: $LNMLP_LIBRARY not found; build it first:" >&2
  echo "  cmake --preset release && cmake --build --preset release --target lnmlp" >&2
  exit 1
fi
cd "$repo"
exec "$PYTHON" -m pytest -q -p no:cacheprovider bindings/python/tests "$@"
