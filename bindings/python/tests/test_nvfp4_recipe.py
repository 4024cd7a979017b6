"""The NVFP4 recipe (lnmlp.NVFP4BlockScaling, LNMLP_RECIPE_NVFP4) through Plan: forward and every
gradient against _fp8_sim.Sim with _nvfp4_sim's independent simulation of TransformerEngine's
NVFP4BlockScaling (float64 GEMMs of the dequantized operands), for both norms, gated and non-gated
activations, fp32 and bf16, the random Hadamard transform, stochastic rounding and the 2-D weight
tiles each on and off; the plan's random state; the saved bytes.

Tolerances: test_fp8_recipes.py's (SIM_MAX_ERR, SIM_ELEM_ERR, SIM_FLIP_LINES), for the same
reason -- the library sums in fp32 and transforms in fp32, the simulation in float64, which can
move a value lying within fp32 rounding of an E2M1 boundary to the neighbouring code, and such
isolated flips touch a few rows or columns.
"""

import numpy as np
import pytest

import lnmlp
import _fp8_sim as sim
import _nvfp4_sim
from test_fp8_recipes import BF16, check_sim, make_dy, plan_for, reference, sim_step, step, inputs_for

# (T, H, F, norm, activations, dtype, biases): T = 70 leaves a partial block of 6 tokens (the
# Hadamard transform leaves it as it is), H and F partial 1x16 blocks and 16x16 tiles.
CONFIGS = {
    "ln-gelu-partial": (70, 96, 200, "layernorm", ("gelu",), np.float32, True),
    "rms-swiglu": (64, 128, 136, "rmsnorm", ("silu", "linear"), np.float32, False),
    "ln-geglu-bf16": (96, 64, 168, "layernorm", ("gelu", "linear"), BF16, True),
}
# (disable_rht, disable_stochastic_rounding, disable_2d_quantization)
OPTIONS = {"te-default": (False, False, False), "all-off": (True, True, True), "rht-only": (False, True, True),
           "sr-2d": (True, False, False)}
SEED, OFFSET = 0x0123456789ABCDEF, 7


def recipe_and_spec(options):
    no_rht, no_sr, no_2d = options
    recipe = lnmlp.NVFP4BlockScaling(disable_rht=no_rht, disable_stochastic_rounding=no_sr,
                                     disable_2d_quantization=no_2d)
    return recipe, ("nvfp4", not no_rht, not no_sr, not no_2d)


def problem(cfg_id, opt, seed):
    """(cfg, recipe, simulation spec, inputs, dy) of a configuration and an option set."""
    cfg = CONFIGS[cfg_id]
    recipe, spec = recipe_and_spec(OPTIONS[opt])
    return cfg, recipe, spec, inputs_for(cfg, seed), make_dy(cfg[0], cfg[1], cfg[5], seed)


def check_against_the_simulation(cfg, spec, inp, dy, y, g, seed, offset, prefix=""):
    """y and the gradients g (a dict) within check_sim's bounds of the simulation drawing from
    (seed, offset); returns the simulation's (y, gradients)."""
    dtype = cfg[5]
    s = sim.Sim(spec, norm=cfg[3], acts=cfg[4], dtype=dtype)
    s.q.nvfp4.update(seed=seed, offset=offset)
    want_y, want_g = sim_step(s, inp, dy)
    check_sim(prefix + "y", y, want_y, dtype)
    for k, v in want_g.items():
        if v is not None:
            check_sim(prefix + k, np.asarray(g[k]).reshape(v.shape), v, dtype)
    return want_y, want_g


@pytest.mark.parametrize("opt", OPTIONS)
@pytest.mark.parametrize("cfg_id", CONFIGS)
def test_plan_matches_the_simulation(cfg_id, opt):
    cfg, recipe, spec, inp, dy = problem(cfg_id, opt, 3)
    dtype = cfg[5]
    plan = plan_for(cfg, recipe)
    plan.set_rng_state(SEED, OFFSET)
    y, g = step(plan, inp, dy)
    want_y, want_g = check_against_the_simulation(cfg, spec, inp, dy, y, g, SEED, OFFSET)
    for k, got, want in [("y", y, want_y)] + [(k, g[k], v) for k, v in want_g.items() if v is not None]:
        got, want = np.asarray(got, np.float64), np.asarray(want)
        r = _nvfp4_sim.REPORT.setdefault(k, [0.0, 0, 0])
        r[0] = max(r[0], float(np.abs(got - want).max() / np.abs(want).max()))
        r[1] += int((got == want.astype(dtype).astype(np.float64)).sum())
        r[2] += got.size
    # And it is FP4: far from the unquantized float64 reference (FP4's steps are ~1/4 of a value),
    # yet still its approximation.
    ref_y, _ = reference(cfg, inp, dy)
    rel = np.abs(np.asarray(y, np.float64) - ref_y).max() / np.abs(ref_y).max()
    assert 0.02 < rel < 0.5, f"y vs the unquantized reference: {rel:.3f}"


