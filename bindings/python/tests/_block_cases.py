"""Inputs, configurations and the float64 answer shared by the framework tests (test_jax.py,
test_torch.py): the same cases checked the same way through each framework's op."""

import numpy as np

import _reference as ref

H, F = 16, 24
EPS = 1e-6
CLAMP = {"limit": 0.75, "alpha": 1.702, "offset": 1.0}  # a small limit, so the clamp is exercised

CASES = [  # norm, activations, biases, zero-centered gamma, act_params
    ("layernorm", ("gelu",), (True, True), False, None),
    ("rmsnorm", ("relu",), (False, False), True, None),
    ("layernorm", ("silu", "linear"), (True, False), True, None),
    ("rmsnorm", ("clamped_silu", "clamped_linear"), (False, True), False, CLAMP),
]


def case_id(c):
    return f"{c[0]}-{'_'.join(c[1])}-b{int(c[2][0])}{int(c[2][1])}-z{int(c[3])}"


def make(A, dtype, lead=(2, 3), norm="layernorm", bias=(True, True), seed=0, H=H, F=F):
    """x [*lead, H], gamma, beta, k1 [H, A, F], k2 [F, H], b1 [A, F], b2 [H] of `dtype` (NumPy)."""
    rng = np.random.default_rng(seed)
    f = lambda *s: (rng.standard_normal(s) * 0.5).astype(dtype)  # noqa: E731
    return dict(x=f(*lead, H), gamma=(1 + f(H)).astype(dtype), beta=f(H) if norm == "layernorm" else None,
                k1=f(H, A, F), k2=f(F, H), b1=f(A, F) if bias[0] else None, b2=f(H) if bias[1] else None)


def reference(d, norm, acts, zcg=False, p=None):
    """y and every gradient of sum(y * dy) in float64, for dy = cos(index) (fixed, nonzero)."""
    x2 = np.asarray(d["x"], np.float64).reshape(-1, d["x"].shape[-1])
    args = (x2, d["gamma"], d["beta"], d["k1"], d["b1"], d["k2"], d["b2"], norm, zcg, EPS, acts, p or {})
    y, _ = ref.forward(*args)
    dy = np.cos(np.arange(y.size, dtype=np.float64)).reshape(y.shape)
    return y, dy, ref.backward(dy, *args)
