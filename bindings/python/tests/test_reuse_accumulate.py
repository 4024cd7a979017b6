"""ABI 2, second round: reuse of the plan's weight copies (LNMLP_CALL_WEIGHTS_UNCHANGED, as
``Plan.forward / backward(..., weights_unchanged=True)``) and weight-gradient accumulation
(lnmlp_desc_set_weight_gradients, as ``Plan(..., accumulate_grads=True, grad_dtype=...)`` with
``backward(..., grads=...)``).

The flag's contract (include/lnmlp.h, LNMLP_CALL_WEIGHTS_UNCHANGED): a flagged call reuses the
copies of W1 / W2 the plan kept -- widened (f16) or FP8-quantized -- so (a) with unchanged weights
and a stateless recipe it computes bit for bit what an unflagged call computes, and (b) a caller
that lies (changes W1 and still passes the flag) gets the OLD weights' results from a plan that
keeps copies, and the new ones from a plan that reads the weights as they are (float32, no FP8):
this is how the tests see that the copies are reused. (b') a flagged call may pass other arrays
than the earlier calls' (the library reads only this call's pointers or its copies).

Accumulation: dW1, db1, dW2, db2 become rnd(old + gradient); (c) compares three micro-batches
accumulated into fp32 buffers of a bf16 plan with the float64 reference sum plus the buffers'
initial values, within _reference.py's tolerance for bf16.
"""

import ml_dtypes
import numpy as np
import pytest

import lnmlp
import _reference as ref
from test_fp8_recipes import ARGS, make_dy, make_inputs
from test_tokens import FP8_CONFIGS, same

BF16 = np.dtype(ml_dtypes.bfloat16)
T_MAX, H, F = 37, 48, 80
WEIGHT_GRADS = ("dw1", "db1", "dw2", "db2")
GRADS = ("dx", "dgamma", "dbeta") + WEIGHT_GRADS

# (norm, activations, dtype, biases, recipe factory or None)
CONFIGS = {
    # No widened or FP8 copies; where the CPU packs weights (AVX-512), the first flagged forward packs
    # them, which here comes after the weights changed: it reads W1, W2 as they are.
    "f32": ("layernorm", ("gelu",), np.float32, True, None),
    "f16": ("rmsnorm", ("silu", "linear"), np.float16, True, None),  # widened fp32 copies
    **FP8_CONFIGS,
}


def make_plan(cid, **kw):
    norm, acts, dtype, bias, recipe = CONFIGS[cid]
    return lnmlp.Plan(T_MAX, H, F, norm_type=norm, activation_type=acts, use_bias1=bias, use_bias2=bias,
                      dtype=dtype, num_threads=1, recipe=None if recipe is None else recipe(), **kw)


def params(cid, seed=0):
    """The weights and norm parameters (x is per micro-batch: see batch())."""
    norm, acts, dtype, bias, _ = CONFIGS[cid]
    p = make_inputs(1, H, F, len(acts), norm, dtype, bias, seed)
    del p["x"]
    return p


def batch(cid, t, seed):
    """x [t, H] and dy [t, H] of one micro-batch."""
    norm, acts, dtype, bias, _ = CONFIGS[cid]
    return make_inputs(t, H, F, len(acts), norm, dtype, bias, 100 + seed)["x"], make_dy(t, H, dtype, 100 + seed)


def fwd(plan, p, x, unchanged, **kw):
    return plan.forward(x, *(p[k] for k in ARGS[1:]), weights_unchanged=unchanged, **kw)


def bwd(plan, p, x, dy, saved, unchanged, **kw):
    return plan.backward(dy, x, p["gamma"], p["beta"], p["w1"], p["b1"], p["w2"], saved,
                         weights_unchanged=unchanged, **kw)


def same_results(label, a, b):
    (ya, ga), (yb, gb) = a, b
    same(f"y {label}", ya, yb)
    for k in GRADS:
        same(f"{k} {label}", getattr(ga, k), getattr(gb, k))


# --- (a) unchanged weights: a flagged call computes bit for bit what an unflagged one computes -----
STEPS = ((37, 0), (13, 1), (29, 2))  # (tokens, seed) of three micro-batches


