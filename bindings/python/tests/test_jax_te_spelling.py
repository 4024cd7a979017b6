"""TransformerEngine's current spelling of layernorm_mlp, read beside the seed's: quantizer_sets (the
two halves of one set), activation_params, collective_op_sets, TE's recipe objects (stand-ins with
TE main's class names, module and fields: TE itself needs CUDA to import), and the clear errors of a
TE-style positional call."""

import dataclasses
import enum
import inspect
import os

import numpy as np
import pytest

if os.environ.get("LNMLP_REQUIRE_JAX") == "1":  # the README's test command: never skip silently
    import jax
else:
    jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import lnmlp  # noqa: E402
import lnmlp.jax as lj  # noqa: E402
from _block_cases import CLAMP, make  # noqa: E402
from lnmlp.jax._quantizer_set import GEMM_ROWS  # noqa: E402

TE_MODULE = "transformer_engine.common.recipe"


# ---- stand-ins for TransformerEngine's objects (TE main d0067d0: common/recipe/__init__.py,
# jax/cpp_extensions/gemm.py), with TE's names, module and fields -------------------------------

class Format(enum.Enum):
    E4M3 = (448, 448)
    E5M2 = (57344, 57344)
    HYBRID = (448, 57344)


@dataclasses.dataclass(frozen=True)
class QParams:
    power_2_scale: bool = False
    amax_epsilon: float = 0.0
    random_hadamard_transform: bool = False
    stochastic_rounding: bool = False
    fp4_2d_quantization: bool = False


@dataclasses.dataclass
class DelayedScaling:
    margin: int = 0
    fp8_format: Format = Format.HYBRID
    amax_history_len: int = 1024
    amax_compute_algo: object = "max"
    scaling_factor_compute_algo: object = None
    reduce_amax: bool = True
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: object = None


@dataclasses.dataclass
class Float8CurrentScaling:
    fp8_format: Format = Format.HYBRID
    fp8_quant_fwd_inp: QParams = QParams()
    fp8_quant_fwd_weight: QParams = QParams()
    fp8_quant_bwd_grad: QParams = QParams()
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: object = None


@dataclasses.dataclass
class Float8BlockScaling(Float8CurrentScaling):  # TE's fields: the per-role QParams, and the block dimensions
    fp8_format: Format = Format.E4M3
    fp8_quant_fwd_inp: QParams = QParams(power_2_scale=True)
    fp8_quant_fwd_weight: QParams = QParams(power_2_scale=True)
    fp8_quant_bwd_grad: QParams = QParams(power_2_scale=True)
    x_block_scaling_dim: int = 1
    w_block_scaling_dim: int = 2
    grad_block_scaling_dim: int = 1


@dataclasses.dataclass
class MXFP8BlockScaling:
    margin: int = 0
    fp8_format: Format = Format.E4M3
    backward_override: object = None
    enable_2d_quantization: bool = False


@dataclasses.dataclass
class NVFP4BlockScaling:
    fp8_format: Format = Format.E4M3


@dataclasses.dataclass
class NVFP4BlockScalingWithRoles:  # a newer TE's object: its options, and the roles its flags derive
    fp8_format: Format = Format.E4M3
    disable_rht: bool = False
    disable_stochastic_rounding: bool = False
    disable_2d_quantization: bool = False
    row_scaled_activation: bool = False
    nvfp4_4over6: str = "none"

    def __post_init__(self):
        rht, sr, two_d = not self.disable_rht, not self.disable_stochastic_rounding, not self.disable_2d_quantization
        self.fp4_quant_fwd_inp = QParams(random_hadamard_transform=rht)
        self.fp4_quant_fwd_weight = QParams(fp4_2d_quantization=two_d)
        self.fp4_quant_bwd_grad = QParams(random_hadamard_transform=rht, stochastic_rounding=sr)


NVFP4BlockScalingWithRoles.__name__ = "NVFP4BlockScaling"


def _with_role(te, role, qparams):
    """te with one role's QParams changed after construction (which TE's dataclass allows)."""
    setattr(te, role, qparams)
    return te


class CollectiveOp(enum.Enum):
    NONE = 0
    ALL_GATHER = 1
    REDUCE_SCATTER = 2


@dataclasses.dataclass(frozen=True)
class CollectiveOpSet:
    forward: CollectiveOp
    backward: CollectiveOp


