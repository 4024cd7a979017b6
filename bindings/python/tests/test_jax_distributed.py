"""lnmlp.jax across processes: 2 processes of 2 CPU devices each, joined by jax.distributed with
gloo collectives (jax_dist_rank.py, spawned here), run layernorm_mlp split over a global mesh of
the 4 devices: tensor and sequence parallelism with the data axis across the processes (2x2) and
with the tensor axis across them (1x4), delayed scaling over three steps, current scaling (in
stages, the amaxes reduced across the processes), and FSDP kernels. Each
process's gathered y and gradients must be the other's bits and equal its own one-device step
within the dtype's tolerance (unquantized: the float64 reference's too); the delayed-scaling state
must be the same bits on all 4 devices and equal the one-device run's."""

import os

import numpy as np
import pytest

import _reference as ref

if os.environ.get("LNMLP_REQUIRE_JAX") != "1":  # the README's test command never skips silently
    pytest.importorskip("jax")

import jax_dist_rank as rank_job  # noqa: E402
from _ranks import run_ranks  # noqa: E402

WORLD = 2


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """{configuration: [rank 0's results, rank 1's]} (dicts of NumPy arrays)."""
    out = tmp_path_factory.mktemp("jax_dist")
    run_ranks(rank_job.__file__, WORLD, out, "jax.distributed processes")
    return {name: [dict(np.load(out / f"{name}-rank{r}.npz")) for r in range(WORLD)] for name in rank_job.CONFIGS}


@pytest.mark.parametrize("name", list(rank_job.CONFIGS))
def test_every_process_gets_the_one_device_result(ranks, name):
    mesh_shape, sp, fsdp, dtype_name, rid, acts, steps = rank_job.CONFIGS[name]
    r0, r1 = ranks[name]
    outputs = [k for k in r0 if not k.startswith("one_") and k != "states"]
    assert "y" in outputs and "dk1" in outputs and "dk2" in outputs, outputs
    for k in outputs:  # the processes gathered the same global arrays
        np.testing.assert_array_equal(r0[k], r1[k], err_msg=f"{k} differs between the processes")
    errs = {}
    for k in outputs:
        got, want = r0[k].astype(np.float64), r0["one_" + k].astype(np.float64)
        assert got.shape == want.shape and np.all(np.isfinite(got)), k
        errs[k] = float(np.max(np.abs(got - want))) / max(float(np.max(np.abs(want))), 1e-30)
    tol = ref.TOLERANCE_FP8_SHARDED if rid is not None else ref.TOLERANCES[dtype_name]
    worst = max(errs, key=errs.get)
    assert errs[worst] <= tol, f"{worst}: {errs[worst]:.3e} from the one-device step > {tol}"
    if rid is None:  # the float64 reference, independently of the one-device step
        d, dy = rank_job.inputs(name)
        x2 = np.asarray(d["x"], np.float64).reshape(-1, rank_job.H)
        block = (x2, d["gamma"], d["beta"], d["k1"], d["b1"], d["k2"], d["b2"], "rmsnorm", False, 1e-5, acts, {})
        y_ref, _ = ref.forward(*block)
        g_ref = ref.backward(dy.astype(np.float64).reshape(-1, rank_job.H), *block)
        ref.assert_close(f"{name} y", r0["y"].reshape(y_ref.shape), y_ref, dtype_name)
        want = dict(dx=g_ref["dx"], dgamma=g_ref["dgamma"], dk1=g_ref["dw1"], dk2=g_ref["dw2"], db1=g_ref["db1"],
                    db2=g_ref["db2"])
        for k, w in want.items():
            ref.assert_close(f"{name} {k}", r0[k].reshape(w.shape), w, dtype_name)
    if rid == "delayed":
        states = np.concatenate([r0["states"], r1["states"]])
        assert len(states) == 4, "a state per device"
        assert all(np.array_equal(s, states[0], equal_nan=True) for s in states), "the state differs between devices"
        np.testing.assert_allclose(states[0], r0["one_state"], rtol=1e-3,
                                   err_msg="the state differs from the one-device run's")
        assert np.all(states[0][:, 1:] > 0), "a history entry was not recorded"
    layout = f"{mesh_shape[0]}x{mesh_shape[1]}{' SP' if sp else ''}{' FSDP' if fsdp else ''}"
    ref.MESH_REPORT.append(f"2 processes x 2 devices, {layout} {dtype_name} {rid or ''} ({steps} step(s)): "
                           f"max error {errs[worst]:.1e} ({worst})")
