"""ABI 2: a call's own token count (0 .. the plan's most), the shape query, and caller-owned FP8
state (per call and attached).

A call with t tokens must compute exactly -- bit for bit -- what a plan made for t tokens computes
(include/lnmlp.h, lnmlp_plan_forward), so (a) compares a plan for at most T_MAX tokens run with t
tokens against a plan created for exactly t, with np.array_equal and the bytes of every output.
"""

import gc
import weakref

import ml_dtypes
import numpy as np
import pytest

import lnmlp
import _reference as ref
from test_fp8_recipes import ARGS, make_dy, make_inputs

BF16 = np.dtype(ml_dtypes.bfloat16)
T_MAX, H, F = 37, 48, 80
TOKENS = (1, 13, 37)

# (norm, activations, dtype, biases, recipe factory or None): each FP8 recipe (test_reuse_accumulate.py
# takes these too), then plans without one.
FP8_CONFIGS = {
    "fp8-current": ("layernorm", ("gelu",), np.float32, True, lambda: lnmlp.Float8CurrentScaling()),
    "fp8-current-bf16-swiglu": ("rmsnorm", ("silu", "linear"), BF16, True,
                                lambda: lnmlp.Float8CurrentScaling(fp8_format="E4M3", power_2_scale=True)),
    "fp8-delayed": ("layernorm", ("gelu",), np.float32, True, lambda: lnmlp.DelayedScaling(amax_history_len=4)),
    "fp8-block": ("layernorm", ("gelu",), np.float32, True, lambda: lnmlp.Float8BlockScaling()),
    "fp8-mxfp8": ("rmsnorm", ("silu", "linear"), BF16, True, lambda: lnmlp.MXFP8BlockScaling()),
}
CONFIGS = {
    "f32-layernorm-gelu-bias": ("layernorm", ("gelu",), np.float32, True, None),
    "bf16-rmsnorm-swiglu": ("rmsnorm", ("silu", "linear"), BF16, False, None),
    **FP8_CONFIGS,
}
GRADS = ("dx", "dgamma", "dbeta", "dw1", "db1", "dw2", "db2")


def make_plan(cid, tokens, remat="save_all", **kw):
    norm, acts, dtype, bias, recipe = CONFIGS[cid]
    return lnmlp.Plan(tokens, H, F, norm_type=norm, activation_type=acts, use_bias1=bias, use_bias2=bias,
                      dtype=dtype, remat=remat, num_threads=1, recipe=None if recipe is None else recipe(), **kw)


def data(cid, t, seed):
    norm, acts, dtype, bias, _ = CONFIGS[cid]
    inp = make_inputs(t, H, F, len(acts), norm, dtype, bias, seed)
    return inp, make_dy(t, H, dtype, seed)


def step(plan, inp, dy, **kw):
    y, saved = plan.forward(*(inp[k] for k in ARGS), **kw)
    g = plan.backward(dy, inp["x"], inp["gamma"], inp["beta"], inp["w1"], inp["b1"], inp["w2"], saved, **kw)
    return y, saved, g


def same(name, got, want):
    """Bitwise equality (and np.array_equal) of two outputs, None included."""
    if want is None:
        assert got is None, f"{name}: expected None"
        return
    assert got is not None, f"{name} is None"
    assert got.dtype == want.dtype and got.shape == want.shape, (name, got.dtype, got.shape, want.dtype, want.shape)
    assert np.array_equal(got, want), f"{name} differs"
    assert got.tobytes() == want.tobytes(), f"{name} differs in its bits"


def same_step(label, a, b):
    (ya, _, ga), (yb, _, gb) = a, b
    same(f"y {label}", ya, yb)
    for k in GRADS:
        same(f"{k} {label}", getattr(ga, k), getattr(gb, k))


def fresh_state(plan):
    shape = plan.tensor_shape("fp8_state")
    st = np.zeros(shape, np.float32)
    st[:, 0] = 1.0
    return st


def plan_state(plan):
    """The plan's state as an array of the FP8_STATE layout, read through the state API."""
    rows = []
    for n in lnmlp.QUANTIZERS:
        scale, hist = plan.quantizer_state(n)
        rows.append(np.concatenate([np.float32([scale]), hist]))
    return np.stack(rows)