@pytest.mark.parametrize("first_flagged", [False, True], ids=["first-unflagged", "all-flagged"])
@pytest.mark.parametrize("cid", ["fp8-current", "fp8-current-bf16-swiglu", "f16"])
def test_weights_unchanged_is_bitwise_the_unflagged_result(cid, first_flagged):
    p = params(cid)
    with make_plan(cid) as flagged, make_plan(cid) as plain:
        for i, (t, seed) in enumerate(STEPS):
            x, dy = batch(cid, t, seed)
            # TransformerEngine's pattern: the first micro-batch's forward makes the copies
            # (is_first_microbatch=True), its backward and every later call reuse them. A copy not
            # made yet is made, so flagging a fresh plan's first call is as exact.
            y, saved = fwd(flagged, p, x, unchanged=first_flagged or i > 0)
            got = (y, bwd(flagged, p, x, dy, saved, unchanged=True))
            y, saved = fwd(plain, p, x, unchanged=False)
            want = (y, bwd(plain, p, x, dy, saved, unchanged=False))
            same_results(f"{cid} step {i} ({t} tokens)", got, want)


# --- (b) a caller that lies: copies give the OLD weights' results, no copies the new ones ---------
@pytest.mark.parametrize("cid", ["f32", "f16", "fp8-current", "fp8-current-bf16-swiglu", "fp8-delayed",
                                 "fp8-block", "fp8-mxfp8"])
def test_lying_about_unchanged_weights_shows_the_reuse(cid):
    keeps_copies = CONFIGS[cid][4] is not None or CONFIGS[cid][2] == np.float16
    x1, dy1 = batch(cid, 37, 0)
    x2, dy2 = batch(cid, 23, 1)
    out = {}
    # truth: w1 unchanged, flagged; lie: w1 halved in place, flagged; new: w1 halved, unflagged.
    for case in ("truth", "lie", "new"):
        p = params(cid)  # each plan has its own arrays, modified in place as an optimizer would
        with make_plan(cid) as plan:
            y, saved = fwd(plan, p, x1, unchanged=False)
            bwd(plan, p, x1, dy1, saved, unchanged=True)  # backward of a forward with the same weights
            if case != "truth":
                p["w1"][...] = (p["w1"].astype(np.float32) * 0.5).astype(p["w1"].dtype)
            y, saved = fwd(plan, p, x2, unchanged=case != "new")
            g = bwd(plan, p, x2, dy2, saved, unchanged=case != "new")
            state = plan.export_state()
        out[case] = (y, g, state)
    lie, truth, new = out["lie"], out["truth"], out["new"]
    assert not np.array_equal(truth[0], new[0]), "halving w1 must change y, or the test proves nothing"
    if keeps_copies:
        same_results(f"{cid}: the lie gives the old weights' results", lie[:2], truth[:2])
        assert lie[2] == truth[2], "the FP8 state must be the one of the old weights' copies"
        assert not np.array_equal(lie[0], new[0])
    else:
        same_results(f"{cid}: without copies the lie reads the new weights", lie[:2], new[:2])


