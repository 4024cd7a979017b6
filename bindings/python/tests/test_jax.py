"""lnmlp.jax.layernorm_mlp: TransformerEngine's JAX function as a native JAX op (XLA FFI), against
the independent float64 reference (_reference.py) under jit, grad, value_and_grad, vjp and vmap."""

import os

import numpy as np
import pytest

import _reference as ref
from _block_cases import CASES, CLAMP, EPS, F, H, case_id, make, reference

if os.environ.get("LNMLP_REQUIRE_JAX") == "1":  # the README's test command: never skip silently
    import jax
else:
    jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import lnmlp  # noqa: E402
import lnmlp.jax as lj  # noqa: E402


def run(d, norm, acts, zcg=False, act_params=None, **kw):
    return lj.layernorm_mlp(d["x"], d["gamma"], d["beta"], [d["k1"], d["k2"]], [d["b1"], d["b2"]], norm,
                            zero_centered_gamma=zcg, epsilon=EPS, activation_type=acts, act_params=act_params,
                            **kw)


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_jit_grad_matches_the_float64_reference(case, dtype_name):
    norm, acts, bias, zcg, p = case
    dtype = ref.DTYPES[dtype_name]
    d = make(len(acts), dtype, norm=norm, bias=bias, seed=3)
    y_ref, dy, g_ref = reference(d, norm, acts, zcg, p)
    dy_j = jnp.asarray(dy.reshape(d["x"].shape), dtype)

    def loss(x, gamma, beta, k1, k2, b1, b2):
        dd = dict(x=x, gamma=gamma, beta=beta, k1=k1, k2=k2, b1=b1, b2=b2)
        y = run(dd, norm, acts, zcg, p)
        return jnp.sum(y.astype(jnp.float32) * dy_j.astype(jnp.float32)), y

    names = ("x", "gamma", "beta", "k1", "k2", "b1", "b2")
    step = jax.jit(jax.value_and_grad(loss, argnums=tuple(range(7)), has_aux=True))
    (_, y), grads = step(*(d[n] for n in names))
    assert y.dtype == dtype and y.shape == d["x"].shape
    ref.assert_close(f"jax y {case}", np.asarray(y).reshape(-1, H), y_ref, dtype_name)
    want = dict(x=g_ref["dx"], gamma=g_ref["dgamma"], beta=g_ref["dbeta"], k1=g_ref["dw1"], k2=g_ref["dw2"],
                b1=g_ref["db1"], b2=g_ref["db2"])
    for n, g in zip(names, grads):
        if d[n] is None:
            assert g is None, f"d{n} of an absent tensor is {g}"
            continue
        assert g.dtype == dtype, f"d{n}: {g.dtype}"
        if n == "beta" and norm == "rmsnorm":  # beta is ignored for rmsnorm: its gradient is zero
            np.testing.assert_array_equal(np.asarray(g), 0)
            continue
        ref.assert_close(f"jax d{n} {case}", np.asarray(g).reshape(want[n].shape), want[n], dtype_name)


def test_forward_alone_and_vjp_agree_with_jit_grad():
    d = make(2, np.float32, seed=5)
    acts = ("silu", "linear")
    y_ref, dy, g_ref = reference(d, "layernorm", acts)
    y_eager = run(d, "layernorm", acts)
    y_jit = jax.jit(lambda x: run(dict(d, x=x), "layernorm", acts))(d["x"])
    ref.assert_close("eager y", np.asarray(y_eager).reshape(-1, H), y_ref, "float32")
    np.testing.assert_array_equal(np.asarray(y_eager), np.asarray(y_jit))
    y, pullback = jax.vjp(lambda x, k1: run(dict(d, x=x, k1=k1), "layernorm", acts), d["x"], d["k1"])
    dx, dk1 = pullback(jnp.asarray(dy.reshape(y.shape), jnp.float32))
    ref.assert_close("vjp dx", np.asarray(dx).reshape(-1, H), g_ref["dx"], "float32")
    ref.assert_close("vjp dw1", np.asarray(dk1), g_ref["dw1"], "float32")