# ---------------------------------------------------------------------------------------------------
# the shape query
# ---------------------------------------------------------------------------------------------------
def test_tensor_shapes_come_from_the_library():
    with make_plan("f32-layernorm-gelu-bias", T_MAX) as p:
        assert p.local_tokens == T_MAX and p.local_ffn == F
        assert p.tensor_shape("x") == (T_MAX, H) and p.tensor_shape("dy", 5) == (5, H)
        assert p.tensor_shape("w1") == p.tensor_shape(lnmlp._lib.TENSOR_DW1) == (H, 1, F)
        assert p.tensor_shape("b1") == (1, F) and p.tensor_shape("w2") == (F, H) and p.tensor_shape("beta") == (H,)
        assert p.tensor_shape("fp8_state") is None
        assert p.tensor_shape("saved") == (p.saved_bytes,)
        assert p.tensor_shape("SAVED", 0)[0] <= p.tensor_shape("saved", 13)[0] <= p.saved_bytes
        with pytest.raises(lnmlp.InvalidArgumentError) as e:
            p.tensor_shape("x", T_MAX + 1)
        assert "tokens" in e.value.message
        with pytest.raises(lnmlp.InvalidArgumentError, match="tensor must be one of"):
            p.tensor_shape("weights")
        with pytest.raises(lnmlp.InvalidArgumentError, match="tokens must be an int"):
            p.tensor_shape("x", 2.0)
    with make_plan("bf16-rmsnorm-swiglu", T_MAX) as p:
        assert p.tensor_shape("beta") is None and p.tensor_shape("dbeta") is None
        assert p.tensor_shape("b1") is None and p.tensor_shape("db2") is None
        assert p.tensor_shape("w1") == (H, 2, F)
    with make_plan("fp8-delayed", T_MAX) as p:
        assert p.tensor_shape("fp8_state") == (len(lnmlp.QUANTIZERS), 1 + p.amax_history_length) == (6, 5)
    with make_plan("f32-layernorm-gelu-bias", T_MAX, remat="forward_only") as p:
        assert p.tensor_shape("saved") is None


# ---------------------------------------------------------------------------------------------------
# (a) t tokens on a plan for T_MAX == a plan for exactly t tokens, bit for bit
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cid", list(CONFIGS))
def test_fewer_tokens_equal_a_plan_made_for_them(cid):
    with make_plan(cid, T_MAX) as big:
        for i, t in enumerate(TOKENS + (13, 1)):  # revisited counts reuse the plan's per-count kernels
            inp, dy = data(cid, t, seed=100 + t)
            with make_plan(cid, t) as exact:
                if big.amax_history_length:  # delayed: both start from the same state
                    exact.import_state(big.export_state())
                got, want = step(big, inp, dy), step(exact, inp, dy)
                same_step(f"{cid} t={t} (call {i})", got, want)
                assert got[1].nbytes == big.tensor_shape("saved", t)[0] == exact.saved_bytes
                assert big.export_state() == exact.export_state()


@pytest.mark.parametrize("cid", list(CONFIGS))
def test_prepared_token_counts_equal_a_plan_made_for_them(cid):
    """Counts whose GEMMs the plan made at creation (prepared_tokens) run them: the bits of a plan
    made for exactly that count, as for a count it was not asked to prepare (13)."""
    with make_plan(cid, T_MAX, prepared_tokens=[16, 1, 16]) as big:
        assert big.prepared_tokens == (1, 16)
        for t in (16, 1, 13, 16):
            inp, dy = data(cid, t, seed=500 + t)
            with make_plan(cid, t) as exact:
                if big.amax_history_length:
                    exact.import_state(big.export_state())
                same_step(f"{cid} t={t}", step(big, inp, dy), step(exact, inp, dy))


def test_prepared_token_counts_are_checked():
    for bad, err in (([0], lnmlp.InvalidArgumentError), ([T_MAX + 1], lnmlp.InvalidArgumentError),
                     (list(range(1, 34)), lnmlp.InvalidArgumentError), ([2.5], lnmlp.InvalidArgumentError),
                     (7, lnmlp.InvalidArgumentError), ([True], lnmlp.InvalidArgumentError)):
        with pytest.raises(err):
            make_plan("f32-layernorm-gelu-bias", T_MAX, prepared_tokens=bad)
    with make_plan("f32-layernorm-gelu-bias", T_MAX, prepared_tokens=range(1, 33)) as p:
        assert p.prepared_tokens == tuple(range(1, 33))


