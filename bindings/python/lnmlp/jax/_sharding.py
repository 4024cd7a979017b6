"""lnmlp.jax over a device mesh: data, tensor and sequence parallelism, the collectives by XLA.

``layernorm_mlp``'s axes arguments say how x and the kernels lie on the mesh of the context
(``jax.set_mesh(mesh)``, or the older ``with mesh:``): ``norm_input_axes`` names x's dimensions,
``kernel_1_axes`` and ``kernel_2_axes`` the kernels'. Each name is a mesh axis, or a logical name
that flax's logical axis rules (``flax.linen.logical_axis_rules``) map to mesh axes, as with
TransformerEngine; a name that is neither leaves its dimension whole. Without axes arguments,
arrays whose sharding is in their type (a mesh of Explicit axes) give their own. From them:

* the tensor axis: the mesh axes of kernel_1's F dimension, which must be kernel_2's F dimension's
  too (W1 column-parallel, W2 row-parallel, b1 with W1);
* sequence parallelism: x's token dimensions are split over the tensor axis too;
* data parallelism: x's token dimensions split over other mesh axes;
* FSDP: the kernels' H dimension (W1's rows, W2's columns) split over data axes too: each
  device holds a shard of H, gathered for the call, and its gradient comes back reduce-scattered
  to that shard.

The block then runs as ``jax.shard_map`` over the mesh: on each device one lnmlp custom call on its
shards (``_calls.py``), and between the calls XLA's collectives, as docs/jax-mesh.md draws them:

forward   [SP: all-gather x over the tensor axis] -> lnmlp forward without b2 -> GEMM2's partial
          outputs summed in fp32 over the tensor axis (psum; SP: psum_scatter) -> + b2
backward  [SP: all-gather dy and x] -> lnmlp backward -> dx's partial sums summed like y's;
          dgamma, dbeta (and db2) summed over the tensor and data axes; dW1, db1, dW2 over the
          data axes (FSDP: dW1, dW2 reduce-scattered over the FSDP axes along H)
[FSDP: W1 and W2 all-gathered along H over the FSDP axes before each call]

dx is a sum of per-rank terms because the norm's backward is linear in its incoming gradient: the
norm backward of each rank's partial dn, summed, is the norm backward of the summed dn. Each
partial (y's, dx's) is rounded to the I/O dtype by its call before the fp32 sum.

FP8: delayed scaling quantizes with the scales of the state every rank holds; after each call the
amax histories are max-reduced over every mesh axis the block is split on (pmax), and each
quantizer's scale is taken from a rank whose amax equals the group's, which is the scale the
unsharded call computes, so the state stays identical on every rank. Current scaling needs the
group's amax of a tensor inside the fused call, before it is quantized: each call runs in stages
(the library's LNMLP_CALL_AMAX_*), a measuring call per stage whose amaxes are max-reduced over
the split axes, then the call with every amax given (forward: ln_out, W1 and W2, then act_out;
backward: dy, then dh). NVFP4 runs the same stages for its global scales (two amaxes per
quantizer); its backward quantizes W1 and W2 again, so forward's group amaxes are a residual given
to each backward call; and its stochastic rounding places each call in the whole tensors
(lnmlp_plan_set_rng_place: its tokens' first row, its F part), so that the devices draw the bits
of the unsplit call where each call's rows are a contiguous run of x's tokens in order (a split of
the outermost token dimension, or of the innermost with the outer ones whole on each device; under
sequence parallelism the tensor axes innermost), and distinct streams otherwise. Other blocked
recipes need no reduction: their scales are per block of each shard (docs/sharding.md, "FP8
recipes").
"""

from __future__ import annotations

import dataclasses
import math
import sys

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from .. import _capi
from .._lib import InvalidArgumentError, NotSupportedError
from . import _autocast, _calls

__all__ = ["Layout", "resolve_layout", "layout_of_axes", "forward", "forward_local", "backward",
           "backward_local"]