for _cls in (Format, QParams, DelayedScaling, Float8CurrentScaling, Float8BlockScaling, MXFP8BlockScaling,
             NVFP4BlockScaling, NVFP4BlockScalingWithRoles):
    _cls.__module__ = TE_MODULE
CollectiveOp.__module__ = CollectiveOpSet.__module__ = "transformer_engine.jax.cpp_extensions.gemm"
NOOP = CollectiveOpSet(CollectiveOp.NONE, CollectiveOp.NONE)


# ---- recipes --------------------------------------------------------------------------------------

@pytest.mark.parametrize("te, want", [
    (DelayedScaling(margin=1, fp8_format=Format.E4M3, amax_history_len=16, amax_compute_algo="most_recent",
                    fp8_dpa=True), lj.DelayedScaling(1, "E4M3", 16, "most_recent")),
    (Float8CurrentScaling(), lj.Float8CurrentScaling()),
    (Float8CurrentScaling(fp8_quant_fwd_inp=QParams(True, 0.5), fp8_quant_fwd_weight=QParams(True, 0.5),
                          fp8_quant_bwd_grad=QParams(True, 0.5)), lj.Float8CurrentScaling("HYBRID", True, 0.5)),
    (Float8BlockScaling(), lj.Float8BlockScaling()),
    (MXFP8BlockScaling(fp8_format=Format.HYBRID), lj.MXFP8BlockScaling("HYBRID")),
], ids=["delayed", "current", "current-p2-eps", "block", "mxfp8"])
def test_transformer_engines_recipes_are_read_as_lnmlps(te, want):
    assert lnmlp.recipe.as_recipe(te) == want
    assert lj.make_quantizer_set(te).recipe == want
    with lnmlp.Plan(16, 32, 32, recipe=te) as p:
        assert p.recipe == want
    d = make(1, np.float32, lead=(16,), seed=2, H=32, F=32)
    args = (jnp.asarray(d["x"], jnp.bfloat16), d["gamma"], d["beta"], [d["k1"], d["k2"]], [d["b1"], d["b2"]],
            "layernorm")
    got = lj.layernorm_mlp(*args, quantizer_set=lj.make_quantizer_set(te))
    np.testing.assert_array_equal(np.asarray(got, np.float32),
                                  np.asarray(lj.layernorm_mlp(*args, quantizer_set=lj.make_quantizer_set(want)),
                                             np.float32))


@pytest.mark.parametrize("te, match", [
    (DelayedScaling(amax_compute_algo=max), "amax_compute_algo"),
    (DelayedScaling(scaling_factor_compute_algo=lambda *a: 1.0), "scaling_factor_compute_algo"),
    (DelayedScaling(reduce_amax=False), "reduce_amax"),
    (DelayedScaling(backward_override="high_precision"), "backward_override"),
    (Float8CurrentScaling(fp8_quant_bwd_grad=QParams(True)), "fp8_quant_bwd_grad"),
    (Float8CurrentScaling(fp8_quant_fwd_inp=QParams(stochastic_rounding=True)), "stochastic_rounding"),
    (Float8BlockScaling(x_block_scaling_dim=2, w_block_scaling_dim=1), "x_block_scaling_dim"),
    (MXFP8BlockScaling(enable_2d_quantization=True), "enable_2d_quantization"),
    (NVFP4BlockScalingWithRoles(row_scaled_activation=True), "row_scaled_activation"),
    (NVFP4BlockScalingWithRoles(nvfp4_4over6="weights"), "nvfp4_4over6"),
    (_with_role(NVFP4BlockScalingWithRoles(), "fp4_quant_fwd_inp", QParams()), "fp4_quant_fwd_inp"),
])
def test_a_transformer_engine_recipe_lnmlp_cannot_honour_is_refused_naming_the_field(te, match):
    with pytest.raises(lnmlp.NotSupportedError, match=match):
        lj.make_quantizer_set(te)
    with pytest.raises(lnmlp.NotSupportedError, match=match):
        lnmlp.Plan(16, 32, 32, recipe=te)


