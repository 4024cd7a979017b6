"""lnmlp.torch: the custom ops (opcheck), the functional API and the LayerNormMLP module, eager and
under torch.compile, against the independent float64 reference (_reference.py) and, under FP8,
against the NumPy FP8 simulation (_fp8_sim.py); state_dict round trips; bad input."""

import copy
import gc
import inspect
import pickle
import threading

import numpy as np
import pytest

import _reference as ref
from _block_cases import CASES, EPS, F, H, case_id, make, reference

from _requirements import torch_or_skip  # noqa: E402

torch = torch_or_skip()

import lnmlp  # noqa: E402
import lnmlp.torch as lt  # noqa: E402
from lnmlp.torch import _ops  # noqa: E402
from test_fp8_recipes import (RECIPES, check_sim, make_dy, make_inputs, recipe_of,  # noqa: E402
                              sim_for, sim_step)

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def tensor(a, dtype, requires_grad=False):
    """A numpy array (already holding values of `dtype`) as a torch tensor of that dtype, exactly."""
    if a is None:
        return None
    t = torch.from_numpy(np.asarray(a, np.float32).copy()).to(dtype)
    return t.requires_grad_(requires_grad)


def numpy(t):
    return t.detach().float().cpu().numpy().astype(np.float64)


NAMES = ("x", "gamma", "beta", "k1", "b1", "k2", "b2")
GRAD_OF = dict(x="dx", gamma="dgamma", beta="dbeta", k1="dw1", b1="db1", k2="dw2", b2="db2")


def functional_step(d, norm, acts, zcg, p, dy, dtype, compiled=False):
    """y and the gradients of sum(y * dy) through lnmlp.torch.layernorm_mlp (eager or compiled)."""
    ts = {n: tensor(d[n], dtype, requires_grad=True) for n in NAMES}

    def call(x, gamma, beta, k1, b1, k2, b2):
        return lt.layernorm_mlp(x, gamma, beta, [k1, k2], [b1, b2], norm, zero_centered_gamma=zcg, epsilon=EPS,
                                activation_type=acts, act_params=p)

    if compiled:
        torch._dynamo.reset()  # each case is a new configuration: a fresh compile, not a recompile
    y = (torch.compile(call, fullgraph=True) if compiled else call)(*(ts[n] for n in NAMES))
    (y.float() * tensor(dy.reshape(y.shape), torch.float32)).sum().backward()
    return y, {n: (None if ts[n] is None else ts[n].grad) for n in NAMES}


@pytest.mark.parametrize("mode", ["eager", "compiled"])
@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_forward_and_gradients_match_the_float64_reference(case, dtype_name, mode):
    norm, acts, bias, zcg, p = case
    d = make(len(acts), ref.DTYPES[dtype_name], norm=norm, bias=bias, seed=3)
    y_ref, dy, g_ref = reference(d, norm, acts, zcg, p)
    y, grads = functional_step(d, norm, acts, zcg, p, dy, TORCH_DTYPES[dtype_name], compiled=mode == "compiled")
    assert y.dtype == TORCH_DTYPES[dtype_name] and y.shape == d["x"].shape
    ref.assert_close(f"torch {mode} y {case}", numpy(y).reshape(-1, H), y_ref, dtype_name)
    for n, g in grads.items():
        if d[n] is None:
            assert g is None, n
            continue
        if n == "beta" and norm == "rmsnorm":  # ignored for rmsnorm: no gradient flows to it
            assert g is None or not g.any(), n
            continue
        assert g.dtype == TORCH_DTYPES[dtype_name], f"d{n}: {g.dtype}"
        want = g_ref[GRAD_OF[n]]
        ref.assert_close(f"torch {mode} d{n} {case}", numpy(g).reshape(want.shape), want, dtype_name)
    if mode == "compiled":  # the compiled graph runs the same ops: the eager bits exactly
        y_e, g_e = functional_step(d, norm, acts, zcg, p, dy, TORCH_DTYPES[dtype_name])
        torch.testing.assert_close(y, y_e, rtol=0, atol=0)
        for n in NAMES:
            if g_e[n] is not None:
                torch.testing.assert_close(grads[n], g_e[n], rtol=0, atol=0, msg=f"d{n}")


# ---- the ops: opcheck --------------------------------------------------------------------------------

def _op_args(dtype=torch.float32, recipe=None, T=6):
    torch.manual_seed(0)
    A = 2
    cfg = lt._functional.config("layernorm", False, EPS, ("silu", "linear"), None, recipe)
    x = torch.randn(T, H, dtype=dtype)
    gamma, beta = torch.randn(H, dtype=dtype), torch.randn(H, dtype=dtype)
    w1, b1 = torch.randn(H, A, F, dtype=dtype) * 0.3, torch.randn(A, F, dtype=dtype)
    w2, b2 = torch.randn(F, H, dtype=dtype) * 0.3, torch.randn(H, dtype=dtype)
    state = lt._functional.fresh_state(recipe) if recipe is not None and recipe.stateful else None
    return cfg, x, gamma, beta, w1, b1, w2, b2, state


@pytest.mark.parametrize("recipe", [None, lnmlp.DelayedScaling(amax_history_len=4)], ids=["plain", "delayed"])
def test_opcheck_passes_on_every_op(recipe):
    cfg, x, gamma, beta, w1, b1, w2, b2, state = _op_args(recipe=recipe)
    leaf = lambda t: t.clone().requires_grad_(True)  # noqa: E731
    fwd_args = (leaf(x), leaf(gamma), leaf(beta), leaf(w1), leaf(b1), leaf(w2), leaf(b2), state, None, None,
                cfg.ints(), cfg.floats())
    torch.library.opcheck(torch.ops.lnmlp.forward.default, fwd_args)
    y, saved, st, _ = torch.ops.lnmlp.forward(x, gamma, beta, w1, b1, w2, b2, state, None, None, cfg.ints(),
                                           cfg.floats())
    dy = torch.randn_like(y)
    bwd_args = (dy, x, gamma, beta, w1, b1, w2, True, saved, st, cfg.ints(), cfg.floats())
    torch.library.opcheck(torch.ops.lnmlp.backward.default, bwd_args)
    acc = cfg.with_(grad_dtype=lnmlp._lib.DTYPE_F32)
    main1, main2 = torch.zeros(H, 2, F), torch.zeros(F, H)
    acc_args = (dy, x, gamma, beta, w1, b1, w2, True, saved, st, main1, main2, acc.ints(), acc.floats())
    torch.library.opcheck(torch.ops.lnmlp.backward_accumulate.default, acc_args)


