#!/usr/bin/env bash
# The CPU comparison of lnmlp with PyTorch (eager, torch.compile), JAX and NumPy, and lnmlp's
# scaling with tokens and threads (docs/cpu-compare.md):
#     bash bench/compare/run.sh            # the full run (about 20 min on 2 cores): docs/cpu-compare.{json,png},
#                                          # docs/cpu-scaling.{json,png}
#     bash bench/compare/run.sh --quick    # small T, few iterations (development): build/compare-quick/
# Other arguments go to compare.py (--help lists them). BENCH_VENV picks the Python environment.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "${REPO}"
if [[ ! -f build/release/CMakeCache.txt ]]; then
  cmake --preset release
fi
cmake --build --preset release -j"$(nproc)" --target lnmlp lnmlp-bench
bash bench/compare/setup.sh
VENV="${BENCH_VENV:-${REPO}/build/bench-venv}"
export LNMLP_LIBRARY="${LNMLP_LIBRARY:-${REPO}/build/release/src/liblnmlp.so.2}"
export PYTHONPATH="${REPO}/bindings/python${PYTHONPATH:+:${PYTHONPATH}}"
exec "${VENV}/bin/python" bench/compare/compare.py "$@"
