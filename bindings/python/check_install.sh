#!/usr/bin/env bash
# `pip install ./bindings/python` into a fresh virtual environment gives a working, self-contained
# package: pip builds the wheel from source (scikit-build-core runs the project's CMake; no CMake
# step first), then the seed's usage example, a jitted lnmlp.jax gradient and an lnmlp.torch module's
# gradient run from outside the source tree, with no LNMLP_LIBRARY set, on the libraries inside the
# package.
#
# The CUDA module is left out of this wheel build (-C cmake.define.LNMLP_CUDA=OFF) to keep CI
# short: the release build compiles it, and a wheel built where nvcc exists carries it.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
PYTHON="${PYTHON:-python3}"
venv="$(mktemp -d)"
trap 'rm -rf "$venv"' EXIT
# --system-site-packages: reuse the numpy/ml_dtypes/jax that scripts/setup.sh installed.
"$PYTHON" -m venv --system-site-packages "$venv"
start=$(date +%s)
CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" "$venv/bin/python" -m pip install -q -C cmake.define.LNMLP_CUDA=OFF "$here"
echo "check_install: pip built and installed the wheel in $(( $(date +%s) - start )) s"
pkg="$("$venv/bin/python" -c "import lnmlp, os; print(os.path.dirname(lnmlp.__file__))")"
ls "$pkg" | grep -E '^liblnmlp' | sed 's/^/check_install: in the package: /'
cd "$venv"
env -u LNMLP_LIBRARY "$venv/bin/python" "$repo/examples/python/seed_usage.py"
env -u LNMLP_LIBRARY "$venv/bin/python" -c "import lnmlp; print('installed:', lnmlp.library_path(), lnmlp.build_info())"
env -u LNMLP_LIBRARY -u LNMLP_XLA_LIBRARY "$venv/bin/python" -c "
import jax, jax.numpy as jnp, lnmlp.jax as lj
x = jnp.ones((4, 8)); k1 = jnp.ones((8, 1, 16)) / 8; k2 = jnp.ones((16, 8)) / 16
g = jax.jit(jax.grad(lambda x: lj.layernorm_mlp(x, jnp.ones(8), jnp.zeros(8), [k1, k2], [None, None], 'rmsnorm').sum()))(x)
print('installed lnmlp.jax:', lj.library_path(), g.shape)"
env -u LNMLP_LIBRARY "$venv/bin/python" -c "
import torch, lnmlp, lnmlp.torch as lt
m = lt.LayerNormMLP(8, 16, activation='swiglu'); x = torch.ones(4, 8, requires_grad=True)
m(x).sum().backward()
print('installed lnmlp.torch:', lnmlp.library_path(), tuple(m.fc1_weight.grad.shape))"