def test_the_saved_bound_covers_every_call():
    """The ops allocate saved = per_token * t + slack bytes (a shape torch.compile can state for a
    symbolic t): never less than the library's exact size for the call."""
    for recipe in (None, lnmlp.DelayedScaling(), lnmlp.Float8BlockScaling(), lnmlp.MXFP8BlockScaling(),
                   lnmlp.NVFP4BlockScaling()):
        for remat in ("save_all", "save_ffn1", "save_stats"):
            for Hh, Ff in ((16, 24), (96, 200)):
                cfg = lt._functional.config("layernorm", False, EPS, ("gelu", "linear"), None, recipe)
                cfg = cfg.with_(remat=lnmlp._plan._REMATS[remat])
                with lnmlp.Plan(300, Hh, Ff, activation_type=("gelu", "linear"), use_bias1=True, use_bias2=True,
                                recipe=recipe, remat=remat) as plan:
                    for t in range(1, 300, 7):
                        exact = plan.tensor_shape("saved", t)[0]
                        bound = _ops.saved_bytes_bound(cfg, t, Hh, 2, Ff, torch.float32, True, True)
                        assert exact <= bound, (recipe, remat, Hh, Ff, t, exact, bound)


# ---- the module ------------------------------------------------------------------------------------------

def module_reference(m, x, acts, dy, dn_extra=None, cache=None):
    """The float64 reference for module m: its parameters in lnmlp's layout (W1 = fc1_weight^T as
    [H, A, F]: the first F rows of fc1_weight feed the activation, the next F the linear half)."""
    A = len(acts)
    k1 = numpy(m.fc1_weight).T.reshape(H, A, F)
    d = dict(x=numpy(x), gamma=numpy(m.layer_norm_weight), beta=numpy(m.layer_norm_bias), k1=k1,
             b1=None if m.fc1_bias is None else numpy(m.fc1_bias).reshape(A, F), k2=numpy(m.fc2_weight).T,
             b2=None if m.fc2_bias is None else numpy(m.fc2_bias))
    args = (d["x"].reshape(-1, H), d["gamma"], d["beta"], d["k1"], d["b1"], d["k2"], d["b2"],
            "layernorm", False, 1e-5, acts, {})
    y, c = ref.forward(*args)
    if cache is not None:
        cache.update(c)
    return y, ref.backward(dy, *args, dn_extra=dn_extra)


def test_module_parameters_are_transformer_engines_and_a_te_checkpoint_loads():
    torch.manual_seed(1)
    m = lt.LayerNormMLP(H, F, activation="swiglu")
    shapes = {n: tuple(p.shape) for n, p in m.named_parameters()}
    assert shapes == {"layer_norm_weight": (H,), "layer_norm_bias": (H,), "fc1_weight": (2 * F, H),
                      "fc1_bias": (2 * F,), "fc2_weight": (H, F), "fc2_bias": (H,)}
    assert torch.equal(m.layer_norm_weight, torch.ones(H)) and not m.fc1_bias.any()
    assert 0.015 < float(m.fc1_weight.detach().std()) < 0.03  # TE's N(0, 0.023)
    # A checkpoint as TransformerEngine writes it: contiguous tensors in TE's shapes.
    g = torch.Generator().manual_seed(2)
    te = {n: torch.randn(s, generator=g) * 0.3 for n, s in shapes.items()}
    te["_extra_state"] = torch.empty(0, dtype=torch.uint8)  # every TE module's, empty without FP8
    assert set(m.state_dict()) == set(te)
    m.load_state_dict(te, strict=True)
    assert m.fc1_weight.is_contiguous() and m.fc2_weight.is_contiguous(), "TE's layout, read in place"
    x = torch.randn(3, 5, H, generator=g, requires_grad=True)
    y = m(x)
    dy = np.cos(np.arange(y.numel(), dtype=np.float64)).reshape(-1, H)
    (y * tensor(dy.reshape(y.shape), torch.float32)).sum().backward()
    y_ref, g_ref = module_reference(m, x, ("silu", "linear"), dy)
    ref.assert_close("module y", numpy(y).reshape(-1, H), y_ref, "float32")
    ref.assert_close("module dfc1_weight", numpy(m.fc1_weight.grad), g_ref["dw1"].reshape(H, 2 * F).T, "float32")
    ref.assert_close("module dfc2_weight", numpy(m.fc2_weight.grad), g_ref["dw2"].T, "float32")
    ref.assert_close("module dx", numpy(x.grad).reshape(-1, H), g_ref["dx"], "float32")
    assert m.fc1_weight.grad.shape == m.fc1_weight.shape
    rms = lt.LayerNormMLP(H, F, normalization="RMSNorm", bias=False, zero_centered_gamma=True)
    assert [n for n, _ in rms.named_parameters()] == ["layer_norm_weight", "fc1_weight", "fc2_weight"]
    assert not rms.layer_norm_weight.any(), "zero-centered gamma starts at 0"