def test_kernel_1_as_h_by_a_times_f_and_bias_1_flat():
    d = make(2, np.float32, seed=6)
    acts = ("gelu", "linear")
    want = run(d, "layernorm", acts)
    flat = dict(d, k1=d["k1"].reshape(H, 2 * F), b1=d["b1"].reshape(2 * F))
    np.testing.assert_array_equal(np.asarray(run(flat, "layernorm", acts)), np.asarray(want))
    g = jax.grad(lambda k1: jnp.sum(run(dict(flat, k1=k1), "layernorm", acts) ** 2))(flat["k1"])
    g3 = jax.grad(lambda k1: jnp.sum(run(dict(d, k1=k1), "layernorm", acts) ** 2))(d["k1"])
    assert g.shape == (H, 2 * F), "the gradient has the layout kernel_1 was given in"
    np.testing.assert_array_equal(np.asarray(g), np.asarray(g3).reshape(H, 2 * F))


def test_float32_parameters_with_bfloat16_x_are_cast_and_their_gradients_stay_float32():
    d = make(1, np.float32, seed=7)
    x16 = jnp.asarray(d["x"], jnp.bfloat16)
    mixed = dict(d, x=x16)
    cast = {k: (None if v is None else jnp.asarray(v, jnp.bfloat16)) for k, v in d.items()}
    y = run(mixed, "layernorm", ("relu",))
    assert y.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(run(cast, "layernorm", ("relu",)), np.float32))
    g = jax.grad(lambda k2: jnp.sum(run(dict(mixed, k2=k2), "layernorm", ("relu",)).astype(jnp.float32)))(d["k2"])
    assert g.dtype == jnp.float32


def test_vmap_over_x_is_one_call_with_more_tokens():
    d = make(1, np.float32, lead=(4, 5), seed=8)
    f = lambda x: run(dict(d, x=x), "rmsnorm", ("relu",))  # noqa: E731
    batched = jax.vmap(f)(d["x"])
    looped = jnp.stack([f(d["x"][i]) for i in range(4)])
    np.testing.assert_allclose(np.asarray(batched), np.asarray(looped), rtol=1e-6, atol=1e-6)
    text = jax.jit(jax.vmap(f)).lower(d["x"]).as_text()
    assert text.count("lnmlp_forward") == 1 and "while" not in text, "the batch is not folded into one call"
    gb = jax.vmap(jax.grad(lambda x: jnp.sum(f(x) ** 2)))(d["x"])
    gl = jnp.stack([jax.grad(lambda x: jnp.sum(f(x) ** 2))(d["x"][i]) for i in range(4)])
    np.testing.assert_allclose(np.asarray(gb), np.asarray(gl), rtol=1e-5, atol=1e-6)


def test_vmap_over_weights_and_jacrev_run_the_batch_in_turn():
    d = make(1, np.float32, lead=(3,), seed=9)
    ks = np.stack([d["k2"], 2 * d["k2"]])
    f = lambda k2: run(dict(d, k2=k2), "layernorm", ("gelu",))  # noqa: E731
    batched = jax.vmap(f)(ks)
    np.testing.assert_allclose(np.asarray(batched), np.asarray(jnp.stack([f(k) for k in ks])), rtol=1e-6,
                               atol=1e-6)
    # jacrev batches the cotangent alone; its column 2 is the central difference along x[2].
    x0 = np.asarray(d["x"][0], np.float32)
    g = lambda x: np.asarray(run(dict(d, x=x), "layernorm", ("gelu",)), np.float64)  # noqa: E731
    J = jax.jacrev(lambda x: run(dict(d, x=x), "layernorm", ("gelu",)))(x0)
    step = np.float32(1e-2) * np.eye(H, dtype=np.float32)[2]
    np.testing.assert_allclose(np.asarray(J)[:, 2], (g(x0 + step) - g(x0 - step)) / 2e-2, rtol=2e-2, atol=2e-3)


