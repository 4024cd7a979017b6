#!/usr/bin/env bash
# Every test: set up, then build and run the whole suite twice, in Release and under
# AddressSanitizer + UndefinedBehaviorSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
for preset in release asan; do
  echo "=== ${preset}: build ==="
  cmake --preset "${preset}" >/dev/null
  cmake --build --preset "${preset}" -j"$(nproc)"
  echo "=== ${preset}: test ==="
  ctest --preset "${preset}"
done