def test_glu_is_transformer_engines_sigmoid_gate():
    """TE's "glu": sigmoid(the first F rows of fc1's output) * the next F (layernorm_mlp.py's
    reference map), against the float64 reference with ("sigmoid", "linear")."""
    torch.manual_seed(12)
    m = lt.LayerNormMLP(H, F, activation="glu")
    assert m.fc1_weight.shape == (2 * F, H)
    with torch.no_grad():
        for p in (m.fc1_bias, m.fc2_bias, m.layer_norm_bias):
            p.normal_(0, 0.3)
    x = torch.randn(9, H, requires_grad=True)
    y = m(x)
    dy = np.sin(np.arange(y.numel(), dtype=np.float64)).reshape(-1, H)
    (y * tensor(dy, torch.float32)).sum().backward()
    y_ref, g_ref = module_reference(m, x, ("sigmoid", "linear"), dy)
    ref.assert_close("glu y", numpy(y), y_ref, "float32")
    ref.assert_close("glu dx", numpy(x.grad), g_ref["dx"], "float32")
    ref.assert_close("glu dfc1_weight", numpy(m.fc1_weight.grad), g_ref["dw1"].reshape(H, 2 * F).T, "float32")


def test_checkpoint_true_recomputes_in_backward_for_the_same_gradients_and_less_memory():
    """TE's checkpoint=True (selective recompute): the library's save_stats policy; the saved
    buffer autograd keeps shrinks to the norm's statistics, the results do not change."""
    torch.manual_seed(13)
    x = torch.randn(32, H)
    results = {}
    for checkpoint in (False, True):
        m = lt.LayerNormMLP(H, F, activation="swiglu", checkpoint=checkpoint)
        m.load_state_dict(random_module_state(m, seed=14))
        xi = x.clone().requires_grad_(True)
        kept = []

        def pack(t):
            kept.append(t.nbytes if t.dtype == torch.uint8 else 0)  # the op's saved buffer
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = m(xi)
        dy = np.cos(np.arange(y.numel(), dtype=np.float64)).reshape(-1, H)
        (y * tensor(dy, torch.float32)).sum().backward()
        results[checkpoint] = (sum(kept), y.detach(), xi.grad, m.fc1_weight.grad, m.fc2_weight.grad)
        if checkpoint:
            y_ref, g_ref = module_reference(m, xi, ("silu", "linear"), dy)
            ref.assert_close("checkpoint y", numpy(y), y_ref, "float32")
            ref.assert_close("checkpoint dx", numpy(xi.grad), g_ref["dx"], "float32")
            ref.assert_close("checkpoint dfc1_weight", numpy(m.fc1_weight.grad), g_ref["dw1"].reshape(H, 2 * F).T,
                             "float32")
    (plain_bytes, *plain), (ckpt_bytes, *ckpt) = results[False], results[True]
    assert 0 < ckpt_bytes < plain_bytes / 4, (ckpt_bytes, plain_bytes)
    for a, b in zip(plain, ckpt):
        torch.testing.assert_close(b, a, rtol=0, atol=0)


def test_a_module_made_on_the_meta_device_initialises_after_to_empty():
    """TE's deferred initialisation: device="meta" allocates nothing; to_empty + reset_parameters
    give the values a module made in place gets from the same generator state."""
    recipe = lnmlp.DelayedScaling(amax_history_len=3)
    m = lt.LayerNormMLP(H, F, activation="geglu", device="meta", fp8_recipe=recipe)
    assert all(t.is_meta for t in (*m.parameters(), m.fp8_state))
    m.to_empty(device="cpu")
    torch.manual_seed(15)
    m.reset_parameters()
    torch.manual_seed(15)
    direct = lt.LayerNormMLP(H, F, activation="geglu", fp8_recipe=recipe)
    for (name, a), b in zip(m.named_parameters(), direct.parameters()):
        assert torch.equal(a, b), name
    assert torch.equal(m.fp8_state, direct.fp8_state)
    x = torch.randn(5, H)
    torch.testing.assert_close(m(x), direct(x), rtol=0, atol=0)
    with pytest.raises(lnmlp.InvalidArgumentError, match="lnmlp runs on CPU and CUDA"):
        lt.LayerNormMLP(H, F, device="meta")(torch.zeros(2, H, device="meta"))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_under_torch_autocast_the_module_computes_in_autocasts_dtype(compiled):
    """TE's module under torch.autocast computes in autocast's dtype (set_activation_dtype), its
    fp32 parameters cast to it: the same as casting input and parameters by hand."""
    torch.manual_seed(17)
    m = lt.LayerNormMLP(H, F, activation="swiglu", device="cpu")
    m.load_state_dict(random_module_state(m, seed=18))
    by_hand = lt.LayerNormMLP(H, F, activation="swiglu", device="cpu", params_dtype=torch.bfloat16)
    by_hand.load_state_dict(m.state_dict())
    x = torch.randn(6, H, requires_grad=True)
    step = torch.compile(m) if compiled else m
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = step(x)
    assert y.dtype == torch.bfloat16
    dy = torch.randn(6, H)
    (y.float() * dy).sum().backward()
    x2 = x.detach().bfloat16().requires_grad_(True)
    y2 = by_hand(x2)
    (y2.float() * dy).sum().backward()
    torch.testing.assert_close(y, y2, rtol=0, atol=0)
    assert x.grad.dtype == torch.float32 and m.fc1_weight.grad.dtype == torch.float32
    torch.testing.assert_close(x.grad, x2.grad.float(), rtol=0, atol=0)
    torch.testing.assert_close(m.fc1_weight.grad, by_hand.fc1_weight.grad.float(), rtol=0, atol=0)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=False):
        assert m(x).dtype == torch.float32