@pytest.mark.parametrize("remat", ["save_all", "save_ffn1", "save_stats"])
@pytest.mark.parametrize("cid", list(CONFIGS))
def test_a_plan_for_more_tokens_reads_the_saved_of_a_call(cid, remat):
    """The saved buffer of a t-token call depends on t alone: a plan made for more tokens runs the
    backward of a smaller plan's forward, bit for bit (lnmlp.jax relies on it when a plan grows
    between a forward and its backward)."""
    t = 13
    inp, dy = data(cid, t, seed=7)
    args = lambda saved: (dy, inp["x"], inp["gamma"], inp["beta"], inp["w1"], inp["b1"], inp["w2"], saved)  # noqa: E731
    with make_plan(cid, t, remat) as small, make_plan(cid, T_MAX, remat) as big:
        _, saved = small.forward(*(inp[k] for k in ARGS))
        if big.amax_history_length:  # delayed: both backwards start from the state after the forward
            big.import_state(small.export_state())
        g_big = big.backward(*args(saved.copy()))
        g = small.backward(*args(saved))
        for k in GRADS:
            same(f"{k} {cid} {remat}", getattr(g_big, k), getattr(g, k))


@pytest.mark.parametrize("remat", ["save_ffn1", "save_stats"])
@pytest.mark.parametrize("cid", ["f32-layernorm-gelu-bias", "fp8-current"])
def test_fewer_tokens_under_every_remat_policy(cid, remat):
    with make_plan(cid, T_MAX, remat) as big:
        for t in TOKENS:
            inp, dy = data(cid, t, seed=200 + t)
            with make_plan(cid, t, remat) as exact:
                same_step(f"{cid}/{remat} t={t}", step(big, inp, dy), step(exact, inp, dy))


@pytest.mark.parametrize("cid", ["f32-layernorm-gelu-bias", "bf16-rmsnorm-swiglu"])
def test_fewer_tokens_against_the_float64_reference(cid):
    norm, acts, dtype, bias, _ = CONFIGS[cid]
    dn = np.dtype(dtype).name
    with make_plan(cid, T_MAX) as big:
        for t, lead in ((1, (1,)), (13, (13,)), (12, (3, 4)), (37, (37,))):
            inp, dy = data(cid, t, seed=300 + t)
            x = inp["x"].reshape(lead + (H,))
            y, saved = big.forward(x, *(inp[k] for k in ARGS[1:]))
            g = big.backward(dy.reshape(lead + (H,)), x, inp["gamma"], inp["beta"], inp["w1"], inp["b1"],
                             inp["w2"], saved)
            assert y.shape == x.shape and g.dx.shape == x.shape
            f64 = {k: None if v is None else v.astype(np.float64) for k, v in inp.items()}
            kw = dict(norm=norm, zcg=False, eps=1e-6, acts=acts, p={})
            args = [f64[k] for k in ARGS]
            ref.assert_close(f"y t={t} {cid}", y.reshape(t, H), ref.forward(*args, **kw)[0], dn)
            gr = ref.backward(dy.astype(np.float64), *args, **kw)
            for k in GRADS:
                if gr[k] is None:
                    assert getattr(g, k) is None
                else:
                    got = getattr(g, k).reshape(gr[k].shape)
                    ref.assert_close(f"{k} t={t} {cid}", got, gr[k], dn)


