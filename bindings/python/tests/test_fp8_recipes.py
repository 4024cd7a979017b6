"""FP8 recipes: Plan(recipe=...), the quantizer sets of the functional API, the delayed-scaling state.

Every recipe's forward and gradients are checked against
  1. _fp8_sim.Sim, an independent NumPy + ml_dtypes simulation of docs/fp8.md with float64 GEMMs
     (a tight tolerance: the two differ only by fp32 summation order, see SIM_TOL), and
  2. _reference, the unquantized float64 reference, within TransformerEngine's FP8 tolerances.
"""

import math

import ml_dtypes
import numpy as np
import pytest

import lnmlp
import _fp8_sim as sim
import _reference as ref

BF16 = np.dtype(ml_dtypes.bfloat16)

# ================================================================================================
# TOLERANCES -- the one place they live.
#
# (a) Against the unquantized float64 reference: TransformerEngine's own FP8 tolerances. TE's
#     JAX test of this very function (tests/jax/test_custom_call_compute.py,
#     TestFusedDense.test_layernorm_mlp_grad) checks the output with
#     assert_allclose(..., dtype=jnp.float8_e4m3fn) and the gradients with dtype=jnp.float8_e5m2
#     (tests/jax/utils.py, dtype_tols: rtol = eps**(2/3), atol = max(ulp(1.0), eps**(2/3))), i.e.
#       E4M3 (eps 2^-3): rtol = atol = 0.25;   E5M2 (eps 2^-2): rtol = atol = 0.397
#     elementwise, |got - ref| <= atol + rtol |ref|, on O(1) data (TE draws x ~ N(0, 1), kernels
#     ~ N(0, 1)/sqrt(fan_in), as make_inputs does). Our weight gradients are sums over T tokens
#     (not O(1)), so each tensor is first divided by max|ref| (check_te). Gradients use the
#     backward format of the recipe (E5M2 under HYBRID, E4M3 under E4M3). As in TE's test, the
#     activations are smooth (gelu, geglu, swiglu): ReLU's derivative jumps at 0, so a quantized
#     h of the other sign flips a whole dh element, which no FP8 tolerance bounds.
# (b) Against the simulation (same quantization, float64 GEMMs): the library sums FP8 products in
#     fp32 (relative error ~1e-6) and, for blocks without power-of-two scales, dequantizes in fp32
#     (2^-24). Those tiny differences can move a value that lies within ~1e-6 of an FP8 rounding
#     boundary to the neighbouring code (one FP8 ulp, 2^-3 or 2^-2 relative, of ONE element of a
#     computed tensor: ln_out, act_out, dh), which then shifts the outputs that element feeds by a
#     small amount: a flipped ln_out/act_out/dh element changes one row of y/dx and one column of
#     dW1/dW2 (and, by ~1e-3 of their max, the reductions dgamma, dbeta). Hence two criteria,
#     normalised by max|sim| per tensor:
#       * max error <= SIM_MAX_ERR: an isolated flip moves a value by up to ~1.5e-2 of the
#         tensor's max (seen: one E5M2 dh code near its amax, 1.4e-2 on dW1); wrong semantics
#         (scale, format, block orientation, rounding point) give errors of the size of FP8's own
#         error, 5e-2 .. 1e-1, on most elements;
#       * the bulk agrees to fp32 accuracy: every element that differs by more than
#         SIM_ELEM_ERR (+ one rounding of the I/O dtype) lies in at most SIM_FLIP_LINES rows or
#         columns of a 2-D tensor (the lines isolated flips touch).
# (c) Delayed-scaling amaxes: inputs (w1, w2, dy) are exact (the same float32 values); computed
#     tensors (ln_out, act_out, dh) are computed in fp32 by the library and in float64 rounded to
#     float32 by the simulation, so their amaxes agree to a few fp32 ulps: AMAX_RTOL.
# ================================================================================================
TE_FP8_TOLS = {"e4m3": dict(rtol=0.125 ** (2 / 3), atol=0.125 ** (2 / 3)),
               "e5m2": dict(rtol=0.25 ** (2 / 3), atol=0.25 ** (2 / 3))}
SIM_MAX_ERR = {"float32": 2e-2, "bfloat16": 3e-2}
SIM_ELEM_ERR = 2e-5
SIM_FLIP_LINES = 4
AMAX_RTOL = 1e-6
IO_EPS = {"float32": 2.0 ** -24, "bfloat16": 2.0 ** -8}

# Recipes under test: id -> spec for _fp8_sim.Sim. The lnmlp object is made by recipe_of().
RECIPES = {
    "delayed-hybrid": ("delayed", "HYBRID", 0, 16, "max"),
    "delayed-e4m3-margin1-recent": ("delayed", "E4M3", 1, 16, "most_recent"),
    "current-hybrid": ("current", "HYBRID", False, 0.0),
    "current-e4m3-p2-eps": ("current", "E4M3", True, 0.5),
    "block-p2": ("block", "E4M3", True, 0.0),
    "block-nop2-hybrid": ("block", "HYBRID", False, 0.0),
    "block-p2-eps": ("block", "E4M3", True, 0.05),
    "mxfp8-e4m3": ("mxfp8", "E4M3"),
    "mxfp8-hybrid": ("mxfp8", "HYBRID"),
}

