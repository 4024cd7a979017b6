"""An independent float64 NumPy reference of the fused LayerNorm-MLP (forward and hand-derived
backward), written from docs/design.md, "What is computed" and sharing no code with the library or binding."""

import numpy as np
import ml_dtypes

DTYPES = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16),
          "bfloat16": np.dtype(ml_dtypes.bfloat16)}
# Tolerance on max|got - ref| / max|ref|, per tensor, by I/O dtype: the one place they live.
TOLERANCES = {"float32": 1e-5, "float16": 4e-3, "bfloat16": 3e-2}
# Largest normalised error seen per dtype (printed at the end of the session by conftest.py).
MAX_ERRORS = {}
# An FP8 recipe split over a device mesh (test_jax_mesh.py) against the same call on one device,
# same measure: as docs/sharding.md says of a sharded plan (and tests/tolerances.h's
# kTolFp8Sharded), every rank quantizes with the unsharded call's per-tensor scales and blocked
# scales are powers of 2, so what differs is the order of fp32 sums (GEMM2's and dx's partials
# over F/P, and a rounding of each partial to the I/O dtype). That moves an intermediate across an
# FP8 rounding boundary in a few elements (one E4M3 step is 12.5 % of the value), which 0.04 bounds;
# a rank using its own scale instead of the group's, or a wrong reduction, errs by far more.
TOLERANCE_FP8_SHARDED = 0.04
# What each mesh configuration measured (test_jax_mesh.py): printed by conftest.py at the end.
MESH_REPORT = []

SQRT_2_OVER_PI = np.sqrt(2.0 / np.pi)


def _sig(x):
    return 1.0 / (1.0 + np.exp(-x))


def act_f(name, x, p):
    """f(x) and f'(x) in float64."""
    if name == "linear":
        return x, np.ones_like(x)
    if name == "relu":
        return np.maximum(x, 0.0), (x > 0).astype(np.float64)
    if name == "gelu":
        u = SQRT_2_OVER_PI * (x + 0.044715 * x ** 3)
        t = np.tanh(u)
        return (0.5 * x * (1 + t),
                0.5 * (1 + t) + 0.5 * x * (1 - t * t) * SQRT_2_OVER_PI * (1 + 3 * 0.044715 * x * x))
    if name == "silu":
        s = _sig(x)
        return x * s, s + x * s * (1 - s)
    if name == "quick_gelu":
        s = _sig(1.702 * x)
        return x * s, s + 1.702 * x * s * (1 - s)
    if name == "squared_relu":
        return np.where(x > 0, x * x, 0.0), np.where(x > 0, 2 * x, 0.0)
    if name == "sigmoid":
        s = _sig(x)
        return s, s * (1 - s)
    if name == "clamped_silu":
        limit, alpha = p["limit"], p["alpha"]
        c = np.minimum(x, limit)
        s = _sig(alpha * c)
        return c * s, np.where(x > limit, 0.0, s + alpha * c * s * (1 - s))
    if name == "clamped_linear":
        limit, offset = p["limit"], p["offset"]
        return np.clip(x, -limit, limit) + offset, (np.abs(x) <= limit).astype(np.float64)
    raise ValueError(name)


def forward(x, gamma, beta, w1, b1, w2, b2, norm, zcg, eps, acts, p):
    """y and the intermediates, all float64. x: [T, H]; w1: [H, A, F]."""
    x = x.astype(np.float64)
    g = gamma.astype(np.float64) + (1.0 if zcg else 0.0)
    H, A, F = w1.shape
    if norm == "layernorm":
        mu = x.mean(-1, keepdims=True)
        rs = 1.0 / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)
        xhat = (x - mu) * rs
        n = xhat * g + beta.astype(np.float64)
    else:
        rs = 1.0 / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
        xhat = x * rs
        n = xhat * g
    h = (n @ w1.astype(np.float64).reshape(H, A * F)).reshape(-1, A, F)
    if b1 is not None:
        h = h + b1.astype(np.float64)
    f0, d0 = act_f(acts[0], h[:, 0], p)
    if A == 1:
        a = f0
        f1 = d1 = None
    else:
        f1, d1 = act_f(acts[1], h[:, 1], p)
        a = f0 * f1
    y = a @ w2.astype(np.float64)
    if b2 is not None:
        y = y + b2.astype(np.float64)
    return y, dict(xhat=xhat, rs=rs, g=g, n=n, h=h, a=a, f0=f0, d0=d0, f1=f1, d1=d1)


def backward(dy, x, gamma, beta, w1, b1, w2, b2, norm, zcg, eps, acts, p, dn_extra=None):
    """Hand-derived gradients of L = sum(y * dy): dict dx, dgamma, dbeta, dw1, db1, dw2, db2.
    dn_extra [T, H]: the cotangent of the norm output n, when the loss also reads n (L + sum(n *
    dn_extra)), which joins the one that comes back through GEMM1."""
    _, c = forward(x, gamma, beta, w1, b1, w2, b2, norm, zcg, eps, acts, p)
    dy = dy.astype(np.float64)
    H, A, F = w1.shape
    dw2 = c["a"].T @ dy
    db2 = dy.sum(0)
    da = dy @ w2.astype(np.float64).T
    if A == 1:
        dh = (da * c["d0"])[:, None, :]
    else:
        dh = np.stack([da * c["f1"] * c["d0"], da * c["f0"] * c["d1"]], axis=1)
    dh2 = dh.reshape(-1, A * F)
    dw1 = (c["n"].T @ dh2).reshape(H, A, F)
    db1 = dh.sum(0)
    dn = dh2 @ w1.astype(np.float64).reshape(H, A * F).T
    if dn_extra is not None:
        dn = dn + dn_extra.astype(np.float64)
    dgamma = (dn * c["xhat"]).sum(0)
    dbeta = dn.sum(0)
    dxhat = dn * c["g"]
    xhat, rs = c["xhat"], c["rs"]
    proj = (dxhat * xhat).mean(-1, keepdims=True)
    if norm == "layernorm":
        dx = rs * (dxhat - dxhat.mean(-1, keepdims=True) - xhat * proj)
    else:
        dx = rs * (dxhat - xhat * proj)
    return dict(dx=dx, dgamma=dgamma, dbeta=dbeta if norm == "layernorm" else None,
                dw1=dw1, db1=db1 if b1 is not None else None, dw2=dw2,
                db2=db2 if b2 is not None else None)


def assert_close(name, got, ref, dtype_name):
    """max|got - ref| / max|ref| <= TOLERANCES[dtype]; records the error for the summary."""
    assert got is not None, f"{name} is None"
    got = np.asarray(got).astype(np.float64)
    assert got.shape == ref.shape, f"{name}: shape {got.shape} != {ref.shape}"
    assert np.all(np.isfinite(got)), f"{name}: non-finite values"
    scale = max(float(np.max(np.abs(ref))), 1e-30)
    err = float(np.max(np.abs(got - ref))) / scale
    key = dtype_name
    if err > MAX_ERRORS.get(key, (-1.0, ""))[0]:
        MAX_ERRORS[key] = (err, name)
    tol = TOLERANCES[dtype_name]
    assert err <= tol, f"{name} ({dtype_name}): normalised error {err:.3e} > {tol:.1e}"
    return err