def test_one_plan_serves_every_batch_size_on_the_cpu():
    d = make(1, np.float32, lead=(5,), H=8, F=40, seed=14)
    f = jax.jit(jax.grad(lambda x: jnp.sum(run(dict(d, x=x), "rmsnorm", ("squared_relu",)))))
    before = lj.plan_count()
    f(d["x"])  # a new configuration: its plan (the forward-only one is another configuration)
    made = lj.plan_count() - before
    assert made == 1
    for rows in (3, 17, 2):  # more and fewer tokens: the same plan, grown to the largest
        x = np.random.default_rng(rows).standard_normal((rows, 8)).astype(np.float32)
        g = f(x)
        want = np.stack([np.asarray(f(x[i:i + 1]))[0] for i in range(rows)])
        np.testing.assert_allclose(np.asarray(g), want, rtol=1e-6, atol=1e-7)
    assert lj.plan_count() - before == made


def test_a_call_with_no_tokens():
    d = make(1, np.float32, lead=(0,), seed=10)
    y = run(d, "layernorm", ("relu",))
    assert y.shape == (0, H)
    g = jax.grad(lambda k1: jnp.sum(run(dict(d, k1=k1), "layernorm", ("relu",))))(d["k1"])
    np.testing.assert_array_equal(np.asarray(g), 0)


@pytest.mark.parametrize("bad, match", [
    (dict(k1=np.zeros((H, 2, F), np.float32)), "kernel_1"),
    (dict(k2=np.zeros((F + 1, H), np.float32)), "kernel_2"),
    (dict(gamma=np.zeros((H + 1,), np.float32)), "gamma"),
    (dict(beta=None), "beta"),
    (dict(b1=np.zeros((2, F), np.float32)), "bias_1"),
    (dict(x=np.zeros((2, H), np.int32)), "x must be float32"),
    (dict(k2=np.zeros((F, H), np.int32)), "kernel_2 must be float32"),
])
def test_bad_input_raises_a_clear_error_at_trace_time(bad, match):
    d = dict(make(1, np.float32, seed=11), **bad)
    with pytest.raises(lnmlp.InvalidArgumentError, match=match):
        jax.jit(lambda x: run(dict(d, x=x), "layernorm", ("relu",))).lower(d["x"])


# ---- the XLA FFI handlers check every buffer themselves: a direct custom call -------------------------

def _direct(call_name, spec, args, results=None, **changed_results):
    """Runs lnmlp's custom call directly (jax.ffi.ffi_call, as any JAX program could), with the
    results lnmlp.jax would give it unless `results` or `changed_results` say otherwise."""
    from lnmlp.jax import _calls, _ffi
    _ffi.ensure_registered()
    out = _calls._output_types(spec)
    names = (("y", "saved") if call_name == "forward" else _calls._BACKWARD_OUTPUTS) + ("workspace", "fp8_state")
    types = results or tuple(changed_results.get(n, out[n]) for n in names)
    call = jax.ffi.ffi_call(_ffi.FORWARD if call_name == "forward" else _ffi.BACKWARD, types)
    return call(*args, **spec.attributes())


def _direct_case():
    from lnmlp.jax._calls import Spec, no_state
    T = 8
    spec = Spec(tokens=T, hidden=H, ffn=F, norm_type="layernorm", zero_centered_gamma=False, epsilon=EPS,
                activations=("gelu",), act_params=(7.0, 1.702, 1.0), has_bias1=True, has_bias2=True,
                dtype="float32", remat="save_all", backend="cpu")
    d = make(1, np.float32, lead=(T,), seed=13)
    x = jnp.asarray(d["x"])
    fwd = [x, d["gamma"], d["beta"], d["k1"], d["b1"], d["k2"], d["b2"], no_state()]
    return spec, [jnp.asarray(a) for a in fwd], d


def test_a_direct_custom_call_with_the_right_buffers_computes_the_block():
    """The custom calls made directly, with the buffers the plan takes: y and every gradient are the
    float64 block's."""
    spec, fwd, d = _direct_case()
    y_ref, dy, grads = reference(d, "layernorm", ("gelu",))
    y, saved, _, _ = _direct("forward", spec, fwd)
    ref.assert_close("direct y", np.asarray(y, np.float64), y_ref, "float32")
    got = _direct("backward", spec, [jnp.asarray(dy, jnp.float32), *fwd[:6], saved, fwd[7]])
    for name, g in zip(("dx", "dgamma", "dbeta", "dw1", "db1", "dw2", "db2"), got):
        ref.assert_close(f"direct {name}", np.asarray(g, np.float64), grads[name].reshape(g.shape), "float32")