# ---------------------------------------------------------------------------------------------------
# (b) zero tokens
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cid", ["f32-layernorm-gelu-bias", "bf16-rmsnorm-swiglu", "fp8-current", "fp8-delayed"])
def test_zero_tokens(cid):
    norm, acts, dtype, bias, _ = CONFIGS[cid]
    inp, _ = data(cid, 4, seed=400)
    with make_plan(cid, T_MAX) as p:
        before = p.export_state()
        for lead in ((0,), (2, 0)):
            x = np.zeros(lead + (H,), dtype)
            y, saved = p.forward(x, *(inp[k] for k in ARGS[1:]))
            assert y.shape == x.shape and y.dtype == dtype and y.size == 0
            assert saved.dtype == np.uint8 and saved.nbytes == p.tensor_shape("saved", 0)[0]
            g = p.backward(np.zeros_like(x), x, inp["gamma"], inp["beta"], inp["w1"], inp["b1"], inp["w2"], saved)
            assert g.dx.shape == x.shape and g.dx.size == 0
            for k in GRADS[1:]:
                shape = p.tensor_shape(k)
                if shape is None:
                    assert getattr(g, k) is None, k
                else:
                    v = getattr(g, k)
                    assert v.shape == shape and v.dtype == dtype, k
                    assert not np.any(v.astype(np.float32)), f"{k} is not zero"
        assert p.export_state() == before  # 0 tokens leave the FP8 state as it was
        # and the plan goes on computing what a fresh one does
        inp, dy = data(cid, 13, seed=401)
        with make_plan(cid, 13) as exact:
            same_step(f"{cid} after t=0", step(p, inp, dy), step(exact, inp, dy))


def test_zero_tokens_with_a_per_call_fp8_state():
    inp, _ = data("fp8-delayed", 4, seed=402)
    with make_plan("fp8-delayed", T_MAX) as p:
        st = fresh_state(p)
        st[:, 1] = 3.0  # a non-fresh history
        keep = st.copy()
        x = np.zeros((0, H), np.float32)
        y, saved = p.forward(x, *(inp[k] for k in ARGS[1:]), fp8_state=st)
        p.backward(x, x, inp["gamma"], inp["beta"], inp["w1"], inp["b1"], inp["w2"], saved, fp8_state=st)
        assert st.tobytes() == keep.tobytes()


# ---------------------------------------------------------------------------------------------------
# (c) more tokens than the plan's most
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cid", ["f32-layernorm-gelu-bias", "fp8-delayed"])
def test_too_many_tokens_raise_the_library_error_and_change_nothing(cid):
    with make_plan(cid, T_MAX) as p:
        inp, dy = data(cid, T_MAX, seed=500)
        y0, s0, g0 = step(p, inp, dy)
        st = fresh_state(p) if p.amax_history_length else None
        st_before = None if st is None else st.copy()
        state_before = p.export_state()
        big, dybig = data(cid, T_MAX + 1, seed=501)
        for lead in ((T_MAX + 1,), (2, 19)):  # 38 tokens, also as leading dims
            x = big["x"].reshape(lead + (H,))
            for kw in ({}, {} if st is None else {"fp8_state": st}):
                with pytest.raises(lnmlp.InvalidArgumentError) as e:
                    p.forward(x, *(big[k] for k in ARGS[1:]), **kw)
                assert e.value.status == lnmlp._lib.ERROR_INVALID_ARGUMENT
                assert "lnmlp_plan_forward" in e.value.message and "tokens" in e.value.message
                assert str(T_MAX) in e.value.message and str(T_MAX + 1) in e.value.message
                with pytest.raises(lnmlp.InvalidArgumentError) as e:
                    p.backward(dybig.reshape(x.shape), x, big["gamma"], big["beta"], big["w1"], big["b1"],
                               big["w2"], s0, **kw)
                assert "lnmlp_plan_backward" in e.value.message and "tokens" in e.value.message
        assert p.export_state() == state_before
        if st is not None:
            assert st.tobytes() == st_before.tobytes()
        # the plan is unchanged: the same state gives the same step again
        if state_before:
            p.import_state(state_before)
            with make_plan(cid, T_MAX) as q:
                q.import_state(state_before)
                same_step("after the refusal", step(p, inp, dy), step(q, inp, dy))
        else:
            same_step("after the refusal", step(p, inp, dy), (y0, s0, g0))


