"""``lnmlp.torch.layernorm_mlp``: TransformerEngine's ``layernorm_mlp`` signature on torch tensors,
and the checked call into the ops (``_ops.py``) that the module shares.
"""

from __future__ import annotations

import math

import torch

from .. import _plan
from .._functional import unpack_kernels_and_biases
from .._lib import InvalidArgumentError
from ..recipe import QUANTIZERS, Recipe, as_recipe, check_history, check_scale
from . import _ops

__all__ = ["layernorm_mlp", "noop_quantizer_set", "QuantizerSet", "make_quantizer_set"]

#: TransformerEngine's ``noop_quantizer_set``: no FP8 quantization.
noop_quantizer_set = None


class QuantizerSet:
    """The FP8 quantizers of one layernorm_mlp call site: ``recipe`` (an lnmlp recipe) and, for
    delayed scaling, ``state``: a float32 tensor ``[6, 1 + amax_history_len]`` (per quantizer in
    ``lnmlp.QUANTIZERS`` order -- ln_out, w1, act_out, w2, dy, dh -- its scale, then its amax
    history, newest first; the library's LNMLP_TENSOR_FP8_STATE layout). Each forward updates the
    forward quantizers' rows in place, each backward the dy and dh rows: the PyTorch way, as a
    module's buffer is. Move it with :meth:`to` to the tensors' device. Use one set per layer."""

    def __init__(self, recipe: Recipe, state: torch.Tensor | None = None, device="cpu"):
        lnmlp_recipe = as_recipe(recipe)  # a TransformerEngine recipe object: the lnmlp recipe it equals
        if lnmlp_recipe is None:
            raise InvalidArgumentError(f"a quantizer set needs an lnmlp recipe (or TransformerEngine's), got "
                                       f"{type(recipe).__name__}")
        recipe = lnmlp_recipe
        self.recipe = recipe
        if recipe.stateful and state is None:
            state = fresh_state(recipe, device)
        self.state = state if recipe.stateful else None

    def __repr__(self):
        return f"lnmlp.torch.QuantizerSet({self.recipe!r})"

    def to(self, device) -> "QuantizerSet":
        if self.state is not None:
            self.state = self.state.to(device)
        return self

    def state_dict(self) -> dict:
        """``{name: {"scale": float, "amax_history": tensor}}`` (copies; ``{}`` when stateless)."""
        if self.state is None:
            return {}
        s = self.state.detach().cpu()
        return {n: {"scale": float(s[i, 0]), "amax_history": s[i, 1:].clone()} for i, n in enumerate(QUANTIZERS)}

    def load_state_dict(self, state: dict) -> None:
        """Restores what :meth:`state_dict` returned; a bad state raises and changes nothing."""
        if self.state is None:
            if state:
                raise InvalidArgumentError(f"{type(self.recipe).__name__} keeps no quantizer state")
            return
        if not isinstance(state, dict) or set(state) != set(QUANTIZERS):
            raise InvalidArgumentError(f"state must be a dict with exactly the quantizers {', '.join(QUANTIZERS)}")
        rows = []
        for n in QUANTIZERS:
            q = state[n]
            if not isinstance(q, dict) or set(q) != {"scale", "amax_history"}:
                raise InvalidArgumentError(f"state[{n!r}] must be a dict with 'scale' and 'amax_history'")
            hist = torch.as_tensor(q["amax_history"]).detach().cpu().numpy()
            rows.append([check_scale(n, q["scale"]), *check_history(n, hist, self.recipe.amax_history_len)])
        with torch.no_grad():
            self.state.copy_(torch.tensor(rows, dtype=torch.float32))


def fresh_state(recipe: Recipe, device="cpu") -> torch.Tensor:
    """Delayed scaling's initial state: scales 1, zero histories."""
    state = torch.zeros((len(QUANTIZERS), 1 + recipe.amax_history_len), dtype=torch.float32, device=device)
    state[:, 0] = 1.0
    return state


def make_quantizer_set(recipe: Recipe, device="cpu") -> QuantizerSet:
    """A :class:`QuantizerSet` for ``recipe`` (delayed scaling: scales 1, zero histories)."""
    return QuantizerSet(recipe, device=device)