@pytest.mark.parametrize("recipe", [None, "delayed", "mxfp8"])
def test_the_saved_sections_apart_give_the_one_buffers_bits(recipe):
    """Spec(saved_apart=True): forward returns each saved section as an array of its own (what
    partitioning shards), backward takes them; every result is the one buffer's bits, each section
    the bytes at its offset in the one buffer, and under jit and vmap (the batching rules) too."""
    from lnmlp import recipe as r
    from lnmlp.jax import _ffi
    from lnmlp.jax._calls import _output_types, backward_call, forward_call
    _ffi.ensure_registered()
    spec, fwd, _ = _direct_case()
    if recipe is not None:
        spec = spec.with_(recipe=r.DelayedScaling() if recipe == "delayed" else r.MXFP8BlockScaling(), tokens=32)
        d = make(1, np.float32, lead=(32,), seed=17)
        fwd = [jnp.asarray(a) for a in (d["x"], d["gamma"], d["beta"], d["k1"], d["b1"], d["k2"], d["b2"])]
        state = np.zeros(_output_types(spec)["fp8_state"].shape, np.float32)
        if recipe == "delayed":
            state[:, 0] = 1.0  # a fresh delayed-scaling state: every scale 1, every history entry 0
        fwd.append(jnp.asarray(state))
    apart = spec.with_(saved_apart=True)
    dy = jnp.asarray(np.random.default_rng(5).standard_normal((spec.tokens, H)), jnp.float32)

    def both(s):
        y, saved, state = forward_call(s)(*fwd)
        return y, saved, state, backward_call(s)(dy, *fwd[:6], saved, state)

    for run in (both, jax.jit(both, static_argnums=0)):
        y1, saved, st1, g1 = run(spec)
        y2, sections, st2, g2 = run(apart)
        assert len(sections) == len(lnmlp._lib.SAVED_SECTIONS)
        for name, a, b in [("y", y1, y2), ("state", st1, st2)] + list(zip(["grad"] * 8, g1, g2)):
            np.testing.assert_array_equal(np.asarray(b), np.asarray(a), err_msg=name)
        with lnmlp.Plan(**spec.plan_kwargs()) as p:
            where = [p.saved_section(i, spec.tokens) for i in range(len(sections))]
        one = np.asarray(saved)
        assert sum(w is not None for w in where) >= 2
        for i, (w, sec) in enumerate(zip(where, sections)):
            sec = np.asarray(sec)
            if w is None:
                assert sec.size == 0, i
                continue
            offset, shape, dtype = w
            assert sec.shape == shape and sec.dtype == dtype, (i, sec.shape, sec.dtype, w)
            np.testing.assert_array_equal(sec.view(np.uint8).ravel(), one[offset:offset + sec.nbytes],
                                          err_msg=f"section {i}")

    if recipe is None:  # vmap over x and dy: one call with the batch folded into the tokens
        xs, dys = jnp.stack([fwd[0], fwd[0] * 0.5]), jnp.stack([dy, -dy])

        def batched(s):
            def one(x, dy):
                y, saved, state = forward_call(s)(x, *fwd[1:])
                return y, backward_call(s)(dy, x, *fwd[1:6], saved, state)[0]
            return jax.vmap(one)(xs, dys)

        for a, b in zip(batched(spec), batched(apart)):
            np.testing.assert_array_equal(np.asarray(b), np.asarray(a))