@dataclasses.dataclass(frozen=True)
class Layout:
    """How one call lies on its mesh (static, hashable)."""

    mesh: object  # jax.sharding.Mesh or AbstractMesh
    x_spec: P  # x's PartitionSpec, every dimension; the hidden one is never split
    tensor_axes: tuple  # the mesh axes W1's columns and W2's rows are split over; () for none
    token_axes: tuple  # the mesh axes x's tokens are split over (tensor axes included under SP)
    w1_fsdp_axes: tuple = ()  # the data axes W1's H dimension (its rows) is split over (FSDP); () for none
    w2_fsdp_axes: tuple = ()  # the data axes W2's H dimension (its columns) is split over

    @property
    def tensor_size(self):
        return math.prod(self.mesh.shape[a] for a in self.tensor_axes)

    @property
    def sequence_parallel(self):
        return bool(self.tensor_axes) and set(self.tensor_axes) <= set(self.token_axes)

    @property
    def data_axes(self):
        """The token axes that are not the tensor axes: gradients of weights are summed over them."""
        return tuple(a for a in self.token_axes if a not in self.tensor_axes)

    @property
    def split_axes(self):
        """Every mesh axis the block is split over: FP8 amaxes are max-reduced over them, and
        dgamma and dbeta summed."""
        return self.token_axes + tuple(a for a in self.tensor_axes if a not in self.token_axes)

    @property
    def per_device(self):
        """The spec of an array stacked from one block per device (the saved residuals)."""
        return P(tuple(self.mesh.axis_names))

    def weight_specs(self, b1):
        """The PartitionSpecs of W1, b1 (its zero-element stand-in when absent) and W2."""
        t = self.tensor_axes or None
        return P(self.w1_fsdp_axes or None, None, t), P(None, t) if b1.size else P(), P(t, self.w2_fsdp_axes or None)


def _context_mesh():
    mesh = jax.sharding.get_abstract_mesh()
    if mesh is not None and not mesh.empty:
        return mesh
    from jax._src import mesh as mesh_lib  # `with mesh:`, deprecated in jax but still in use

    physical = mesh_lib.thread_resources.env.physical_mesh
    return None if physical.empty else physical


def _mesh_axes(names, mesh, what):
    """The mesh axes (a tuple per dimension) of a tuple of axis names: flax's logical axis rules
    where they name it, TransformerEngine's logical names (nvte_*) through the autocast context's
    MeshResource, the name itself where it is one of the mesh's axes, else none."""
    if names is None:
        return None
    if isinstance(names, str) or not all(n is None or isinstance(n, str) for n in names):
        raise InvalidArgumentError(f"{what} must be a tuple of axis names (str or None), got {names!r}")
    mapped = [None] * len(names)
    flax_linen = sys.modules.get("flax.linen")  # rules only exist where flax is in use
    if flax_linen is not None and flax_linen.get_logical_axis_rules():
        mapped = list(flax_linen.logical_to_mesh_axes(tuple(names)))
    te_axes = _autocast.te_logical_axes(mesh)
    out = []
    for name, m in zip(names, mapped):
        if m is None and name is not None and name.startswith("nvte_"):
            if name not in te_axes:
                raise InvalidArgumentError(
                    f"{what}: {name!r} is TransformerEngine's logical axis name, which maps onto the mesh through a "
                    "MeshResource: run inside lnmlp.jax.autocast(mesh_resource=lnmlp.jax.MeshResource(...))"
                    if not te_axes else f"{what}: {name!r} is not one of TransformerEngine's logical axis names")
            m = te_axes[name]
        if m is None and name in mesh.axis_names:
            m = name
        axes = () if m is None else (m,) if isinstance(m, str) else tuple(m)
        for a in axes:
            if a not in mesh.axis_names:
                raise InvalidArgumentError(f"{what}: {name!r} maps to mesh axis {a!r}, which the mesh "
                                           f"{tuple(mesh.axis_names)} does not have")
        out.append(axes)
    return out


def _explicit_axes(a):
    """The mesh axes of each dimension of a traced array whose sharding is in its type (a mesh of
    Explicit axes), and that mesh; (None, None) where there is none."""
    sharding = getattr(jax.typeof(a), "sharding", None)
    mesh = getattr(sharding, "mesh", None)
    if mesh is None or mesh.empty:
        return None, None
    return axes_of_spec(sharding.spec, a.ndim), mesh


