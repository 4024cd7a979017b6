#!/usr/bin/env bash
# Creates the benchmark's Python environment for bench/compare (the peers and plotting; they are
# benchmark-time dependencies only, never the library's):
#     bash bench/compare/setup.sh            # venv in build/bench-venv, or $BENCH_VENV
# Idempotent: an existing venv is reused and only missing packages are installed.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${BENCH_VENV:-${REPO}/build/bench-venv}"
PY="${VENV}/bin/python"

if [[ ! -x "${PY}" ]]; then
  echo "[setup] creating ${VENV}"
  python3 -m venv "${VENV}"
  "${PY}" -m pip install -q --upgrade pip
fi

# module name -> pip requirement, all from PyPI (torch's PyPI wheel runs on the CPU too; it brings
# NVIDIA's runtime packages with it, about 6 GB in all; jax: its CPU jaxlib)
declare -A PKG=([numpy]=numpy [ml_dtypes]=ml_dtypes [matplotlib]=matplotlib [torch]=torch [jax]=jax)
missing=()
for mod in numpy ml_dtypes matplotlib torch jax; do
  "${PY}" -c "import ${mod}" >/dev/null 2>&1 || missing+=("${mod}")
done
if ((${#missing[@]} == 0)); then
  echo "[setup] ${VENV}: numpy ml_dtypes matplotlib torch jax all present"
  exit 0
fi
for mod in "${missing[@]}"; do
  echo "[setup] installing ${PKG[${mod}]} into ${VENV}"
  "${PY}" -m pip install -q "${PKG[${mod}]}"
done
