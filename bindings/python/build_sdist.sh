#!/usr/bin/env bash
# Builds lnmlp's source distribution: what `pip install lnmlp-<version>.tar.gz` compiles from (the
# library, its CUDA and MPI modules and lnmlp.jax's XLA FFI library, with the project's CMake,
# through scikit-build-core), from the committed files alone. The package's pyproject.toml builds
# from the repository root (cmake.source-dir = "../.."), outside its own folder, where an sdist
# cannot reach; so the sdist is made from a staging copy laid out as the repository is -- the root
# CMakeLists.txt, cmake/, include/, src/, LICENSE and the Python package with its XLA FFI sources --
# with that pyproject.toml at its root, its paths rewritten to match.
#
# Usage: bindings/python/build_sdist.sh OUT_DIR   (prints the sdist's path last)
# Needs git (the files are the committed ones), and the Python packages build and
# scikit-build-core (scripts/setup.sh installs them; no build isolation, so nothing is downloaded).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
PYTHON="${PYTHON:-python3}"
out="$(mkdir -p "$1" && cd "$1" && pwd)"
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT

# The tracked files the build reads (tests, benchmarks and the other bindings stay out: the wheel
# build turns them off).
git -C "$repo" ls-files -z -- CMakeLists.txt cmake include src LICENSE \
    bindings/python/README.md bindings/python/lnmlp bindings/python/xla_ffi |
  (cd "$repo" && tar --null -T - -cf -) | tar -xf - -C "$stage"

# The package's pyproject.toml, its paths made relative to the root instead of bindings/python.
"$PYTHON" - "$here/pyproject.toml" "$stage/pyproject.toml" <<'PY'
import sys
text = open(sys.argv[1]).read()
for old, new in [
    ('cmake.source-dir = "../.."', 'cmake.source-dir = "."'),
    ('wheel.packages = ["lnmlp"]', 'wheel.packages = ["bindings/python/lnmlp"]'),
    ('readme = "README.md"', 'readme = "bindings/python/README.md"'),
    ('input = "lnmlp/_version.py"', 'input = "bindings/python/lnmlp/_version.py"'),
]:
    if text.count(old) != 1:
        sys.exit(f"build_sdist: bindings/python/pyproject.toml has no single {old!r} to rewrite")
    text = text.replace(old, new)
open(sys.argv[2], "w").write(text)
PY

(cd "$stage" && "$PYTHON" -m build --sdist --no-isolation --outdir "$out" .) >&2
sdist="$(ls -t "$out"/lnmlp-*.tar.gz | head -n 1)"
echo "build_sdist: $(basename "$sdist"), $(( $(stat -c %s "$sdist") / 1024 )) KiB," \
     "$(tar -tzf "$sdist" | grep -vc '/$') files" >&2
echo "$sdist"