@pytest.mark.parametrize("return_bias", [False, True])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_return_layernorm_output_gives_the_norm_output_and_its_gradient(compiled, return_bias):
    """TE's return_layernorm_output: forward also returns the norm output, last; its cotangent
    reaches inp, layer_norm_weight and layer_norm_bias. Against the float64 reference, whose
    backward takes the norm output's extra cotangent."""
    torch.manual_seed(19)
    m = lt.LayerNormMLP(H, F, activation="geglu", return_layernorm_output=True, return_bias=return_bias,
                        device="cpu")
    m.load_state_dict(random_module_state(m, seed=20))
    x = torch.randn(3, 4, H, requires_grad=True)
    out = (torch.compile(m) if compiled else m)(x)
    assert len(out) == (3 if return_bias else 2)
    y, ln = out[0], out[-1]
    if return_bias:
        y = y + out[1]
    assert ln.shape == x.shape and ln.dtype == x.dtype
    dy = np.cos(np.arange(y.numel(), dtype=np.float64)).reshape(-1, H)
    dln = np.sin(0.5 * np.arange(y.numel(), dtype=np.float64)).reshape(-1, H)
    ((y * tensor(dy.reshape(y.shape), torch.float32)).sum() + (ln * tensor(dln.reshape(ln.shape), torch.float32))
     .sum()).backward()
    cache = {}
    y_ref, g_ref = module_reference(m, x, ("gelu", "linear"), dy, dn_extra=dln, cache=cache)
    ref.assert_close("y", numpy(y).reshape(-1, H), y_ref, "float32")
    ref.assert_close("ln_out", numpy(ln).reshape(-1, H), cache["n"], "float32")
    ref.assert_close("dx with the norm output's cotangent", numpy(x.grad).reshape(-1, H), g_ref["dx"], "float32")
    ref.assert_close("dlayer_norm_weight", numpy(m.layer_norm_weight.grad), g_ref["dgamma"], "float32")
    ref.assert_close("dlayer_norm_bias", numpy(m.layer_norm_bias.grad), g_ref["dbeta"], "float32")
    ref.assert_close("dfc1_weight", numpy(m.fc1_weight.grad), g_ref["dw1"].reshape(H, 2 * F).T, "float32")
    with torch.no_grad():
        _, ln_eval = m(x)[0], m(x)[-1]
    torch.testing.assert_close(ln_eval, ln.detach(), rtol=0, atol=0)


def random_module_state(m, seed):
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(v.shape, generator=g) * 0.3 if k != "_extra_state" else v
            for k, v in m.state_dict().items()}


def test_compiled_module_has_no_graph_breaks_and_one_graph_for_every_batch_size():
    torch.manual_seed(3)
    m = lt.LayerNormMLP(H, F, activation="geglu")
    x = torch.randn(4, 8, H)
    explain = torch._dynamo.explain(m)(x)
    assert explain.graph_count == 1 and explain.graph_break_count == 0, str(explain)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(m, fullgraph=True, dynamic=True)
    for batch in (2, 5, 9):
        xb = torch.randn(batch, 8, H, requires_grad=True)
        xe = xb.detach().clone().requires_grad_(True)
        m.zero_grad()
        yc = compiled(xb)
        yc.square().sum().backward()
        gc = m.fc1_weight.grad.clone()
        m.zero_grad()
        ye = m(xe)
        ye.square().sum().backward()
        torch.testing.assert_close(yc, ye, rtol=0, atol=0)
        torch.testing.assert_close(xb.grad, xe.grad, rtol=0, atol=0)
        torch.testing.assert_close(gc, m.fc1_weight.grad, rtol=0, atol=0)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1, dict(torch._dynamo.utils.counters["stats"])


# ---- FP8 -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("rid", list(RECIPES))
def test_fp8_recipes_match_the_simulation(rid):
    spec = RECIPES[rid]
    cfg = (160, 96, 200, "layernorm", ("gelu",), np.float32, True)
    T, H_, F_, norm, acts, dtype, bias = cfg
    inp = make_inputs(T, H_, F_, 1, norm, dtype, bias, seed=4)
    dy = make_dy(T, H_, dtype, seed=4)
    s = sim_for(cfg, spec)
    qs = lt.make_quantizer_set(recipe_of(spec))
    for _ in range(2 if spec[0] == "delayed" else 1):  # delayed: the second step's scales are calibrated
        ts = {k: tensor(inp[k], torch.float32, requires_grad=True) for k in ("x", "gamma", "beta", "w1", "b1",
                                                                              "w2", "b2")}
        y = lt.layernorm_mlp(ts["x"], ts["gamma"], ts["beta"], [ts["w1"], ts["w2"]], [ts["b1"], ts["b2"]], norm,
                             activation_type=acts, quantizer_set=qs)
        y.backward(tensor(dy, torch.float32))
        y_sim, g_sim = sim_step(s, inp, dy)
    check_sim(f"torch y {rid}", numpy(y), y_sim, dtype)
    names = dict(dx="x", dgamma="gamma", dbeta="beta", dw1="w1", db1="b1", dw2="w2", db2="b2")
    for k, v in g_sim.items():
        if v is not None:
            check_sim(f"torch {k} {rid}", numpy(ts[names[k]].grad), v, dtype)
    if spec[0] == "delayed":
        want = s.state
        for i, n in enumerate(lnmlp.QUANTIZERS):
            assert float(qs.state[i, 0]) == pytest.approx(float(want.scale[n]), rel=1e-6), n


def test_fp8_module_state_dict_round_trip_resumes_bit_exactly():
    torch.manual_seed(5)
    recipe = lnmlp.DelayedScaling(amax_history_len=4)
    a = lt.LayerNormMLP(H, F, activation="swiglu", fp8_recipe=recipe)
    batches = [torch.randn(16, H) for _ in range(4)]
    for x in batches[:2]:
        a(x).square().sum().backward()
    sd = {k: v.clone() for k, v in a.state_dict().items()}
    saved = a.fp8_state.clone()
    assert "fp8_state" not in sd and sd["_extra_state"].numel() > 0  # the state travels in TE's format
    b = lt.LayerNormMLP(H, F, activation="swiglu")  # no recipe yet: the checkpoint brings the state
    b.load_state_dict(sd, strict=True)
    # Every entry but the oldest, which the next update drops unused (TE's format has no place for it).
    assert torch.equal(b.fp8_state[:, :-1], saved[:, :-1]) and not b.fp8_state[:, -1].any()
    for x in batches[2:]:
        with lt.fp8_autocast(fp8_recipe=recipe):
            yb = b(x)
        ya = a(x)
        torch.testing.assert_close(yb, ya, rtol=0, atol=0)
        ya.square().sum().backward()
        yb.square().sum().backward()
        assert torch.equal(a.fp8_state, b.fp8_state)
    assert not torch.equal(a.fp8_state, saved), "the state moved on"