# (T, H, F, norm, activations, dtype, biases): sizes not multiples of 128/32 exercise partial blocks
CONFIGS = {
    "ln-gelu-partial": (160, 96, 200, "layernorm", ("gelu",), np.float32, True),
    "rms-swiglu": (64, 256, 136, "rmsnorm", ("silu", "linear"), np.float32, False),
    "ln-geglu-bf16": (96, 64, 168, "layernorm", ("gelu", "linear"), BF16, True),
}


def recipe_of(spec):
    kind = spec[0]
    if kind == "delayed":
        return lnmlp.DelayedScaling(margin=spec[2], fp8_format=spec[1], amax_history_len=spec[3],
                                    amax_compute_algo=spec[4])
    if kind == "current":
        return lnmlp.Float8CurrentScaling(fp8_format=spec[1], power_2_scale=spec[2], amax_epsilon=spec[3])
    if kind == "block":
        return lnmlp.Float8BlockScaling(fp8_format=spec[1], power_2_scale=spec[2], amax_epsilon=spec[3])
    return lnmlp.MXFP8BlockScaling(fp8_format=spec[1])


def make_inputs(T, H, F, A, norm, dtype, bias, seed):
    rng = np.random.default_rng(seed)
    n = rng.standard_normal
    c = lambda v: np.ascontiguousarray(v).astype(dtype)  # noqa: E731
    return dict(x=c(n((T, H))), gamma=c(1 + 0.2 * n(H)), beta=c(0.1 * n(H)) if norm == "layernorm" else None,
                w1=c(n((H, A, F)) / math.sqrt(H)), b1=c(0.1 * n((A, F))) if bias else None,
                w2=c(n((F, H)) / math.sqrt(F)), b2=c(0.1 * n(H)) if bias else None)


def inputs_for(cfg, seed):
    T, H, F, norm, acts, dtype, bias = cfg
    return make_inputs(T, H, F, len(acts), norm, dtype, bias, seed)


def make_dy(T, H, dtype, seed):
    return np.random.default_rng(1000 + seed).standard_normal((T, H)).astype(dtype)


ARGS = ("x", "gamma", "beta", "w1", "b1", "w2", "b2")


def plan_for(cfg, recipe, remat="save_all", **kw):
    T, H, F, norm, acts, dtype, bias = cfg
    return lnmlp.Plan(T, H, F, norm_type=norm, activation_type=acts, use_bias1=bias, use_bias2=bias,
                      dtype=dtype, remat=remat, recipe=recipe, **kw)


def step(plan, inp, dy):
    y, saved = plan.forward(*(inp[k] for k in ARGS))
    g = plan.backward(dy, inp["x"], inp["gamma"], inp["beta"], inp["w1"], inp["b1"], inp["w2"], saved)
    return y, g._asdict()


def sim_for(cfg, spec):
    T, H, F, norm, acts, dtype, bias = cfg
    return sim.Sim(spec, norm=norm, acts=acts, dtype=dtype)


def sim_step(s, inp, dy):
    y, ctx = s.forward(*(inp[k] for k in ARGS))
    return y, s.backward(dy, ctx)


def check_sim(name, got, want, dtype):
    got = np.asarray(got).astype(np.float64)
    assert got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape}"
    assert np.all(np.isfinite(got)), f"{name}: non-finite values"
    dn = np.dtype(dtype).name
    scale = max(float(np.max(np.abs(want))), 1e-30)
    diff = np.abs(got - want)
    err = float(diff.max()) / scale
    assert err <= SIM_MAX_ERR[dn], f"{name}: max error vs simulation {err:.2e} > {SIM_MAX_ERR[dn]:.0e}"
    if want.ndim >= 2:
        off = (diff > SIM_ELEM_ERR * scale + IO_EPS[dn] * np.abs(want)).reshape(want.shape[0], -1)
        total = int(off.sum())
        for _ in range(SIM_FLIP_LINES):  # take away the row or column with the most mismatches
            rows, cols = off.sum(1), off.sum(0)
            if rows.max() >= cols.max():
                off[rows.argmax(), :] = False
            else:
                off[:, cols.argmax()] = False
        assert not off.any(), (f"{name}: {total} elements ({total / off.size:.1%}) off the simulation by more "
                               f"than fp32 accuracy, not confined to {SIM_FLIP_LINES} rows/columns")
    return err


def check_te(name, got, want, fmt):
    """TE's elementwise FP8 tolerance on the tensor in units of max|ref| (TE's data are O(1))."""
    m = max(float(np.max(np.abs(want))), 1e-30)
    got, want = np.asarray(got).astype(np.float64) / m, want / m
    tol = TE_FP8_TOLS[fmt]
    bad = np.abs(got - want) > tol["atol"] + tol["rtol"] * np.abs(want)
    assert not bad.any(), (f"{name}: {bad.sum()} elements outside TransformerEngine's {fmt} tolerance "
                           f"(max |diff| {np.abs(got - want).max():.3g})")


def reference(cfg, inp, dy):
    T, H, F, norm, acts, dtype, bias = cfg
    f64 = lambda a: None if a is None else a.astype(np.float64)  # noqa: E731
    args = [f64(inp[k]) for k in ARGS]
    kw = dict(norm=norm, zcg=False, eps=1e-6, acts=acts, p={})
    return ref.forward(*args, **kw)[0], ref.backward(f64(dy), *args, **kw)