def test_nvfp4_is_read_as_lnmlps():
    """TE's NVFP4BlockScaling reads as lnmlp's (the fields TE's object lacks at their TE defaults),
    which lnmlp.Plan and lnmlp.jax run (a set with the random state, test_jax_nvfp4.py)."""
    want = lnmlp.NVFP4BlockScaling(disable_rht=False, disable_stochastic_rounding=False,
                                   disable_2d_quantization=False)
    assert lnmlp.recipe.as_recipe(NVFP4BlockScaling()) == want
    with lnmlp.Plan(16, 32, 32, recipe=NVFP4BlockScaling()) as p:
        assert p.recipe == want
    for recipe in (NVFP4BlockScaling(), want):
        qs = lj.make_quantizer_set(recipe, seed=5)
        assert qs.recipe == want and qs.rng_state() == (5, 0)
    # A newer object, its options at their defaults and its roles as its flags derive them.
    te = NVFP4BlockScalingWithRoles(disable_rht=True, disable_2d_quantization=True)
    assert lnmlp.recipe.as_recipe(te) == lnmlp.NVFP4BlockScaling(disable_rht=True, disable_stochastic_rounding=False,
                                                                 disable_2d_quantization=True)


# ---- quantizer_sets, activation_params, collective_op_sets -----------------------------------------

def _problem(acts=("gelu",), seed=4):
    d = make(len(acts), np.float32, lead=(32,), seed=seed, H=32, F=48)
    x = jnp.asarray(d["x"], jnp.bfloat16)
    params = (d["gamma"], d["beta"], d["k1"], d["b1"], d["k2"], d["b2"])
    return x, [jnp.asarray(p, jnp.bfloat16) for p in params]


def _grads(x, params, **kw):
    """y, and the gradients of sum(y * cos) with respect to x, the parameters and the sets given."""
    sets_name = "quantizer_sets" if "quantizer_sets" in kw else "quantizer_set"
    sets = kw.pop(sets_name)

    def loss(x, params, sets):
        g, b, k1, b1, k2, b2 = params
        y = lj.layernorm_mlp(x, g, b, [k1, k2], [b1, b2], "layernorm", activation_type=("gelu",),
                             **{sets_name: sets}, **kw)
        return jnp.sum(y.astype(jnp.float32) * jnp.cos(jnp.arange(y.size).reshape(y.shape))), y

    return jax.jit(jax.grad(loss, argnums=(0, 1, 2), has_aux=True))(x, params, sets)


@pytest.mark.parametrize("recipe", [lj.DelayedScaling(amax_history_len=4), lj.Float8BlockScaling()],
                         ids=["delayed", "block"])
def test_quantizer_sets_are_the_two_halves_of_one_set(recipe):
    x, params = _problem()
    whole = lj.make_quantizer_set(recipe)
    (dx, dparams, dset), y = _grads(x, params, quantizer_set=whole)
    (dx2, dparams2, dhalves), y2 = _grads(x, params, quantizer_sets=lj.make_quantizer_sets(recipe))
    for a, b in zip((y, dx, *dparams), (y2, dx2, *dparams2)):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
    if recipe.stateful:  # each half's cotangent is its rows of the whole set's: the state after the step
        for half, rows in zip(dhalves, GEMM_ROWS):
            np.testing.assert_array_equal(np.asarray(half.state), np.asarray(dset.state)[list(rows)])
        assert not np.array_equal(np.asarray(dset.state), np.asarray(whole.state))
    # A set's halves from split(), and (noop, noop), mean what they say.
    (_, _, _), y3 = _grads(x, params, quantizer_sets=whole.split())
    np.testing.assert_array_equal(np.asarray(y3, np.float32), np.asarray(y, np.float32))
    (_, _, _), y4 = _grads(x, params, quantizer_sets=(None, None))
    (_, _, _), y5 = _grads(x, params, quantizer_set=None)
    np.testing.assert_array_equal(np.asarray(y4, np.float32), np.asarray(y5, np.float32))


def test_activation_params_and_collective_op_sets():
    acts = ("clamped_silu", "clamped_linear")
    x, (g, b, k1, b1, k2, b2) = _problem(acts)
    te = dict(limit=CLAMP["limit"], alpha=CLAMP["alpha"], glu_linear_offset=CLAMP["offset"])
    args = (x, g, b, [k1, k2], [b1, b2], "layernorm")
    want = lj.layernorm_mlp(*args, activation_type=acts, act_params=CLAMP)
    got = lj.layernorm_mlp(*args, activation_type=acts, activation_params=te, collective_op_sets=(NOOP, NOOP))
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
    assert not np.array_equal(np.asarray(want, np.float32),
                              np.asarray(lj.layernorm_mlp(*args, activation_type=acts), np.float32))
    # Other activations: TransformerEngine ignores activation_params, and so does lnmlp.
    x1, (g1, b_1, k11, b11, k21, b21) = _problem()
    plain = (x1, g1, b_1, [k11, k21], [b11, b21], "layernorm")
    np.testing.assert_array_equal(np.asarray(lj.layernorm_mlp(*plain, activation_params=te), np.float32),
                                  np.asarray(lj.layernorm_mlp(*plain), np.float32))
    gather = CollectiveOpSet(CollectiveOp.ALL_GATHER, CollectiveOp.REDUCE_SCATTER)
    with pytest.raises(lnmlp.NotSupportedError, match="collective GEMM"):
        lj.layernorm_mlp(*plain, collective_op_sets=(gather, NOOP))
    with pytest.raises(lnmlp.InvalidArgumentError, match="not both"):
        lj.layernorm_mlp(*args, activation_type=acts, act_params=CLAMP, activation_params=te)


