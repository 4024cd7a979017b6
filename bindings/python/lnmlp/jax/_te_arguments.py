"""TransformerEngine's current spelling of ``layernorm_mlp``'s last arguments, read beside the
seed's. TE main's signature ends ``activation_type, activation_params, collective_op_sets,
quantizer_sets``; the seed's (lnmlp's requirement) ends ``activation_type, quantizer_set,
act_params``. Positionally the seed's order stands, so TE's three go by keyword; a TE-style
positional call is refused with the keyword to use wherever the seed's order cannot mean it.
"""

from __future__ import annotations

from .._lib import InvalidArgumentError, NotSupportedError
from .._te_recipe import is_transformer_engine_object
from ._quantizer_set import GemmQuantizerSet, QuantizerSet, join


def _positional_errors(quantizer_set, act_params, extra_positional):
    if extra_positional:
        raise InvalidArgumentError(
            f"layernorm_mlp takes at most 19 positional arguments, in the seed's order (..., activation_type, "
            f"quantizer_set, act_params); got {19 + len(extra_positional)}. TransformerEngine's activation_params, "
            f"collective_op_sets and quantizer_sets go by keyword")
    if isinstance(quantizer_set, dict):
        raise InvalidArgumentError(
            "quantizer_set (the 18th argument in the seed's order) got a dict: pass TransformerEngine's "
            "activation_params by keyword (activation_params=...)")
    if isinstance(act_params, (tuple, list)):
        raise InvalidArgumentError(
            "act_params (the 19th argument in the seed's order) got a sequence: pass TransformerEngine's "
            "collective_op_sets (or quantizer_sets) by keyword")


def _is_noop_collective(op_set):
    if op_set is None:
        return True
    ops = (getattr(op_set, "forward", None), getattr(op_set, "backward", None))
    return all(getattr(op, "name", None) == "NONE" for op in ops)


def _check_collective_op_sets(collective_op_sets):
    if collective_op_sets is None:
        return
    if not isinstance(collective_op_sets, (tuple, list)) or len(collective_op_sets) != 2:
        raise InvalidArgumentError(f"collective_op_sets must be a pair (ffn1's, ffn2's), got {collective_op_sets!r}")
    for name, op_set in zip(("ffn1", "ffn2"), collective_op_sets):
        if not _is_noop_collective(op_set):
            raise NotSupportedError(
                f"collective_op_sets: {name}'s {op_set!r} asks for TransformerEngine's collective GEMM, which lnmlp "
                "does not run; on a mesh lnmlp.jax places XLA's collectives itself (pass noop sets, or none)")


def _joined_quantizer_sets(quantizer_sets):
    if not isinstance(quantizer_sets, (tuple, list)) or len(quantizer_sets) != 2:
        raise InvalidArgumentError(f"quantizer_sets must be a pair (ffn1's set, ffn2's set), got {quantizer_sets!r}")
    ffn1, ffn2 = quantizer_sets
    if ffn1 is None and ffn2 is None:
        return None
    if any(is_transformer_engine_object(s) for s in quantizer_sets):
        raise NotSupportedError(
            "quantizer_sets holds TransformerEngine's quantizer sets, whose quantizers are TE's own; make lnmlp's "
            "pair for the same recipe with lnmlp.jax.make_quantizer_sets(recipe) (TE's recipe objects are read)")
    if isinstance(ffn1, QuantizerSet) or isinstance(ffn2, QuantizerSet):
        raise InvalidArgumentError(
            "quantizer_sets holds a whole lnmlp QuantizerSet: pass it as quantizer_set=, or its halves "
            "(QuantizerSet.split()) as quantizer_sets=")
    if not (isinstance(ffn1, GemmQuantizerSet) and isinstance(ffn2, GemmQuantizerSet)):
        raise InvalidArgumentError(
            "quantizer_sets must be (noop, noop) or the two halves of one lnmlp set "
            f"(lnmlp.jax.make_quantizer_sets(recipe) or QuantizerSet.split()), got "
            f"({type(ffn1).__name__}, {type(ffn2).__name__}): lnmlp quantizes both GEMMs or neither")
    if (ffn1.gemm, ffn2.gemm) != (0, 1):
        raise InvalidArgumentError(f"quantizer_sets must be (ffn1's half, ffn2's half) in that order, got "
                                   f"({ffn1!r}, {ffn2!r})")
    if ffn1.recipe != ffn2.recipe:
        raise NotSupportedError(f"quantizer_sets: the fused block runs both GEMMs under one recipe, got "
                                f"{ffn1.recipe!r} and {ffn2.recipe!r}")
    return join(ffn1, ffn2)


def resolve(activations, quantizer_set, act_params, extra_positional, activation_params, collective_op_sets,
            quantizer_sets):
    """(quantizer_set, act_params) from the seed's and TransformerEngine's spellings together."""
    _positional_errors(quantizer_set, act_params, extra_positional)
    _check_collective_op_sets(collective_op_sets)
    if quantizer_sets is not None:
        if quantizer_set is not None:
            raise InvalidArgumentError("give quantizer_set (the seed's) or quantizer_sets (TransformerEngine's), "
                                       "not both")
        quantizer_set = _joined_quantizer_sets(quantizer_sets)
    if activation_params is not None:
        if act_params is not None:
            raise InvalidArgumentError("give act_params (the seed's) or activation_params (TransformerEngine's), "
                                       "not both")
        if not isinstance(activation_params, dict):
            raise InvalidArgumentError(f"activation_params must be a dict (TransformerEngine's), got "
                                       f"{type(activation_params).__name__}")
        # TransformerEngine reads them for the clamped SwiGLU pair only and ignores them otherwise.
        if tuple(activations) == ("clamped_silu", "clamped_linear"):
            act_params = activation_params
    return quantizer_set, act_params
