#!/usr/bin/env bash
# Builds lnmlp's wheel and makes it self-contained: pip builds it from source (scikit-build-core
# runs the project's CMake), then `auditwheel repair` copies the libraries it links that no
# manylinux system guarantees -- oneDNN and what oneDNN links (the OpenMP runtime, the OpenCL
# loader) -- into the wheel (lnmlp.libs/, reached by RPATH) and gives it the manylinux tag its
# symbol versions allow. Left out on purpose, loaded at run time only when a program asks: the
# libraries of scripts/shipped-libs-lib.sh's RUN_TIME_LIBRARIES (the machine's MPI for the MPI
# module; cuBLASLt and NCCL for the CUDA module, from NVIDIA's pip wheels or a CUDA install).
#
# Usage: bindings/python/build_wheel.sh OUT_DIR [--from SDIST] [pip -C options, e.g.
#        -C cmake.define.LNMLP_CUDA=OFF]
# Builds from the sdist SDIST (build_sdist.sh) if given, else from this checkout. Prints the
# repaired wheel's path last. Needs auditwheel and patchelf (scripts/setup.sh installs them).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${PYTHON:-python3}"
out="$(mkdir -p "$1" && cd "$1" && pwd)"
shift
source_tree="$here"
if [ "${1:-}" = --from ]; then
  source_tree="$(readlink -f "$2")"
  shift 2
fi
raw="$(mktemp -d)"
trap 'rm -rf "$raw"' EXIT
CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
  "$PYTHON" -m pip wheel -q --no-deps -w "$raw" "$@" "$source_tree" >&2
# shellcheck source=scripts/shipped-libs-lib.sh
source "$here/../../scripts/shipped-libs-lib.sh"
excluded=("${RUN_TIME_LIBRARIES[@]}")
"$PYTHON" -m auditwheel repair "${excluded[@]/#/--exclude=}" -w "$out" "$raw"/lnmlp-*.whl >&2
wheel="$(ls -t "$out"/lnmlp-*manylinux*.whl | head -n 1)"
"$PYTHON" -m auditwheel show "$wheel" >&2
# auditwheel show knows nothing of --exclude: a wheel whose CUDA module links libcublasLt.so.13
# reads as plain linux_x86_64 there. Accepted when its symbol versions allow a manylinux tag and
# the only libraries standing between it and that tag are the ones left to run time on purpose.
"$PYTHON" -m auditwheel show --json "$wheel" | "$PYTHON" -c '
import json, sys
report, allowed = json.load(sys.stdin), set(sys.argv[1:])
tag = report["sym_tag"]
blocking = set(report["policy_upgrades"].get(tag, {}).get("libs_to_eliminate", []))
if not tag.startswith("manylinux") or blocking - allowed:
    sys.exit(f"build_wheel: not a manylinux wheel: symbol tag {tag}, libraries outside the policy {sorted(blocking - allowed)}")
left = ", ".join(sorted(blocking)) or "none"
print(f"build_wheel: {tag}; left to run time on purpose: {left}", file=sys.stderr)
' "${excluded[@]}"
echo "$wheel"