# --- (b') the flag with NEW weight arrays: the library reads this call's pointers or its copies -----
@pytest.mark.parametrize("replaced", [("w1",), ("w2",), ("w1", "w2")], ids=["w1", "w2", "w1+w2"])
@pytest.mark.parametrize("cid", ["f32", "fp8-current", "f16"])
def test_weights_unchanged_with_new_arrays(cid, replaced):
    # Regression: a flagged call on a float32 plan (no copies) read the previous call's w1 address.
    # Now a flagged call given new arrays (halved values; the old ones kept alive and unchanged, so
    # reading them would go unnoticed but for the values) computes with the new values on a plan
    # that keeps no copies, and gives the old weights' results (its kept copies) on one that does.
    keeps_copies = CONFIGS[cid][4] is not None or CONFIGS[cid][2] == np.float16
    x1, dy1 = batch(cid, 37, 0)
    x2, dy2 = batch(cid, 23, 1)
    p = params(cid)
    snapshot = {k: p[k].copy() for k in ("w1", "w2")}
    halved = dict(p, **{k: (p[k].astype(np.float32) * 0.5).astype(p[k].dtype) for k in replaced})
    for k in replaced:
        assert not np.may_share_memory(halved[k], p[k])

    def run(plan, step2, unchanged):
        """Micro-batch 1 with the old arrays (makes the copies), then micro-batch 2 with `step2`."""
        y, saved = fwd(plan, p, x1, unchanged=False)
        bwd(plan, p, x1, dy1, saved, unchanged=True)
        y, saved = fwd(plan, step2, x2, unchanged=unchanged)
        return y, bwd(plan, step2, x2, dy2, saved, unchanged=unchanged)

    with make_plan(cid) as plan:
        got = run(plan, halved, unchanged=True)
    with make_plan(cid) as plan:
        old = run(plan, p, unchanged=False)
    with make_plan(cid) as plan:
        new = run(plan, halved, unchanged=False)
    for k in ("w1", "w2"):  # the old arrays were alive and unchanged throughout
        same(f"{cid}: old {k} unchanged", p[k], snapshot[k])
    assert not np.array_equal(old[0], new[0]), "halving the weights must change y, or the test proves nothing"
    if keeps_copies:
        same_results(f"{cid}, new {'+'.join(replaced)} flagged: the kept copies (old values)", got, old)
    else:
        same_results(f"{cid}, new {'+'.join(replaced)} flagged: the new values", got, new)


def test_weights_unchanged_must_be_a_bool():
    cid = "f32"
    p = params(cid)
    x, _ = batch(cid, 5, 0)
    with make_plan(cid) as plan:
        for bad in ("yes", 2, None, 0.5):
            with pytest.raises(lnmlp.InvalidArgumentError, match="weights_unchanged"):
                fwd(plan, p, x, unchanged=bad)


# --- (c) accumulation over micro-batches into fp32 grads of a bf16 plan -----------------------------
MICRO_BATCHES = ((37, 10), (13, 11), (24, 12))  # (tokens, seed): different x, dy and token counts


@pytest.mark.parametrize("norm,acts", [("layernorm", ("gelu",)), ("rmsnorm", ("silu", "linear"))],
                         ids=["layernorm-gelu", "rmsnorm-swiglu"])
def test_accumulate_into_fp32_grads_of_bf16_plan(norm, acts):
    dtype_name, A = "bfloat16", len(acts)
    p = make_inputs(1, H, F, A, norm, BF16, True, 0)
    kw = dict(norm=norm, zcg=False, eps=1e-6, acts=acts, p={})
    r = {k: None if v is None else v.astype(np.float64) for k, v in p.items()}
    with lnmlp.Plan(T_MAX, H, F, norm_type=norm, activation_type=acts, use_bias1=True, use_bias2=True,
                    dtype=BF16, num_threads=1, accumulate_grads=True, grad_dtype="float32") as plan:
        assert plan.accumulate_grads and plan.grad_dtype == np.float32
        bufs = plan.zero_weight_grads()
        assert all(bufs[k].dtype == np.float32 and bufs[k].shape == plan.tensor_shape(k) for k in WEIGHT_GRADS)
        # Start from nonzero values (a running main_grad), of the gradients' magnitude.
        rng = np.random.default_rng(3)
        for k in WEIGHT_GRADS:
            bufs[k][...] = rng.uniform(-0.5, 0.5, bufs[k].shape)
        init = {k: bufs[k].astype(np.float64) for k in WEIGHT_GRADS}
        total = {k: np.zeros(bufs[k].shape) for k in WEIGHT_GRADS}
        for i, (t, seed) in enumerate(MICRO_BATCHES):
            x = make_inputs(t, H, F, A, norm, BF16, True, seed)["x"]
            dy = make_dy(t, H, BF16, seed)
            y, saved = plan.forward(x, *(p[k] for k in ARGS[1:]), weights_unchanged=i > 0)
            g = plan.backward(dy, x, p["gamma"], p["beta"], p["w1"], p["b1"], p["w2"], saved,
                              weights_unchanged=True, grads=bufs)
            for k in WEIGHT_GRADS:
                assert getattr(g, k) is bufs[k], f"backward must return the caller's {k}"
            gr = ref.backward(dy.astype(np.float64), x.astype(np.float64), r["gamma"], r["beta"], r["w1"],
                              r["b1"], r["w2"], r["b2"], **kw)
            label = f"{norm}/{'+'.join(acts)} micro-batch {i} ({t} tokens)"
            # dx, dgamma, dbeta are this micro-batch's own (overwritten, bf16), not accumulated.
            for k in ("dx", "dgamma", "dbeta"):
                if gr[k] is None:
                    assert getattr(g, k) is None
                    continue
                assert getattr(g, k).dtype == BF16
                ref.assert_close(f"{k} {label}", getattr(g, k), gr[k], dtype_name)
            for k in WEIGHT_GRADS:
                total[k] += gr[k]
                ref.assert_close(f"accumulated {k} {label}", bufs[k], init[k] + total[k], dtype_name)
        for k in WEIGHT_GRADS:  # and what was added, on its own scale
            ref.assert_close(f"sum of {k} {norm}", bufs[k].astype(np.float64) - init[k], total[k], dtype_name)


