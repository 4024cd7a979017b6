"""The norm output a plan gives (Plan(norm_output=True), lnmlp_desc_set_norm_output) and the saved
buffer's sections (Plan.saved_section): against the float64 reference's norm, under every recipe
and remat policy, for a call with fewer tokens than the plan's, and with the plan's other results
unchanged."""

import numpy as np
import pytest

import _reference as ref
import lnmlp
from _block_cases import EPS, make

RECIPES = {"none": None, "delayed": lnmlp.DelayedScaling, "current": lnmlp.Float8CurrentScaling,
           "block": lnmlp.Float8BlockScaling, "mxfp8": lnmlp.MXFP8BlockScaling}
DTYPES = ["float32", "bfloat16", "float16"]
T_MAX, T_CALL, H, F = 40, 33, 32, 48


def _plan(dtype, recipe, remat, norm, norm_output=True):
    make_recipe = RECIPES[recipe]
    return lnmlp.Plan(T_MAX, H, F, norm_type=norm, activation_type=("gelu",), use_bias1=True, use_bias2=True,
                      dtype=ref.DTYPES[dtype], remat=remat, recipe=None if make_recipe is None else make_recipe(),
                      norm_output=norm_output, num_threads=1)


def _forward(plan, d):
    return plan.forward(d["x"], d["gamma"], d["beta"], d["k1"], d["b1"], d["k2"], d["b2"])


@pytest.mark.parametrize("remat", ["save_all", "save_ffn1", "save_stats", "forward_only"])
@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_norm_output_is_the_rounded_norm_and_changes_nothing_else(dtype, recipe, remat):
    norm = "rmsnorm" if remat in ("save_ffn1", "forward_only") else "layernorm"
    d = make(1, ref.DTYPES[dtype], lead=(T_CALL,), norm=norm, seed=17, H=H, F=F)
    with _plan(dtype, recipe, remat, norm) as plan, _plan(dtype, recipe, remat, norm, norm_output=False) as base:
        y, saved = _forward(plan, d)
        ln = plan.norm_output_from(saved, T_CALL)
        assert ln.shape == (T_CALL, H) and ln.dtype == ref.DTYPES[dtype]
        _, parts = ref.forward(d["x"], d["gamma"], d["beta"], d["k1"], d["b1"], d["k2"], d["b2"], norm, False, EPS,
                               ("gelu",), {})
        ref.assert_close(f"norm output {recipe} {remat}", np.asarray(ln, np.float64), parts["n"], dtype)
        # Asking for it changes nothing else: y, and (where the plan runs backward) every gradient.
        y_base, saved_base = _forward(base, d)
        np.testing.assert_array_equal(y.view(np.uint8), y_base.view(np.uint8))
        if remat != "forward_only":
            dy = make(1, ref.DTYPES[dtype], lead=(T_CALL,), seed=18, H=H, F=F)["x"]
            args = (d["x"], d["gamma"], d["beta"], d["k1"], d["b1"], d["k2"])
            got, want = plan.backward(dy, *args, saved), base.backward(dy, *args, saved_base)
            for name, a, b in zip(got._fields, got, want):
                if a is not None:
                    np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8), err_msg=name)
    # Bit for bit what an unquantized "save_all" plan saves anyway.
    with _plan(dtype, "none", "save_all", norm, norm_output=False) as plain:
        np.testing.assert_array_equal(ln.view(np.uint8), plain.norm_output_from(_forward(plain, d)[1], T_CALL)
                                      .view(np.uint8))


def test_the_sections_say_where_everything_is():
    with _plan("bfloat16", "block", "save_all", "layernorm") as plan:
        sections = {name: plan.saved_section(name, T_CALL) for name in lnmlp._lib.SAVED_SECTIONS}
        assert sections["norm_output"][1:] == ((T_CALL, H), ref.DTYPES["bfloat16"])
        assert sections["ffn1"][1:] == ((T_CALL, 1, F), ref.DTYPES["bfloat16"])
        assert sections["mean"][1:] == ((T_CALL,), np.dtype(np.float32))
        assert sections["act_out"] is None and sections["fp8_scales"] is None  # codes instead; blocked scales
        assert sections["norm_output_codes"][1:] == ((T_CALL * H,), np.dtype(np.uint8))
        present = sorted((o, o + int(np.prod(s)) * dt.itemsize) for o, s, dt in filter(None, sections.values()))
        assert all(a[1] <= b[0] for a, b in zip(present, present[1:]))
        assert present[-1][1] <= plan.tensor_shape("saved", T_CALL)[0]
        assert plan.saved_section(lnmlp._capi.SAVED_RSTD) == plan.saved_section("rstd", T_MAX)


def test_bad_arguments_are_refused_clearly():
    with _plan("float32", "none", "save_stats", "layernorm", norm_output=False) as plan:
        d = make(1, np.float32, lead=(T_CALL,), seed=3, H=H, F=F)
        _, saved = _forward(plan, d)
        with pytest.raises(lnmlp.InvalidArgumentError, match="does not give the norm output"):
            plan.norm_output_from(saved, T_CALL)
        with pytest.raises(lnmlp.InvalidArgumentError, match="section must be one of"):
            plan.saved_section("ln_out")
        with pytest.raises(lnmlp.InvalidArgumentError, match="tokens must be in"):
            plan.saved_section("rstd", T_MAX + 1)
    with _plan("float32", "none", "save_stats", "layernorm") as plan:
        _, saved = _forward(plan, d)
        with pytest.raises(lnmlp.InvalidArgumentError, match="pass the buffer of that call"):
            plan.norm_output_from(saved[:64], T_CALL)
        with pytest.raises(lnmlp.InvalidArgumentError, match="1-D uint8"):
            plan.norm_output_from(saved.view(np.float32), T_CALL)
    with pytest.raises(lnmlp.InvalidArgumentError, match="norm_output"):
        lnmlp.Plan(8, H, F, norm_output=2)