def test_the_simulation_sees_each_option():
    """The check above can fail: each option, mis-set in the simulation, is far from the plan."""
    cfg = CONFIGS["rms-swiglu"]
    inp = inputs_for(cfg, 4)
    dy = make_dy(cfg[0], cfg[1], cfg[5], 4)
    recipe, spec = recipe_and_spec(OPTIONS["te-default"])
    plan = plan_for(cfg, recipe)
    plan.set_rng_state(SEED, OFFSET)
    _, g = step(plan, inp, dy)
    for wrong in (("nvfp4", False, True, True), ("nvfp4", True, False, True), ("nvfp4", True, True, False)):
        s = sim.Sim(wrong, norm=cfg[3], acts=cfg[4], dtype=cfg[5])
        s.q.nvfp4.update(seed=SEED, offset=OFFSET)
        _, want = sim_step(s, inp, dy)
        with pytest.raises(AssertionError):
            for k in ("dw1", "dw2", "dx"):
                check_sim(k, g[k], want[k], cfg[5])
    s = sim.Sim(spec, norm=cfg[3], acts=cfg[4], dtype=cfg[5])
    s.q.nvfp4.update(seed=SEED, offset=OFFSET + 1)  # another stream
    _, want = sim_step(s, inp, dy)
    with pytest.raises(AssertionError):
        check_sim("dw2", g["dw2"], want["dw2"], cfg[5])


def test_random_state_moves_on_and_reproduces():
    cfg = CONFIGS["rms-swiglu"]
    inp = inputs_for(cfg, 5)
    dy = make_dy(cfg[0], cfg[1], cfg[5], 5)
    plan = plan_for(cfg, lnmlp.NVFP4BlockScaling(disable_stochastic_rounding=False))
    assert plan.rng_state() == (0, 0)
    plan.set_rng_state(SEED, 41)
    _, first = step(plan, inp, dy)
    assert plan.rng_state() == (SEED, 42), "each backward that draws moves the offset on by one"
    _, second = step(plan, inp, dy)
    assert not np.array_equal(first["dw2"], second["dw2"]), "a new offset draws other bits"
    plan.set_rng_state(SEED, 41)
    _, again = step(plan, inp, dy)
    for k, v in first.items():
        if v is not None:
            np.testing.assert_array_equal(again[k], v, err_msg=k)
    # Without stochastic rounding nothing is drawn: the state stays, the bits are those of any state.
    rtne = plan_for(cfg, lnmlp.NVFP4BlockScaling(disable_stochastic_rounding=True))
    rtne.set_rng_state(5, 6)
    step(rtne, inp, dy)
    assert rtne.rng_state() == (5, 6)
    with pytest.raises(lnmlp.InvalidArgumentError):
        plan.set_rng_state(-1)
    with pytest.raises(lnmlp.InvalidArgumentError):
        plan.set_rng_state(0, 2 ** 64)
    # The place (a split done by the caller; tests/test_current_stages.cpp checks the bits of halves):
    # the tokens further on in a whole tensor draw other bits, and placed back the first ones.
    plan.set_rng_place(cfg[0], 4 * cfg[0])
    plan.set_rng_state(SEED, 41)
    _, elsewhere = step(plan, inp, dy)
    assert not np.array_equal(first["dw2"], elsewhere["dw2"])
    plan.set_rng_place(0)
    plan.set_rng_state(SEED, 41)
    _, back = step(plan, inp, dy)
    np.testing.assert_array_equal(back["dw2"], first["dw2"])
    for bad in ((-1,), (0, 0, 1, 1), (0, 0, 0, 0), (0, 0, 0, 2 ** 31), (1.5,)):
        with pytest.raises(lnmlp.InvalidArgumentError):
            plan.set_rng_place(*bad)


