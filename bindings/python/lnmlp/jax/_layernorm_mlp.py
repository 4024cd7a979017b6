"""``lnmlp.jax.layernorm_mlp``: TransformerEngine's JAX ``layernorm_mlp`` as a native JAX op.

The block is a ``jax.custom_vjp`` whose forward and backward are lnmlp's, through the XLA FFI
custom calls of ``_calls.py``: one call each on one device, or on a device mesh one per device
with XLA's collectives between them (``_sharding.py``).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from .. import _plan
from .._functional import unpack_kernels_and_biases
from .._lib import InvalidArgumentError, NotSupportedError
from . import _auto, _ffi, _sharding, _te_arguments
from ._calls import Spec, absent, no_state
from ._quantizer_set import QuantizerSet

__all__ = ["layernorm_mlp", "noop_quantizer_set"]

#: TransformerEngine's ``noop_quantizer_set``: no FP8 quantization.
noop_quantizer_set = None


# ---- the differentiable block ------------------------------------------------------------------------

# The block's outputs: y, or (y, norm output) for spec.norm_output.

@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _block(spec, layout, saved_names, x, gamma, beta, w1, b1, w2, b2, state):
    # Not differentiated: a plan that saves nothing (but the norm output, when asked for); the
    # state's update has nowhere to go (the seed's function returns y alone), as in
    # TransformerEngine.
    inference = spec.with_(remat="forward_only")
    if spec.draws_random:  # the random state is backward's; forward takes the stand-in
        state = no_state()
    if layout is None:  # split as XLA's partitioning places the operands, if it does (_auto.py)
        y, ln = _auto.forward(inference, x, gamma, beta, w1, b1, w2, b2, state)
    else:
        y, _, _, ln = _sharding.forward(inference, layout, x, gamma, beta, w1, b1, w2, b2, state)
    return (y, ln) if spec.norm_output else y


def _block_fwd(spec, layout, saved_names, x, gamma, beta, w1, b1, w2, b2, state):
    rng = state if spec.draws_random else None  # the random state: backward's operand, kept here
    if rng is not None:
        state = no_state()
    if layout is None:  # split as XLA's partitioning places the operands, if it does (_auto.py)
        y, saved, state, ln = _auto.train_forward(spec, x, gamma, beta, w1, b1, w2, b2, state)
    else:
        y, saved, state, ln = _sharding.forward(spec, layout, x, gamma, beta, w1, b1, w2, b2, state)
    # The saved buffer -- norm statistics, norm output, GEMM1 output ("ffn1"), activation output --
    # is the residual TransformerEngine names ffn1_ckpt_name (and, under FP8, whose codes are the
    # quantized operands its quantization_checkpoint_name names): a jax.checkpoint policy that
    # saves one of saved_names keeps it, one that does not recomputes it (the forward runs again in
    # backward).
    for name in saved_names:
        saved = checkpoint_name(saved, name)
    # The state residual: delayed scaling's, or on a mesh NVFP4's group amaxes (_sharding.py); with
    # stochastic rounding the random state, beside the amaxes on a mesh.
    if rng is not None:
        state = rng if layout is None else (state, rng)
    return ((y, ln) if spec.norm_output else y), (x, gamma, beta, w1, b1, w2, saved, state)


def _norm_output_grads(spec, x, gamma, beta, dln):
    """The fp32 gradients of x, gamma (and beta, for layernorm) that the norm output's cotangent
    contributes: the VJP of the norm of docs/design.md, where TransformerEngine adds that cotangent
    to the norm's backward. (The library's backward takes no second cotangent, so this one pass
    over [T, H] runs beside it, and each gradient is rounded twice: once by the library, once
    after the sum.)"""
    H, f32 = spec.hidden, jnp.float32
    shift = 1.0 if spec.zero_centered_gamma else 0.0

    def norm(x, gamma, *beta):
        x = x.reshape(-1, H).astype(f32)
        if spec.norm_type == "layernorm":
            x = x - jnp.mean(x, axis=-1, keepdims=True)
        xhat = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + spec.epsilon)
        n = xhat * (gamma.astype(f32) + shift)
        return n + beta[0].astype(f32) if beta else n

    params = (x, gamma, beta) if spec.norm_type == "layernorm" else (x, gamma)
    return jax.vjp(norm, *params)[1](dln.reshape(-1, H).astype(f32))


def _block_bwd(spec, layout, saved_names, residuals, cotangent):
    x, gamma, beta, w1, b1, w2, _, state_in = residuals
    dy, dln = cotangent if spec.norm_output else (cotangent, None)
    if spec.draws_random and spec.backend != "cpu":
        raise NotSupportedError(
            "lnmlp.jax runs NVFP4BlockScaling's stochastic rounding on the CPU platform only in this version (the "
            "random state would have to be read from the GPU on the host); use disable_stochastic_rounding=True, or "
            "lnmlp.torch / lnmlp.Plan on CUDA")
    if layout is None:
        *grads, state = _auto.train_backward(spec, dy, *residuals)
    else:
        *grads, state = _sharding.backward(spec, layout, dy, *residuals)
    if dln is not None:
        for i, extra in enumerate(_norm_output_grads(spec, x, gamma, beta, dln)):
            grads[i] = (grads[i].astype(jnp.float32) + extra.reshape(grads[i].shape)).astype(grads[i].dtype)
    # Every gradient in its parameter's dtype: a plan with fp32 kernels under FP8 gives the biases'
    # gradients in fp32 too (weight_dtype covers all four), while the biases themselves are x's
    # dtype here (b2, not a residual, always is).
    dtypes = [a.dtype for a in (x, gamma, beta, w1, b1, w2)] + [jnp.dtype(spec.dtype)]
    grads = [g.astype(dt) for g, dt in zip(grads, dtypes)]
    # The state's "cotangent" is the state after this step (TransformerEngine's convention); an
    # integer random state has none (float0).
    if spec.draws_random:
        rng = state_in if layout is None else state_in[1]
        state = np.zeros(rng.shape, jax.dtypes.float0)
    return (*grads, state)


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
                  act_params=None, *te_positional, activation_params=None, collective_op_sets=None,
                  quantizer_sets=None):
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

    On a device mesh (``jax.set_mesh``), ``norm_input_axes`` (x's dimensions), ``kernel_1_axes``
    and ``kernel_2_axes`` -- mesh axes, or logical names mapped by flax's logical axis rules --
    split the block: x's tokens over data axes, W1's columns, b1 and W2's rows over the tensor
    axis, the tokens over the tensor axis too for sequence parallelism; XLA runs the collectives
    (``_sharding.py``, docs/jax-mesh.md). ``dot_1_input_axes`` and ``dot_2_input_axes`` follow from
    them (the norm output whole over the tensor axis, the activation split along F) and are not
    read. Without a mesh the axes change nothing, as in TransformerEngine;
    ``transpose_batch_sequence`` changes nothing, since every leading dimension is flattened into
    tokens anyway.

    TransformerEngine's current spelling is read beside the seed's, by keyword (positionally the
    seed's order stands; ``_te_arguments.py``): ``quantizer_sets=(ffn1, ffn2)``, the two halves of
    one set (:func:`make_quantizer_sets`), or ``(noop, noop)``; ``activation_params``, a dict for the
    clamped SwiGLU pair (ignored for other activations, as TE ignores it); ``collective_op_sets``,
    noop sets only (lnmlp does not run TE's collective GEMM). Recipes may be TE's own objects.
    """
    del transpose_batch_sequence, dot_1_input_axes, dot_2_input_axes
    quantizer_set, act_params = _te_arguments.resolve(
        _plan.normalize_activations(activation_type), quantizer_set, act_params, te_positional, activation_params,
        collective_op_sets, quantizer_sets)
    return _layernorm_mlp(x, gamma, beta, kernels, biases, norm_type, zero_centered_gamma, epsilon, norm_input_axes,
                          kernel_1_axes, kernel_2_axes, ffn1_ckpt_name, ffn2_ckpt_name, activation_type, quantizer_set,
                          act_params)


