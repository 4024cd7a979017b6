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

A differentiated call is two such functions, forward and backward. Forward's residual is the
saved buffer's sections apart (``Spec(saved_apart=True)``), each an array that shards with the
tokens and with F (``_section_specs``), so that its global shape does not depend on the split;
backward takes them with the shardings forward gave them, and reads the layout from the same
operands (x, W1, W2), so no section is ever moved. Blocked FP8 recipes (their block scales do not
split with the tokens in general) run such a call whole.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec as P

from .. import _lib
from .._lib import InvalidArgumentError, NotSupportedError
from . import _calls, _sharding


def _layout(spec, mesh, x, w1, w2):
    """The Layout the shardings of x, W1 and W2 name, or the nearest one the block runs (the
    kernels whole, then the tokens whole too: None)."""
    if not all(isinstance(a.sharding, NamedSharding) for a in (x, w1, w2)):
        return None
    if spec.saved_apart and spec.recipe is not None and type(spec.recipe).__name__ in ("Float8BlockScaling",
                                                                                       "MXFP8BlockScaling"):
        return None
    x_axes = _sharding.axes_of_spec(x.sharding.spec, len(x.shape))
    x_axes[-1] = ()  # the hidden dimension is never split: gathered
    k1, k2 = _sharding.axes_of_spec(w1.sharding.spec, 3), _sharding.axes_of_spec(w2.sharding.spec, 2)
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


def _partitioner(spec, whole, shardings, lower_of, at):
    """The partition and infer callbacks of a call whose x, W1 and W2 are operands `at`: the
    layout their shardings name (_layout), the operand and result shardings of it
    (shardings(mesh, layout, arg_shapes)), and the call run whole (no layout) or as
    lower_of(layout) on each device's shards."""

    def partition(mesh, arg_shapes, result_shape):
        layout = _layout(spec, mesh, *(arg_shapes[i] for i in at))
        operands, results = shardings(mesh, layout, arg_shapes)
        return mesh, whole if layout is None else lower_of(layout), results, operands

    def infer(mesh, arg_shapes, result_shape):
        return shardings(mesh, _layout(spec, mesh, *(arg_shapes[i] for i in at)), arg_shapes)[1]

    return partition, infer


@functools.lru_cache(maxsize=256)
def _inference(spec, shapes):
    """The custom-partitioned forward of spec (its remat "forward_only") for operands of `shapes`
    (their global shapes, which key the rule): (x, gamma, beta, w1, b1, w2, b2, state) -> (y,)
    or (y, norm output)."""

    def whole(x, gamma, beta, w1, b1, w2, b2, state):
        y, _, _, ln = _sharding.forward(spec, None, x, gamma, beta, w1, b1, w2, b2, state)
        return (y, ln) if spec.norm_output else (y,)

    def lower_of(layout):
        local = _sharding.forward_local(spec, layout)

        def lower(*args):
            outs = local(*args)
            return (outs[0], outs[3]) if spec.norm_output else (outs[0],)

        return lower

    def shardings(mesh, layout, arg_shapes):
        return _shardings(spec, mesh, layout, arg_shapes)

    block = custom_partitioning(whole)
    partition, infer = _partitioner(spec, whole, shardings, lower_of, (0, 3, 5))
    f = _Factors(len(shapes[0]))
    operands = [f.x_like(), f.fresh(shapes[1]), f.fresh(shapes[2]), *f.kernels(math.prod(shapes[4]) > 0),
                f.fresh(shapes[6]), f.fresh(shapes[7])]
    results = [f.x_like() for _ in range(2 if spec.norm_output else 1)]
    block.def_partition(partition, infer_sharding_from_operands=infer,
                        sharding_rule=", ".join(operands) + " -> " + ", ".join(results))
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


# ---- a differentiated call: forward and backward, the residual's sections apart -----------------------

def _section_specs(spec, layout):
    """The PartitionSpec of each saved section (LNMLP_SAVED_* order) of a call split by layout:
    each device's call runs on its tensor group's rows (gathered under sequence parallelism), so
    the statistics, the norm output, FFN1, the activation output and their FP8 codes are of those
    rows (and of its F shard); forward's FP8 scales are the group's (the same on every device). A
    section the plan does not save is a zero-element stand-in."""
    data, tensor = layout.data_axes or None, layout.tensor_axes or None
    rows_first = spec.backend == "cpu"  # the FP8 codes' layout (_calls.sections_shaped)
    by_name = dict(mean=P(data), rstd=P(data), norm_output=P(data, None), ffn1=P(data, None, tensor),
                   act_out=P(data, tensor), fp8_scales=P(),
                   norm_output_codes=P(data, None) if rows_first else P(None, data),
                   act_out_codes=P(data, tensor) if rows_first else P(tensor, data))
    facts = _calls._output_types(spec.with_(saved_apart=False))["sections"]
    return tuple(by_name.get(name, P()) if facts[i].shape != (0,) else P()
                 for name, i in _lib.SAVED_SECTIONS.items())