def config(norm_type, zero_centered_gamma, epsilon, activation_type, act_params, recipe, slot=0, flags=0):
    """The ops' configuration for these settings (checked)."""
    if not isinstance(norm_type, str) or norm_type.lower() not in _plan._NORMS:
        raise InvalidArgumentError(f"norm_type must be 'layernorm' or 'rmsnorm', got {norm_type!r}")
    acts = _plan.normalize_activations(activation_type)
    p = _plan.act_params_for(acts, act_params) or _plan.ActParams()
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not math.isfinite(epsilon) or epsilon < 0:
        raise InvalidArgumentError(f"epsilon must be a finite float >= 0, got {epsilon!r}")
    return _ops._Config(slot=slot, norm=_plan._NORMS[norm_type.lower()],
                        zero_centered_gamma=int(bool(zero_centered_gamma)),
                        act0=_plan.ACTIVATIONS[acts[0]], act1=_plan.ACTIVATIONS[acts[1]] if len(acts) > 1 else -1,
                        recipe=_ops.recipe_number(recipe), flags=flags, epsilon=float(epsilon),
                        clamp_limit=float(p.limit), clamp_alpha=float(p.alpha), clamp_offset=float(p.offset))


#: The functional API's names for the block's tensors, in its error messages.
NAMES = dict(x="x", gamma="gamma", beta="beta", w1="kernel_1", b1="bias_1", w2="kernel_2", b2="bias_2")


def run(cfg, recipe, x, gamma, beta, w1, b1, w2, b2, state=None, main_grads=None, names=NAMES):
    """y (and the norm output, with cfg.norm_output) for x [..., H] with w1 [H, A, F] and w2 [F, H]
    (or, with cfg's out x in weight layout, w1 [A, F, H] and w2 [H, F]), b1 [A, F] or None, b2 [H]
    or None, after the checks every caller gets: torch tensors on x's device, contiguous, of the
    right shapes (errors name them by `names`, the caller's names for x, gamma, beta, w1, b1, w2,
    b2). y is a fresh tensor of x's shape, not a view (FSDP2 and others expect a module's output
    to own its storage). Parameters in another dtype than x are cast to it, as TransformerEngine
    casts them -- except fp32 weights with a bf16/f16 x under an FP8 recipe, quantized from fp32
    (gradients fp32)."""
    if cfg.norm != _plan._NORMS["layernorm"]:
        beta = None  # rmsnorm has none (TransformerEngine's layernorm_mlp ignores it)
    _ops.check_operands(names, cfg, x, gamma, beta, w1, b1, w2, b2)
    dt = x.dtype
    cast = lambda p: None if p is None else p.to(dt)  # noqa: E731
    if recipe is not None and dt != torch.float32 and torch.float32 in (w1.dtype, w2.dtype):
        w1, w2 = w1.float(), w2.float()  # quantized from fp32; their gradients fp32 too
        cfg = cfg.with_(grad_dtype=_ops._DTYPES[torch.float32][1])
    else:
        w1, w2 = cast(w1), cast(w2)
    if main_grads is not None:
        cfg = cfg.with_(grad_dtype=_ops._DTYPES[torch.float32][1])
    gamma, beta, b1, b2 = cast(gamma), cast(beta), cast(b1), cast(b2)
    if state is not None:
        want = (len(QUANTIZERS), 1 + recipe.amax_history_len)
        if not isinstance(state, torch.Tensor) or tuple(state.shape) != want or state.dtype != torch.float32:
            raise InvalidArgumentError(f"the delayed-scaling state must be a float32 tensor {want}")
        if not state.is_contiguous():  # read and updated in place, row by row
            raise InvalidArgumentError(f"the delayed-scaling state must be contiguous (a float32 tensor {want}, "
                                       f"row-major), got strides {state.stride()}")
        if state.device != x.device:
            raise InvalidArgumentError(f"the delayed-scaling state is on {state.device}, but x is on {x.device}; "
                                       "move it (quantizer_set.to(device), or module.to(device))")
    trains = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, gamma, beta, w1, b1, w2, b2))
    if not trains:
        cfg = cfg.with_(remat=_plan._REMATS["forward_only"])
    main_dw1 = main_dw2 = None
    if main_grads is not None:
        main_dw1, main_dw2 = main_grads
    y, _, new_state, norm_output = _ops.forward_op(x, gamma, beta, w1, b1, w2, b2, state, main_dw1, main_dw2,
                                                   cfg.ints(), cfg.floats())
    if state is not None:
        with torch.no_grad():
            state.copy_(new_state)
    if not cfg.norm_output:
        return y
    if trains:
        norm_output = norm_output + _norm_output_gradient_path(cfg, x, gamma, beta)
    return y, norm_output