def axes_of_spec(spec, ndim):
    """The mesh axes (a tuple per dimension, () for none) of a PartitionSpec over ndim dimensions."""
    spec = tuple(spec) + (None,) * (ndim - len(spec))
    return [() if e is None else (e,) if isinstance(e, str) else tuple(e) for e in spec]


def resolve_layout(x, kernel_1, kernel_2, recipe, norm_input_axes, kernel_1_axes, kernel_2_axes, kernel_1_ndim):
    """The call's Layout, or None when it runs whole on one device. The axes arguments name the
    layout on the context's mesh; without them, arrays whose sharding is in their type (a mesh of
    Explicit axes) give theirs. kernel_1 is [H, A, F]. Raises InvalidArgumentError /
    NotSupportedError for a layout the block cannot run."""
    x_shape, ffn = x.shape, kernel_1.shape[2]
    if norm_input_axes is None and kernel_1_axes is None and kernel_2_axes is None:
        (x_axes, mesh), (k1, _), (k2, _) = _explicit_axes(x), _explicit_axes(kernel_1), _explicit_axes(kernel_2)
        if mesh is None or mesh.size == 1:
            return None
        kernel_1_ndim = 3
    else:
        mesh = _context_mesh()
        if mesh is None or mesh.size == 1:
            return None  # as TransformerEngine: the axes name a layout only where there is a mesh
        x_axes = _mesh_axes(norm_input_axes, mesh, "norm_input_axes")
        k1 = _mesh_axes(kernel_1_axes, mesh, "kernel_1_axes")
        k2 = _mesh_axes(kernel_2_axes, mesh, "kernel_2_axes")
    return layout_of_axes(mesh, x_shape, ffn, recipe, x_axes, k1, k2, kernel_1_ndim)


