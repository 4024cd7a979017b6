#!/usr/bin/env bash
# The main job: set up, build (Release) and run lnmlp-bench on the CPU backend.
# Extra arguments go to lnmlp-bench (try --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release -j"$(nproc)" --target lnmlp-bench
./build/release/bench/lnmlp-bench "$@"