def _norm_output_gradient_path(cfg, x, gamma, beta):
    """A zero of x's shape and dtype whose gradient is the norm's: torch's own layer_norm /
    rms_norm of x in fp32 minus itself detached. Added to the library's norm output, it leaves
    its value exact and sends the norm output's cotangent to x, gamma and beta as TransformerEngine
    does (its norm backward adds it in), at the cost of one more norm pass over x."""
    H, f32 = x.shape[-1], torch.float32
    weight = gamma.to(f32) + (1.0 if cfg.zero_centered_gamma else 0.0)
    if cfg.norm == _plan._NORMS["layernorm"]:
        n = torch.nn.functional.layer_norm(x.to(f32), (H,), weight, beta.to(f32), cfg.epsilon)
    else:
        n = torch.nn.functional.rms_norm(x.to(f32), (H,), weight, cfg.epsilon)
    return (n - n.detach()).to(x.dtype)


def layernorm_mlp(x, gamma, beta, kernels, biases, norm_type, zero_centered_gamma=False, epsilon=1e-6,
                  transpose_batch_sequence=False, norm_input_axes=None, dot_1_input_axes=None,
                  dot_2_input_axes=None, kernel_1_axes=None, kernel_2_axes=None, ffn1_ckpt_name="ffn1",
                  ffn2_ckpt_name="ffn2", activation_type=("relu",), quantizer_set=noop_quantizer_set,
                  act_params=None):
    """``act(norm(x) @ kernel_1 + bias_1) @ kernel_2 + bias_2`` as one fused op (forward and backward
    are lnmlp's), with TransformerEngine's ``layernorm_mlp`` signature and defaults, on torch
    tensors; differentiable with autograd and traceable by ``torch.compile``.

    x: [..., H] (float32, bfloat16 or float16; CPU or CUDA; every leading dimension is a token);
    gamma, beta: [H] (beta is ignored for rmsnorm); kernels = [kernel_1 [H, A, F] (or [H, A*F]),
    kernel_2 [F, H]]; biases = [bias_1 [A, F] (or [A*F]) or None, bias_2 [H] or None]; A is 1, or 2
    for a gated pair such as ("silu", "linear"). Every tensor must be contiguous and on x's device.
    Parameters in another dtype than x are cast to it (gradients come back in their own), except
    fp32 kernels with a bf16/f16 x under an FP8 quantizer set, quantized from fp32.
    ``quantizer_set``: None (no FP8) or :func:`make_quantizer_set`'s set, whose delayed-scaling state
    is updated in place. The axes and checkpoint-name arguments are JAX's and change nothing here.
    """
    del transpose_batch_sequence, norm_input_axes, dot_1_input_axes, dot_2_input_axes
    del kernel_1_axes, kernel_2_axes, ffn1_ckpt_name, ffn2_ckpt_name
    if quantizer_set is not None and not isinstance(quantizer_set, QuantizerSet):
        raise InvalidArgumentError("quantizer_set must be noop_quantizer_set (None) or a set made by "
                                   f"lnmlp.torch.make_quantizer_set(recipe), got {type(quantizer_set).__name__}")
    recipe = None if quantizer_set is None else quantizer_set.recipe
    cfg = config(norm_type, zero_centered_gamma, epsilon, activation_type, act_params, recipe)
    kernel_1, kernel_2, bias_1, bias_2 = unpack_kernels_and_biases(kernels, biases)
    A = len(cfg.activations)
    if isinstance(kernel_1, torch.Tensor) and kernel_1.dim() == 2 and kernel_1.shape[1] % A == 0:
        kernel_1 = kernel_1.view(kernel_1.shape[0], A, kernel_1.shape[1] // A) if kernel_1.is_contiguous() else kernel_1
    if isinstance(bias_1, torch.Tensor) and bias_1.dim() == 1 and bias_1.shape[0] % A == 0 and bias_1.is_contiguous():
        bias_1 = bias_1.view(A, bias_1.shape[0] // A)
    state = None if quantizer_set is None else quantizer_set.state
    return run(cfg, recipe, x, gamma, beta, kernel_1, bias_1, kernel_2, bias_2, state)