@pytest.mark.parametrize("dtype,grad_dtype", [(np.float32, None), (BF16, "float32"), (BF16, None),
                                              (np.float16, np.float32)],
                         ids=["f32", "bf16-fp32grads", "bf16", "f16-fp32grads"])
def test_accumulation_is_rnd_old_plus_gradient(dtype, grad_dtype):
    # Each element becomes rnd(old + gradient) with the gradient in fp32: bit for bit what adding a
    # non-accumulating plan's fp32 gradients in fp32 and rounding to the buffer's dtype gives.
    cfg = dict(norm_type="rmsnorm", activation_type="swiglu", use_bias1=True, use_bias2=True, dtype=dtype,
               num_threads=1)
    p = make_inputs(1, H, F, 2, "rmsnorm", dtype, True, 0)
    with lnmlp.Plan(T_MAX, H, F, accumulate_grads=True, grad_dtype=grad_dtype, **cfg) as acc, \
            lnmlp.Plan(T_MAX, H, F, grad_dtype="float32", **cfg) as plain:
        bufs = acc.zero_weight_grads()
        rng = np.random.default_rng(4)
        for k in WEIGHT_GRADS:
            bufs[k][...] = rng.standard_normal(bufs[k].shape).astype(bufs[k].dtype)
        want = {k: bufs[k].copy() for k in WEIGHT_GRADS}
        for t, seed in MICRO_BATCHES:
            x, dy = make_inputs(t, H, F, 2, "rmsnorm", dtype, True, seed)["x"], make_dy(t, H, dtype, seed)
            for plan, gk in ((acc, dict(grads=bufs)), (plain, {})):
                y, saved = plan.forward(x, *(p[k] for k in ARGS[1:]))
                g = plan.backward(dy, x, p["gamma"], p["beta"], p["w1"], p["b1"], p["w2"], saved, **gk)
            for k in WEIGHT_GRADS:
                want[k] = (want[k].astype(np.float32) + getattr(g, k)).astype(acc.grad_dtype)
                same(f"{k} after {t} tokens", bufs[k], want[k])


def test_zero_tokens_leave_accumulated_grads_and_zero_out_arrays():
    cid = "f32"
    p = params(cid)
    x, dy = batch(cid, 0, 0)
    with make_plan(cid, accumulate_grads=True) as acc, make_plan(cid) as plain:
        bufs = acc.zero_weight_grads()
        for k in WEIGHT_GRADS:
            bufs[k][...] = 1.5
        y, saved = acc.forward(x, *(p[k] for k in ARGS[1:]))
        g = acc.backward(dy, x, p["gamma"], p["beta"], p["w1"], p["b1"], p["w2"], saved, grads=bufs)
        for k in WEIGHT_GRADS:
            assert np.all(getattr(g, k) == 1.5), f"{k}: 0 tokens must leave accumulating gradients as they are"
        assert np.all(g.dgamma == 0) and np.all(g.dbeta == 0)
        # Not accumulating: caller arrays are out-arrays, overwritten (zeros for 0 tokens).
        y, saved = plain.forward(x, *(p[k] for k in ARGS[1:]))
        g = plain.backward(dy, x, p["gamma"], p["beta"], p["w1"], p["b1"], p["w2"], saved, grads=bufs)
        for k in WEIGHT_GRADS:
            assert getattr(g, k) is bufs[k] and np.all(bufs[k] == 0), k