# ---------------------------------------------------------------------------------------------------
# recipe objects
# ---------------------------------------------------------------------------------------------------
def test_recipe_defaults_match_transformer_engine():
    d = lnmlp.DelayedScaling()
    assert (d.margin, d.fp8_format, d.amax_history_len, d.amax_compute_algo) == (0, "HYBRID", 1024, "max")
    c = lnmlp.Float8CurrentScaling()
    assert (c.fp8_format, c.power_2_scale, c.amax_epsilon) == ("HYBRID", False, 0.0)
    b = lnmlp.Float8BlockScaling()
    assert (b.fp8_format, b.power_2_scale, b.amax_epsilon) == ("E4M3", True, 0.0)
    assert lnmlp.MXFP8BlockScaling().fp8_format == "E4M3"
    assert lnmlp.DelayedScaling(fp8_format="hybrid") == d and hash(lnmlp.DelayedScaling()) == hash(d)
    assert lnmlp.Float8CurrentScaling() != lnmlp.Float8BlockScaling(fp8_format="HYBRID", power_2_scale=False)

    class Format:  # an enum-like object, as TE's recipe.Format.E4M3
        name = "E4M3"
    assert lnmlp.MXFP8BlockScaling(Format()).fp8_format == "E4M3"
    with pytest.raises(AttributeError):
        d.margin = 3


@pytest.mark.parametrize("make, match", [
    (lambda: lnmlp.DelayedScaling(margin=1.5), "margin must be an int"),
    (lambda: lnmlp.DelayedScaling(margin=200), r"margin must be in \[-126, 127\]"),
    (lambda: lnmlp.DelayedScaling(amax_history_len=0), "amax_history_len must be in"),
    (lambda: lnmlp.DelayedScaling(amax_history_len=True), "amax_history_len must be an int"),
    (lambda: lnmlp.DelayedScaling(amax_compute_algo=max), "amax_compute_algo must be 'max' or 'most_recent'"),
    (lambda: lnmlp.DelayedScaling(fp8_format="E5M2"), "'E5M2' is not supported"),
    (lambda: lnmlp.Float8CurrentScaling(fp8_format="fp8"), "fp8_format must be 'HYBRID' or 'E4M3'"),
    (lambda: lnmlp.Float8CurrentScaling(power_2_scale=1), "power_2_scale must be True or False"),
    (lambda: lnmlp.Float8CurrentScaling(amax_epsilon=-1.0), "amax_epsilon must be finite"),
    (lambda: lnmlp.Float8BlockScaling(amax_epsilon=float("nan")), "amax_epsilon must be finite"),
    (lambda: lnmlp.Float8BlockScaling(amax_epsilon=1e300), "amax_epsilon must be finite"),
    (lambda: lnmlp.MXFP8BlockScaling(fp8_format=None), "fp8_format must be"),
    (lambda: lnmlp.Plan(8, 8, 8, recipe="delayed"), "recipe must be None or an lnmlp recipe"),
    (lambda: lnmlp.make_quantizer_set("delayed"), "needs an lnmlp recipe"),
])
def test_recipe_validation(make, match):
    with pytest.raises(lnmlp.InvalidArgumentError, match=match):
        make()


# ---------------------------------------------------------------------------------------------------
# numerics: every recipe against the simulation and the reference
# ---------------------------------------------------------------------------------------------------
_CASES = [(r, c) for r in RECIPES for c in ("ln-gelu-partial", "rms-swiglu")] + \
         [(r, "ln-geglu-bf16") for r in ("delayed-hybrid", "current-hybrid", "block-nop2-hybrid", "mxfp8-e4m3")]


@pytest.mark.parametrize("rid, cid", _CASES)
def test_forward_and_gradients(rid, cid):
    spec, cfg = RECIPES[rid], CONFIGS[cid]
    T, H, F, norm, acts, dtype, bias = cfg
    inp = make_inputs(T, H, F, len(acts), norm, dtype, bias, seed=3)
    dy = make_dy(T, H, dtype, seed=3)
    s = sim_for(cfg, spec)
    with plan_for(cfg, recipe_of(spec)) as plan:
        steps = 2 if spec[0] == "delayed" else 1  # delayed: the second step uses calibrated scales
        for _ in range(steps):
            y, g = step(plan, inp, dy)
            y_sim, g_sim = sim_step(s, inp, dy)
    y_ref, g_ref = reference(cfg, inp, dy)
    bwd_fmt = "e5m2" if spec[1] == "HYBRID" else "e4m3"
    check_sim(f"y {rid}/{cid}", y, y_sim, dtype)
    check_te(f"y {rid}/{cid}", y, y_ref, "e4m3")
    for k, v in g_ref.items():
        if v is None:
            assert g[k] is None and g_sim[k] is None, k
            continue
        check_sim(f"{k} {rid}/{cid}", g[k], g_sim[k], dtype)
        check_te(f"{k} {rid}/{cid}", g[k], v, bwd_fmt)