def layout_of_axes(mesh, x_shape, ffn, recipe, x_axes, k1, k2, kernel_1_ndim=3):
    """The Layout of a call on `mesh` whose x (of x_shape), kernel_1 ([H, A, F], or [H, F] where
    kernel_1_ndim is 2) and kernel_2 ([F, H]) lie over the mesh axes x_axes, k1 and k2 (a tuple
    of axes per dimension; None: whole), or None when it runs whole. Raises InvalidArgumentError /
    NotSupportedError for a layout the block cannot run."""
    if x_axes is None:
        x_axes = [()] * len(x_shape)
    if len(x_axes) != len(x_shape):
        raise InvalidArgumentError(f"norm_input_axes has {len(x_axes)} names for x's {len(x_shape)} dimensions")
    if x_axes[-1]:
        raise NotSupportedError(f"x's hidden dimension cannot be split over the mesh (norm_input_axes maps it to "
                                f"{x_axes[-1]}); split its token dimensions")
    if k1 is not None and len(k1) != kernel_1_ndim:
        raise InvalidArgumentError(f"kernel_1_axes has {len(k1)} names for kernel_1's {kernel_1_ndim} dimensions")
    if k2 is not None and len(k2) != 2:
        raise InvalidArgumentError(f"kernel_2_axes has {len(k2)} names for kernel_2's 2 dimensions")
    if k1 is not None and kernel_1_ndim == 3 and k1[1]:
        raise NotSupportedError(f"kernel_1's activation dimension cannot be split (kernel_1_axes maps it to {k1[1]})")
    tensor_1 = k1[-1] if k1 is not None else ()
    tensor_2 = k2[0] if k2 is not None else ()
    fsdp_1 = k1[0] if k1 is not None else ()  # the kernels' H dimensions
    fsdp_2 = k2[-1] if k2 is not None else ()
    if tensor_1 != tensor_2:
        raise InvalidArgumentError(
            f"kernel_1's F dimension is split over mesh axes {tensor_1} and kernel_2's over {tensor_2}: W1's columns "
            "and W2's rows must be split over the same tensor axis")
    token_axes = tuple(a for axes in x_axes[:-1] for a in axes)
    if len(set(token_axes)) != len(token_axes):
        raise InvalidArgumentError(f"norm_input_axes uses a mesh axis twice: {token_axes}")
    if set(tensor_1) & set(token_axes) and not set(tensor_1) <= set(token_axes):
        raise NotSupportedError(f"x's tokens are split over part of the tensor axes {tensor_1} only: sequence "
                                "parallelism splits them over all of them")
    for n, axes in zip(x_shape, x_axes):
        size = math.prod(mesh.shape[a] for a in axes)
        if n % size:
            raise InvalidArgumentError(f"x's dimension of {n} is not divisible by the {size} shards of mesh axes "
                                       f"{axes}")
    # Axes of size 1 split nothing: no collective over them.
    big = lambda axes: tuple(a for a in axes if mesh.shape[a] > 1)  # noqa: E731
    for what, axes in (("kernel_1", fsdp_1), ("kernel_2", fsdp_2)):
        if not set(big(axes)) <= set(token_axes) - set(tensor_1):
            raise NotSupportedError(
                f"{what}'s H dimension is split over mesh axes {axes}: FSDP splits the kernels' H over axes that split "
                f"x's tokens (and not over the tensor axes {tensor_1}); x's tokens are split over {token_axes}")
        size = math.prod(mesh.shape[a] for a in axes)
        if x_shape[-1] % size:
            raise InvalidArgumentError(f"H = {x_shape[-1]} is not divisible by the {size} shards of {what}'s H "
                                       f"dimension over mesh axes {axes}")
    layout = Layout(mesh=mesh, x_spec=P(*[a or None for a in x_axes]), tensor_axes=big(tensor_1),
                    token_axes=big(token_axes), w1_fsdp_axes=big(fsdp_1), w2_fsdp_axes=big(fsdp_2))
    if layout.tensor_size == 1 and math.prod(mesh.shape[a] for a in token_axes) == 1:
        return None
    if ffn % layout.tensor_size:
        raise InvalidArgumentError(f"F = {ffn} is not divisible by the {layout.tensor_size} shards of the tensor "
                                   f"axes {layout.tensor_axes}")
    if recipe is not None:
        name = type(recipe).__name__
        if name == "NVFP4BlockScaling" and (ffn // layout.tensor_size) % 16:
            raise NotSupportedError(
                f"NVFP4BlockScaling splits F only into whole blocks of 16: F / tensor shards = "
                f"{ffn // layout.tensor_size}")
        if name == "Float8BlockScaling" and not recipe.power_2_scale and (ffn // layout.tensor_size) % 128:
            raise NotSupportedError(
                f"Float8BlockScaling without power_2_scale needs F / tensor shards = {ffn // layout.tensor_size} to "
                "be a multiple of 128 (docs/sharding.md, 'FP8 recipes'); use power_2_scale=True")
    return layout


# ---- the two passes ------------------------------------------------------------------------------------

def _sum(a, axes):
    """a summed over mesh axes in fp32, back in its dtype."""
    return jax.lax.psum(a.astype(jnp.float32), axes).astype(a.dtype) if axes and a.size else a


def _partials_summed(a, layout, out_dtype):
    """GEMM2's (or dx's) per-rank partial rows summed in fp32 over the tensor axes: whole (psum)
    or, under sequence parallelism, this rank's rows (psum_scatter)."""
    a = a.astype(jnp.float32)
    if layout.sequence_parallel:
        a = jax.lax.psum_scatter(a, layout.tensor_axes, scatter_dimension=0, tiled=True)
    else:
        a = jax.lax.psum(a, layout.tensor_axes)
    return a.astype(out_dtype)


def _whole_h(w, axes, dim):
    """FSDP: a kernel's H shard gathered into the whole H (dimension dim) over its FSDP axes."""
    return jax.lax.all_gather(w, axes, axis=dim, tiled=True) if axes else w


def _weight_grad(g, layout, fsdp_axes, dim):
    """A kernel's gradient summed in fp32 over the data axes: whole, or under FSDP this rank's H
    shard of the sum (reduce-scattered along dimension dim over the FSDP axes)."""
    if not fsdp_axes:
        return _sum(g, layout.data_axes)
    g32 = g.astype(jnp.float32)
    rest = tuple(a for a in layout.data_axes if a not in fsdp_axes)
    if rest:
        g32 = jax.lax.psum(g32, rest)
    return jax.lax.psum_scatter(g32, fsdp_axes, scatter_dimension=dim, tiled=True).astype(g.dtype)


def _gathered(rows, layout):
    """Under sequence parallelism the rows of every rank of the tensor group; else rows."""
    if layout.sequence_parallel:
        return jax.lax.all_gather(rows, layout.tensor_axes, axis=0, tiled=True)
    return rows


def _agreed_state(state, spec, layout):
    """The delayed-scaling state after a call, made identical on every rank and equal to the
    unsharded call's: histories max-reduced over the split axes (the newest entry becomes the
    group's amax, older ones are identical already); each quantizer's scale taken from a rank
    whose reduced amax equals the group's (the scale is a function of that amax, so this is the
    scale the library computes for the group's history)."""
    if not spec.stateful:
        return state
    axes = layout.split_axes
    history = state[:, 1:]
    group_history = jax.lax.pmax(history, axes)

    def reduced(h):
        return h[:, 0] if spec.recipe.amax_compute_algo == "most_recent" else jnp.max(h, axis=1)

    mine, group = reduced(history), reduced(group_history)
    holds_it = (mine == group) | (jnp.isnan(mine) & jnp.isnan(group))
    scale = jax.lax.pmax(jnp.where(holds_it, state[:, 0], -jnp.inf), axes)
    return jnp.concatenate([scale[:, None], group_history], axis=1)


# Amaxes in stages: the quantizers whose amaxes each stage of a call measures.
_FORWARD_STAGES = ((_capi.QUANTIZER_LN_OUT, _capi.QUANTIZER_W1, _capi.QUANTIZER_W2), (_capi.QUANTIZER_ACT_OUT,))
_BACKWARD_STAGES = ((_capi.QUANTIZER_DY,), (_capi.QUANTIZER_DH,))


def _in_stages(spec):
    return spec.nvfp4 or (spec.recipe is not None and type(spec.recipe).__name__ == "Float8CurrentScaling")


def _given(stages):
    """The LNMLP_CALL_AMAX_GIVEN_* flags of the stages' quantizers."""
    return sum(_capi.CALL_AMAX_GIVEN_LN_OUT << q for stage in stages for q in stage)


def _group_amaxes(run, spec, stages, layout, amax=None, given=0):
    """Float8CurrentScaling or NVFP4BlockScaling split over the mesh: (the amax array of the
    group's amaxes, the LNMLP_CALL_AMAX_GIVEN_* flags of them), stage by stage: each stage's call
    measures its part of the stage's tensors, the earlier stages' group amaxes given (and those of
    `amax` that `given` flags), and the amaxes are max-reduced over the split axes. run(call's spec,
    amax array) returns the call's amax array."""
    if amax is None:
        amax = jnp.zeros((spec.amax_count,), jnp.float32)
    for stage in stages:
        measured = run(spec.with_(amax_flags=_capi.CALL_AMAX_MEASURE | given), amax)
        amax = jax.lax.pmax(measured, layout.split_axes)
        given |= _given((stage,))
    return amax, given


def _shard_map(f, mesh, in_specs, out_specs):
    """jax.shard_map (jax >= 0.7; jax.experimental's before), its replication unchecked: the
    outputs said to be replicated are made so by the collectives in f."""
    if hasattr(jax, "shard_map"):
        return jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)
    from jax.experimental.shard_map import shard_map

    return shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_rep=False)