def test_a_direct_custom_call_with_a_wrong_saved_section_is_refused():
    """With the sections apart, each section's array is checked against the plan's section (its
    element type and count; a zero-element stand-in where the plan saves none)."""
    from lnmlp.jax import _calls, _ffi
    spec, fwd, _ = _direct_case()
    apart = spec.with_(saved_apart=True)
    out = _calls._output_types(apart)
    sections = list(out["sections"])
    index = lnmlp._lib.SAVED_SECTIONS
    short_ffn1 = jax.ShapeDtypeStruct((sections[index["ffn1"]].shape[0] - 1, F), jnp.float32)
    for i, wrong, match in [(index["ffn1"], short_ffn1,
                             r"saved section 3 is float32 \[7, %d\], but the plan takes float32 of %d elements"
                             % (F, 8 * F)),
                            (index["fp8_scales"], jax.ShapeDtypeStruct((4,), jnp.float32),
                             r"saved section 5 is float32 \[4\], but the plan takes a zero-element array")]:
        types = sections[:i] + [wrong] + sections[i + 1:]
        _ffi.ensure_registered()
        call = jax.ffi.ffi_call(_ffi.FORWARD, (out["y"], *types, out["workspace"], out["fp8_state"]))
        with pytest.raises(Exception, match=match):
            jax.block_until_ready(call(*fwd, **apart.attributes()))


@pytest.mark.parametrize("what", ["kernel_1 smaller", "x bfloat16", "saved of 16 bytes", "y too small",
                                  "dkernel_2 bfloat16", "bias_1 present for a plan without", "fp8 state given"])
def test_a_direct_custom_call_with_wrong_buffers_is_refused_before_it_runs(what):
    spec, fwd, _ = _direct_case()
    y, saved, _, _ = _direct("forward", spec, fwd)
    dy = jnp.ones_like(y)
    bwd = [dy, *fwd[:6], saved, fwd[7]]
    if what == "kernel_1 smaller":
        call = lambda: _direct("forward", spec, fwd[:3] + [fwd[3][:, :, :-1]] + fwd[4:])  # noqa: E731
        match = (r"forward custom call's kernel_1 is float32 \[%d, 1, %d\], "
                 r"but the plan takes float32 \[%d, 1, %d\]" % (H, F - 1, H, F))
    elif what == "x bfloat16":
        call = lambda: _direct("forward", spec, [fwd[0].astype(jnp.bfloat16)] + fwd[1:])  # noqa: E731
        match = r"x is bfloat16 \[8, %d\], but the plan takes float32" % H
    elif what == "saved of 16 bytes":
        call = lambda: _direct("backward", spec, bwd[:7] + [jnp.zeros((16,), jnp.uint8), bwd[8]])  # noqa: E731
        match = r"backward custom call's saved is uint8 \[16\], but the plan takes at least uint8"
    elif what == "y too small":
        call = lambda: _direct("forward", spec, fwd, y=jax.ShapeDtypeStruct((4, H), jnp.float32))  # noqa: E731
        match = r"forward custom call's y is float32 \[4, %d\]" % H
    elif what == "dkernel_2 bfloat16":
        call = lambda: _direct("backward", spec, bwd, dw2=jax.ShapeDtypeStruct((F, H), jnp.bfloat16))  # noqa: E731
        match = r"dkernel_2 is bfloat16"
    elif what == "bias_1 present for a plan without":
        call = lambda: _direct("forward", spec.with_(has_bias1=False), fwd)  # noqa: E731
        match = r"bias_1 is float32 \[1, %d\], but the plan takes a zero-element array" % F
    else:
        call = lambda: _direct("forward", spec, fwd[:7] + [jnp.ones((6, 17), jnp.float32)])  # noqa: E731
        match = r"fp8 state is float32 \[6, 17\], but the plan takes a zero-element array"
    with pytest.raises(Exception, match=match):
        jax.block_until_ready(call())


@pytest.mark.parametrize("kw, match", [
    (dict(acts=("swish",)), "unknown activation"),
    (dict(norm="batchnorm"), "norm_type"),
    (dict(act_params=CLAMP), "act_params applies only"),
    (dict(quantizer_set=object()), "quantizer_set must be"),
    (dict(quantizer_set=lnmlp.make_quantizer_set(lnmlp.Float8CurrentScaling())), "quantizer_set must be"),
])
def test_bad_options_raise_a_clear_error(kw, match):
    d = make(1, np.float32, seed=12)
    norm, acts = kw.pop("norm", "layernorm"), kw.pop("acts", ("relu",))
    with pytest.raises(lnmlp.InvalidArgumentError, match=match):
        run(d, norm, acts, **kw)