def test_quantizer_sets_that_cannot_be_one_set_are_refused():
    x, (g, b, k1, b1, k2, b2) = _problem()
    args = (x, g, b, [k1, k2], [b1, b2], "layernorm")
    ffn1, ffn2 = lj.make_quantizer_sets(lj.DelayedScaling(amax_history_len=4))
    other = lj.make_quantizer_sets(lj.Float8CurrentScaling())[1]
    whole = lj.make_quantizer_set(lj.Float8CurrentScaling())
    te_set = type("QuantizerSet", (), {"__module__": "transformer_engine.jax.quantize.quantizer"})()
    for sets, error, match in (((ffn1, None), lnmlp.InvalidArgumentError, "both GEMMs or neither"),
                               ((ffn2, ffn1), lnmlp.InvalidArgumentError, "in that order"),
                               ((ffn1, other), lnmlp.NotSupportedError, "one recipe"),
                               ((te_set, te_set), lnmlp.NotSupportedError, "make_quantizer_sets"),
                               ((ffn1,), lnmlp.InvalidArgumentError, "a pair"),
                               ((whole, whole), lnmlp.InvalidArgumentError, "as quantizer_set=")):
        with pytest.raises(error, match=match):
            lj.layernorm_mlp(*args, quantizer_sets=sets)
    with pytest.raises(lnmlp.InvalidArgumentError, match="not both"):
        lj.layernorm_mlp(*args, quantizer_set=lj.make_quantizer_set(lj.Float8CurrentScaling()),
                         quantizer_sets=(ffn1, ffn2))


# ---- positionally the seed's order stands ------------------------------------------------------------

SEED_PARAMETERS = [("x", None), ("gamma", None), ("beta", None), ("kernels", None), ("biases", None),
                   ("norm_type", None), ("zero_centered_gamma", False), ("epsilon", 1e-6),
                   ("transpose_batch_sequence", False), ("norm_input_axes", None), ("dot_1_input_axes", None),
                   ("dot_2_input_axes", None), ("kernel_1_axes", None), ("kernel_2_axes", None),
                   ("ffn1_ckpt_name", "ffn1"), ("ffn2_ckpt_name", "ffn2"), ("activation_type", ("relu",)),
                   ("quantizer_set", None), ("act_params", None)]


def test_the_seeds_signature_stands_and_te_style_positional_calls_are_refused_clearly():
    params = list(inspect.signature(lj.layernorm_mlp).parameters.values())
    assert [(p.name, None if p.default is inspect.Parameter.empty else p.default) for p in params[:19]] == \
        SEED_PARAMETERS
    assert all(p.kind == p.KEYWORD_ONLY for p in params[20:])
    x, (g, b, k1, b1, k2, b2) = _problem()
    head = (x, g, b, [k1, k2], [b1, b2], "layernorm", False, 1e-6, False, None, None, None, None, None, "ffn1",
            "ffn2", ("gelu",))
    sets = lj.make_quantizer_sets(lj.Float8CurrentScaling())
    # TE main's order: activation_params, collective_op_sets, quantizer_sets.
    with pytest.raises(lnmlp.InvalidArgumentError, match="activation_params by keyword"):
        lj.layernorm_mlp(*head, {"limit": 7.0})
    with pytest.raises(lnmlp.InvalidArgumentError, match="collective_op_sets .*by keyword"):
        lj.layernorm_mlp(*head, None, (NOOP, NOOP))
    with pytest.raises(lnmlp.InvalidArgumentError, match="at most 19 positional.*quantizer_sets go by keyword"):
        lj.layernorm_mlp(*head, None, None, sets)