def test_fp8_autocast_and_compiled_delayed_scaling_match_eager():
    torch.manual_seed(6)
    recipe = lnmlp.DelayedScaling(amax_history_len=3)
    eager = lt.LayerNormMLP(H, F, activation="gelu", fp8_recipe=recipe)
    comp = lt.LayerNormMLP(H, F, activation="gelu", fp8_recipe=recipe)
    comp.load_state_dict(eager.state_dict())
    step = torch.compile(comp, fullgraph=True)
    for i in range(3):
        x = torch.randn(32, H)
        ye, yc = eager(x), step(x)
        torch.testing.assert_close(yc, ye, rtol=0, atol=0)
        ye.square().sum().backward()
        yc.square().sum().backward()
        assert torch.equal(eager.fp8_state, comp.fp8_state), i
    torch.testing.assert_close(comp.fc1_weight.grad, eager.fc1_weight.grad, rtol=0, atol=0)
    assert float(eager.fp8_state[4, 1]) > 0, "backward recorded the dy amax"


def test_compiling_delayed_scaling_before_its_state_exists_says_what_to_do():
    step = torch.compile(lt.LayerNormMLP(H, F), fullgraph=True)
    with lt.fp8_autocast(fp8_recipe=lnmlp.DelayedScaling()), pytest.raises(Exception, match="fp8_recipe=recipe"):
        step(torch.randn(4, H))


# ---- training features ---------------------------------------------------------------------------------

