"""TransformerEngine's global context for its JAX modules: ``autocast(enabled, recipe,
mesh_resource)`` (and ``fp8_autocast``, its older name) and ``MeshResource``.

Inside ``autocast(enabled=True, recipe=...)`` a Flax ``LayerNormMLP`` made without ``fp8_recipe``
runs under the context's recipe (``DelayedScaling()`` when none is given), as TE's modules create
their quantizer sets from it; the function ``layernorm_mlp`` takes its quantizer set as an
argument and is not changed by the recipe, as in TE. The context's ``MeshResource`` names the mesh
axes of each kind of parallelism, so that TE's own logical axis names (``nvte_batch``,
``nvte_w_tp``, ...) in ``norm_input_axes`` / ``kernel_*_axes`` map onto the mesh as TE maps them
(``transformer_engine/jax/sharding.py``), and :func:`lnmlp.jax.flax.extend_logical_axis_rules`
adds those names to flax's rules. The context is process-wide, as TE's is.
"""

from __future__ import annotations

import contextlib
import dataclasses

from .._lib import InvalidArgumentError
from ..recipe import DelayedScaling, check_recipe

__all__ = ["MeshResource", "autocast", "fp8_autocast"]


@dataclasses.dataclass(frozen=True)
class MeshResource:
    """The mesh axis of each kind of parallelism (TransformerEngine's ``MeshResource``, its field
    names): None where the kind is not used. lnmlp.jax splits the block over data
    (``dp_resource``, or ``fsdp_resource`` for the tokens), tensor (``tp_resource``) and tensor
    with sequence (``tpsp_resource``) axes; the others name axes lnmlp.jax does not split over."""

    dp_resource: str = None
    tp_resource: str = None
    tpsp_resource: str = None
    fsdp_resource: str = None
    pp_resource: str = None
    cp_resource: str = None
    ep_resource: str = None


_FIELDS = tuple(f.name for f in dataclasses.fields(MeshResource))
_state = {"recipe": None, "mesh_resource": None}


def _mesh_resource(value):
    """MeshResource from lnmlp's, TransformerEngine's (read by its field names), or None."""
    if value is None or isinstance(value, MeshResource):
        return value
    if all(hasattr(value, f) for f in _FIELDS):
        return MeshResource(**{f: getattr(value, f) for f in _FIELDS})
    raise InvalidArgumentError(f"mesh_resource must be a MeshResource (lnmlp.jax's or TransformerEngine's), got "
                               f"{type(value).__name__}")


@contextlib.contextmanager
def autocast(enabled: bool = False, recipe=None, mesh_resource=None):
    """TransformerEngine's ``autocast``: within it, Flax ``LayerNormMLP`` modules made without
    ``fp8_recipe`` quantize with ``recipe`` when ``enabled`` (``DelayedScaling()`` when None; an
    lnmlp recipe or TE's), and ``mesh_resource`` maps TE's logical axis names onto the mesh."""
    recipe = check_recipe(DelayedScaling() if recipe is None else recipe)
    resource = _mesh_resource(mesh_resource)
    before = dict(_state)
    _state.update(recipe=recipe if enabled else None, mesh_resource=resource)
    try:
        yield
    finally:
        _state.update(before)


def fp8_autocast(enabled: bool = False, fp8_recipe=None, mesh_resource=None):
    """TransformerEngine's older name of :func:`autocast` (``fp8_recipe`` is its ``recipe``)."""
    return autocast(enabled=enabled, recipe=fp8_recipe, mesh_resource=mesh_resource)


def global_recipe():
    """The recipe of the enclosing ``autocast(enabled=True)``, or None."""
    return _state["recipe"]


def te_logical_axes(mesh) -> dict:
    """TransformerEngine's logical axis names -> mesh axes (or None) under the context's
    MeshResource, as TE's ``get_sharding_map_logic_axis_to_mesh_axis`` gives them; {} outside an
    ``autocast`` with a mesh_resource."""
    r = _state["mesh_resource"]
    if r is None:
        return {}

    def active(axis):
        return axis is not None and axis in mesh.axis_names and mesh.shape[axis] > 1

    tp = r.tpsp_resource if active(r.tpsp_resource) else r.tp_resource
    return {"nvte_batch": r.fsdp_resource if active(r.fsdp_resource) else r.dp_resource, "nvte_seqlen": None,
            "nvte_seqlen_tp": r.tpsp_resource, "nvte_seqlen_cp": r.cp_resource, "nvte_head": tp, "nvte_hidden": None,
            "nvte_hidden_tp": tp, "nvte_joined": None, "nvte_w_no_shard": None, "nvte_w_fsdp": r.fsdp_resource,
            "nvte_w_tp": tp, "nvte_w_joined": None}
