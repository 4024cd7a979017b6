"""The TransformerEngine-style functional API: layernorm_mlp, layernorm_mlp_vjp, the plan cache."""

import gc
import pathlib
import runpy
import weakref

import ml_dtypes
import numpy as np
import pytest

import lnmlp
import _reference as ref

H, F = 16, 24


def inputs(A=1, dtype=np.float32, lead=(2, 3), norm="layernorm", bias=True, seed=0):
    rng = np.random.default_rng(seed)
    f = lambda *s: (rng.standard_normal(s) * 0.5).astype(dtype)  # noqa: E731
    return dict(x=f(*lead, H), gamma=(1 + f(H)).astype(dtype), beta=f(H) if norm == "layernorm" else None,
                kernels=[f(H, A, F), f(F, H)], biases=[f(A, F), f(H)] if bias else [None, None])


@pytest.fixture(autouse=True)
def fresh_cache():
    lnmlp.clear_plan_cache()
    lnmlp.set_plan_cache_size(16)
    yield
    lnmlp.clear_plan_cache()
    lnmlp.set_plan_cache_size(16)  # the default: a test that shrank it leaves no trace in later files


def test_seed_usage_example_runs_as_written():
    """examples/python/seed_usage.py, the seed's usage snippet as written, gives the float64
    reference's output (the script's own variables, after it ran)."""
    example = pathlib.Path(__file__).resolve().parents[3] / "examples" / "python" / "seed_usage.py"
    g = runpy.run_path(str(example))
    x, output = g["input_tensor"], g["output"]
    assert output.shape == x.shape and output.dtype == np.float32
    h = x.shape[-1]
    y_ref, _ = ref.forward(x.reshape(-1, h), g["ln_scale"], g["ln_bias"], g["ffn1_weight"], g["ffn1_bias"],
                           g["ffn2_weight"], g["ffn2_bias"], "layernorm", False, 1e-6, ("gelu",), {})
    ref.assert_close("y seed example", output.reshape(-1, h), y_ref, "float32")