@pytest.mark.parametrize("cid", ["f32", "fp8-current-bf16-swiglu"])
def test_out_arrays_without_accumulation(cid):
    # grads= on a plan that does not accumulate: backward overwrites the caller's arrays with what it
    # would have returned (a Grads from an earlier call works, and so does a dict).
    p = params(cid)
    with make_plan(cid) as plan:
        out = None
        for t, seed in STEPS:
            x, dy = batch(cid, t, seed)
            y, saved = fwd(plan, p, x, unchanged=False)
            fresh = bwd(plan, p, x, dy, saved, unchanged=False)
            if out is None:
                out = bwd(plan, p, x, dy, saved, unchanged=False)
                for k in WEIGHT_GRADS:
                    getattr(out, k)[...] = 7  # garbage to be overwritten
            g = bwd(plan, p, x, dy, saved, unchanged=False, grads=out)
            for k in WEIGHT_GRADS:
                assert getattr(g, k) is getattr(out, k)
            for k in GRADS:
                same(f"{k} {cid} {t} tokens", getattr(g, k), getattr(fresh, k))
        d = {k: np.full(plan.tensor_shape(k), 3, plan.grad_dtype) for k in WEIGHT_GRADS}
        g = bwd(plan, p, x, dy, saved, unchanged=False, grads=d)
        for k in WEIGHT_GRADS:
            assert getattr(g, k) is d[k]
            same(k, d[k], getattr(fresh, k))


# --- (d) errors ------------------------------------------------------------------------------------
@pytest.mark.parametrize("grad_dtype", ["int8", np.int32, np.float64, "float64", "bogus", object()],
                         ids=["int8", "int32", "float64", "float64-str", "bogus", "object"])
def test_bad_grad_dtype_raises(grad_dtype):
    with pytest.raises(lnmlp.InvalidArgumentError, match="grad_dtype"):
        make_plan("f32", grad_dtype=grad_dtype)


@pytest.mark.parametrize("dtype,grad_dtype", [(BF16, np.float16), (np.float16, "bfloat16"),
                                              (np.float32, np.float16), (np.float32, BF16)],
                         ids=["bf16-f16", "f16-bf16", "f32-f16", "f32-bf16"])
def test_grad_dtype_other_than_plan_or_fp32_is_refused_by_the_library(dtype, grad_dtype):
    # A float type that is neither the plan's nor float32: lnmlp_plan_create refuses it.
    with pytest.raises(lnmlp.InvalidArgumentError) as e:
        lnmlp.Plan(8, 16, 32, dtype=dtype, grad_dtype=grad_dtype, accumulate_grads=True)
    assert e.value.status_name == "LNMLP_ERROR_INVALID_ARGUMENT"


@pytest.mark.parametrize("dtype,grad_dtype", [(np.float32, "float32"), (np.float32, np.float32),
                                              (BF16, BF16), (BF16, "fp32"), (np.float16, "f16")])
def test_grad_dtype_accepts_the_plan_dtype_and_fp32(dtype, grad_dtype):
    with lnmlp.Plan(8, 16, 32, dtype=dtype, grad_dtype=grad_dtype) as plan:
        want = np.dtype(lnmlp._plan._normalize_dtype(grad_dtype))
        assert plan.grad_dtype == want
        assert plan.zero_weight_grads()["dw1"].dtype == want
        assert "grad_dtype=" in repr(plan)


def test_bad_accumulate_grads_raises():
    for bad in ("yes", 2, None):
        with pytest.raises(lnmlp.InvalidArgumentError, match="accumulate_grads"):
            make_plan("f32", accumulate_grads=bad)


