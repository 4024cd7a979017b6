#!/usr/bin/env bash
# The main job: set up, build and run lnmlp-bench on the CPU backend. It installs and builds only
# what it runs (the compiler, CMake, oneDNN; the library and lnmlp-bench compiled for this machine,
# in build/main); scripts/test.sh sets up and builds everything else.
# Extra arguments go to lnmlp-bench (try --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --main-job
cmake --preset main >/dev/null
cmake --build --preset main -j"$(nproc)" --target lnmlp-bench
./build/main/bench/lnmlp-bench "$@"