class _Factors:
    """Dimension factors of a Shardy rule: the tokens (x's leading dimensions, and the residual's
    rows as their product), F, and a fresh factor for every other dimension."""

    def __init__(self, x_ndim):
        self.tokens = [f"t{d}" for d in range(x_ndim - 1)]
        self._fresh = iter(f"z{i}" for i in range(1024))
        # The rows: the token dimensions' product (a single token, x [H]: a factor of their own).
        self.rows = (self.tokens[0] if len(self.tokens) == 1 else "(" + " ".join(self.tokens) + ")" if self.tokens
                     else self.fresh((0,)))

    def fresh(self, shape):
        return " ".join(next(self._fresh) for _ in shape)

    def x_like(self):  # x, y, dy, dx: the tokens, then H
        return " ".join(self.tokens + [self.fresh((0,))])

    def kernels(self, b1_present):  # W1 [H, A, F], b1 [A, F], W2 [F, H]: F shared
        return [f"{self.fresh((0, 0))} f", f"{self.fresh((0,))} f" if b1_present else self.fresh((0,)),
                f"f {self.fresh((0,))}"]

    def sections(self, spec, sections):
        """Each section's rows are the tokens', its F dimension F (the FP8 codes' as laid out)."""
        rows_first = spec.backend == "cpu"
        by_name = dict(mean=lambda: self.rows, rstd=lambda: self.rows,
                       norm_output=lambda: f"{self.rows} {self.fresh((0,))}",
                       ffn1=lambda: f"{self.rows} {self.fresh((0,))} f", act_out=lambda: f"{self.rows} f",
                       norm_output_codes=lambda: (f"{self.rows} {self.fresh((0,))}" if rows_first
                                                  else f"{self.fresh((0,))} {self.rows}"),
                       act_out_codes=lambda: f"{self.rows} f" if rows_first else f"f {self.rows}")
        factors = []
        for name, a in zip(_lib.SAVED_SECTIONS, sections):
            dims = by_name[name]() if name in by_name and a.shape != (0,) else None
            # A section as the library shapes it (flat codes that are no matrix): its own factors.
            if dims is None or len(dims.replace(self.rows, "rows").split()) != len(a.shape):
                dims = self.fresh(a.shape)
            factors.append(dims)
        return factors


@functools.lru_cache(maxsize=256)
def _training(spec, shapes):
    """(forward, backward): the custom-partitioned calls of a differentiated block (spec with
    saved_apart) for operands of `shapes`. forward (x, gamma, beta, w1, b1, w2, b2, state) ->
    (y, *sections, state[, norm output]); backward (dy, x, gamma, beta, w1, b1, w2, *sections,
    state) -> (dx, dgamma, dbeta, dw1, db1, dw2, db2, state)."""
    named = lambda mesh, p: NamedSharding(mesh, p)  # noqa: E731
    n_sections = len(_lib.SAVED_SECTIONS)

    def forward_whole(x, gamma, beta, w1, b1, w2, b2, state):
        y, sections, state, ln = _sharding.forward(spec, None, x, gamma, beta, w1, b1, w2, b2, state)
        outs = (y, *_calls.sections_shaped(spec, sections), state)
        return outs + ((ln,) if spec.norm_output else ())

    def backward_whole(dy, x, gamma, beta, w1, b1, w2, *rest):
        sections, state = rest[:n_sections], rest[n_sections]
        return _sharding.backward(spec, None, dy, x, gamma, beta, w1, b1, w2, tuple(sections), state)

    forward_block, backward_block = custom_partitioning(forward_whole), custom_partitioning(backward_whole)

    def forward_shardings(mesh, layout, arg_shapes):
        operands, _ = _shardings(spec, mesh, layout, arg_shapes)
        if layout is None:
            outs = (P(),) * (n_sections + 2 + spec.norm_output)
        else:
            outs = (layout.x_spec, *_section_specs(spec, layout), P()) + ((layout.x_spec,) if spec.norm_output else ())
        return operands, tuple(named(mesh, p) for p in outs)

    def forward_lower(layout):
        local = _sharding.forward_local(spec, layout)

        def lower(*args):
            y, sections, state, *ln = local(*args)
            return (y, *sections, state, *ln)

        return lower

    def backward_shardings(mesh, layout, arg_shapes):
        if layout is None:
            return (tuple(named(mesh, P()) for _ in arg_shapes), tuple(named(mesh, P()) for _ in range(8)))
        w1_spec, b1_spec, w2_spec = layout.weight_specs(arg_shapes[5])
        operands = (layout.x_spec, layout.x_spec, P(), P(), w1_spec, b1_spec, w2_spec, *_section_specs(spec, layout),
                    P())
        results = (layout.x_spec, P(), P(), w1_spec, b1_spec, w2_spec, P(), P())
        return tuple(named(mesh, p) for p in operands), tuple(named(mesh, p) for p in results)

    def backward_lower(layout):
        local = _sharding.backward_local(spec, layout)

        def lower(dy, x, gamma, beta, w1, b1, w2, *rest):
            return local(dy, x, gamma, beta, w1, b1, w2, tuple(rest[:n_sections]), rest[n_sections])

        return lower

    structs = [jax.ShapeDtypeStruct(s, "float32") for s in shapes]
    out_types = _calls._output_types(spec.with_(saved_apart=False))
    sections = _calls.sections_shaped(spec, [jax.ShapeDtypeStruct(t.shape, t.dtype) for t in out_types["sections"]])
    f = _Factors(len(shapes[0]))
    b1_present = structs[4].size > 0
    fresh = f.fresh
    forward_operands = [f.x_like(), fresh(shapes[1]), fresh(shapes[2]), *f.kernels(b1_present), fresh(shapes[6]),
                        fresh(shapes[7])]
    forward_results = [f.x_like(), *f.sections(spec, sections), fresh(shapes[7])] + (
        [f.x_like()] if spec.norm_output else [])
    partition, infer = _partitioner(spec, forward_whole, forward_shardings, forward_lower, (0, 3, 5))
    forward_block.def_partition(partition, infer_sharding_from_operands=infer,
                                sharding_rule=", ".join(forward_operands) + " -> " + ", ".join(forward_results))
    w1, b1, w2 = f.kernels(b1_present)
    backward_operands = [f.x_like(), f.x_like(), fresh(shapes[1]), fresh(shapes[2]), w1, b1, w2,
                         *f.sections(spec, sections), fresh(shapes[7])]
    backward_results = [f.x_like(), fresh(shapes[1]), fresh(shapes[2]), *f.kernels(b1_present), fresh((0,)),
                        fresh(shapes[7])]
    partition, infer = _partitioner(spec, backward_whole, backward_shardings, backward_lower, (1, 4, 6))
    backward_block.def_partition(partition, infer_sharding_from_operands=infer,
                                 sharding_rule=", ".join(backward_operands) + " -> " + ", ".join(backward_results))
    return forward_block, backward_block


