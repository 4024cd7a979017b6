#!/usr/bin/env bash
# `pip install ./bindings/python` into a fresh virtual environment gives a working package:
# installs it (bundling the CMake-built library), then runs the seed's usage example from outside
# the source tree with no LNMLP_LIBRARY set.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
PYTHON="${PYTHON:-python3}"
venv="$(mktemp -d)"
trap 'rm -rf "$venv"' EXIT
# --system-site-packages: reuse the numpy/ml_dtypes that run_tests.sh installed.
"$PYTHON" -m venv --system-site-packages "$venv"
"$venv/bin/python" -m pip install -q "$here"
cd "$venv"
env -u LNMLP_LIBRARY "$venv/bin/python" "$repo/examples/python/seed_usage.py"
env -u LNMLP_LIBRARY "$venv/bin/python" -c "import lnmlp; print('installed:', lnmlp.build_info())"
# lnmlp.jax from the installed package, where the build made its XLA FFI library.
if [ -e "$repo/build/release/src/liblnmlp_xla.so" ]; then
  env -u LNMLP_LIBRARY -u LNMLP_XLA_LIBRARY "$venv/bin/python" -c "
import jax, jax.numpy as jnp, lnmlp.jax as lj
x = jnp.ones((4, 8)); k1 = jnp.ones((8, 1, 16)) / 8; k2 = jnp.ones((16, 8)) / 16
g = jax.jit(jax.grad(lambda x: lj.layernorm_mlp(x, jnp.ones(8), jnp.zeros(8), [k1, k2], [None, None], 'rmsnorm').sum()))(x)
print('installed lnmlp.jax:', lj.library_path(), g.shape)"
fi
