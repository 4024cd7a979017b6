"""Forward and every gradient against the float64 reference in _reference.py."""

import numpy as np
import pytest

import lnmlp
import _reference as ref

SINGLES = ["linear", "relu", "gelu", "silu", "quick_gelu", "squared_relu", "sigmoid"]
PAIRS = [("gelu", "linear"), ("silu", "linear"), ("relu", "linear"), ("quick_gelu", "linear"),
         ("squared_relu", "linear"), ("sigmoid", "linear"), ("clamped_silu", "clamped_linear")]
ACTS = [(a,) for a in SINGLES] + PAIRS
# A small limit so that some of the GEMM1 outputs are clamped.
CLAMP = {"limit": 1.25, "alpha": 1.5, "offset": 0.5}


def pick_limit(h, margin):
    """A clamp limit at least `margin` away from every |h|."""
    for limit in np.arange(1.0, 3.0, 0.005):
        if np.min(np.abs(np.abs(h) - limit)) > margin:
            return float(limit)
    raise AssertionError("no clamp limit clear of the data")


def ref_params(acts):
    return CLAMP if acts[0] == "clamped_silu" else {}


def make_inputs(rng, lead, H, F, A, norm, bias1, bias2, zcg):
    x = rng.standard_normal(lead + (H,)) * 1.5 + 0.3
    gamma = rng.standard_normal(H) * 0.2 + (0.0 if zcg else 1.0)
    beta = rng.standard_normal(H) * 0.2 if norm == "layernorm" else None
    w1 = rng.standard_normal((H, A, F)) / np.sqrt(H)
    b1 = rng.standard_normal((A, F)) * 0.2 if bias1 else None
    w2 = rng.standard_normal((F, H)) / np.sqrt(F)
    b2 = rng.standard_normal(H) * 0.2 if bias2 else None
    dy = rng.standard_normal(lead + (H,))
    return dict(x=x, gamma=gamma, beta=beta, w1=w1, b1=b1, w2=w2, b2=b2, dy=dy)


# --- the reference's hand-derived gradients against central finite differences --------------------
@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("acts", ACTS, ids=lambda a: "+".join(a))
def test_reference_gradients_match_finite_differences(acts, norm):
    rng = np.random.default_rng(7)
    t = make_inputs(rng, (3,), 5, 4, len(acts), norm, True, True, zcg=True)
    args = dict(norm=norm, zcg=True, eps=1e-5, acts=acts, p=ref_params(acts))
    names = ["x", "gamma", "beta", "w1", "b1", "w2", "b2"]
    grads = ref.backward(t["dy"], *(t[n] for n in names), **args)

    def loss():
        return float((ref.forward(*(t[n] for n in names), **args)[0] * t["dy"]).sum())

    h = 1e-6
    for n in names:
        if t[n] is None:
            continue
        arr = t[n]
        fd = np.zeros_like(arr)
        for i in np.ndindex(arr.shape):
            old = arr[i]
            arr[i] = old + h
            lp = loss()
            arr[i] = old - h
            lm = loss()
            arr[i] = old
            fd[i] = (lp - lm) / (2 * h)
        g = grads["d" + n]
        assert np.max(np.abs(g - fd)) <= 1e-6 * max(1.0, np.max(np.abs(fd))), n