@pytest.mark.parametrize("rid", list(RECIPES))
def test_remat_policies_give_identical_results(rid):
    spec, cfg = RECIPES[rid], CONFIGS["ln-gelu-partial"]
    T, H, F, norm, acts, dtype, bias = cfg
    results = {}
    for remat in ("save_all", "save_ffn1", "save_stats"):
        with plan_for(cfg, recipe_of(spec), remat=remat) as plan:
            out = []
            for i in range(3):
                inp = make_inputs(T, H, F, len(acts), norm, dtype, bias, seed=10 + i)
                out.append(step(plan, inp, make_dy(T, H, dtype, seed=10 + i)))
            results[remat] = (out, plan.export_state())
    base_out, base_state = results["save_all"]
    for remat, (out, state) in results.items():
        assert state == base_state, remat
        for (y0, g0), (y1, g1) in zip(base_out, out):
            np.testing.assert_array_equal(y1, y0, err_msg=f"y {remat}")
            for k in g0:
                if g0[k] is not None:
                    np.testing.assert_array_equal(g1[k], g0[k], err_msg=f"{k} {remat}")


# ---------------------------------------------------------------------------------------------------
# fp32 weights with a bf16 plan (weight_dtype="float32"): quantized directly, not rounded to bf16 first
# ---------------------------------------------------------------------------------------------------
HAZARD_K = 9  # the weights are 2^-K times values at FP8 scale, so every recipe's scale is 2^K


def double_rounding_hazards(shape, seed):
    """float32 weights on which quantizing directly and quantizing a bf16 copy give different E4M3
    codes everywhere but at the amax elements. At scale 2^K each value is c + ulp/2 + d, c an E4M3
    value with an even mantissa, ulp its E4M3 spacing, d a quarter of bf16's half-spacing there:
    directly it rounds up to c + ulp; rounded to bf16 first it becomes the midpoint c + ulp/2,
    which ties to the even c. The elements with (row + column) % 16 == 0 are +-448 (E4M3's max) so
    that every 1x32 block, 128x128 tile and the whole tensor has the amax 448 * 2^-K: per-tensor,
    block and MXFP8 scales all come out 2^K exactly."""
    rng = np.random.default_rng(seed)
    e = rng.integers(2, 8, size=shape)                     # c in [4, 224], not far below the amax
    c = (1 + rng.choice([0, 2, 4, 6], size=shape) / 8) * np.exp2(e)
    v = c + np.exp2(e - 4) + np.exp2(e - 9)
    idx = np.indices(shape)
    v = np.where((idx[0] + idx[-1]) % 16 == 0, 448.0, v)
    v = v * rng.choice([-1.0, 1.0], size=shape) * 2.0 ** -HAZARD_K
    return v.astype(np.float32)


@pytest.mark.parametrize("rid", ["delayed-hybrid", "current-hybrid", "block-nop2-hybrid", "mxfp8-e4m3"])
def test_float32_weights_are_quantized_directly(rid):
    spec = RECIPES[rid]
    T, H, F, norm, acts, bias = 64, 64, 96, "layernorm", ("gelu",), True
    inp = make_inputs(T, H, F, 1, norm, BF16, bias, seed=5)
    inp["w1"] = double_rounding_hazards((H, 1, F), seed=6)
    inp["w2"] = double_rounding_hazards((F, H), seed=7)
    dy = make_dy(T, H, BF16, seed=5)
    direct = sim.Sim(spec, norm=norm, acts=acts, dtype=BF16, grad_dtype=np.float32)
    via_bf16 = sim.Sim(spec, norm=norm, acts=acts, dtype=BF16, grad_dtype=np.float32)
    rounded = dict(inp, w1=inp["w1"].astype(BF16), w2=inp["w2"].astype(BF16))
    with lnmlp.Plan(T, H, F, norm_type=norm, activation_type=acts, use_bias1=bias, use_bias2=bias, dtype=BF16,
                    recipe=recipe_of(spec), weight_dtype="float32", grad_dtype="float32") as plan:
        assert plan.weight_dtype == np.float32 and plan.grad_dtype == np.float32
        with pytest.raises(lnmlp.InvalidArgumentError, match="w1 has dtype bfloat16"):
            plan.forward(*(rounded[k] for k in ARGS))
        for _ in range(2 if spec[0] == "delayed" else 1):  # delayed: the second step's scale is 2^K
            y, g = step(plan, inp, dy)
            y_sim, g_sim = sim_step(direct, inp, dy)
            y_bf16, _ = sim_step(via_bf16, rounded, dy)
    # The test can fail: rounding the weights to bf16 first gives a y outside the tolerance.
    with pytest.raises(AssertionError):
        check_sim("y of bf16-rounded weights", y_bf16, y_sim, BF16)
    check_sim(f"y {rid}", y, y_sim, BF16)
    for k, v in g_sim.items():
        if v is not None:
            assert g[k].dtype == (np.float32 if k in ("dw1", "db1", "dw2", "db2") else BF16), k
            check_sim(f"{k} {rid}", g[k], v, BF16)


def test_float32_weights_need_an_fp8_recipe():
    with pytest.raises(lnmlp.NotSupportedError, match="need an FP8 recipe"):
        lnmlp.Plan(64, 64, 96, dtype=BF16, weight_dtype="float32")
    with pytest.raises(lnmlp.InvalidArgumentError, match="weight_dtype must be"):
        lnmlp.Plan(64, 64, 96, dtype=BF16, weight_dtype="int8")