# ---- FP8: every recipe against the NumPy FP8 simulation (its tolerances: test_fp8_recipes.py) ----
from test_fp8_recipes import (BF16, CONFIGS, RECIPES, check_sim, double_rounding_hazards, make_dy,  # noqa: E402
                              make_inputs, recipe_of, sim_for, sim_step)


def _fp8_step(cfg, qs, inp, dy):
    """One jitted training step as TransformerEngine users write it: the gradients, and the
    quantizer set after the step in the set's cotangent slot."""
    T, H_, F_, norm, acts, dtype, bias = cfg

    def loss(x, gamma, beta, w1, b1, w2, b2, qs):
        y = lj.layernorm_mlp(x, gamma, beta, [w1, w2], [b1, b2], norm, activation_type=acts, quantizer_set=qs)
        return jnp.sum(y.astype(jnp.float32) * jnp.asarray(dy, jnp.float32)), y

    args = [inp[k] for k in ("x", "gamma", "beta", "w1", "b1", "w2", "b2")]
    (_, y), grads = jax.jit(jax.value_and_grad(loss, argnums=tuple(range(8)), has_aux=True))(*args, qs)
    names = ("dx", "dgamma", "dbeta", "dw1", "db1", "dw2", "db2")
    return y, dict(zip(names, grads[:7])), grads[7]


@pytest.mark.parametrize("rid", list(RECIPES))
def test_fp8_recipes_match_the_simulation_under_jit_grad(rid):
    spec, cfg = RECIPES[rid], CONFIGS["ln-gelu-partial"]
    T, H_, F_, norm, acts, dtype, bias = cfg
    inp = make_inputs(T, H_, F_, len(acts), norm, dtype, bias, seed=4)
    dy = make_dy(T, H_, dtype, seed=4)
    s = sim_for(cfg, spec)
    qs = lj.make_quantizer_set(recipe_of(spec))
    for _ in range(2 if spec[0] == "delayed" else 1):  # delayed: the second step's scales are calibrated
        y, g, qs = _fp8_step(cfg, qs, inp, dy)
        y_sim, g_sim = sim_step(s, inp, dy)
    check_sim(f"jax y {rid}", y, y_sim, dtype)
    for k, v in g_sim.items():
        if v is not None:
            check_sim(f"jax {k} {rid}", g[k], v, dtype)
    assert (qs.state is None) == (spec[0] != "delayed")


@pytest.mark.parametrize("params", ["kernels-f32-rest-bf16", "kernels-bf16-rest-f32", "all-f32"])
@pytest.mark.parametrize("rid", [None, "delayed-hybrid", "current-hybrid", "block-p2", "mxfp8-e4m3"])
def test_every_gradient_has_its_parameters_dtype(rid, params):
    """A bf16 x with parameters in other dtypes, under every recipe: each gradient comes back in its
    parameter's dtype (fp32 kernels under FP8 once gave fp32 db1 and db2 for bf16 biases), and db2,
    the sum of dy over the tokens whatever the recipe, is that sum as the block's bf16 I/O dtype
    holds it (as TransformerEngine's dbias: in dy's dtype, then cast to the bias's)."""
    T, H_, F_, norm, acts = 64, 64, 96, "layernorm", ("gelu",)
    inp = make_inputs(T, H_, F_, 1, norm, np.float32, True, seed=8)
    kernels_dt, rest_dt = {"kernels-f32-rest-bf16": (np.float32, BF16), "kernels-bf16-rest-f32": (BF16, np.float32),
                           "all-f32": (np.float32, np.float32)}[params]
    args = {k: jnp.asarray(v, kernels_dt if k in ("w1", "w2") else rest_dt) for k, v in inp.items() if k != "x"}
    x = jnp.asarray(inp["x"], jnp.bfloat16)
    dy = jnp.asarray(make_dy(T, H_, np.float32, seed=8), jnp.bfloat16)
    qs = None if rid is None else lj.make_quantizer_set(recipe_of(RECIPES[rid]))
    names = ("gamma", "beta", "w1", "b1", "w2", "b2")

    def loss(x, gamma, beta, w1, b1, w2, b2):
        y = lj.layernorm_mlp(x, gamma, beta, [w1, w2], [b1, b2], norm, activation_type=acts, quantizer_set=qs)
        return jnp.sum(y.astype(jnp.float32) * dy.astype(jnp.float32))

    grads = jax.jit(jax.grad(loss, argnums=tuple(range(7))))(x, *(args[n] for n in names))
    for name, value, g in zip(("x",) + names, (x,) + tuple(args[n] for n in names), grads):
        assert g.dtype == value.dtype, f"d{name} is {g.dtype}, but {name} is {value.dtype}"
    db2_ref = np.asarray(dy, np.float64).sum(axis=0)
    ref.assert_close(f"db2 {rid} {params}", np.asarray(grads[6], np.float64), db2_ref, "bfloat16")