def test_saved_of_another_token_count_is_refused():
    cid = "f32-layernorm-gelu-bias"
    with make_plan(cid, T_MAX) as p:
        inp, dy = data(cid, 13, seed=510)
        _, saved = p.forward(*(inp[k] for k in ARGS))
        inp1, dy1 = data(cid, 1, seed=511)
        with pytest.raises(lnmlp.InvalidArgumentError, match="^saved has .* bytes, but this plan saves .* for 1 tokens"):
            p.backward(dy1, inp1["x"], inp1["gamma"], inp1["beta"], inp1["w1"], inp1["b1"], inp1["w2"], saved)


# ---------------------------------------------------------------------------------------------------
# (d) caller-owned delayed-scaling state
# ---------------------------------------------------------------------------------------------------
SEQUENCE = (37, 13, 1, 37, 0, 20)  # token counts of successive steps


def _steps(cid="fp8-delayed"):
    out = []
    for i, t in enumerate(SEQUENCE):
        inp, dy = data(cid, t, seed=600 + i)
        mult = np.float32(2.0 ** (i % 3 - 1))  # changing magnitudes: the scales move
        inp["x"] = (inp["x"] * mult).astype(inp["x"].dtype)
        out.append((inp, (dy * mult * 50).astype(dy.dtype)))
    return out


def test_per_call_fp8_state_matches_the_plans_own_state():
    with make_plan("fp8-delayed", T_MAX) as own, make_plan("fp8-delayed", T_MAX) as caller:
        fresh = caller.export_state()
        st = fresh_state(caller)
        for i, (inp, dy) in enumerate(_steps()):
            a = step(own, inp, dy)
            b = step(caller, inp, dy, fp8_state=st)
            same_step(f"step {i}", b, a)
            want = plan_state(own)
            assert st.tobytes() == want.tobytes(), f"state after step {i}"
        assert np.any(st[:, 0] != 1.0) and np.any(st[:, 1:])  # the steps did move it
        assert caller.export_state() == fresh  # the plan's own state was not used


def test_attached_fp8_state_matches_the_plans_own_state():
    with make_plan("fp8-delayed", T_MAX) as own, make_plan("fp8-delayed", T_MAX) as att:
        st = fresh_state(att)
        ref_st = weakref.ref(st)
        att.attach_fp8_state(st)
        steps = _steps()
        for i, (inp, dy) in enumerate(steps[:3]):
            same_step(f"step {i}", step(att, inp, dy), step(own, inp, dy))
            assert st.tobytes() == plan_state(own).tobytes()
        # the state API reads and writes the attached array
        assert att.export_state() == own.export_state()
        assert plan_state(att).tobytes() == st.tobytes()
        att.set_quantizer_state("dh", 0.5, np.arange(4, dtype=np.float32))
        assert st[5, 0] == 0.5 and st[5, 1:].tolist() == [0, 1, 2, 3]
        own.set_quantizer_state("dh", 0.5, np.arange(4, dtype=np.float32))
        # the plan keeps the array alive while it is attached
        keep = st.copy()
        del st
        gc.collect()
        assert ref_st() is not None
        for i, (inp, dy) in enumerate(steps[3:], 3):
            same_step(f"step {i}", step(att, inp, dy), step(own, inp, dy))
            assert ref_st().tobytes() == plan_state(own).tobytes()
        assert ref_st().tobytes() != keep.tobytes()
        # detaching goes back to the plan's own state, which kept its (fresh) values
        att.attach_fp8_state(None)
        gc.collect()
        assert ref_st() is None
        for n in lnmlp.QUANTIZERS:
            sc, h = att.quantizer_state(n)
            assert sc == 1.0 and not h.any(), n


def test_per_call_state_takes_precedence_over_the_attached_one():
    inp, dy = _steps()[0]
    with make_plan("fp8-delayed", T_MAX) as p, make_plan("fp8-delayed", T_MAX) as own:
        attached, per_call = fresh_state(p), fresh_state(p)
        p.attach_fp8_state(attached)
        same_step("per call", step(p, inp, dy, fp8_state=per_call), step(own, inp, dy))
        assert per_call.tobytes() == plan_state(own).tobytes()
        assert attached.tobytes() == fresh_state(p).tobytes()


def test_attached_state_is_released_on_close():
    p = make_plan("fp8-delayed", T_MAX)
    st = fresh_state(p)
    r = weakref.ref(st)
    p.attach_fp8_state(st)
    del st
    p.close()
    gc.collect()
    assert r() is None