# ---------------------------------------------------------------------------------------------------
# delayed scaling: the state over several steps
# ---------------------------------------------------------------------------------------------------
EXACT_AMAX = ("w1", "w2", "dy")        # the amaxes of inputs: the same float32 values
COMPUTED_AMAX = ("ln_out", "act_out", "dh")


def expected_scale(old, hist, fmt, margin, algo):
    """The update rule of docs/fp8.md in float32 NumPy, from the library's recorded history."""
    h = np.asarray(hist, np.float32)
    amax_h = np.float32(np.max(h)) if algo == "max" else h[0]
    if not (np.isfinite(amax_h) and amax_h > 0):
        return np.float32(old)
    with np.errstate(over="ignore", divide="ignore"):
        s = np.float32(sim.FMT_MAX[fmt] / amax_h) / np.float32(2.0 ** margin)
    return sim.FLT_MAX if np.isinf(s) else s


def check_state_against(plan, s, spec, prev_scales):
    _, fmt_name, margin, L, algo = spec
    fmts = sim.formats(fmt_name)
    for n in lnmlp.QUANTIZERS:
        scale, hist = plan.quantizer_state(n)
        assert hist.dtype == np.float32 and hist.shape == (L,)
        if n in EXACT_AMAX:
            np.testing.assert_array_equal(hist, s.state.hist[n], err_msg=n)
        else:
            np.testing.assert_allclose(hist, s.state.hist[n], rtol=AMAX_RTOL, atol=0, err_msg=n)
        want = expected_scale(prev_scales[n], hist, fmts[n], margin, algo)
        assert np.float32(scale) == want, f"{n}: scale {scale!r} != {want!r} from the recorded history"
        np.testing.assert_allclose(scale, s.state.scale[n], rtol=AMAX_RTOL, err_msg=n)


@pytest.mark.parametrize("spec", [("delayed", "HYBRID", 0, 4, "max"), ("delayed", "E4M3", 2, 3, "most_recent"),
                                  ("delayed", "HYBRID", -1, 1, "max")], ids=["max-L4", "recent-m2-L3", "L1-m-1"])
def test_delayed_state_over_steps(spec):
    cfg = CONFIGS["ln-gelu-partial"]
    T, H, F, norm, acts, dtype, bias = cfg
    s = sim_for(cfg, spec)
    with plan_for(cfg, recipe_of(spec)) as plan:
        assert plan.amax_history_length == spec[3]
        for n in lnmlp.QUANTIZERS:  # initial state: scale 1, zero history
            sc, h = plan.quantizer_state(n)
            assert sc == 1.0 and not h.any()
        for i in range(6):
            inp = make_inputs(T, H, F, len(acts), norm, dtype, bias, seed=20 + i)
            mult = 2.0 ** (i % 3 - 1)  # changing magnitudes, so the scales move
            inp["x"] = (inp["x"] * mult).astype(dtype)
            inp["w1"] = (inp["w1"] * (1 + 0.3 * i)).astype(dtype)
            dy = (make_dy(T, H, dtype, seed=20 + i) * mult * 100).astype(dtype)
            prev = {n: plan.quantizer_state(n)[0] for n in lnmlp.QUANTIZERS}
            y, g = step(plan, inp, dy)
            y_sim, g_sim = sim_step(s, inp, dy)
            check_state_against(plan, s, spec, prev)
            check_sim(f"y step {i}", y, y_sim, dtype)
            check_sim(f"dw1 step {i}", g["dw1"], g_sim["dw1"], dtype)


def test_forward_updates_forward_quantizers_backward_the_backward_ones():
    cfg = CONFIGS["rms-swiglu"]
    T, H, dtype, inp = cfg[0], cfg[1], cfg[5], inputs_for(cfg, seed=5)
    with plan_for(cfg, recipe_of(("delayed", "HYBRID", 0, 4, "max"))) as plan:
        y, saved = plan.forward(*(inp[k] for k in ARGS))
        for n in lnmlp.QUANTIZERS:
            sc, h = plan.quantizer_state(n)
            assert (h[0] > 0) == (n in lnmlp.recipe.FORWARD_QUANTIZERS), n
        plan.backward(make_dy(T, H, dtype, 5), inp["x"], inp["gamma"], None, inp["w1"], None, inp["w2"], saved)
        for n in lnmlp.QUANTIZERS:
            assert plan.quantizer_state(n)[1][0] > 0 and plan.quantizer_state(n)[1][1] == 0, n