def test_fuse_wgrad_accumulation_adds_into_main_grad():
    torch.manual_seed(7)
    m = lt.LayerNormMLP(H, F, activation="swiglu", fuse_wgrad_accumulation=True)
    plain = lt.LayerNormMLP(H, F, activation="swiglu")
    plain.load_state_dict(m.state_dict())
    xs = [torch.randn(10, H) for _ in range(3)]
    for i, x in enumerate(xs):
        m(x, is_first_microbatch=(i == 0)).square().sum().backward()
        plain(x).square().sum().backward()
    assert m.fc1_weight.grad is None and m.fc2_weight.grad is None
    assert m.fc1_weight.main_grad.dtype == torch.float32
    torch.testing.assert_close(m.fc1_weight.main_grad, plain.fc1_weight.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(m.fc2_weight.main_grad, plain.fc2_weight.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(m.fc1_bias.grad, plain.fc1_bias.grad, rtol=1e-5, atol=1e-6)


def test_is_first_microbatch_false_reuses_the_fp8_weight_copies():
    torch.manual_seed(8)
    m = lt.LayerNormMLP(H, F, activation="gelu", fp8_recipe=lnmlp.Float8CurrentScaling())
    x = torch.randn(16, H)
    with torch.no_grad():
        y1 = m(x, is_first_microbatch=True)
        m.fc1_weight.mul_(2.0)  # a promise broken on purpose: the copies show it
        y_reused = m(x, is_first_microbatch=False)
        y_fresh = m(x, is_first_microbatch=None)
    torch.testing.assert_close(y_reused, y1, rtol=0, atol=0)
    assert not torch.equal(y_fresh, y1)


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copied_module_has_its_own_plans_and_weight_copies(how):
    """A deep copy (an EMA or reference model) or an unpickled module used to share the original's
    plans, so is_first_microbatch=False computed with the other module's FP8 weights."""
    torch.manual_seed(8)
    m = lt.LayerNormMLP(H, F, activation="gelu", fp8_recipe=lnmlp.Float8CurrentScaling())
    x = torch.randn(16, H)
    with torch.no_grad():
        y_m = m(x, is_first_microbatch=True)
        c = copy.deepcopy(m) if how == "deepcopy" else pickle.loads(pickle.dumps(m))
        assert c._cfg.slot != m._cfg.slot
        c.fc1_weight.mul_(2.0)
        y_c = c(x, is_first_microbatch=False)  # the copy's first call: its own FP8 weights
        y_c_fresh = c(x, is_first_microbatch=None)
        y_m_again = m(x, is_first_microbatch=False)
    torch.testing.assert_close(y_c, y_c_fresh, rtol=0, atol=0)
    torch.testing.assert_close(y_m_again, y_m, rtol=0, atol=0)
    assert not torch.equal(y_c, y_m)
    before = _ops.plan_count()
    del c
    gc.collect()
    assert _ops.plan_count() < before  # the copy's plans went with it, the original's stay
    with torch.no_grad():
        torch.testing.assert_close(m(x, is_first_microbatch=False), y_m, rtol=0, atol=0)


def test_a_finished_threads_plans_are_closed():
    before = _ops.plan_count()
    made = []

    def work():
        x = torch.randn(5, H, requires_grad=True)
        y = lt.layernorm_mlp(x, torch.ones(H), None, [torch.randn(H, 1, 40), torch.randn(40, H)], [None, None],
                             "rmsnorm", activation_type=("silu",))
        y.sum().backward()
        made.append(_ops.plan_count())

    t = threading.Thread(target=work)
    t.start()
    t.join()
    gc.collect()
    assert made and made[0] > before
    assert _ops.plan_count() == before


# ---- bad input -------------------------------------------------------------------------------------------

def _call(**over):
    d = make(1, np.float32, seed=9)
    ts = {n: tensor(d[n], torch.float32) for n in NAMES}
    ts.update(over)
    return lt.layernorm_mlp(ts["x"], ts["gamma"], ts["beta"], [ts["k1"], ts["k2"]], [ts["b1"], ts["b2"]],
                            "layernorm", activation_type=("gelu",))


@pytest.mark.parametrize("over, match", [
    (dict(x=torch.zeros(2, H, dtype=torch.int32)), "x must be float32"),
    (dict(x=torch.zeros(2, H, device="meta")), "lnmlp runs on CPU and CUDA"),
    (dict(x=torch.zeros(H, 4).t()), "not contiguous"),
    (dict(k1=torch.zeros(H, 2, F)), "kernel_1 must have shape"),
    (dict(k2=torch.zeros(F + 1, H)), "kernel_2 must have shape"),
    (dict(gamma=torch.zeros(H + 1)), "gamma must have shape"),
    (dict(beta=None), "beta is None"),
    (dict(b1=torch.zeros(3, F)), "bias_1 must have shape"),
    (dict(k1=np.zeros((H, 1, F), np.float32)), "kernel_1 must be a torch.Tensor"),
])
def test_bad_input_raises_a_clear_error(over, match):
    with pytest.raises(lnmlp.InvalidArgumentError, match=match):
        _call(**over)


def _op_call(recipe=lnmlp.DelayedScaling(amax_history_len=4)):
    """Good arguments of each op (by name), for the refusal tests to spoil one at a time."""
    cfg, x, gamma, beta, w1, b1, w2, b2, state = _op_args(recipe=recipe)
    fwd = dict(x=x, gamma=gamma, beta=beta, w1=w1, b1=b1, w2=w2, b2=b2, state=state, main_dw1=None, main_dw2=None,
               ints=cfg.ints(), floats=cfg.floats())
    y, saved, state, _ = torch.ops.lnmlp.forward(**fwd)
    bwd = dict(dy=torch.randn_like(y), x=x, gamma=gamma, beta=beta, w1=w1, b1=b1, w2=w2, has_b2=True, saved=saved,
               state=state, ints=cfg.ints(), floats=cfg.floats())
    acc = dict(bwd, main_dw1=torch.zeros(w1.shape), main_dw2=torch.zeros(w2.shape),
               ints=cfg.with_(grad_dtype=lnmlp._lib.DTYPE_F32).ints())
    return dict(forward=fwd, backward=bwd, backward_accumulate=acc)


_T, _A = 6, 2  # _op_args' tokens and activations
_F32 = dict(dtype=torch.float32)


@pytest.mark.parametrize("op, over, match", [
    ("forward", dict(state=torch.ones(2, 5)), r"state must have shape \(6, 5\)"),
    ("forward", dict(state=torch.ones(5, 6).t()), "state is not contiguous"),
    ("forward", dict(state=None), "state is None, but this configuration needs it"),
    ("forward", dict(w1=torch.ones(H + 1, _A, F)), "w1 must have shape"),
    ("forward", dict(w1=torch.ones(H, _A * F)), "w1 must have shape"),
    ("forward", dict(w2=torch.ones(F, H + 1)), "w2 must have shape"),
    ("forward", dict(gamma=torch.ones(H - 1)), "gamma must have shape"),
    ("forward", dict(gamma=torch.ones(H, dtype=torch.float16)), "gamma must be float32"),
    ("forward", dict(beta=None), "beta is None"),
    ("forward", dict(b1=torch.ones(_A, F - 1)), "b1 must have shape"),
    ("forward", dict(b2=torch.ones(H + 3)), "b2 must have shape"),
    ("forward", dict(x=torch.ones(_T, 0)), "x must have shape"),
    ("forward", dict(x=torch.ones(H, _T).t()), "x is not contiguous"),
    ("forward", dict(x=torch.ones(_T, H, dtype=torch.float64)), "x must be float32"),
    ("forward", dict(gamma=torch.ones(H, device="meta")), "gamma is on meta, but x is on cpu"),
    ("backward", dict(saved=torch.zeros(10 ** 5, dtype=torch.uint8, device="meta")), "saved is on meta"),
    ("forward", dict(main_dw1=torch.zeros(H, _A, F), main_dw2=None), "both given or both None"),
    ("forward", dict(main_dw1=torch.zeros(H, _A, F), main_dw2=torch.zeros(F, H - 1)), "main_dw2 must have shape"),
    ("forward", dict(ints=[0] * 3), f"expected {len(lt._ops._Config._INTS)} ints"),
    ("forward", dict(ints=lt._functional.config("layernorm", False, EPS, ("silu", "linear"), None, None)
                     .with_(tp_group=10 ** 6).ints()), "tp_group 1000000 is not valid"),
    ("forward", dict(ints=lt._functional.config("layernorm", False, EPS, ("silu", "linear"), None, None)
                     .with_(sequence_parallel=1).ints()), "sequence_parallel 1 is not valid"),  # without a group
    ("forward", dict(ints=lt._functional.config("layernorm", False, EPS, ("silu", "linear"), None, None)
                     .with_(recipe=10 ** 6).ints()), "recipe 1000000 is not valid"),
    ("forward", dict(ints=lt._functional.config("layernorm", False, EPS, ("silu", "linear"), None, None)
                     .with_(act0=99, remat=7).ints()), "act0 99 is not valid, remat 7 is not valid"),
    ("backward", dict(dy=torch.ones(_T - 1, H)), "dy must have shape"),
    ("backward", dict(dy=torch.ones(_T, H, dtype=torch.bfloat16)), "dy must be float32"),
    ("backward", dict(saved=torch.zeros(16, dtype=torch.uint8)), "saved must be the 1-D uint8 tensor"),
    ("backward", dict(saved=torch.zeros(10 ** 5, **_F32)), "saved must be uint8"),
    ("backward", dict(state=torch.ones(6, 2)), "state must have shape"),
    ("backward", dict(w1=torch.ones(H, _A, F, dtype=torch.float16)), "the weights. dtype"),
    ("backward_accumulate", dict(main_dw1=torch.zeros(H, _A, F, dtype=torch.bfloat16)), "main_dw1 must be float32"),
    ("backward_accumulate", dict(main_dw2=torch.zeros(F - 1, H)), "main_dw2 must have shape"),
    ("backward_accumulate", dict(main_dw2=torch.zeros(H, F).t()), "main_dw2 is not contiguous"),
])
def test_the_ops_refuse_what_does_not_fit_the_plan(op, over, match):
    """torch.ops.lnmlp.* are public: each checks every tensor it reads or writes against the shapes
    and dtypes the plan reports (before, a small state was written out of bounds, and a wrong w1,
    gamma, b1, dy or saved read out of bounds), and its configuration."""
    args = _op_call()[op]
    args.update(over)
    with pytest.raises(lnmlp.InvalidArgumentError, match=match):
        getattr(torch.ops.lnmlp, op)(**args)


def test_a_non_contiguous_delayed_scaling_state_is_refused():
    """A dense but transposed state used to be read and written as if row-major."""
    recipe = lnmlp.DelayedScaling(amax_history_len=5)
    good = lt._functional.fresh_state(recipe)
    qs = lt.QuantizerSet(recipe, state=good.t().contiguous().t())
    assert torch.equal(qs.state, good) and not qs.state.is_contiguous()
    d = make(1, np.float32, seed=9)
    ts = {n: tensor(d[n], torch.float32) for n in NAMES}
    with pytest.raises(lnmlp.InvalidArgumentError, match="must be contiguous"):
        lt.layernorm_mlp(ts["x"], ts["gamma"], ts["beta"], [ts["k1"], ts["k2"]], [ts["b1"], ts["b2"]], "layernorm",
                         activation_type=("gelu",), quantizer_set=qs)
    assert torch.equal(qs.state, good)


def test_bad_options_raise_a_clear_error():
    with pytest.raises(lnmlp.InvalidArgumentError, match="activation must be one of"):
        lt.LayerNormMLP(H, F, activation="tanh")
    with pytest.raises(lnmlp.InvalidArgumentError, match="normalization"):
        lt.LayerNormMLP(H, F, normalization="BatchNorm")
    with pytest.raises(lnmlp.InvalidArgumentError, match="params_dtype must be .* got torch.float64"):
        lt.LayerNormMLP(H, F, params_dtype=torch.float64)


# TransformerEngine's LayerNormMLP.__init__ (module/layernorm_mlp.py): its arguments in order, with
# their defaults.
TE_ARGUMENTS = dict(
    hidden_size=inspect.Parameter.empty, ffn_hidden_size=inspect.Parameter.empty, eps=1e-5,
    sequence_parallel=False, return_bias=False, get_rng_state_tracker=None, tp_group=None, tp_size=1,
    init_method=None, bias=True, normalization="LayerNorm", activation="gelu", activation_params=None,
    output_layer_init_method=None, fuse_wgrad_accumulation=False, params_dtype=None, return_layernorm_output=False,
    return_layernorm_output_gathered=False, seq_length=None, micro_batch_size=None, set_parallel_mode=False,
    zero_centered_gamma=False, device="cuda", ub_overlap_ag=False, name=None, ub_overlap_rs=False,
    ub_overlap_rs_dgrad=False, ub_bulk_dgrad=False, ub_bulk_wgrad=False, delay_wgrad_compute=False,
    symmetric_ar_type=None, checkpoint=False)


def test_the_constructor_takes_transformer_engines_arguments_in_its_order():
    params = inspect.signature(lt.LayerNormMLP.__init__).parameters
    positional = [n for n, p in params.items() if n != "self" and p.kind == p.POSITIONAL_OR_KEYWORD]
    assert positional == list(TE_ARGUMENTS)
    differ = {n: params[n].default for n, d in TE_ARGUMENTS.items() if params[n].default != d}
    assert differ == {"device": None}  # "cuda" where there is a GPU, else the CPU
    assert [n for n, p in params.items() if p.kind == p.KEYWORD_ONLY] == ["fp8_recipe"]
    # Positionally, as TE's users may call it: eps, sequence_parallel, return_bias.
    m = lt.LayerNormMLP(H, F, 1e-3, False, True, activation="relu", device="cpu")
    assert m.eps == 1e-3 and m.return_bias


@pytest.mark.parametrize("kwargs", [
    dict(seq_length=128, micro_batch_size=2, name="mlp0"),
    dict(tp_group=None, tp_size=1, sequence_parallel=False, set_parallel_mode=False, symmetric_ar_type=None,
         ub_overlap_ag=False, ub_overlap_rs=False, ub_overlap_rs_dgrad=False, ub_bulk_dgrad=False,
         ub_bulk_wgrad=False, return_layernorm_output_gathered=False),
], ids=["no-effect", "te-defaults"])
def test_te_arguments_that_mean_nothing_here_are_accepted_and_change_nothing(kwargs):
    torch.manual_seed(16)
    plain = lt.LayerNormMLP(H, F, device="cpu")
    m = lt.LayerNormMLP(H, F, device="cpu", **kwargs)
    m.load_state_dict(plain.state_dict())
    x = torch.randn(4, H)
    torch.testing.assert_close(m(x), plain(x), rtol=0, atol=0)


@pytest.mark.parametrize("kwargs, match", [
    (dict(ub_overlap_ag=True, ub_bulk_wgrad=True), "ub_overlap_ag=True, ub_bulk_wgrad=True are not supported"),
    (dict(symmetric_ar_type="multimem_all_reduce"), "symmetric_ar_type='multimem_all_reduce'"),
    (dict(return_layernorm_output_gathered=True), "return_layernorm_output_gathered=True"),
])
def test_te_arguments_asking_for_what_lnmlp_does_not_do_are_refused_by_name(kwargs, match):
    with pytest.raises(lnmlp.NotSupportedError, match=match):
        lt.LayerNormMLP(H, F, **kwargs)


@pytest.mark.parametrize("param, value, match", [
    ("fc1_weight", torch.zeros(F, H, dtype=torch.float64), "fc1_weight must be float32"),
    ("fc2_weight", torch.zeros(H, F + 1), "fc2_weight must have shape"),
    ("layer_norm_weight", torch.zeros(H, 2)[:, 0], "layer_norm_weight is not contiguous"),
    ("fc1_weight", torch.zeros(2 * F, H), "fc1_weight must have shape"),
])
def test_the_modules_errors_name_its_parameters(param, value, match):
    m = lt.LayerNormMLP(H, F, activation="gelu")
    setattr(m, param, torch.nn.Parameter(value))
    with pytest.raises(lnmlp.InvalidArgumentError, match=match):
        m(torch.zeros(3, H))
    with pytest.raises(lnmlp.InvalidArgumentError, match=r"inp must be a tensor \[..., hidden_size\]"):
        lt.LayerNormMLP(H, F)(torch.zeros(3, H + 1))
    with pytest.raises(lnmlp.InvalidArgumentError, match="quantizer_set"):
        _call_qs = make(1, np.float32)
        lt.layernorm_mlp(tensor(_call_qs["x"], torch.float32), tensor(_call_qs["gamma"], torch.float32),
                         tensor(_call_qs["beta"], torch.float32),
                         [tensor(_call_qs["k1"], torch.float32), tensor(_call_qs["k2"], torch.float32)],
                         [None, None], "layernorm", activation_type=("gelu",), quantizer_set="delayed")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_run_on_the_cuda_backend():  # pragma: no cover - runs where a GPU is lent
    norm, acts, bias, zcg, p = CASES[2]
    d = make(len(acts), np.float32, norm=norm, bias=bias, seed=11)
    y_ref, dy, g_ref = reference(d, norm, acts, zcg, p)
    ts = {n: (None if d[n] is None else tensor(d[n], torch.float32).cuda().requires_grad_(True)) for n in NAMES}
    y = lt.layernorm_mlp(ts["x"], ts["gamma"], ts["beta"], [ts["k1"], ts["k2"]], [ts["b1"], ts["b2"]], norm,
                         zero_centered_gamma=zcg, epsilon=EPS, activation_type=acts)
    (y * tensor(dy.reshape(y.shape), torch.float32).cuda()).sum().backward()
    ref.assert_close("cuda y", numpy(y).reshape(-1, H), y_ref, "float32")
    ref.assert_close("cuda dw1", numpy(ts["k1"].grad), g_ref["dw1"], "float32")


def test_nvfp4_draws_its_stochastic_rounding_from_torchs_generator():
    """NVFP4 through the functional op: each backward seeds the plan's random stream with 63 bits
    from torch's default generator, so torch.manual_seed reproduces it, and the gradients are a
    Plan's with that random state, bit for bit. TE's NVFP4BlockScaling object reads as lnmlp's."""
    g = torch.Generator().manual_seed(3)
    T = 32
    x = torch.randn(T, H, generator=g)
    gamma, beta = 1 + 0.1 * torch.randn(H, generator=g), 0.1 * torch.randn(H, generator=g)
    w1, w2 = torch.randn(H, 1, F, generator=g) / H ** 0.5, torch.randn(F, H, generator=g) / F ** 0.5
    dy = torch.randn(T, H, generator=g)
    recipe = lt.NVFP4BlockScaling()

    def grads(seed):
        torch.manual_seed(seed)
        leaves = [t.clone().requires_grad_(True) for t in (x, gamma, beta, w1, w2)]
        y = lt.layernorm_mlp(leaves[0], leaves[1], leaves[2], [leaves[3], leaves[4]], None, "layernorm",
                             activation_type=("gelu",), quantizer_set=lt.make_quantizer_set(recipe))
        y.backward(dy)
        return [t.grad for t in leaves]

    first, again, other = grads(7), grads(7), grads(8)
    for a, b in zip(first, again):
        assert torch.equal(a, b), "torch.manual_seed reproduces the stochastic rounding"
    assert not torch.equal(first[3], other[3]), "another seed draws other bits"
    torch.manual_seed(7)
    seed = int(torch.randint(0, 2 ** 63 - 1, (), dtype=torch.int64).item())
    with lnmlp.Plan(T, H, F, activation_type=("gelu",), recipe=recipe) as plan:
        n = lambda t: t.numpy()  # noqa: E731
        _, saved = plan.forward(n(x), n(gamma), n(beta), n(w1), None, n(w2), None)
        plan.set_rng_state(seed, 0)
        want = plan.backward(n(dy), n(x), n(gamma), n(beta), n(w1), None, n(w2), saved)
    for name, got, w in zip(("dx", "dgamma", "dbeta", "dw1", "dw2"), first,
                            (want.dx, want.dgamma, want.dbeta, want.dw1, want.dw2)):
        np.testing.assert_array_equal(got.numpy(), w, err_msg=name)

    class NVFP4BlockScaling:  # TE's recipe object, as lnmlp reads it (fields, not the class)
        disable_rht, disable_stochastic_rounding, disable_2d_quantization = True, False, True
        fp4_format, fp8_format, backward_override = "E2M1", "E4M3", None
    NVFP4BlockScaling.__module__ = "transformer_engine.common.recipe"
    assert lnmlp.recipe.as_recipe(NVFP4BlockScaling()) == lnmlp.NVFP4BlockScaling(
        disable_rht=True, disable_stochastic_rounding=False, disable_2d_quantization=True)