@pytest.mark.parametrize("rid", ["current-hybrid", "mxfp8-e4m3"])
def test_float32_kernels_under_fp8_are_quantized_directly(rid):
    """fp32 master kernels with a bf16 x under FP8 are quantized from their fp32 values (as
    TransformerEngine quantizes them), not cast to bf16 first; their gradients are fp32."""
    spec = RECIPES[rid]
    T, H_, F_, norm, acts = 64, 64, 96, "layernorm", ("gelu",)
    cfg = (T, H_, F_, norm, acts, BF16, True)
    inp = make_inputs(T, H_, F_, 1, norm, BF16, True, seed=5)
    inp["w1"] = double_rounding_hazards((H_, 1, F_), seed=6)
    inp["w2"] = double_rounding_hazards((F_, H_), seed=7)
    dy = make_dy(T, H_, BF16, seed=5)
    y, g, _ = _fp8_step(cfg, lj.make_quantizer_set(recipe_of(spec)), inp, dy)
    direct = sim_for(cfg, spec)
    direct.grad_dtype = np.dtype(np.float32)
    y_sim, g_sim = sim_step(direct, inp, dy)
    assert y.dtype == jnp.bfloat16 and g["dw1"].dtype == jnp.float32 and g["dw2"].dtype == jnp.float32
    check_sim(f"jax y {rid}", y, y_sim, BF16)
    for k, v in g_sim.items():
        if v is not None:
            check_sim(f"jax {k} {rid}", g[k], v, BF16)
    # bf16 kernels (the same values rounded) give the other, bf16-first result.
    rounded = dict(inp, w1=inp["w1"].astype(BF16), w2=inp["w2"].astype(BF16))
    y16, _, _ = _fp8_step(cfg, lj.make_quantizer_set(recipe_of(spec)), rounded, dy)
    y16_sim, _ = sim_step(sim_for(cfg, spec), rounded, dy)
    check_sim(f"jax y bf16 kernels {rid}", y16, y16_sim, BF16)
    assert not np.array_equal(np.asarray(y16, np.float32), np.asarray(y, np.float32))


def test_delayed_state_over_jitted_steps_equals_the_plan_apis():
    cfg = CONFIGS["rms-swiglu"]
    T, H_, F_, norm, acts, dtype, bias = cfg
    recipe = lj.DelayedScaling(margin=1, amax_history_len=3, amax_compute_algo="most_recent")
    qs = lj.make_quantizer_set(recipe)
    with lnmlp.Plan(T, H_, F_, norm_type=norm, activation_type=acts, dtype=dtype, recipe=recipe) as plan:
        for i in range(4):
            inp = make_inputs(T, H_, F_, len(acts), norm, dtype, bias, seed=20 + i)
            dy = make_dy(T, H_, dtype, seed=20 + i)
            y, g, qs = _fp8_step(cfg, qs, inp, dy)
            y_p, saved = plan.forward(*(inp[k] for k in ("x", "gamma", "beta", "w1", "b1", "w2", "b2")))
            g_p = plan.backward(dy, inp["x"], inp["gamma"], inp["beta"], inp["w1"], inp["b1"], inp["w2"], saved)
            np.testing.assert_array_equal(np.asarray(y), y_p)
            np.testing.assert_array_equal(np.asarray(g["dw1"]), g_p.dw1)
            for n in lj.QUANTIZERS:
                scale, hist = plan.quantizer_state(n)
                assert float(qs.scale(n)) == scale, (i, n)
                np.testing.assert_array_equal(np.asarray(qs.amax_history(n)), hist)