def test_zero_and_nonfinite_amax_keep_the_scale():
    cfg = CONFIGS["rms-swiglu"]
    T, H, dtype, inp = cfg[0], cfg[1], cfg[5], inputs_for(cfg, seed=6)
    with plan_for(cfg, recipe_of(("delayed", "HYBRID", 0, 2, "max"))) as plan:
        step(plan, inp, make_dy(T, H, dtype, 6))
        s_dy, h_dy = plan.quantizer_state("dy")
        s_dh, _ = plan.quantizer_state("dh")
        assert s_dy != 1.0
        # dy all zeros: amax 0 is recorded; the history max is still the previous amax
        step(plan, inp, np.zeros((T, H), dtype))
        s1, h1 = plan.quantizer_state("dy")
        assert h1[0] == 0 and h1[1] == h_dy[0] and s1 == expected_scale(s_dy, h1, "e5m2", 0, "max")
        # another zero step: the whole history is 0 now -> the scale stays
        step(plan, inp, np.zeros((T, H), dtype))
        s2, h2 = plan.quantizer_state("dy")
        assert not h2.any() and s2 == s1
        s_dh2, h_dh2 = plan.quantizer_state("dh")  # dh = dact * act'(h) is zero as well
        assert not h_dh2.any() and s_dh2 == expected_scale(s_dh, [0.0], "e5m2", 0, "max") == s_dh
        # a NaN in dy: NaN is recorded, the scale stays while the NaN is in the history
        dy = make_dy(T, H, dtype, 7)
        dy[3, 5] = np.nan
        step(plan, inp, dy)
        s3, h3 = plan.quantizer_state("dy")
        assert np.isnan(h3[0]) and s3 == s2
        step(plan, inp, make_dy(T, H, dtype, 8))
        s4, h4 = plan.quantizer_state("dy")
        assert np.isnan(h4[1]) and s4 == s3
        step(plan, inp, make_dy(T, H, dtype, 9))  # the NaN has been shifted out
        s5, h5 = plan.quantizer_state("dy")
        assert not np.isnan(h5).any() and s5 == expected_scale(s4, h5, "e5m2", 0, "max") and s5 != s4
        # an inf in dy: recorded as inf, scale kept
        dy = make_dy(T, H, dtype, 10)
        dy[0, 0] = np.inf
        step(plan, inp, dy)
        s6, h6 = plan.quantizer_state("dy")
        assert np.isinf(h6[0]) and s6 == s5


# ---------------------------------------------------------------------------------------------------
# state: read, write, export, import
# ---------------------------------------------------------------------------------------------------
def test_export_import_round_trip_and_resume():
    spec = ("delayed", "HYBRID", 0, 8, "max")
    cfg = CONFIGS["ln-gelu-partial"]
    T, H, F, norm, acts, dtype, bias = cfg
    data = [(make_inputs(T, H, F, 1, norm, dtype, bias, seed=30 + i), make_dy(T, H, dtype, 30 + i)) for i in range(5)]
    a = plan_for(cfg, recipe_of(spec))
    for inp, dy in data[:3]:
        step(a, inp, dy)
    blob = a.export_state()
    assert isinstance(blob, bytes) and len(blob) == a.state_bytes == 24 + 6 * (1 + 8) * 4
    assert blob[:8] == b"LNMLPQS1"
    b = plan_for(cfg, recipe_of(spec), remat="save_stats")
    b.import_state(blob)
    assert b.export_state() == blob
    for n in lnmlp.QUANTIZERS:
        sa, ha = a.quantizer_state(n)
        sb, hb = b.quantizer_state(n)
        assert sa == sb and ha.tobytes() == hb.tobytes()
    for inp, dy in data[3:]:  # resuming: b continues exactly as a
        ya, ga = step(a, inp, dy)
        yb, gb = step(b, inp, dy)
        np.testing.assert_array_equal(ya, yb)
        for k in ga:
            if ga[k] is not None:
                np.testing.assert_array_equal(ga[k], gb[k], err_msg=k)
    assert a.export_state() == b.export_state()
    # per-quantizer writes round-trip bit for bit too (NaN and inf entries included)
    hist = np.array([np.nan, np.inf, 0.0, 1.5, 3e-38, 2.0, 0.0, 7.0], np.float32)
    b.set_quantizer_state("act_out", 0.375, hist)
    sc, h = b.quantizer_state("act_out")
    assert sc == 0.375 and h.tobytes() == hist.tobytes()
    a.close()
    b.close()


def test_bad_state_changes_nothing():
    spec = ("delayed", "HYBRID", 0, 4, "max")
    cfg = CONFIGS["rms-swiglu"]
    T, H, F, norm, acts, dtype, bias = cfg
    with plan_for(cfg, recipe_of(spec)) as plan, \
            plan_for(cfg, lnmlp.DelayedScaling(amax_history_len=5)) as other:
        step(plan, make_inputs(T, H, F, 2, norm, dtype, bias, 40), make_dy(T, H, dtype, 40))
        before = plan.export_state()
        blob = bytearray(before)
        E = lnmlp.InvalidArgumentError
        bad = [
            (lambda: plan.import_state(b"NOTLNMLP" + bytes(before[8:])), "bad magic"),
            (lambda: plan.import_state(before[:-4]), "bytes"),
            (lambda: plan.import_state(before + b"\0\0\0\0"), "bytes"),
            (lambda: plan.import_state(b"LNML"), "header"),
            (lambda: plan.import_state(b""), "header"),
            (lambda: plan.import_state(other.export_state()), "entries"),
            (lambda: plan.import_state(bytes(blob[:8]) + np.int32(2).tobytes() + bytes(blob[12:])), "version"),
            (lambda: plan.import_state(bytes(blob[:12]) + np.int32(2).tobytes() + bytes(blob[16:])), "recipe"),
            (lambda: plan.import_state(bytes(blob[:24]) + np.float32(-1).tobytes() + bytes(blob[28:])), "scale"),
            (lambda: plan.import_state(bytes(blob[:28]) + np.float32(-1).tobytes() + bytes(blob[32:])), "negative"),
            (lambda: plan.import_state("a string"), "bytes"),
            (lambda: plan.set_quantizer_state("dy", 1.0, [1, 2, -3, 4]), "negative"),
            (lambda: plan.set_quantizer_state("dy", 1.0, [1, 2, 3]), "4 entries"),
            (lambda: plan.set_quantizer_state("dy", 1.0, np.zeros((2, 2))), "1-D"),
            (lambda: plan.set_quantizer_state("dy", 0.0, [1, 2, 3, 4]), "finite and > 0"),
            (lambda: plan.set_quantizer_state("dy", float("inf"), [1, 2, 3, 4]), "finite and > 0"),
            (lambda: plan.set_quantizer_state("dy", float("nan"), [1, 2, 3, 4]), "finite and > 0"),
            (lambda: plan.set_quantizer_state("dx", 1.0, [1, 2, 3, 4]), "quantizer must be one of"),
            (lambda: plan.quantizer_state(6), "quantizer must be one of"),
        ]
        for fn, match in bad:
            with pytest.raises(E, match=match):
                fn()
            assert plan.export_state() == before, match
    # stateless recipes keep no state
    with plan_for(cfg, lnmlp.Float8CurrentScaling()) as p:
        assert p.amax_history_length == 0 and p.state_bytes == 0 and p.export_state() == b""
        p.import_state(b"")
        with pytest.raises(lnmlp.InvalidArgumentError, match="keeps no quantizer state"):
            p.quantizer_state("w1")
        with pytest.raises(lnmlp.InvalidArgumentError):
            p.import_state(before)


