"""``lnmlp.jax.layernorm_mlp``: TransformerEngine's JAX ``layernorm_mlp`` as a native JAX op.

The block is a ``jax.custom_vjp`` whose forward and backward are XLA FFI custom calls into lnmlp
(``_ffi.py``, handlers in bindings/python/xla_ffi). Each call's configuration -- shapes, norm,
activations, biases, dtype, what forward saves -- is a static ``_Spec``; XLA gets it as the custom
call's attributes and instantiates (or reuses) the lnmlp plan for it. Forward returns y and the
plan's ``saved`` bytes, the residual backward reads; on a GPU XLA allocates the plan's workspace as
one more output of each call (on the CPU the plan owns it: xla_ffi/plan_cache.cpp says why).

Under ``jax.vmap`` a call batched in x (and dy) only is one call with the batch folded into the
tokens; any other batching (batched weights, a cotangent batched alone as ``jax.jacrev`` does) runs
the batch one element after another with ``jax.lax.map``.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from .. import _plan
from .._functional import unpack_kernels_and_biases
from .. import _lib
from .._lib import InvalidArgumentError
from .. import recipe as _recipe
from ..recipe import Recipe
from . import _ffi
from ._quantizer_set import QuantizerSet

__all__ = ["layernorm_mlp", "noop_quantizer_set"]

#: TransformerEngine's ``noop_quantizer_set``: no FP8 quantization.
noop_quantizer_set = None



@dataclasses.dataclass(frozen=True)
class _Spec:
    """One call's configuration: what the lnmlp plan behind it is made for (hashable: it keys the
    size and custom-call caches, and XLA gets it as attributes)."""

    tokens: int
    hidden: int
    ffn: int
    norm_type: str
    zero_centered_gamma: bool
    epsilon: float
    activations: tuple
    act_params: tuple  # (limit, alpha, offset) of the clamped SwiGLU; the defaults otherwise
    has_bias1: bool
    has_bias2: bool
    dtype: str  # "float32", "bfloat16" or "float16"
    remat: str  # "save_all" for a call that is differentiated, "forward_only" for one that is not
    backend: str  # "cpu" or "cuda"
    recipe: Recipe = None  # the FP8 recipe (None: no quantization)
    # "float32": fp32 kernels under an FP8 recipe with a bf16/f16 x, quantized directly (their
    # gradients fp32 too); None: the kernels are in x's dtype.
    weight_dtype: str = None

    @property
    def stateful(self):
        return self.recipe is not None and self.recipe.stateful

    def with_(self, **changes):
        return dataclasses.replace(self, **changes)

    def plan_kwargs(self):
        ap = dict(zip(("limit", "alpha", "offset"), self.act_params))
        clamped = self.activations == _plan.GATED_PAIRS["clamped_swiglu"]
        return dict(tokens=max(self.tokens, 1), hidden=self.hidden, ffn=self.ffn, norm_type=self.norm_type,
                    zero_centered_gamma=self.zero_centered_gamma, epsilon=self.epsilon,
                    activation_type=self.activations, act_params=ap if clamped else None,
                    use_bias1=self.has_bias1, use_bias2=self.has_bias2, dtype=self.dtype, remat=self.remat,
                    backend=self.backend, recipe=self.recipe, weight_dtype=self.weight_dtype,
                    grad_dtype=self.weight_dtype)

    def attributes(self):
        """The custom call's attributes, with the exact types liblnmlp_xla's handlers decode."""
        i32, i64, f32 = np.int32, np.int64, np.float32
        acts = [_plan.ACTIVATIONS[a] for a in self.activations]
        fp8 = self.recipe._settings() if self.recipe is not None else _recipe._DEFAULT_SETTINGS
        return dict(tokens=i64(max(self.tokens, 1)), hidden=i64(self.hidden), ffn=i64(self.ffn),
                    norm=i32(_plan._NORMS[self.norm_type]), zero_centered_gamma=i32(self.zero_centered_gamma),
                    epsilon=f32(self.epsilon), act0=i32(acts[0]), act1=i32(acts[1] if len(acts) > 1 else -1),
                    clamp_limit=f32(self.act_params[0]), clamp_alpha=f32(self.act_params[1]),
                    clamp_offset=f32(self.act_params[2]), has_bias1=i32(self.has_bias1),
                    has_bias2=i32(self.has_bias2), dtype=i32(_plan._DTYPES[np.dtype(jnp.dtype(self.dtype))]),
                    remat=i32(_plan._REMATS[self.remat]), recipe=i32(fp8["recipe"]),
                    fp8_format=i32(fp8["fp8_format"]), margin=i32(fp8["margin"]),
                    amax_history_len=i64(fp8["amax_history_len"]), amax_compute_algo=i32(fp8["amax_compute_algo"]),
                    power_2_scale=i32(fp8["power_2_scale"]), amax_epsilon=f32(fp8["amax_epsilon"]),
                    backend=i32(_plan._BACKENDS[self.backend]), device=i32(0),
                    weight_dtype=i32(-1 if self.weight_dtype is None else
                                     _plan._DTYPES[np.dtype(jnp.dtype(self.weight_dtype))]))


# The outputs of each custom call, as lnmlp_plan_get_tensor_shape names them (a tensor the plan
# does not take is a zero-element stand-in).
_FORWARD_OUTPUTS = ("y", "saved")
_BACKWARD_OUTPUTS = ("dx", "dgamma", "dbeta", "dw1", "db1", "dw2", "db2")


@functools.lru_cache(maxsize=512)
def _output_types(spec: _Spec):
    """{name: jax.ShapeDtypeStruct} of a call's outputs, as the library's shape query gives them for
    the call's tokens: the tensors above, "fp8_state", and "workspace" -- on a GPU the plan's
    workspace plus its alignment (the handler rounds XLA's buffer start up to it), on the CPU
    nothing (the plan owns its workspace: xla_ffi/plan_cache.cpp says why)."""
    types = {}
    with _plan.Plan(**spec.plan_kwargs(), external_workspace=True) as p:
        for name in _FORWARD_OUTPUTS + _BACKWARD_OUTPUTS + ("fp8_state",):
            shape, dtype = p._tensor_shape(_lib.TENSORS[name], spec.tokens, with_dtype=True)
            types[name] = jax.ShapeDtypeStruct(shape if shape is not None else (0,),
                                               dtype if dtype is not None else np.float32)
        workspace = 0 if spec.backend == "cpu" else p.workspace_bytes + p.alignment
    types["workspace"] = jax.ShapeDtypeStruct((workspace,), jnp.uint8)
    return types


def _absent(dtype):
    """The zero-element stand-in of a tensor the configuration does not take."""
    return jnp.zeros((0,), dtype)


def _no_state():
    return jnp.zeros((0,), jnp.float32)


# ---- the custom calls, each with its batching rule -------------------------------------------------

def _sequential(fn, axis_size, in_batched, args):
    """fn over the batch, one element at a time (jax.lax.map); unbatched args are shared."""
    batched = [a for a, b in zip(args, in_batched) if b]

    def one(xs):
        it = iter(xs)
        return fn(*[next(it) if b else a for a, b in zip(args, in_batched)])

    outs = jax.lax.map(one, batched)
    return outs, (True,) * len(outs)


@functools.lru_cache(maxsize=512)
def _forward_call(spec: _Spec):
    """(x, gamma, beta, w1, b1, w2, b2, state) -> (y, saved, state) for spec's tokens."""
    out = _output_types(spec)
    # The state (argument 7) is updated in place: XLA aliases it to output 3.
    call = jax.ffi.ffi_call(
        _ffi.FORWARD, tuple(out[n] for n in _FORWARD_OUTPUTS + ("workspace", "fp8_state")),
        input_output_aliases={7: 3} if spec.stateful else None)
    attrs = spec.attributes()

    @jax.custom_batching.custom_vmap
    def forward(x, gamma, beta, w1, b1, w2, b2, state):
        y, saved, _, state = call(x, gamma, beta, w1, b1, w2, b2, state, **attrs)
        return y, saved, state

    @forward.def_vmap
    def forward_batched(axis_size, in_batched, x, gamma, beta, w1, b1, w2, b2, state):
        args = (x, gamma, beta, w1, b1, w2, b2, state)
        if in_batched[0] and not any(in_batched[1:]):
            # Only x is batched: one call with the batch folded into the tokens. saved is that
            # call's, so it stays unbatched (backward's rule below reads it whole).
            big = spec.with_(tokens=axis_size * spec.tokens)
            y, saved, state = _forward_call(big)(x.reshape(big.tokens, spec.hidden), *args[1:])
            return (y.reshape(axis_size, spec.tokens, spec.hidden), saved, state), (True, False, False)
        return _sequential(forward, axis_size, in_batched, args)

    return forward


@functools.lru_cache(maxsize=512)
def _backward_call(spec: _Spec):
    """(dy, x, gamma, beta, w1, b1, w2, saved, state) -> (dx, dgamma, dbeta, dw1, db1, dw2, db2, state)."""
    out = _output_types(spec)
    # The state (argument 8) is updated in place: XLA aliases it to output 8.
    call = jax.ffi.ffi_call(
        _ffi.BACKWARD, tuple(out[n] for n in _BACKWARD_OUTPUTS + ("workspace", "fp8_state")),
        input_output_aliases={8: 8} if spec.stateful else None)
    attrs = spec.attributes()

    @jax.custom_batching.custom_vmap
    def backward(dy, x, gamma, beta, w1, b1, w2, saved, state):
        *grads, _, state = call(dy, x, gamma, beta, w1, b1, w2, saved, state, **attrs)
        return (*grads, state)

    @backward.def_vmap
    def backward_batched(axis_size, in_batched, dy, x, gamma, beta, w1, b1, w2, saved, state):
        args = (dy, x, gamma, beta, w1, b1, w2, saved, state)
        if in_batched[0] and in_batched[1] and not any(in_batched[2:]):
            # dy and x batched, saved whole: the backward of forward_batched's one call.
            big = spec.with_(tokens=axis_size * spec.tokens)
            rows = (big.tokens, spec.hidden)
            dx, *rest = _backward_call(big)(dy.reshape(rows), x.reshape(rows), *args[2:])
            dx = dx.reshape(axis_size, spec.tokens, spec.hidden)
            return (dx, *rest), (True,) + (False,) * len(rest)
        return _sequential(backward, axis_size, in_batched, args)

    return backward


# ---- the differentiable block ------------------------------------------------------------------------

@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _block(spec, ffn1_name, x, gamma, beta, w1, b1, w2, b2, state):
    # Not differentiated: a plan that saves nothing; the state's update has nowhere to go (the
    # seed's function returns y alone), as in TransformerEngine.
    y, _, _ = _forward_call(spec.with_(remat="forward_only"))(x, gamma, beta, w1, b1, w2, b2, state)
    return y


def _block_fwd(spec, ffn1_name, x, gamma, beta, w1, b1, w2, b2, state):
    y, saved, state = _forward_call(spec)(x, gamma, beta, w1, b1, w2, b2, state)
    # The saved buffer -- norm statistics, norm output, GEMM1 output ("ffn1"), activation output --
    # is the residual TransformerEngine names ffn1_ckpt_name: a jax.checkpoint policy that saves
    # the name keeps it, one that does not recomputes it (the forward runs again in backward).
    saved = checkpoint_name(saved, ffn1_name)
    return y, (x, gamma, beta, w1, b1, w2, saved, state)


def _block_bwd(spec, ffn1_name, residuals, dy):
    x, gamma, beta, w1, b1, w2, saved, state = residuals
    dx, dgamma, dbeta, dw1, db1, dw2, db2, state = _backward_call(spec)(dy, x, gamma, beta, w1, b1, w2, saved,
                                                                        state)
    # The state's "cotangent" is the state after this step (TransformerEngine's convention).
    return dx, dgamma, dbeta, dw1, db1, dw2, db2, state


_block.defvjp(_block_fwd, _block_bwd)


# ---- the public function -----------------------------------------------------------------------------

def _dtype_name(a, name):
    dt = jnp.dtype(a.dtype)
    if np.dtype(dt) not in _plan._DTYPES:
        raise InvalidArgumentError(f"{name} must be float32, bfloat16 or float16, got {dt.name}")
    return dt.name


def _shape_error(name, want, got):
    return InvalidArgumentError(f"{name} must have shape {want}, got {tuple(got)}")


def _act_params_tuple(activations, act_params):
    p = _plan.act_params_for(activations, act_params) or _plan.ActParams()
    return (float(p.limit), float(p.alpha), float(p.offset))


def _backend_of_default_device():
    return "cuda" if jax.default_backend() == "gpu" else "cpu"


def layernorm_mlp(x, gamma, beta, kernels, biases, norm_type, zero_centered_gamma=False, epsilon=1e-6,
                  transpose_batch_sequence=False, norm_input_axes=None, dot_1_input_axes=None,
                  dot_2_input_axes=None, kernel_1_axes=None, kernel_2_axes=None, ffn1_ckpt_name="ffn1",
                  ffn2_ckpt_name="ffn2", activation_type=("relu",), quantizer_set=noop_quantizer_set,
                  act_params=None):
    """``act(norm(x) @ kernel_1 + bias_1) @ kernel_2 + bias_2``: TransformerEngine's JAX
    ``layernorm_mlp``, signature and defaults, as one fused JAX op (forward and backward are
    lnmlp's, through XLA FFI). Works under ``jax.jit``, ``jax.grad``, ``jax.value_and_grad``,
    ``jax.vjp`` and ``jax.vmap``.

    x: [..., H] (float32, bfloat16 or float16; every leading dimension is a token); gamma, beta:
    [H] (beta is ignored for rmsnorm); kernels = [kernel_1 [H, A, F] (or [H, A*F]), kernel_2
    [F, H]]; biases = [bias_1 [A, F] (or [A*F]) or None, bias_2 [H] or None]. A is 1, or 2 for a
    gated pair such as ("silu", "linear"). Parameters in another floating dtype than x are cast
    to x's dtype (their gradients come back in their own), except float32 kernels with a bfloat16
    or float16 x under an FP8 quantizer set: those are quantized from their float32 values, as
    TransformerEngine does, and their gradients computed in float32. Returns y shaped like x.

    The axes arguments name mesh axes for sharding and have no effect on one device;
    ``transpose_batch_sequence`` changes nothing, since every leading dimension is flattened into
    tokens anyway.
    """
    del transpose_batch_sequence, norm_input_axes, dot_1_input_axes, dot_2_input_axes
    del kernel_1_axes, kernel_2_axes
    if quantizer_set is not None and not isinstance(quantizer_set, QuantizerSet):
        raise InvalidArgumentError(
            "quantizer_set must be noop_quantizer_set (None) or a set made by lnmlp.jax.make_quantizer_set(recipe), "
            f"got {type(quantizer_set).__name__}")
    recipe = None if quantizer_set is None else quantizer_set.recipe
    state = _no_state()
    if recipe is not None and recipe.stateful:
        state = jnp.asarray(quantizer_set.state)
        want = (6, 1 + recipe.amax_history_len)
        if state.shape != want or state.dtype != jnp.float32:
            raise InvalidArgumentError(f"the quantizer set's state must be float32 {want}, got "
                                       f"{state.dtype} {tuple(state.shape)}")
    if not isinstance(norm_type, str) or norm_type.lower() not in _plan._NORMS:
        raise InvalidArgumentError(f"norm_type must be 'layernorm' or 'rmsnorm', got {norm_type!r}")
    norm_type = norm_type.lower()
    kernel_1, kernel_2, bias_1, bias_2 = unpack_kernels_and_biases(kernels, biases)
    activations = _plan.normalize_activations(activation_type)
    act_params = _act_params_tuple(activations, act_params)
    A = len(activations)

    x = jnp.asarray(x)
    dtype = _dtype_name(x, "x")
    if x.ndim < 1:
        raise InvalidArgumentError("x must have shape [..., H], got a scalar")
    H = int(x.shape[-1])
    kernel_1, kernel_2 = jnp.asarray(kernel_1), jnp.asarray(kernel_2)
    if kernel_1.ndim == 2 and kernel_1.shape[0] == H and kernel_1.shape[1] % A == 0:
        kernel_1 = kernel_1.reshape(H, A, kernel_1.shape[1] // A)
    if kernel_1.ndim != 3 or kernel_1.shape[:2] != (H, A):
        raise _shape_error("kernel_1", f"(H, A, F) = ({H}, {A}, F) or (H, A*F)", kernel_1.shape)
    F = int(kernel_1.shape[2])
    if kernel_2.shape != (F, H):
        raise _shape_error("kernel_2", (F, H), kernel_2.shape)
    gamma = jnp.asarray(gamma)
    if gamma.shape != (H,):
        raise _shape_error("gamma", (H,), gamma.shape)
    if norm_type == "layernorm":
        if beta is None:
            raise InvalidArgumentError("beta is None, but layernorm needs it (shape (H,))")
        beta = jnp.asarray(beta)
        if beta.shape != (H,):
            raise _shape_error("beta", (H,), beta.shape)
    if bias_1 is not None:
        bias_1 = jnp.asarray(bias_1)
        if bias_1.shape == (A * F,):
            bias_1 = bias_1.reshape(A, F)
        if bias_1.shape != (A, F):
            raise _shape_error("bias_1", f"(A, F) = ({A}, {F}) or (A*F,)", bias_1.shape)
    if bias_2 is not None:
        bias_2 = jnp.asarray(bias_2)
        if bias_2.shape != (H,):
            raise _shape_error("bias_2", (H,), bias_2.shape)
    for name, p in (("gamma", gamma), ("beta", beta), ("kernel_1", kernel_1), ("kernel_2", kernel_2),
                    ("bias_1", bias_1), ("bias_2", bias_2)):
        if p is not None:
            _dtype_name(p, name)

    dt = jnp.dtype(dtype)
    cast = lambda p: None if p is None else p.astype(dt)  # noqa: E731 (TE casts parameters to x's dtype)
    weight_dtype = None
    if recipe is not None and dt != jnp.float32 and jnp.float32 in (kernel_1.dtype, kernel_2.dtype):
        # fp32 (master) kernels under FP8 are quantized from their fp32 values, as TransformerEngine
        # quantizes them, not rounded to x's dtype first; their gradients come back in fp32.
        weight_dtype = "float32"
        kernel_1, kernel_2 = kernel_1.astype(jnp.float32), kernel_2.astype(jnp.float32)
    else:
        kernel_1, kernel_2 = cast(kernel_1), cast(kernel_2)
    gamma = cast(gamma)
    beta = cast(beta) if norm_type == "layernorm" else _absent(dt)
    b1 = cast(bias_1) if bias_1 is not None else _absent(dt)
    b2 = cast(bias_2) if bias_2 is not None else _absent(dt)
    tokens = int(math.prod(x.shape[:-1]))
    spec = _Spec(tokens=tokens, hidden=H, ffn=F, norm_type=norm_type, zero_centered_gamma=bool(zero_centered_gamma),
                 epsilon=float(epsilon), activations=activations, act_params=act_params,
                 has_bias1=bias_1 is not None, has_bias2=bias_2 is not None, dtype=dtype, remat="save_all",
                 backend=_backend_of_default_device(), recipe=recipe, weight_dtype=weight_dtype)
    _ffi.ensure_registered()
    y = _block(spec, ffn1_ckpt_name, x.reshape(tokens, H), gamma, beta, kernel_1, b1, kernel_2, b2, state)
    # The block's output is the GEMM2 output TransformerEngine names ffn2_ckpt_name.
    return checkpoint_name(y.reshape(x.shape), ffn2_ckpt_name)