def _local_spec(spec, layout, rows):
    """The configuration of one rank's call: its rows, its F shard, b2 left to after the sum."""
    tp = layout.tensor_size
    return spec.with_(tokens=rows, ffn=spec.ffn // tp, has_bias2=spec.has_bias2 and tp == 1)


def _local_rows(rows, layout):
    """This rank's part of rows that _gathered gathered (under sequence parallelism), else rows."""
    if not layout.sequence_parallel:
        return rows
    n = rows.shape[0] // layout.tensor_size
    return jax.lax.dynamic_slice_in_dim(rows, jax.lax.axis_index(layout.tensor_axes) * n, n)


def forward_local(spec, layout):
    """forward's body on one device of the mesh: (x, gamma, beta, w1, b1, w2, b2, state) of its
    shards -> (y shaped like its x, its saved bytes [1, n] (spec.saved_apart: the tuple of its
    sections, _calls.sections_shaped), the state, [its rows' norm output]), the collectives of the
    layout between the calls."""
    H, tp = spec.hidden, layout.tensor_size

    def local(x, gamma, beta, w1, b1, w2, b2, state):
        rows = _gathered(x.reshape(-1, H), layout)
        call_spec = _local_spec(spec, layout, rows.shape[0])
        w1, w2 = _whole_h(w1, layout.w1_fsdp_axes, 0), _whole_h(w2, layout.w2_fsdp_axes, 1)
        local_b2 = b2 if tp == 1 else _calls.absent(b2.dtype)
        args = (rows, gamma, beta, w1, b1, w2, local_b2)
        if _in_stages(spec):
            amax, given = _group_amaxes(lambda s, a: _calls.forward_call(s)(*args, a)[2], call_spec, _FORWARD_STAGES,
                                        layout)
            call_spec = call_spec.with_(amax_flags=given)
            y, saved, _ = _calls.forward_call(call_spec)(*args, amax)
            if spec.nvfp4:  # forward's group amaxes: backward's residual
                state = amax
        else:
            y, saved, state = _calls.forward_call(call_spec)(*args, state)
        if tp > 1:
            y32 = _partials_summed(y, layout, jnp.float32)
            y = (y32 + b2.astype(jnp.float32) if spec.has_bias2 else y32).astype(y.dtype)
        # The saved bytes stacked per device, or the sections apart as their own arrays.
        kept = _calls.sections_shaped(call_spec, saved) if spec.saved_apart else saved[None]
        outs = (y.reshape(x.shape), kept, _agreed_state(state, spec, layout))
        if spec.norm_output:  # the gathered rows' norm output; this rank's rows of it
            outs += (_local_rows(_calls.norm_output_of(call_spec, saved), layout).reshape(x.shape),)
        return outs

    return local


def forward(spec, layout, x, gamma, beta, w1, b1, w2, b2, state):
    """(y shaped like x, saved, state, norm output shaped like x or None). saved is the call's
    residual: the plan's bytes, or on a mesh every device's, stacked along a leading axis split over
    all the mesh's axes. The norm output (spec.norm_output) is read out of it, sharded as x."""
    H = spec.hidden
    if layout is None:
        y, saved, state = _calls.forward_call(spec)(x.reshape(-1, H), gamma, beta, w1, b1, w2, b2, state)
        ln = _calls.norm_output_of(spec, saved).reshape(x.shape) if spec.norm_output else None
        return y.reshape(x.shape), saved, state, ln
    w1_spec, b1_spec, w2_spec = layout.weight_specs(b1)
    out_specs = (layout.x_spec, layout.per_device, P()) + ((layout.x_spec,) if spec.norm_output else ())
    outs = _shard_map(forward_local(spec, layout), layout.mesh,
                      in_specs=(layout.x_spec, P(), P(), w1_spec, b1_spec, w2_spec, P(), P()),
                      out_specs=out_specs)(x, gamma, beta, w1, b1, w2, b2, state)
    return outs if spec.norm_output else (*outs, None)


def backward_local(spec, layout):
    """backward's body on one device of the mesh: (dy, x, gamma, beta, w1, b1, w2, saved, state)
    of its shards (saved as forward_local gave it) -> (dx, dgamma, dbeta, dw1, db1, dw2, db2,
    state), the collectives of the layout between the calls."""
    H, tp = spec.hidden, layout.tensor_size
    data = layout.data_axes

    def local(dy, x, gamma, beta, w1, b1, w2, saved, state):
        dy_rows = dy.reshape(-1, H)
        rows = _gathered(x.reshape(-1, H), layout)
        call_spec = _local_spec(spec, layout, rows.shape[0])
        w1, w2 = _whole_h(w1, layout.w1_fsdp_axes, 0), _whole_h(w2, layout.w2_fsdp_axes, 1)
        args = (_gathered(dy_rows, layout), rows, gamma, beta, w1, b1, w2, saved if spec.saved_apart else saved[0])
        if _in_stages(spec):
            amax, given, rng = None, 0, None
            if spec.nvfp4:  # forward's group amaxes given; the random state placed
                amax, rng = state if spec.draws_random else (state, None)
                given, state = _given(_FORWARD_STAGES), _calls.no_state()
                if rng is not None:
                    rng = _placed(rng, rows.shape[0], layout)
            amax, given = _group_amaxes(lambda s, a: _calls.backward_call(s)(*args, a, rng)[-1], call_spec,
                                        _BACKWARD_STAGES, layout, amax, given)
            dx, dgamma, dbeta, dw1, db1, dw2, db2, _ = _calls.backward_call(call_spec.with_(amax_flags=given))(
                *args, amax, rng)
        else:
            dx, dgamma, dbeta, dw1, db1, dw2, db2, state = _calls.backward_call(call_spec)(*args, state)
        if tp > 1:
            dx = _partials_summed(dx, layout, dx.dtype)
        if spec.has_bias2:
            # The sum of every rank's dy rows, in fp32 until the one rounding (the call has no b2
            # when F is split, and its db2 is of this rank's rows only, rounded).
            db2 = jnp.sum(dy_rows.astype(jnp.float32), axis=0)
            db2 = (jax.lax.psum(db2, layout.token_axes) if layout.token_axes else db2).astype(dy.dtype)
        # dgamma and dbeta: this rank's rows, and split along F its part of dn; the weights'
        # gradients: this rank's rows.
        dgamma, dbeta = _sum(dgamma, layout.split_axes), _sum(dbeta, layout.split_axes)
        dw1, db1 = _weight_grad(dw1, layout, layout.w1_fsdp_axes, 0), _sum(db1, data)
        dw2 = _weight_grad(dw2, layout, layout.w2_fsdp_axes, 1)
        return dx.reshape(x.shape), dgamma, dbeta, dw1, db1, dw2, db2, _agreed_state(state, spec, layout)

    return local


def _placed(rng_state, rows, layout):
    """The random operand of a call of `rows` rows on the mesh: the random state, placed in the whole
    tensors (lnmlp_plan_set_rng_place): its rows the group's run of them that its data axes' index
    says, its F the tensor axes' part."""
    data = layout.data_axes
    groups = math.prod(layout.mesh.shape[a] for a in data)
    first = jax.lax.axis_index(data) * rows if data else 0
    part = jax.lax.axis_index(layout.tensor_axes) if layout.tensor_axes else 0
    return _calls.random_operand(rng_state, first, rows * groups, part, layout.tensor_size)


def backward(spec, layout, dy, x, gamma, beta, w1, b1, w2, saved, state):
    """(dx, dgamma, dbeta, dw1, db1, dw2, db2, state) for forward's residuals."""
    H = spec.hidden
    if layout is None:
        dx, *grads = _calls.backward_call(spec)(dy.reshape(-1, H), x.reshape(-1, H), gamma, beta, w1, b1, w2, saved,
                                                state)
        return (dx.reshape(x.shape), *grads)
    local = backward_local(spec, layout)
    w1_spec, b1_spec, w2_spec = layout.weight_specs(b1)
    state_spec = (P(), P()) if isinstance(state, tuple) else P()  # NVFP4's (amaxes, random state)
    return _shard_map(local, layout.mesh,
                      in_specs=(layout.x_spec, layout.x_spec, P(), P(), w1_spec, b1_spec, w2_spec, layout.per_device,
                                state_spec),
                      out_specs=(layout.x_spec, P(), P(), w1_spec, b1_spec, w2_spec, P(), P()))(
        dy, x, gamma, beta, w1, b1, w2, saved, state)