def test_fp8_state_misuse_is_a_clear_error():
    inp, dy = data("fp8-delayed", 5, seed=700)
    args = [inp[k] for k in ARGS]
    bargs = [inp[k] for k in ("x", "gamma", "beta", "w1", "b1", "w2")]
    with make_plan("fp8-delayed", T_MAX) as p:
        _, saved = p.forward(*args)
        before = p.export_state()
        good = fresh_state(p)
        ro = good.copy()
        ro.flags.writeable = False
        bad = [
            (np.zeros((6, 4), np.float32), r"^fp8_state has shape \(6, 4\), but this plan's FP8 state is \(6, 5\)"),
            (np.zeros((6, 5), np.float64), "^fp8_state has dtype float64, but the FP8 state is float32"),
            (np.ones(30, np.float32), r"^fp8_state has shape \(30,\)"),
            (np.asfortranarray(good), "^fp8_state is not C-contiguous"),
            (np.ones((6, 10), np.float32)[:, ::2], "^fp8_state is not C-contiguous"),
            (ro, "^fp8_state is read-only"),
            (good.tolist(), "^fp8_state must be a float32 numpy.ndarray of shape"),
        ]
        for arr, match in bad:
            snapshot = arr.copy() if isinstance(arr, np.ndarray) else None
            with pytest.raises(lnmlp.InvalidArgumentError, match=match):
                p.forward(*args, fp8_state=arr)
            with pytest.raises(lnmlp.InvalidArgumentError, match=match):
                p.backward(dy, *bargs, saved, fp8_state=arr)
            with pytest.raises(lnmlp.InvalidArgumentError, match=match.replace("fp8_state", "state", 1)):
                p.attach_fp8_state(arr)
            if snapshot is not None:
                assert arr.tobytes() == snapshot.tobytes(), match
            assert p.export_state() == before, match
        # nothing was attached: the plan still uses its own state
        assert plan_state(p).tobytes() != good.tobytes()
    # a plan of another recipe has no state to pass or attach
    for cid in ("fp8-current", "f32-layernorm-gelu-bias"):
        with make_plan(cid, T_MAX) as p:
            st = np.ones((6, 5), np.float32)
            with pytest.raises(lnmlp.InvalidArgumentError, match="keeps no quantizer state; only DelayedScaling"):
                p.forward(*args, fp8_state=st)
            _, saved = p.forward(*args)
            with pytest.raises(lnmlp.InvalidArgumentError, match="keeps no quantizer state; only DelayedScaling"):
                p.backward(dy, *bargs, saved, fp8_state=st)
            with pytest.raises(lnmlp.InvalidArgumentError, match="keeps no quantizer state; only DelayedScaling"):
                p.attach_fp8_state(st)
            with pytest.raises(lnmlp.InvalidArgumentError, match="keeps no quantizer state"):
                p.attach_fp8_state(None)
            assert (st == 1).all()


def test_quantizer_set_state_is_the_per_call_array():
    """The functional API passes its quantizer set's array per call (no copies into the plan)."""
    lnmlp.clear_plan_cache()
    try:
        cid = "fp8-delayed"
        norm, acts, dtype, bias, recipe = CONFIGS[cid]
        qs = lnmlp.make_quantizer_set(recipe())
        with make_plan(cid, T_MAX) as own:
            for i, (inp, dy) in enumerate(_steps()[:3]):
                t = inp["x"].shape[0]
                y, vjp = lnmlp.layernorm_mlp_vjp(inp["x"], inp["gamma"], inp["beta"], [inp["w1"], inp["w2"]],
                                                 [inp["b1"], inp["b2"]], norm, activation_type=acts,
                                                 quantizer_set=qs)
                dx = vjp(dy)[0]
                y0, _, g0 = step(own, inp, dy)
                same(f"y {i}", y, y0)
                same(f"dx {i}", dx, g0.dx)
                assert qs._state.tobytes() == plan_state(own).tobytes()
                plan = vjp._plan
                assert plan.tokens == t
                with make_plan(cid, t) as fresh:
                    assert plan.export_state() == fresh.export_state()  # the plan's own state: never used
    finally:
        lnmlp.clear_plan_cache()