# ---------------------------------------------------------------------------------------------------
# saved bytes
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rid", ["none", "delayed-hybrid", "current-hybrid", "block-p2", "mxfp8-e4m3"])
@pytest.mark.parametrize("remat", ["save_all", "save_ffn1", "save_stats"])
def test_saved_bytes_per_token(rid, remat):
    # include/lnmlp.h (LNMLP_REMAT_*): the codes of ln_out and act_out (1 byte) replace their D
    # copies; BLOCK adds 4 bytes per 128 elements (one scale per 128 tokens and column), MXFP8 1
    # byte per 32; per-tensor scales are a few bytes per plan, not per token.
    for (T, H, F, norm, acts, dtype, bias) in CONFIGS.values():
        A, e = len(acts), np.dtype(dtype).itemsize
        stats = 8 if norm == "layernorm" else 4
        if remat == "save_stats":
            want = stats
        elif remat == "save_ffn1":
            want = stats + e * A * F
        elif rid == "none":
            want = stats + e * (H + A * F + F)
        else:
            want = stats + e * A * F + H + F
            if rid == "block-p2":
                want += -(-(H + F) * 4 // 128)
            if rid == "mxfp8-e4m3":
                want += -(-(H + F) // 32)
        recipe = None if rid == "none" else recipe_of(RECIPES[rid])
        with lnmlp.Plan(T, H, F, norm_type=norm, activation_type=acts, dtype=dtype, remat=remat,
                        recipe=recipe) as p:
            assert p.saved_bytes_per_token == want, (T, H, F, norm, acts)


# ---------------------------------------------------------------------------------------------------
# the functional API's quantizer sets
# ---------------------------------------------------------------------------------------------------
def _functional(inp, norm, acts, qs):
    kernels = [inp["w1"], inp["w2"]]
    biases = [inp["b1"], inp["b2"]]
    return lnmlp.layernorm_mlp_vjp(inp["x"], inp["gamma"], inp["beta"], kernels, biases, norm,
                                   activation_type=acts, quantizer_set=qs)


@pytest.fixture
def fresh_cache():
    lnmlp.clear_plan_cache()
    yield
    lnmlp.clear_plan_cache()


@pytest.mark.parametrize("rid", list(RECIPES))
def test_quantizer_set_matches_the_plan(rid, fresh_cache):
    spec, cfg = RECIPES[rid], CONFIGS["ln-gelu-partial"]
    T, H, F, norm, acts, dtype, bias = cfg
    qs = lnmlp.make_quantizer_set(recipe_of(spec))
    with plan_for(cfg, recipe_of(spec)) as plan:
        for i in range(2):
            inp = make_inputs(T, H, F, 1, norm, dtype, bias, seed=50 + i)
            dy = make_dy(T, H, dtype, 50 + i)
            y0, g0 = step(plan, inp, dy)
            y1, vjp = _functional(inp, norm, acts, qs)
            dx, dgamma, dbeta, (dw1, dw2), (db1, db2) = vjp(dy)
            np.testing.assert_array_equal(y1, y0)
            for k, v in dict(dx=dx, dgamma=dgamma, dbeta=dbeta, dw1=dw1, dw2=dw2, db1=db1, db2=db2).items():
                np.testing.assert_array_equal(v, g0[k], err_msg=k)
        st = qs.state()
        if spec[0] != "delayed":
            assert st == {}
        else:
            assert set(st) == set(lnmlp.QUANTIZERS)
            for n in lnmlp.QUANTIZERS:
                sc, h = plan.quantizer_state(n)
                assert st[n]["scale"] == sc and st[n]["amax_history"].tobytes() == h.tobytes()
                assert st[n]["amax_history"].dtype == np.float32


def test_quantizer_sets_sharing_a_cached_plan_keep_their_own_state(fresh_cache):
    spec, cfg = RECIPES["delayed-hybrid"], CONFIGS["ln-gelu-partial"]
    T, H, F, norm, acts, dtype, bias = cfg
    qa, qb = lnmlp.make_quantizer_set(recipe_of(spec)), lnmlp.make_quantizer_set(recipe_of(spec))
    pa, pb = plan_for(cfg, recipe_of(spec)), plan_for(cfg, recipe_of(spec))
    for i in range(3):  # interleaved: a's forward, b's forward, b's backward, a's backward
        ia = make_inputs(T, H, F, 1, norm, dtype, bias, seed=60 + i)
        ib = make_inputs(T, H, F, 1, norm, dtype, bias, seed=70 + i)
        ib["x"] = (ib["x"] * 4).astype(dtype)
        dya, dyb = make_dy(T, H, dtype, 60 + i), (make_dy(T, H, dtype, 70 + i) * 0.01).astype(dtype)
        ya, vja = _functional(ia, norm, acts, qa)
        yb, vjb = _functional(ib, norm, acts, qb)
        gb, ga = vjb(dyb), vja(dya)
        ya0, ga0 = step(pa, ia, dya)
        yb0, gb0 = step(pb, ib, dyb)
        np.testing.assert_array_equal(ya, ya0)
        np.testing.assert_array_equal(yb, yb0)
        np.testing.assert_array_equal(ga[0], ga0["dx"])
        np.testing.assert_array_equal(gb[3][0], gb0["dw1"])
    assert lnmlp.plan_cache_info()["size"] == 1  # one shared plan
    for qs, p in ((qa, pa), (qb, pb)):
        st = qs.state()
        for n in lnmlp.QUANTIZERS:
            assert st[n]["scale"] == p.quantizer_state(n)[0], n
    assert qa.state()["ln_out"]["scale"] != qb.state()["ln_out"]["scale"]
    # layernorm_mlp (forward only) moves only the forward quantizers
    before = qa.state()
    lnmlp.layernorm_mlp(ia["x"], ia["gamma"], ia["beta"], [ia["w1"], ia["w2"]], [ia["b1"], ia["b2"]], norm,
                        activation_type=acts, quantizer_set=qa)
    after = qa.state()
    for n in lnmlp.QUANTIZERS:
        moved = after[n]["amax_history"].tobytes() != before[n]["amax_history"].tobytes()
        assert moved == (n in lnmlp.recipe.FORWARD_QUANTIZERS), n
    # the cache key includes the recipe: another recipe is another plan
    _functional(ia, norm, acts, lnmlp.make_quantizer_set(lnmlp.Float8CurrentScaling()))
    _functional(ia, norm, acts, None)
    assert lnmlp.plan_cache_info()["size"] == 4  # + the forward-only plan of layernorm_mlp
    pa.close()
    pb.close()


def test_quantizer_set_state_round_trip_and_validation(fresh_cache):
    spec, cfg = ("delayed", "HYBRID", 0, 4, "max"), CONFIGS["rms-swiglu"]
    T, H, F, norm, acts, dtype, bias = cfg
    q1 = lnmlp.make_quantizer_set(recipe_of(spec))
    assert q1.amax_history_length == 4
    for n, v in q1.state().items():
        assert v["scale"] == 1.0 and v["amax_history"].shape == (4,) and not v["amax_history"].any()
    data = [(make_inputs(T, H, F, 2, norm, dtype, bias, seed=80 + i), make_dy(T, H, dtype, 80 + i)) for i in range(4)]
    for inp, dy in data[:2]:
        _functional(inp, norm, acts, q1)[1](dy)
    q2 = lnmlp.make_quantizer_set(recipe_of(spec))
    q2.load_state(q1.state())
    for inp, dy in data[2:]:
        y1, g1 = _functional(inp, norm, acts, q1)
        y2, g2 = _functional(inp, norm, acts, q2)
        np.testing.assert_array_equal(y1, y2)
        np.testing.assert_array_equal(g1(dy)[3][0], g2(dy)[3][0])
    s1, s2 = q1.state(), q2.state()
    for n in lnmlp.QUANTIZERS:
        assert s1[n]["scale"] == s2[n]["scale"] and s1[n]["amax_history"].tobytes() == s2[n]["amax_history"].tobytes()
    good = q1.state()
    E = lnmlp.InvalidArgumentError
    bads = [
        {k: v for k, v in good.items() if k != "dh"},
        dict(good, dh={"scale": 1.0}),
        dict(good, dh={"scale": -1.0, "amax_history": np.zeros(4)}),
        dict(good, dh={"scale": 1.0, "amax_history": np.zeros(5)}),
        dict(good, dh={"scale": 1.0, "amax_history": np.array([1, -1, 0, 0.0])}),
        "not a dict",
    ]
    for b in bads:
        with pytest.raises(E):
            q2.load_state(b)
        assert all(q2.state()[n]["scale"] == s2[n]["scale"] for n in lnmlp.QUANTIZERS)
    stateless = lnmlp.make_quantizer_set(lnmlp.MXFP8BlockScaling())
    assert stateless.state() == {} and stateless.amax_history_length == 0
    stateless.load_state({})
    with pytest.raises(E, match="keeps no quantizer state"):
        stateless.load_state(good)