# --- the library against the reference -------------------------------------------------------------
def run_case(acts, norm, dtype_name, bias1=True, bias2=True, zcg=False, lead=(2, 3), H=32, F=24,
             remat="save_all", seed=0, weight_layout="in_out"):
    dtype = ref.DTYPES[dtype_name]
    rng = np.random.default_rng(seed)
    t = make_inputs(rng, lead, H, F, len(acts), norm, bias1, bias2, zcg)
    # cast to the I/O dtype; the reference sees exactly the cast values
    c = {k: (None if v is None else v.astype(dtype)) for k, v in t.items()}
    eps = 1e-5
    T = int(np.prod(lead))
    r = {k: (None if v is None else v.astype(np.float64)) for k, v in c.items()}
    args = (r["x"].reshape(T, H), r["gamma"], r["beta"], r["w1"], r["b1"], r["w2"], r["b2"])
    p = ref_params(acts)
    if acts[0] == "clamped_silu":
        # The clamp's derivative jumps at +-limit; keep every GEMM1 output clear of it by more
        # than the I/O dtype's rounding, so the test compares numerics, not which side of a kink.
        h = ref.forward(*args, norm=norm, zcg=zcg, eps=eps, acts=acts, p=p)[1]["h"]
        p = dict(p, limit=pick_limit(h, margin=0.02))
    w1, w2 = c["w1"], c["w2"]  # [H, A, F] and [F, H]; out x in: [A, F, H] and [H, F]
    if weight_layout == "out_in":
        w1, w2 = np.ascontiguousarray(w1.transpose(1, 2, 0)), np.ascontiguousarray(w2.T)
    with lnmlp.Plan(int(np.prod(lead)), H, F, norm_type=norm, zero_centered_gamma=zcg,
                    epsilon=eps, activation_type=acts, act_params=p or None, use_bias1=bias1, use_bias2=bias2,
                    dtype=dtype, remat=remat, weight_layout=weight_layout) as plan:
        assert plan.tensor_shape("w1") == w1.shape and plan.tensor_shape("dw2") == w2.shape
        y, saved = plan.forward(c["x"], c["gamma"], c["beta"], w1, c["b1"], w2, c["b2"])
        g = plan.backward(c["dy"], c["x"], c["gamma"], c["beta"], w1, c["b1"], w2, saved)
    assert y.dtype == dtype and y.shape == lead + (H,)
    assert g.dx.shape == lead + (H,)
    kw = dict(norm=norm, zcg=zcg, eps=eps, acts=acts, p=p)
    y_ref, _ = ref.forward(*args, **kw)
    gr = ref.backward(r["dy"].reshape(T, H), *args, **kw)
    label = f"{'+'.join(acts)}/{norm}/{dtype_name}"
    ref.assert_close(f"y {label}", y.reshape(T, H), y_ref, dtype_name)
    for name in ("dx", "dgamma", "dbeta", "dw1", "db1", "dw2", "db2"):
        got = getattr(g, name)
        if gr[name] is None:
            assert got is None, f"{name} should be None"
            continue
        if name == "dx":
            got = got.reshape(T, H)
        if weight_layout == "out_in" and name in ("dw1", "dw2"):
            got = got.transpose(2, 0, 1) if name == "dw1" else got.T
        assert got.dtype == dtype
        ref.assert_close(f"{name} {label}", got, gr[name], dtype_name)


@pytest.mark.parametrize("dtype_name", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("acts", ACTS, ids=lambda a: "+".join(a))
def test_forward_backward(acts, norm, dtype_name):
    run_case(acts, norm, dtype_name)


@pytest.mark.parametrize("zcg", [False, True], ids=["gamma", "zero_centered"])
@pytest.mark.parametrize("bias1,bias2", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("acts", [("gelu",), ("silu", "linear")], ids=lambda a: "+".join(a))
def test_bias_and_gamma_options(acts, norm, bias1, bias2, zcg):
    run_case(acts, norm, "float32", bias1=bias1, bias2=bias2, zcg=zcg, seed=1)


@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
def test_zero_centered_gamma_reduced_precision(dtype_name):
    run_case(("gelu", "linear"), "rmsnorm", dtype_name, zcg=True, seed=2)


@pytest.mark.parametrize("lead", [(), (5,), (2, 3), (2, 1, 3)], ids=str)
def test_leading_dims(lead):
    run_case(("relu",), "layernorm", "float32", lead=lead if lead else (1,), seed=3)


@pytest.mark.parametrize("remat", ["save_all", "save_stats"])
@pytest.mark.parametrize("dtype_name", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("acts", [("gelu",), ("silu", "linear")], ids=lambda a: "+".join(a))
def test_weights_out_in(acts, dtype_name, remat):
    # PyTorch's layout (w1 [A, F, H], w2 [H, F]; dw1, dw2 alike) against the same reference.
    run_case(acts, "layernorm", dtype_name, remat=remat, weight_layout="out_in")


@pytest.mark.parametrize("remat", ["save_all", "save_ffn1", "save_stats"])
def test_remat_policies(remat):
    run_case(("silu", "linear"), "layernorm", "float32", remat=remat, seed=4)
    run_case(("gelu",), "rmsnorm", "bfloat16", remat=remat, seed=4)


def test_gated_pair_with_nonlinear_second_function():
    run_case(("silu", "gelu"), "layernorm", "float32", seed=5)