def test_recipe_fields_defaults_and_environment(monkeypatch):
    r = lnmlp.NVFP4BlockScaling()
    assert (r.disable_rht, r.disable_stochastic_rounding, r.disable_2d_quantization) == (False, False, False)
    assert (r.fp4_format, r.fp8_format) == ("E2M1", "E4M3")
    monkeypatch.setenv("NVTE_NVFP4_DISABLE_RHT", "1")
    monkeypatch.setenv("NVTE_NVFP4_DISABLE_2D_QUANTIZATION", "1")
    r = lnmlp.NVFP4BlockScaling()
    assert (r.disable_rht, r.disable_stochastic_rounding, r.disable_2d_quantization) == (True, False, True)
    assert lnmlp.NVFP4BlockScaling(disable_rht=False).disable_rht is False
    for bad in (dict(fp4_format="E4M3"), dict(fp8_format="E5M2"), dict(disable_rht=1)):
        with pytest.raises(lnmlp.InvalidArgumentError):
            lnmlp.NVFP4BlockScaling(**bad)
    # TE's options lnmlp does not have: accepted at their defaults only, from arguments or environment.
    assert lnmlp.NVFP4BlockScaling(row_scaled_activation=False, nvfp4_4over6="none") == lnmlp.NVFP4BlockScaling()
    for bad, match in ((dict(row_scaled_activation=True), "row_scaled_activation"),
                       (dict(nvfp4_4over6="weights"), "4over6"), (dict(nvfp4_4over6="all"), "4over6")):
        with pytest.raises(lnmlp.NotSupportedError, match=match):
            lnmlp.NVFP4BlockScaling(**bad)
    for env, value in (("NVTE_NVFP4_4OVER6", "activations"), ("NVTE_NVFP4_ROW_SCALED_ACTIVATION", "1")):
        with monkeypatch.context() as m:
            m.setenv(env, value)
            with pytest.raises(lnmlp.NotSupportedError):
                lnmlp.NVFP4BlockScaling()


def test_saved_bytes_per_token():
    """Under SAVE_ALL NVFP4 saves ln_out's and act_out's codes at half a byte per element and one
    E4M3 scale per 16 tokens and column, beside the statistics and FFN1."""
    T, H, F = 64, 128, 256
    plan = lnmlp.Plan(T, H, F, activation_type=("gelu",), recipe=lnmlp.NVFP4BlockScaling(), dtype=BF16)
    mu_rs, ffn1 = 8, 2 * F
    assert plan.saved_bytes_per_token == mu_rs + ffn1 + (H + F) // 2 + (H + F) // 16



def test_functional_api_draws_from_the_quantizer_sets_random_state():
    """layernorm_mlp_vjp with make_quantizer_set(NVFP4BlockScaling()): each set draws from its own
    (seed, offset), as a Plan with that random state does, and moves it on."""
    cfg = CONFIGS["ln-gelu-partial"]
    inp = inputs_for(cfg, 6)
    dy = make_dy(cfg[0], cfg[1], cfg[5], 6)
    recipe = lnmlp.NVFP4BlockScaling()
    a, b = lnmlp.make_quantizer_set(recipe), lnmlp.make_quantizer_set(recipe)
    assert a.rng_state()[0] != b.rng_state()[0], "each set draws its own stream by default"
    qs = lnmlp.make_quantizer_set(recipe, seed=SEED)
    assert qs.rng_state() == (SEED, 0)

    def vjp(qs):
        _, f = lnmlp.layernorm_mlp_vjp(inp["x"], inp["gamma"], inp["beta"], [inp["w1"], inp["w2"]],
                                       [inp["b1"], inp["b2"]], cfg[3], activation_type=cfg[4], quantizer_set=qs)
        return f(dy)

    got = vjp(qs)
    assert qs.rng_state() == (SEED, 1)
    plan = plan_for(cfg, recipe)
    plan.set_rng_state(SEED, 0)
    _, want = step(plan, inp, dy)
    np.testing.assert_array_equal(got[3][0], want["dw1"])
    np.testing.assert_array_equal(got[0], want["dx"])
    second = vjp(qs)
    assert not np.array_equal(second[3][1], got[3][1]), "the next call draws other bits"
    qs.set_rng_state(SEED, 0)
    np.testing.assert_array_equal(vjp(qs)[3][1], got[3][1])
    with pytest.raises(lnmlp.InvalidArgumentError):
        lnmlp.make_quantizer_set(recipe, seed=-3)
