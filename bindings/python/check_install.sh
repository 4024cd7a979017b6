#!/usr/bin/env bash
# The self-contained wheel works where nothing else of lnmlp's is installed: build_sdist.sh makes the
# sdist from the committed files, build_wheel.sh builds the wheel from that sdist alone and repairs
# it (oneDNN and the OpenMP runtime inside, a manylinux tag), pip installs it with its extras
# [jax,torch,flax] without an index (they resolve to what the machine has), then in that fresh
# virtual environment, with the system's oneDNN hidden from the loader, the seed's usage example, a jitted
# lnmlp.jax gradient and an lnmlp.torch module's gradient run from outside the source tree, with no
# LNMLP_LIBRARY set, on the libraries inside the wheel. Then every library the wheel ships is
# checked with ldd: each dependency is in the wheel or a library every manylinux system has
# (glibc's, libstdc++, libgcc_s), except the MPI module's, which loads the machine's MPI only when a
# program asks for an MPI communicator.
#
# The CUDA module is left out of this wheel build (-C cmake.define.LNMLP_CUDA=OFF) to keep CI
# short: the release build compiles it, and a wheel built where nvcc exists carries it.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
PYTHON="${PYTHON:-python3}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
start=$(date +%s)
sdist="$(bash "$here/build_sdist.sh" "$work/sdist")"
echo "check_install: $(basename "$sdist"), $(( $(stat -c %s "$sdist") / 1024 )) KiB"
wheel="$(bash "$here/build_wheel.sh" "$work/dist" --from "$sdist" -C cmake.define.LNMLP_CUDA=OFF)"
echo "check_install: built and repaired $(basename "$wheel") in $(( $(date +%s) - start )) s," \
     "$(( $(stat -c %s "$wheel") / 1024 )) KiB"
"$PYTHON" -m zipfile -l "$wheel" | grep -E '\.so' | sed 's/^/check_install: in the wheel: /'

# --system-site-packages: reuse the numpy/ml_dtypes/jax/torch that scripts/setup.sh installed;
# lnmlp and its libraries come from the wheel alone.
venv="$work/venv"
"$PYTHON" -m venv --system-site-packages "$venv"
# The venv's own bootstrap setuptools (Python < 3.12 puts one in) would hide the machine's, which is
# what torch's requirement (setuptools >= 77) is met by.
"$venv/bin/python" -m pip uninstall -q -y setuptools 2>/dev/null || true
# --no-index: the dependencies and the extras' packages must be ones the machine has; a wheel that
# lacks an extra only gets a warning from pip, so that is checked too.
"$venv/bin/python" -m pip install --no-index "${wheel}[jax,torch,flax]" > "$work/pip.log" 2>&1 ||
  { cat "$work/pip.log" >&2; exit 1; }
if grep -i "does not provide the extra" "$work/pip.log" >&2; then exit 1; fi
echo "check_install: pip installed $(basename "$wheel")[jax,torch,flax] from no index"
site="$("$venv/bin/python" -c "import lnmlp, os; print(os.path.dirname(os.path.dirname(lnmlp.__file__)))")"

# shellcheck source=scripts/shipped-libs-lib.sh
source "$repo/scripts/shipped-libs-lib.sh"
# Where this process may make a private mount namespace; elsewhere the /proc/self/maps check below
# still shows which oneDNN each run loaded.
hide_system_onednn "check_install: "
run() { (cd "$work" && env -u LNMLP_LIBRARY -u LNMLP_XLA_LIBRARY -u LD_LIBRARY_PATH "${HIDE_ONEDNN[@]}" "$venv/bin/python" "$@"); }
# Each run ends by checking that every oneDNN and OpenMP runtime it mapped is the wheel's.
maps="
import os
libs = {l.split()[-1] for l in open('/proc/self/maps') if 'libdnnl' in l or 'libgomp' in l}
outside = [l for l in libs if not l.startswith('$site/lnmlp') and 'torch' not in l]
assert libs and not outside, ('loaded from outside the wheel', outside)"

run "$repo/examples/python/seed_usage.py"
run -c "import lnmlp; print('installed:', lnmlp.library_path(), lnmlp.build_info())
$maps"
run -c "
import jax, jax.numpy as jnp, lnmlp.jax as lj
x = jnp.ones((4, 8)); k1 = jnp.ones((8, 1, 16)) / 8; k2 = jnp.ones((16, 8)) / 16
g = jax.jit(jax.grad(lambda x: lj.layernorm_mlp(x, jnp.ones(8), jnp.zeros(8), [k1, k2], [None, None], 'rmsnorm').sum()))(x)
print('installed lnmlp.jax:', lj.library_path(), g.shape)
$maps"
run -c "
import torch, lnmlp, lnmlp.torch as lt
m = lt.LayerNormMLP(8, 16, activation='swiglu'); x = torch.ones(4, 8, requires_grad=True)
m(x).sum().backward()
print('installed lnmlp.torch:', lnmlp.library_path(), tuple(m.fc1_weight.grad.shape))
$maps"

# ldd: nothing outside the wheel but what every manylinux system provides.
bad=0
for lib in "$site"/lnmlp/*.so* "$site"/lnmlp.libs/*; do
  case "$(basename "$lib")" in liblnmlp_mpi.so.*) continue ;; esac  # the machine's MPI, when asked for
  while read -r name path; do
    [[ "$path" == "$site"/lnmlp* ]] && continue
    echo "check_install: $(basename "$lib") needs $name from $path, outside the wheel" >&2
    bad=1
  done < <(needed_from_machine "$lib")
done
[ "$bad" -eq 0 ] || exit 1
echo "check_install: every shipped library's dependencies are in the wheel or the manylinux policy"