@pytest.mark.parametrize("dtype_name", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_vjp_against_reference(norm, dtype_name):
    dtype = ref.DTYPES[dtype_name]
    d = inputs(A=2, dtype=dtype, norm=norm, seed=1)
    k1, k2 = d["kernels"]
    b1, b2 = d["biases"]
    y, vjp = lnmlp.layernorm_mlp_vjp(d["x"], d["gamma"], d["beta"], d["kernels"], d["biases"], norm,
                                     zero_centered_gamma=False, epsilon=1e-5, activation_type="swiglu")
    dy = np.random.default_rng(2).standard_normal(d["x"].shape).astype(dtype)
    dx, dgamma, dbeta, (dk1, dk2), (db1, db2) = vjp(dy)
    assert dx.shape == d["x"].shape and dk1.shape == (H, 2, F) and db1.shape == (2, F)
    f64 = lambda a: None if a is None else a.astype(np.float64)  # noqa: E731
    args = (f64(d["x"]).reshape(-1, H), f64(d["gamma"]), f64(d["beta"]), f64(k1), f64(b1), f64(k2), f64(b2))
    kw = dict(norm=norm, zcg=False, eps=1e-5, acts=("silu", "linear"), p={})
    ref.assert_close(f"y functional/{norm}", y.reshape(-1, H), ref.forward(*args, **kw)[0], dtype_name)
    g = ref.backward(f64(dy).reshape(-1, H), *args, **kw)
    got = dict(dx=dx.reshape(-1, H), dgamma=dgamma, dbeta=dbeta, dw1=dk1, db1=db1, dw2=dk2, db2=db2)
    for k, v in g.items():
        if v is None:
            assert got[k] is None
        else:
            ref.assert_close(f"{k} functional/{norm}", got[k], v, dtype_name)
    # the forward-only path gives the same output
    y2 = lnmlp.layernorm_mlp(d["x"], d["gamma"], d["beta"], d["kernels"], d["biases"], norm,
                             epsilon=1e-5, activation_type=("silu", "linear"))
    np.testing.assert_array_equal(y, y2)


def test_none_biases_and_rmsnorm_give_none_gradients():
    d = inputs(norm="rmsnorm", bias=False)
    y, vjp = lnmlp.layernorm_mlp_vjp(d["x"], d["gamma"], None, d["kernels"], [None, None], "rmsnorm")
    dx, dgamma, dbeta, dks, dbs = vjp(np.ones_like(y))
    assert dbeta is None and dbs == [None, None] and all(k is not None for k in dks)
    y3, vjp3 = lnmlp.layernorm_mlp_vjp(d["x"], d["gamma"], None, d["kernels"], [None, d["gamma"]], "rmsnorm")
    assert vjp3(np.ones_like(y))[4][0] is None and vjp3(np.ones_like(y))[4][1].shape == (H,)


def test_extra_seed_arguments_are_accepted_and_transpose_batch_sequence_just_works():
    d = inputs(lead=(4, 3))
    base = lnmlp.layernorm_mlp(d["x"], d["gamma"], d["beta"], d["kernels"], d["biases"], "layernorm")
    y = lnmlp.layernorm_mlp(d["x"], d["gamma"], d["beta"], d["kernels"], d["biases"], "layernorm",
                            False, 1e-6, True, ("batch", "seq", "embed"), ("batch", "seq", "embed"),
                            ("batch", "seq", "mlp"), ("embed", "act", "mlp"), ("mlp", "embed"),
                            "my_ffn1", "my_ffn2", ("relu",), None, None)
    np.testing.assert_array_equal(base, y)
    # (sequence, batch, hidden) input: same rows, so the same per-token result
    xt = np.ascontiguousarray(d["x"].transpose(1, 0, 2))
    yt = lnmlp.layernorm_mlp(xt, d["gamma"], d["beta"], d["kernels"], d["biases"], "layernorm",
                             transpose_batch_sequence=True)
    np.testing.assert_allclose(yt.transpose(1, 0, 2), base, rtol=1e-6, atol=1e-6)


def test_quantizer_set_must_be_none_or_a_quantizer_set():
    d = inputs()
    with pytest.raises(lnmlp.InvalidArgumentError, match="make_quantizer_set"):
        lnmlp.layernorm_mlp(**d, norm_type="layernorm", quantizer_set=object())
    assert lnmlp.layernorm_mlp(**d, norm_type="layernorm", quantizer_set=lnmlp.noop_quantizer_set) is not None


def test_errors_use_the_functional_names():
    d = inputs()
    k1, k2 = d["kernels"]
    with pytest.raises(lnmlp.InvalidArgumentError, match="^kernel_2 has dtype float16"):
        lnmlp.layernorm_mlp(d["x"], d["gamma"], d["beta"], [k1, k2.astype(np.float16)], d["biases"], "layernorm")
    with pytest.raises(lnmlp.InvalidArgumentError, match="^bias_1 has shape"):
        lnmlp.layernorm_mlp(d["x"], d["gamma"], d["beta"], [k1, k2], [d["biases"][0][:, :3], None], "layernorm")
    with pytest.raises(lnmlp.InvalidArgumentError, match="kernel_1 must have shape"):
        lnmlp.layernorm_mlp(d["x"], d["gamma"], d["beta"], [k1[:, 0], k2], d["biases"], "layernorm")
    with pytest.raises(lnmlp.InvalidArgumentError, match="^kernel_1 has shape"):
        lnmlp.layernorm_mlp(d["x"], d["gamma"], d["beta"], d["kernels"], d["biases"], "layernorm",
                            activation_type="geglu")
    with pytest.raises(lnmlp.InvalidArgumentError, match="beta was given, but rmsnorm"):
        lnmlp.layernorm_mlp(d["x"], d["gamma"], d["beta"], d["kernels"], d["biases"], "rmsnorm")
    with pytest.raises(lnmlp.InvalidArgumentError, match="unknown activation"):
        lnmlp.layernorm_mlp(**d, norm_type="layernorm", activation_type=("swish",))
    with pytest.raises(lnmlp.InvalidArgumentError, match="kernels must be"):
        lnmlp.layernorm_mlp(d["x"], d["gamma"], d["beta"], [k1], d["biases"], "layernorm")


def test_cache_reuses_plans():
    d = inputs()
    for _ in range(3):
        lnmlp.layernorm_mlp(**d, norm_type="layernorm")
    info = lnmlp.plan_cache_info()
    assert info["misses"] == 1 and info["hits"] == 2 and info["size"] == 1
    lnmlp.layernorm_mlp(**inputs(dtype=ml_dtypes.bfloat16), norm_type="layernorm")   # another dtype
    lnmlp.layernorm_mlp(**inputs(lead=(5,)), norm_type="layernorm")                  # another shape
    lnmlp.layernorm_mlp(**d, norm_type="layernorm", activation_type="gelu")          # another option
    lnmlp.layernorm_mlp_vjp(**d, norm_type="layernorm")                              # remat differs
    assert lnmlp.plan_cache_info()["misses"] == 5 and lnmlp.plan_cache_info()["size"] == 5


def test_cache_eviction_closes_plans_but_keeps_pending_vjps_working():
    lnmlp.set_plan_cache_size(2)
    d = inputs()
    y, vjp = lnmlp.layernorm_mlp_vjp(**d, norm_type="layernorm")
    held = weakref.ref(vjp._plan)
    lnmlp.layernorm_mlp(**d, norm_type="layernorm")
    probe = lnmlp.layernorm_mlp_vjp(**inputs(lead=(5,)), norm_type="layernorm")[1]._plan
    assert lnmlp.plan_cache_info()["evictions"] == 1  # the first vjp's plan
    assert not held().closed                          # still needed by `vjp`
    lnmlp.layernorm_mlp(**inputs(lead=(7,)), norm_type="layernorm")     # evicts the forward plan
    lnmlp.layernorm_mlp(**inputs(lead=(9,)), norm_type="layernorm")     # evicts `probe`'s plan
    info = lnmlp.plan_cache_info()
    assert info["size"] == 2 and info["evictions"] == 3
    assert probe.closed                               # its vjp is gone: closed on eviction
    dx = vjp(np.ones_like(y))[0]
    assert dx.shape == y.shape and np.all(np.isfinite(dx))
    del vjp
    gc.collect()
    assert held() is None                             # freed with its last vjp
    lnmlp.clear_plan_cache()
    assert lnmlp.plan_cache_info()["size"] == 0