def _layernorm_mlp(x, gamma, beta, kernels, biases, norm_type, zero_centered_gamma, epsilon, norm_input_axes,
                   kernel_1_axes, kernel_2_axes, ffn1_ckpt_name, ffn2_ckpt_name, activation_type, quantizer_set,
                   act_params, norm_output=False, quantization_checkpoint_name=None):
    """layernorm_mlp's work; with ``norm_output`` it returns ``(y, norm output)``, the norm output
    shaped like x in x's dtype (the Flax module's ``return_layernorm_output``).
    ``quantization_checkpoint_name`` (the Flax module's) names the saved residual too under FP8."""
    if quantizer_set is not None and not isinstance(quantizer_set, QuantizerSet):
        raise InvalidArgumentError(
            "quantizer_set must be noop_quantizer_set (None) or a set made by lnmlp.jax.make_quantizer_set(recipe), "
            f"got {type(quantizer_set).__name__}")
    recipe = None if quantizer_set is None else quantizer_set.recipe
    state = no_state()
    if recipe is not None and recipe.stateful:
        state = jnp.asarray(quantizer_set.state)
        want = (6, 1 + recipe.amax_history_len)
        if state.shape != want or state.dtype != jnp.float32:
            raise InvalidArgumentError(f"the quantizer set's state must be float32 {want}, got "
                                       f"{state.dtype} {tuple(state.shape)}")
    elif recipe is not None and recipe.draws_random:
        if quantizer_set.state is None:
            raise InvalidArgumentError("the quantizer set has no random state: make it with "
                                       "lnmlp.jax.make_quantizer_set(recipe, seed=...)")
        state = jnp.asarray(quantizer_set.state)
        if state.shape != (4,) or state.dtype != jnp.uint32:
            raise InvalidArgumentError(f"the quantizer set's random state must be uint32 (4,), got "
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
    kernel_1_ndim = kernel_1.ndim
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
    beta = cast(beta) if norm_type == "layernorm" else absent(dt)
    b1 = cast(bias_1) if bias_1 is not None else absent(dt)
    b2 = cast(bias_2) if bias_2 is not None else absent(dt)
    tokens = int(math.prod(x.shape[:-1]))
    spec = Spec(tokens=tokens, hidden=H, ffn=F, norm_type=norm_type, zero_centered_gamma=bool(zero_centered_gamma),
                 epsilon=float(epsilon), activations=activations, act_params=act_params,
                 has_bias1=bias_1 is not None, has_bias2=bias_2 is not None, dtype=dtype, remat="save_all",
                 backend=_backend_of_default_device(), recipe=recipe, weight_dtype=weight_dtype,
                 norm_output=bool(norm_output))
    layout = _sharding.resolve_layout(x, kernel_1, kernel_2, recipe, norm_input_axes, kernel_1_axes, kernel_2_axes,
                                      kernel_1_ndim)
    _ffi.ensure_registered()
    saved_names = (ffn1_ckpt_name,) + ((quantization_checkpoint_name,) if quantization_checkpoint_name and recipe
                                       else ())
    out = _block(spec, layout, saved_names, x, gamma, beta, kernel_1, b1, kernel_2, b2, state)
    # The block's output is the GEMM2 output TransformerEngine names ffn2_ckpt_name.
    if norm_output:
        return checkpoint_name(out[0], ffn2_ckpt_name), out[1]
    return checkpoint_name(out, ffn2_ckpt_name)