def test_accumulate_without_grads_raises_clearly():
    cid = "f32"
    p = params(cid)
    x, dy = batch(cid, 5, 0)
    with make_plan(cid, accumulate_grads=True) as plan:
        y, saved = fwd(plan, p, x, unchanged=False)
        with pytest.raises(lnmlp.NullPointerError,
                           match=r"grads is None.*accumulate_grads=True.*zero_weight_grads"):
            bwd(plan, p, x, dy, saved, unchanged=False)
        bufs = plan.zero_weight_grads()
        for missing in WEIGHT_GRADS:
            with pytest.raises(lnmlp.NullPointerError, match=rf"grads\['{missing}'\] is missing"):
                bwd(plan, p, x, dy, saved, unchanged=False, grads={k: v for k, v in bufs.items() if k != missing})
        for k in WEIGHT_GRADS:
            assert np.all(bufs[k] == 0), "a refused call must write nothing"
        bwd(plan, p, x, dy, saved, unchanged=False, grads=bufs)  # and with them it runs


def test_bad_grads_arrays_raise():
    cid = "f32"
    p = params(cid)
    x, dy = batch(cid, 5, 0)
    with make_plan(cid, accumulate_grads=True) as plan, \
            lnmlp.Plan(8, H, F, dtype=BF16, grad_dtype="float32", accumulate_grads=True) as nobias:
        y, saved = fwd(plan, p, x, unchanged=False)
        good = plan.zero_weight_grads()

        def call(**changes):
            return bwd(plan, p, x, dy, saved, unchanged=False, grads=dict(good, **changes))

        err = lnmlp.InvalidArgumentError
        with pytest.raises(err, match=r"grads\['dw1'\] has dtype float64.*float32"):
            call(dw1=np.zeros(plan.tensor_shape("dw1")))
        with pytest.raises(err, match=r"grads\['dw2'\] has shape \(48, 80\), but the plan needs \(80, 48\)"):
            call(dw2=np.zeros((H, F), np.float32))
        with pytest.raises(err, match="not C-contiguous"):
            call(dw2=np.zeros((H, F), np.float32).T)
        ro = np.zeros(plan.tensor_shape("db2"), np.float32)
        ro.flags.writeable = False
        with pytest.raises(err, match="read-only"):
            call(db2=ro)
        with pytest.raises(err, match="must be a numpy.ndarray"):
            call(db1=[[0.0] * F])
        with pytest.raises(err, match="unknown keys"):
            call(dW1=good["dw1"])
        with pytest.raises(err, match=r"grads\['dw1'\] overlaps w1"):
            call(dw1=p["w1"])
        with pytest.raises(err, match=r"grads\['dw1'\] overlaps grads\['dw2'\]"):
            call(dw2=good["dw1"].reshape(-1)[:F * H].reshape(F, H))
        for k in WEIGHT_GRADS:
            assert np.all(good[k] == 0), "a refused call must write nothing"

        # A plan without biases takes no db1 / db2: None or left out is fine, an array is refused.
        xb, dyb = make_inputs(8, H, F, 1, "layernorm", BF16, False, 1)["x"], make_dy(8, H, BF16, 1)
        pb = make_inputs(1, H, F, 1, "layernorm", BF16, False, 1)
        bufs = nobias.zero_weight_grads()
        assert bufs["db1"] is None and bufs["db2"] is None
        y, saved = nobias.forward(xb, pb["gamma"], pb["beta"], pb["w1"], None, pb["w2"], None)
        with pytest.raises(err, match=r"grads\['db1'\] was given, but the plan has use_bias1=False"):
            nobias.backward(dyb, xb, pb["gamma"], pb["beta"], pb["w1"], None, pb["w2"], saved,
                            grads=dict(bufs, db1=np.zeros((1, F), np.float32)))
        g = nobias.backward(dyb, xb, pb["gamma"], pb["beta"], pb["w1"], None, pb["w2"], saved,
                            grads={"dw1": bufs["dw1"], "dw2": bufs["dw2"]})
        assert g.db1 is None and g.db2 is None and g.dw1 is bufs["dw1"]
        # An object with attributes (a Grads) works as well; a missing attribute is named.
        from lnmlp import Grads
        with pytest.raises(lnmlp.NullPointerError, match=r"grads\.dw2 is missing"):
            nobias.backward(dyb, xb, pb["gamma"], pb["beta"], pb["w1"], None, pb["w2"], saved,
                            grads=Grads(None, None, None, bufs["dw1"], None, None, None))