def test_quantizer_set_state_dict_round_trip():
    qs = lj.make_quantizer_set(lj.DelayedScaling(amax_history_len=2))
    d = qs.state_dict()
    d["dy"] = {"scale": 4.0, "amax_history": np.array([3.0, 1.0], np.float32)}
    q2 = qs.load_state_dict(d)
    assert float(q2.scale("dy")) == 4.0 and float(q2.scale("w1")) == 1.0
    with pytest.raises(lnmlp.InvalidArgumentError):
        qs.load_state_dict(dict(d, dy={"scale": -1.0, "amax_history": np.zeros(2, np.float32)}))
    assert lj.make_quantizer_set(lj.MXFP8BlockScaling()).state is None


# ---- checkpoint names ---------------------------------------------------------------------------------
def test_checkpoint_policies_follow_the_ffn1_and_ffn2_names():
    import contextlib
    import io
    import re

    d = make(1, np.float32, lead=(32,), seed=13)

    def block(x, k1, k2):
        y = lj.layernorm_mlp(x, d["gamma"], d["beta"], [k1, k2], [None, None], "layernorm",
                             activation_type=("gelu",), ffn1_ckpt_name="my_ffn1", ffn2_ckpt_name="my_ffn2")
        return jnp.sum(y * y)

    args = (d["x"], d["k1"], d["k2"])

    def saved(policy):
        """The residuals a policy keeps besides the arguments and constants, as
        jax.ad_checkpoint.print_saved_residuals lists them: {description: bytes}."""
        f = jax.checkpoint(block, policy=policy) if policy else block
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            jax.ad_checkpoint.print_saved_residuals(f, *args)
        kept = {}
        for line in out.getvalue().splitlines():
            m = re.match(r"(\w+)\[([\d,]*)\] (.*)", line)
            if not m or "from the argument" in line or "from a constant" in line:
                continue
            n = int(np.prod([int(v) for v in m.group(2).split(",") if v])) if m.group(2) else 1
            if n:
                kept[m.group(3)] = n * {"u8": 1, "f32": 4}[m.group(1)]
        return kept

    names = jax.checkpoint_policies.save_only_these_names
    keep_ffn1 = saved(names("my_ffn1"))
    assert len(keep_ffn1) == 1 and "named 'my_ffn1'" in next(iter(keep_ffn1)), keep_ffn1
    keep_ffn2 = saved(names("my_ffn2"))
    assert len(keep_ffn2) == 1 and "named 'my_ffn2'" in next(iter(keep_ffn2)), keep_ffn2
    assert next(iter(keep_ffn2.values())) == d["x"].nbytes  # y itself
    assert saved(jax.checkpoint_policies.nothing_saveable) == {}
    assert any("my_ffn1" in k for k in saved(None)), "without jax.checkpoint the saved buffer is kept"
    want = jax.grad(block, argnums=(0, 1, 2))(*args)
    for policy in (names("my_ffn1"), names("my_ffn2"), jax.checkpoint_policies.nothing_saveable):
        got = jax.jit(jax.grad(jax.checkpoint(block, policy=policy), argnums=(0, 1, 2)))(*args)
        for a, b in zip(got, want):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_calls_from_several_threads_share_plans_safely():
    """XLA may run calls of one plan at once (two threads, or independent call sites): the handlers
    keep a plan's calls one at a time, and a plan that grows for one thread's call stays right for
    the other's."""
    import concurrent.futures

    d = make(2, np.float32, lead=(1,), H=16, F=24, seed=15)
    f = jax.jit(jax.value_and_grad(lambda x: jnp.sum(run(dict(d, x=x), "layernorm", ("silu", "linear")) ** 2)))
    xs = [np.random.default_rng(i).standard_normal((rows, 16)).astype(np.float32) for i, rows in
          enumerate((3, 40, 7, 64, 1, 33, 5, 50))]
    want = [f(x) for x in xs]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        for _ in range(3):
            got = list(pool.map(f, xs))
            for (v, g), (vw, gw) in zip(got, want):
                assert float(v) == float(vw)
                np.testing.assert_array_equal(np.asarray(g), np.asarray(gw))