def train_forward(spec, x, gamma, beta, w1, b1, w2, b2, state):
    """(y, the saved sections (a tuple), the state, the norm output or None) of a differentiated
    call, split as XLA's partitioning places its operands."""
    spec = spec.with_(saved_apart=True)
    operands = (x, gamma, beta, w1, b1, w2, b2, state)
    shapes = tuple(tuple(a.shape) for a in operands)
    n = len(_lib.SAVED_SECTIONS)

    @jax.custom_batching.custom_vmap
    def call(*operands):
        return _training(spec, shapes)[0](*operands)

    @call.def_vmap
    def batched(axis_size, in_batched, x, *rest):
        if in_batched[0] and not any(in_batched[1:]):
            # Only x is batched: one call with the batch folded into the tokens, its residual
            # unbatched (train_backward's rule reads it whole), as lnmlp.jax's calls do.
            big = spec.with_(tokens=axis_size * spec.tokens)
            y, sections, state, ln = train_forward(big, x.reshape(axis_size * x.shape[1], *x.shape[2:]), *rest)
            outs = (y.reshape(x.shape), *sections, state) + ((ln.reshape(x.shape),) if spec.norm_output else ())
            return outs, (True,) + (False,) * (n + 1) + ((True,) if spec.norm_output else ())
        return _calls._sequential(call, axis_size, in_batched, (x, *rest))

    outs = call(*operands)
    return outs[0], tuple(outs[1:1 + n]), outs[1 + n], outs[2 + n] if spec.norm_output else None


def train_backward(spec, dy, x, gamma, beta, w1, b1, w2, sections, state):
    """(dx, dgamma, dbeta, dw1, db1, dw2, db2, state) for train_forward's residuals."""
    spec = spec.with_(saved_apart=True)
    shapes = tuple(tuple(a.shape) for a in (x, gamma, beta, w1, b1, w2, jnp.zeros((0,)), state))
    n = len(_lib.SAVED_SECTIONS)

    @jax.custom_batching.custom_vmap
    def call(*operands):
        return _training(spec, shapes)[1](*operands)

    @call.def_vmap
    def batched(axis_size, in_batched, dy, x, *rest):
        if in_batched[0] and in_batched[1] and not any(in_batched[2:]):
            # dy and x batched, the residual whole: the backward of train_forward's folded call.
            big = spec.with_(tokens=axis_size * spec.tokens)
            fold = lambda a: a.reshape(axis_size * a.shape[1], *a.shape[2:])  # noqa: E731
            dx, *grads = train_backward(big, fold(dy), fold(x), *rest[:5], tuple(rest[5:5 + n]), rest[5 + n])
            return (dx.reshape(x.shape), *grads), (True,) + (False,) * len(grads)
        return _calls._sequential(call, axis_size, in_batched, (dy, x, *rest))

    return call(dy, x, gamma, beta, w1, b1, w2, *sections, state)
