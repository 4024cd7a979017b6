"""An independent NumPy + ml_dtypes simulation of lnmlp's FP8 computation, written from docs/fp8.md
(and docs/design.md, "FP8") and sharing no code with the library or the binding.

Conventions of the simulation:
  * scales are computed in float32 NumPy arithmetic, exactly as the doc's formulas say;
  * FP8 casts are ml_dtypes casts of float32 values (round to nearest even) after clipping to
    +-max finite (ml_dtypes does not saturate: it gives NaN/inf), NaN kept;
  * dequantized operands are float64 (code * scale_inv is exact in float64) and the GEMMs are
    float64, i.e. the exact value of the doc's GEMM contract; the library sums in fp32, so the
    two differ by fp32 summation error only;
  * where the doc computes in fp32 without rounding to D (n, a, dact, dh, dn), the simulation
    computes in float64 and rounds to float32; where it rounds to D (h, y, dW1, dW2 and the
    outputs), it rounds the float32 value to D.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

import _nvfp4_sim
from _reference import act_f

E4M3, E5M2 = "e4m3", "e5m2"
FP8_DTYPE = {E4M3: np.dtype(ml_dtypes.float8_e4m3fn), E5M2: np.dtype(ml_dtypes.float8_e5m2)}
FMT_MAX = {E4M3: np.float32(448.0), E5M2: np.float32(57344.0)}
FLT_MAX = np.float32(np.finfo(np.float32).max)
FLT_MIN = np.float32(np.finfo(np.float32).tiny)  # the smallest normal float, 2^-126
NAMES = ("ln_out", "w1", "act_out", "w2", "dy", "dh")


def formats(fp8_format):
    """Quantizer name -> "e4m3"/"e5m2" for "HYBRID" or "E4M3"."""
    return {n: (E5M2 if fp8_format == "HYBRID" and n in ("dy", "dh") else E4M3) for n in NAMES}


# --- the elementary operations ---------------------------------------------------------------------
def f32(v):
    return np.asarray(v, dtype=np.float32)


def amax(t):
    """max |t| in float32, NaN-propagating (np.max propagates NaN)."""
    t = f32(t)
    return np.float32(np.max(np.abs(t))) if t.size else np.float32(0.0)


def cast_fp8(v32, fmt):
    """Codes of float32 values as float64 (exact): saturating round-to-nearest-even cast."""
    m = FMT_MAX[fmt]
    v = np.clip(f32(v32), -m, m)  # +-inf -> +-max, NaN stays NaN
    return v.astype(FP8_DTYPE[fmt]).astype(np.float64)


def positive_finite(a):
    a = f32(a)
    return np.isfinite(a) & (a > 0)


def current_scale(amax_, fmt, power_2_scale=False, amax_epsilon=0.0):
    """fmt_max / max(amax, eps) in float32; inf -> FLT_MAX; optionally 2^floor(log2(.)) ; 1 for a
    zero or non-finite (floored) amax. Works elementwise on arrays of amaxes."""
    a = f32(amax_)
    eps = np.float32(amax_epsilon)
    a = np.where(a < eps, eps, a)  # NaN < eps is False: NaN stays
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        s = FMT_MAX[fmt] / a
    s = f32(np.where(np.isinf(s), FLT_MAX, s))
    if power_2_scale:
        s = (s.view(np.uint32) & np.uint32(0xFF800000)).view(np.float32)
    return f32(np.where(positive_finite(a), s, np.float32(1.0)))


def delayed_scale(old_scale, history, fmt, margin, algo):
    """The delayed-scaling update given the (already pushed) history."""
    h = f32(history)
    amax_h = np.float32(np.max(h)) if algo == "max" else h[0]  # np.max propagates NaN
    if not positive_finite(amax_h):
        return np.float32(old_scale)
    with np.errstate(divide="ignore", over="ignore", under="ignore"):
        s = np.float32(FMT_MAX[fmt] / amax_h) / np.float32(2.0 ** margin)
    return FLT_MAX if np.isinf(s) else max(np.float32(s), FLT_MIN)


def mxfp8_exponent(amax_block, fmt):
    """e = ceil(log2(amax / fmt_max)) exactly, clamped to [-127, 127]; amax 0 -> -127;
    inf / NaN -> 127. Exact: the smallest e with amax <= fmt_max * 2^e (float64 products of
    powers of two are exact)."""
    a = np.asarray(amax_block, dtype=np.float64)
    m = float(FMT_MAX[fmt])
    finite_pos = np.isfinite(a) & (a > 0)
    safe = np.where(finite_pos, a, 1.0)
    e = np.ceil(np.log2(safe / m)).astype(np.int64)
    for _ in range(2):  # fix the float64 log2's possible off-by-one, exactly
        e = np.where(np.ldexp(m, e) < safe, e + 1, e)
        e = np.where(np.ldexp(m, e - 1) >= safe, e - 1, e)
    e = np.where(finite_pos, e, np.where(a == 0, -127, 127))
    return np.clip(e, -127, 127)


# --- quantize-dequantize in the doc's layouts --------------------------------------------------------
class Q:
    """How one recipe quantizes (kind "delayed", "current", "block", "mxfp8", "nvfp4"; NVFP4's
    options and random stream in `nvfp4`: _nvfp4_sim.operand's keywords)."""

    def __init__(self, kind, fp8_format, power_2_scale=False, amax_epsilon=0.0, nvfp4=None):
        self.kind, self.fmt = kind, formats(fp8_format)
        self.p2, self.eps = power_2_scale, amax_epsilon
        self.nvfp4 = dict(nvfp4 or {})

    def tensor(self, t, name, scale):
        """Per tensor with a given scale: dequantized float64 values."""
        s = np.float32(scale)
        sinv = np.float32(1.0) / s
        return cast_fp8(f32(t) * s, self.fmt[name]) * np.float64(sinv)

    def _blocked(self, t, name, axis, block):
        """1 x block blocks along `axis` (partial last block its own block)."""
        fmt = self.fmt[name]
        t = np.moveaxis(f32(t), axis, -1)
        n = t.shape[-1]
        nb = -(-n // block)
        pad = np.zeros(t.shape[:-1] + (nb * block - n,), np.float32)  # zeros never raise an amax
        tb = np.concatenate([t, pad], -1).reshape(t.shape[:-1] + (nb, block))
        am = np.max(np.abs(tb), axis=-1, keepdims=True)  # NaN-propagating
        if self.kind == "mxfp8":
            e = mxfp8_exponent(am, fmt)
            scale = f32(np.ldexp(np.float32(1.0), -e))  # 2^-e (2^-127 is a float32 subnormal)
            deq = cast_fp8(tb * scale, fmt) * np.ldexp(1.0, e)
            deq = np.where(np.isnan(am), np.nan, deq)  # E8M0 NaN: the whole block is NaN
        else:
            scale = current_scale(am, fmt, self.p2, self.eps)
            deq = cast_fp8(tb * scale, fmt) * (np.float32(1.0) / scale).astype(np.float64)
        out = deq.reshape(t.shape[:-1] + (nb * block,))[..., :n]
        return np.moveaxis(out, -1, axis)

    def _tiles(self, w, name, tile=128):
        fmt = self.fmt[name]
        w = f32(w)
        out = np.empty(w.shape, np.float64)
        for r in range(0, w.shape[0], tile):
            for c in range(0, w.shape[1], tile):
                blk = w[r:r + tile, c:c + tile]
                s = current_scale(amax(blk), fmt, self.p2, self.eps)
                out[r:r + tile, c:c + tile] = cast_fp8(blk * s, fmt) * np.float64(np.float32(1.0) / s)
        return out

    def operand(self, t, name, contract_axis, weight=False, scale=None):
        """Dequantized operand `t` (2-D) quantized for a GEMM contracting `contract_axis`."""
        if self.kind == "nvfp4":
            return _nvfp4_sim.operand(t, name, contract_axis, weight, **self.nvfp4)
        if self.kind in ("delayed", "current"):
            if scale is None:
                scale = current_scale(amax(t), self.fmt[name], self.p2, self.eps)
            return self.tensor(t, name, scale)
        if self.kind == "block" and weight:
            return self._tiles(t, name)
        return self._blocked(t, name, contract_axis, 128 if self.kind == "block" else 32)


def rnd(v, dtype):
    """rnd_D of an fp32 value: float64 -> float32 -> D, back as float64."""
    return f32(v).astype(dtype).astype(np.float64)


# --- the recipes' state ----------------------------------------------------------------------------
class DelayedState:
    """Scale + amax history (newest first) per quantizer, as the doc's delayed scaling keeps them."""

    def __init__(self, history_len, fp8_format="HYBRID", margin=0, algo="max"):
        self.fmt = formats(fp8_format)
        self.margin, self.algo = margin, algo
        self.scale = {n: np.float32(1.0) for n in NAMES}
        self.hist = {n: np.zeros(history_len, np.float32) for n in NAMES}

    def record(self, name, amax_):
        h = self.hist[name]
        self.hist[name] = np.concatenate([[np.float32(amax_)], h[:-1]]).astype(np.float32)
        self.scale[name] = delayed_scale(self.scale[name], self.hist[name], self.fmt[name],
                                         self.margin, self.algo)


# --- the block -------------------------------------------------------------------------------------
class Sim:
    """forward() and backward() of one plan configuration under one recipe (docs/fp8.md).

    recipe: ("delayed", fmt, margin, history_len, algo) | ("current", fmt, p2, eps) |
            ("block", fmt, p2, eps) | ("mxfp8", fmt) | ("nvfp4", rht, stochastic, two_d) (then
            backward draws from q.nvfp4's seed and offset: set them as the plan's random state)
    """

    def __init__(self, recipe, norm="layernorm", acts=("gelu",), eps=1e-6, dtype=np.float32, p=None,
                 grad_dtype=None):
        kind = recipe[0]
        self.kind, self.norm, self.acts, self.eps = kind, norm, tuple(acts), eps
        self.dtype, self.p = np.dtype(dtype), (p or {})
        # dW1, db1, dW2, db2's dtype (the plan's grad_dtype): the I/O dtype unless given.
        self.grad_dtype = self.dtype if grad_dtype is None else np.dtype(grad_dtype)
        if kind == "delayed":
            _, fmt, margin, L, algo = recipe
            self.q = Q("delayed", fmt)
            self.state = DelayedState(L, fmt, margin, algo)
        elif kind in ("current", "block"):
            _, fmt, p2, aeps = recipe
            self.q = Q(kind, fmt, p2, aeps)
            self.state = None
        elif kind == "nvfp4":
            _, rht, stochastic, two_d = recipe
            self.q = Q("nvfp4", "E4M3", nvfp4=dict(rht=rht, stochastic=stochastic, two_d=two_d))
            self.state = None
        else:
            self.q = Q("mxfp8", recipe[1])
            self.state = None
        self.amaxes = {}

    def _scale(self, name):
        return None if self.state is None else self.state.scale[name]

    def forward(self, x, gamma, beta, w1, b1, w2, b2):
        """y (float64 values of D) and the context backward needs."""
        D = self.dtype
        xd = x.astype(np.float64).reshape(-1, x.shape[-1])
        T, H = xd.shape
        _, A, F = w1.shape
        g = gamma.astype(np.float64)
        if self.norm == "layernorm":
            mu = xd.mean(-1, keepdims=True)
            rs = 1.0 / np.sqrt(((xd - mu) ** 2).mean(-1, keepdims=True) + self.eps)
            xhat = (xd - mu) * rs
            n = f32(xhat * g + beta.astype(np.float64))
        else:
            rs = 1.0 / np.sqrt((xd * xd).mean(-1, keepdims=True) + self.eps)
            xhat = xd * rs
            n = f32(xhat * g)
        W1 = f32(w1.astype(np.float32).reshape(H, A * F))
        W2 = f32(w2.astype(np.float32))
        s_ln, s_w1, s_act, s_w2 = (self._scale(k) for k in ("ln_out", "w1", "act_out", "w2"))
        q_ln_row = self.q.operand(n, "ln_out", 1, scale=s_ln)          # GEMM1 contracts H
        q_w1_col = self.q.operand(W1, "w1", 0, weight=True, scale=s_w1)
        hb = f32(q_ln_row @ q_w1_col)
        if b1 is not None:
            hb = hb + f32(b1.astype(np.float32).reshape(A * F))
        h = rnd(hb, D).reshape(T, A, F)
        f0, d0 = act_f(self.acts[0], h[:, 0], self.p)
        if A == 1:
            a64, f1, d1 = f0, None, None
        else:
            f1, d1 = act_f(self.acts[1], h[:, 1], self.p)
            a64 = f0 * f1
        a = f32(a64)
        q_act_row = self.q.operand(a, "act_out", 1, scale=s_act)       # GEMM2 contracts F
        q_w2_col = self.q.operand(W2, "w2", 0, weight=True, scale=s_w2)
        yb = f32(q_act_row @ q_w2_col)
        if b2 is not None:
            yb = yb + f32(b2.astype(np.float32))
        y = rnd(yb, D)
        fwd_scales = dict(w1=s_w1, w2=s_w2, ln_out=s_ln, act_out=s_act)
        self.amaxes.update(ln_out=amax(n), w1=amax(W1), act_out=amax(a), w2=amax(W2))
        if self.state is not None:
            for k in ("ln_out", "w1", "act_out", "w2"):
                self.state.record(k, self.amaxes[k])
        ctx = dict(n=n, W1=W1, W2=W2, h=h, a=a, f0=f0, d0=d0, f1=f1, d1=d1, xhat=xhat, rs=rs, g=g,
                   fwd_scales=fwd_scales, shape=(T, H, A, F), has_b1=b1 is not None,
                   has_b2=b2 is not None)
        return y.reshape(x.shape), ctx

    def backward(self, dy, ctx):
        D = self.dtype
        T, H, A, F = ctx["shape"]
        fs = ctx["fwd_scales"]
        dy32 = f32(dy.astype(np.float32).reshape(T, H))
        G = self.grad_dtype
        db2 = rnd(dy32.astype(np.float64).sum(0), G) if ctx["has_b2"] else None
        s_dy, s_dh = self._scale("dy"), self._scale("dh")
        q_dy_row = self.q.operand(dy32, "dy", 1, scale=s_dy)                       # dact contracts H
        q_w2_row = self.q.operand(ctx["W2"], "w2", 1, weight=True, scale=fs["w2"])
        dact = f32(q_dy_row @ q_w2_row.T)
        q_act_col = self.q.operand(ctx["a"], "act_out", 0, scale=fs["act_out"])    # dW2 contracts T
        q_dy_col = self.q.operand(dy32, "dy", 0, scale=s_dy)
        dw2 = rnd(q_act_col.T @ q_dy_col, G)
        da = dact.astype(np.float64)
        if A == 1:
            dh = f32(da * ctx["d0"])[:, None, :]
        else:
            dh = f32(np.stack([da * ctx["f1"] * ctx["d0"], da * ctx["f0"] * ctx["d1"]], axis=1))
        dh2 = dh.reshape(T, A * F)
        db1 = rnd(dh.astype(np.float64).sum(0), G) if ctx["has_b1"] else None
        q_dh_row = self.q.operand(dh2, "dh", 1, scale=s_dh)                        # dn contracts A*F
        q_w1_row = self.q.operand(ctx["W1"], "w1", 1, weight=True, scale=fs["w1"])
        dn = f32(q_dh_row @ q_w1_row.T).astype(np.float64)
        q_ln_col = self.q.operand(ctx["n"], "ln_out", 0, scale=fs["ln_out"])       # dW1 contracts T
        q_dh_col = self.q.operand(dh2, "dh", 0, scale=s_dh)
        dw1 = rnd(q_ln_col.T @ q_dh_col, G).reshape(H, A, F)
        xhat, rs, g = ctx["xhat"], ctx["rs"], ctx["g"]
        dgamma = rnd((dn * xhat).sum(0), D)
        dbeta = rnd(dn.sum(0), D) if self.norm == "layernorm" else None
        dxhat = dn * g
        proj = (dxhat * xhat).mean(-1, keepdims=True)
        if self.norm == "layernorm":
            dx = rs * (dxhat - dxhat.mean(-1, keepdims=True) - xhat * proj)
        else:
            dx = rs * (dxhat - xhat * proj)
        self.amaxes.update(dy=amax(dy32), dh=amax(dh2))
        if self.state is not None:
            for k in ("dy", "dh"):
                self.state.record(k, self.amaxes[k])
        return dict(dx=rnd(dx, D), dgamma=dgamma, dbeta=dbeta, dw1=dw1,
                    db1=None if db1 is None else db1.reshape(A, F), dw2=dw2, db2=db2)
