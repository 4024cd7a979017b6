"""TransformerEngine's own recipe objects (``transformer_engine.common.recipe``) as lnmlp recipes,
recognised by their type's name and module and read field by field, without importing
TransformerEngine (which needs its CUDA libraries to import).

Every field keeps TransformerEngine's meaning, or the recipe is refused with an error naming the
field: lnmlp has one scaling option per recipe where TE has one per tensor role (the three roles
must agree), no custom scaling callables, no high-precision backward override, and the block
layout of TE's defaults. Fields that configure attention (``fp8_dpa``, ``fp8_mha``) and the GEMMs'
split accumulation (``fp8_gemm_*``: lnmlp accumulates in fp32 unless a plan's ``gemm_math`` says
otherwise) have no effect here and are accepted as they are.
"""

from __future__ import annotations

from ._lib import NotSupportedError

#: TransformerEngine's recipe classes lnmlp reads, by name.
TE_RECIPES = ("DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling", "MXFP8BlockScaling", "NVFP4BlockScaling")


def is_transformer_engine_object(obj) -> bool:
    return type(obj).__module__.split(".")[0] == "transformer_engine"


def _refuse(recipe, field, value, why):
    raise NotSupportedError(f"TransformerEngine's {recipe}({field}={value!r}) is not supported: {why}")


def _common(te, name):
    """The checks every TE recipe shares: no backward override."""
    override = getattr(te, "backward_override", None)
    if override is not None:
        _refuse(name, "backward_override", override, "lnmlp's backward always uses the FP8 operands")


def _scaling_options(te, name):
    """(power_2_scale, amax_epsilon) from TE's three per-role QParams, which must agree."""
    roles = ("fp8_quant_fwd_inp", "fp8_quant_fwd_weight", "fp8_quant_bwd_grad")
    params = [getattr(te, r) for r in roles]
    for role, q in zip(roles, params):
        for flag in ("random_hadamard_transform", "stochastic_rounding", "fp4_2d_quantization"):
            if getattr(q, flag, False):
                _refuse(name, f"{role}.{flag}", True, "that is an NVFP4 option")
    first = (bool(params[0].power_2_scale), float(params[0].amax_epsilon))
    for role, q in zip(roles[1:], params[1:]):
        if (bool(q.power_2_scale), float(q.amax_epsilon)) != first:
            _refuse(name, role, q, f"lnmlp uses one power_2_scale and amax_epsilon for every tensor; "
                                   f"{roles[0]} has {params[0]}")
    return first


def _nvfp4_roles_as_the_flags_say(te, name):
    """TE's NVFP4 object derives its per-role QParams from its three disable_* flags; lnmlp reads
    the flags, so roles changed after construction (where the object has them) are refused."""
    rht, sr, two_d = (not bool(getattr(te, f, False)) for f in ("disable_rht", "disable_stochastic_rounding",
                                                                 "disable_2d_quantization"))
    derived = {"fp4_quant_fwd_inp": (rht, False, False), "fp4_quant_fwd_weight": (False, False, two_d),
               "fp4_quant_bwd_grad": (rht, sr, False)}
    for role, want in derived.items():
        q = getattr(te, role, None)
        if q is None:
            continue
        got = tuple(bool(getattr(q, f, False)) for f in ("random_hadamard_transform", "stochastic_rounding",
                                                          "fp4_2d_quantization"))
        if got != want:
            _refuse(name, role, q, "lnmlp's NVFP4 applies the Hadamard transform, stochastic rounding and 2-D "
                                   "blocks as the disable_* flags say (TransformerEngine's derivation)")


def from_transformer_engine(te):
    """The lnmlp recipe equal to TransformerEngine recipe object ``te``."""
    from . import recipe as lr

    name = type(te).__name__
    if name not in TE_RECIPES:
        raise NotSupportedError(f"TransformerEngine's {name} recipe is not supported by lnmlp "
                                f"(it reads {', '.join(TE_RECIPES)})")
    _common(te, name)
    fmt = getattr(te.fp8_format, "name", te.fp8_format)
    if name == "NVFP4BlockScaling":  # (fp8_dpa, fp8_mha: attention's, not this block's)
        lr.refuse_nvfp4_options_not_in_lnmlp(name, bool(getattr(te, "row_scaled_activation", False)),
                                             getattr(te, "nvfp4_4over6", "none"))
        _nvfp4_roles_as_the_flags_say(te, name)
        return lr.NVFP4BlockScaling(row_scaled_activation=False, nvfp4_4over6="none",
                                    disable_rht=bool(getattr(te, "disable_rht", False)),
                                    disable_stochastic_rounding=bool(getattr(te, "disable_stochastic_rounding", False)),
                                    disable_2d_quantization=bool(getattr(te, "disable_2d_quantization", False)),
                                    fp4_format=getattr(te, "fp4_format", "E2M1"), fp8_format=fmt)
    if name == "DelayedScaling":
        if callable(te.amax_compute_algo):
            _refuse(name, "amax_compute_algo", te.amax_compute_algo, "use 'max' or 'most_recent'")
        if te.scaling_factor_compute_algo is not None:
            _refuse(name, "scaling_factor_compute_algo", te.scaling_factor_compute_algo,
                    "lnmlp computes the scale as TE's default does")
        if not te.reduce_amax:
            _refuse(name, "reduce_amax", False, "lnmlp always reduces amaxes over the devices a block is split over")
        return lr.DelayedScaling(margin=te.margin, fp8_format=fmt, amax_history_len=te.amax_history_len,
                                 amax_compute_algo=te.amax_compute_algo)
    if name == "MXFP8BlockScaling":
        if getattr(te, "margin", 0):
            _refuse(name, "margin", te.margin, "MXFP8 scales have no margin")
        if getattr(te, "enable_2d_quantization", False):
            _refuse(name, "enable_2d_quantization", True, "lnmlp's MXFP8 blocks are 1 x 32")
        return lr.MXFP8BlockScaling(fp8_format=fmt)
    power_2_scale, amax_epsilon = _scaling_options(te, name)
    if name == "Float8BlockScaling":
        for field, want in (("x_block_scaling_dim", 1), ("w_block_scaling_dim", 2), ("grad_block_scaling_dim", 1)):
            if getattr(te, field) != want:
                _refuse(name, field, getattr(te, field), f"lnmlp's blocks are TE's defaults ({field}={want})")
        return lr.Float8BlockScaling(fp8_format=fmt, power_2_scale=power_2_scale, amax_epsilon=amax_epsilon)
    return lr.Float8CurrentScaling(fp8_format=fmt, power_2_scale=power_2_scale, amax_epsilon=amax_epsilon)

