"""Automatic partitioning: ``jax.jit`` over arrays placed with NamedSharding on a mesh of Auto axes,
with no axes arguments (the default way people shard), splits the block as the axes arguments would.

The block is a ``jax.experimental.custom_partitioning`` function with a Shardy sharding rule: when
XLA partitions the program it hands the rule's callback the shardings its operands have, the callback
reads the layout from them as ``_sharding.resolve_layout`` reads it from the axes arguments (x's
token dimensions over data axes, W1's columns and W2's rows over the tensor axes, x's tokens over
them too for sequence parallelism, the kernels' H over data axes for FSDP), and the block runs as
``_sharding.forward_local`` on each device's shards with the same collectives. Operand shardings
the block cannot run (x's hidden dimension split, W1's and W2's F over different axes, a shard
count that does not divide) are replaced: the tokens' split is kept where it can be, and XLA moves
the data (``docs/jax-mesh.md``). On one device, and inside ``shard_map``, the function is the
block itself.

This covers calls that are not differentiated (inference); a differentiated call takes the axes
arguments or Explicit shardings (its residuals are split per section: the next step).
"""

from __future__ import annotations

import functools

import jax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec as P

from .._lib import InvalidArgumentError, NotSupportedError
from . import _sharding


def _axes_of(sharding, ndim):
    """The mesh axes (a tuple per dimension) of a NamedSharding's spec."""
    spec = tuple(sharding.spec) + (None,) * (ndim - len(sharding.spec))
    return [() if e is None else (e,) if isinstance(e, str) else tuple(e) for e in spec]


def _layout(spec, mesh, arg_shapes):
    """The Layout the operands' shardings name, or the nearest one the block runs (the kernels
    whole, then the tokens whole too: None)."""
    x, _, _, w1, _, w2 = arg_shapes[:6]
    if not all(isinstance(a.sharding, NamedSharding) for a in (x, w1, w2)):
        return None
    x_axes = _axes_of(x.sharding, len(x.shape))
    x_axes[-1] = ()  # the hidden dimension is never split: gathered
    k1, k2 = _axes_of(w1.sharding, 3), _axes_of(w2.sharding, 2)
    for kernels in ((k1, k2), (None, None)):
        try:
            return _sharding.layout_of_axes(mesh, x.shape, spec.ffn, spec.recipe, x_axes, *kernels)
        except (InvalidArgumentError, NotSupportedError):
            continue
    return None


def _shardings(spec, mesh, layout, arg_shapes):
    """(operand shardings, result shardings) of the call under layout (None: every one whole)."""
    named = lambda p: NamedSharding(mesh, p)  # noqa: E731
    n_out = 2 if spec.norm_output else 1
    if layout is None:
        return tuple(named(P()) for _ in arg_shapes), tuple(named(P()) for _ in range(n_out))
    w1_spec, b1_spec, w2_spec = layout.weight_specs(arg_shapes[4])
    args = (layout.x_spec, P(), P(), w1_spec, b1_spec, w2_spec, P(), P())
    return tuple(named(p) for p in args), tuple(named(layout.x_spec) for _ in range(n_out))


def _rule(arg_shapes, norm_output):
    """The Shardy rule: x's token dimensions are y's (and the norm output's), and F is shared by
    W1's columns, b1 and W2's rows; every other dimension is a factor of its own, so that no
    kernel's sharding (FSDP's along H) spreads to x or y."""
    x, gamma, beta, w1, b1, w2, b2, state = arg_shapes
    fresh = iter(f"z{i}" for i in range(64))
    own = lambda a: " ".join(next(fresh) for _ in a.shape)  # noqa: E731
    tokens = " ".join(f"t{i}" for i in range(len(x.shape) - 1))
    operands = [f"{tokens} {next(fresh)}", own(gamma), own(beta), f"{next(fresh)} a f",
                f"{next(fresh)} f" if b1.size else own(b1), f"f {next(fresh)}", own(b2), own(state)]
    results = [f"{tokens} {next(fresh)}" for _ in range(2 if norm_output else 1)]
    return ", ".join(operands) + " -> " + ", ".join(results)


@functools.lru_cache(maxsize=256)
def _inference(spec, shapes):
    """The custom-partitioned forward of spec (its remat "forward_only") for operands of `shapes`
    (their global shapes, which key the rule): (x, gamma, beta, w1, b1, w2, b2, state) -> (y,)
    or (y, norm output)."""

    def whole(x, gamma, beta, w1, b1, w2, b2, state):
        y, _, _, ln = _sharding.forward(spec, None, x, gamma, beta, w1, b1, w2, b2, state)
        return (y, ln) if spec.norm_output else (y,)

    block = custom_partitioning(whole)

    def partition(mesh, arg_shapes, result_shape):
        layout = _layout(spec, mesh, arg_shapes)
        arg_shardings, result_shardings = _shardings(spec, mesh, layout, arg_shapes)
        if layout is None:
            return mesh, whole, result_shardings, arg_shardings
        local = _sharding.forward_local(spec, layout)

        def lower(*args):
            outs = local(*args)
            return (outs[0], outs[3]) if spec.norm_output else (outs[0],)

        return mesh, lower, result_shardings, arg_shardings

    def infer(mesh, arg_shapes, result_shape):
        return _shardings(spec, mesh, _layout(spec, mesh, arg_shapes), arg_shapes)[1]

    structs = [jax.ShapeDtypeStruct(s, "float32") for s in shapes]
    block.def_partition(partition, infer_sharding_from_operands=infer, sharding_rule=_rule(structs, spec.norm_output))
    return block


def forward(spec, x, gamma, beta, w1, b1, w2, b2, state):
    """y (and the norm output, or None) of a call that is not differentiated, split as XLA's
    partitioning places its operands. Under vmap, the block's own batching (unsplit)."""
    operands = (x, gamma, beta, w1, b1, w2, b2, state)

    @jax.custom_batching.custom_vmap
    def call(*operands):
        return _inference(spec, tuple(tuple(a.shape) for a in operands))(*operands)

    @call.def_vmap
    def batched(axis_size, in_batched, *operands):
        def one(*a):
            y, _, _, ln = _sharding.forward(spec, None, *a)
            return (y, ln) if spec.norm_output else (y,)

        outs = jax.vmap(one, in_axes=tuple(0 if b else None for b in in_batched))(*operands)
        return outs, (True,) * len(outs)

    outs = call(*operands)
    return (outs[0], outs[1]) if spec.norm_output else (outs[0], None)
