"""``lnmlp.jax.flax.LayerNormMLP``: TransformerEngine's Flax (linen) module ``LayerNormMLP`` on
lnmlp's fused block (``lnmlp.jax.layernorm_mlp``). Importing this module imports flax.

Constructor names and defaults are TransformerEngine's where the fused block has the feature;
parameters are named, shaped, initialised and given logical axes as TransformerEngine's module
gives them: ``scale`` and ``ln_bias`` [H] (axes ``("embed",)``), ``wi_kernel`` [H, A, F]
(``kernel_axes_1``), ``wi_bias`` [A, F] (``bias_axes_1``), ``wo_kernel`` [F, H]
(``kernel_axes_2``), ``wo_bias`` [H] (``bias_axes_2``). The kernel axes are also the block's
``kernel_1_axes`` / ``kernel_2_axes``, so under flax's logical axis rules and a mesh
(``jax.set_mesh``) the block runs split as docs/jax-mesh.md says.

FP8: ``fp8_recipe`` (lnmlp's or TransformerEngine's recipe), or when it is None the recipe of the
enclosing ``lnmlp.jax.autocast(enabled=True, ...)``, as TransformerEngine's modules read theirs.
With a delayed-scaling recipe the quantizer state is kept as TransformerEngine keeps it, so that
a TE Flax checkpoint's FP8 state loads: the collection ``"fp8_metas"`` (:data:`FP8_COLLECTION`),
per quantizer ``{name}_scale`` float32 ``(1,)`` and ``{name}_amax_history`` float32
``(amax_history_len,)``, newest first, with TE's names (:data:`TE_FP8_NAMES`: ``x_0``, ``kernel_0``,
``grad_0`` for GEMM1's input, kernel and output gradient, ``x_1``, ``kernel_1``, ``grad_1`` for
GEMM2's). Differentiate the loss with respect to that collection too, and replace it with its
"gradient", which is the state after the step (TransformerEngine's ``update_collections``).
Variables saved by lnmlp before this layout (one ``quantizer_state`` in the collection
``"_overwrite_with_gradient"``) load after :func:`migrate_fp8_state`.

NVFP4BlockScaling's stochastic rounding draws 64 bits of seed from the rng stream ``"sr_rng"``
(:data:`SR_RNG_NAME`) per call where ``apply`` is given one (``rngs={"sr_rng": key}``; a new key
each step draws new bits), else it draws from the fixed state (0, 0).

``return_layernorm_output=True`` returns ``(out, ln_output)``: the norm output shaped like the
inputs, in their dtype, as TransformerEngine returns it (the plan's norm output, a section of its
saved buffer: docs/design.md). Its cotangent reaches the inputs, ``scale`` and ``ln_bias``.

Not here, because the fused block has no place for them (refused with errors naming them):
dropout between the activation and GEMM2 when it is not the identity (``intermediate_dropout_rate``
> 0 runs with ``deterministic=True`` only), LoRA, and a module without the norm.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from .._lib import InvalidArgumentError, NotSupportedError
from .. import _plan
from ..recipe import Recipe, check_recipe
from . import _autocast
from ._layernorm_mlp import _layernorm_mlp
from ._quantizer_set import GEMM_ROWS, QuantizerSet

__all__ = ["LayerNormMLP", "FP8_COLLECTION", "TE_FP8_NAMES", "OVERWRITE_WITH_GRADIENT", "migrate_fp8_state",
           "extend_logical_axis_rules"]

#: The variable collection of the delayed-scaling state (TransformerEngine's NVTE_FP8_COLLECTION_NAME).
FP8_COLLECTION = "fp8_metas"
#: TransformerEngine's names of the six quantizers, in lnmlp.QUANTIZERS order (ln_out, w1, act_out,
#: w2, dy, dh): GEMM g's x, kernel and grad quantizers (rows GEMM_ROWS[g]) are "x_g", "kernel_g",
#: "grad_g" -- ("x_0", "kernel_0", "x_1", "kernel_1", "grad_1", "grad_0").
TE_FP8_NAMES = tuple(name for _, name in sorted((row, f"{role}_{g}") for g, rows in enumerate(GEMM_ROWS)
                                                for role, row in zip(("x", "kernel", "grad"), rows)))
#: The collection of lnmlp's earlier layout, one ``quantizer_state`` [6, 1 + amax_history_len]
#: (read by :func:`migrate_fp8_state`).
OVERWRITE_WITH_GRADIENT = "_overwrite_with_gradient"


def _fp8_state(module, recipe):
    """The delayed-scaling state [6, 1 + L] from the module's variables in TransformerEngine's
    layout (made fresh at init: scales 1, histories 0), each checked against the recipe."""
    L = recipe.amax_history_len
    rows = []
    for name in TE_FP8_NAMES:
        scale = module.variable(FP8_COLLECTION, f"{name}_scale", jnp.ones, (1,), jnp.float32).value
        history = module.variable(FP8_COLLECTION, f"{name}_amax_history", jnp.zeros, (L,), jnp.float32).value
        for var, value, want in ((f"{name}_scale", scale, (1,)), (f"{name}_amax_history", history, (L,))):
            if tuple(value.shape) != want or value.dtype != jnp.float32:
                raise InvalidArgumentError(
                    f"LayerNormMLP: {FP8_COLLECTION}/{var} is {value.dtype} {tuple(value.shape)}, but float32 {want} "
                    f"is what {recipe!r} keeps (amax_history_len={L})")
        rows.append(jnp.concatenate([scale, history]))
    return jnp.stack(rows)


def migrate_fp8_state(variables):
    """``variables`` with every ``"_overwrite_with_gradient"/.../quantizer_state`` (lnmlp's earlier
    layout) rewritten as the same module's ``"fp8_metas"`` variables in TransformerEngine's layout;
    everything else as it is. Returns plain dicts."""
    def unfrozen(tree):
        return {k: unfrozen(v) for k, v in tree.items()} if hasattr(tree, "items") else tree

    out = unfrozen(variables)
    old = out.pop(OVERWRITE_WITH_GRADIENT, None)
    if old is None:
        return out

    def convert(tree):
        result = {}
        for key, value in tree.items():
            if key == "quantizer_state":
                for name, row in zip(TE_FP8_NAMES, jnp.asarray(value)):
                    result[f"{name}_scale"], result[f"{name}_amax_history"] = row[:1], row[1:]
            else:
                result[key] = convert(value)
        return result

    out[FP8_COLLECTION] = convert(old)
    return out


def extend_logical_axis_rules(rules):
    """``rules`` (flax logical axis rules, (name, mesh axis or None) pairs) with TransformerEngine's
    logical axis names added as the enclosing :func:`lnmlp.jax.autocast`'s MeshResource maps them
    (TransformerEngine's ``extend_logical_axis_rules``); a given rule for one of those names must
    agree with TE's. Needs a mesh in context."""
    from ._sharding import _context_mesh
    given = {}
    for item in rules:
        if len(item) != 2 or not isinstance(item[0], str) or not (item[1] is None or isinstance(item[1], str)):
            raise InvalidArgumentError(f"a logical axis rule is (axis name, mesh axis name or None), got {item!r}")
        given.setdefault(item[0], []).append(item[1])
    mesh = _context_mesh()
    extended = list(rules)
    for name, axis in (_autocast.te_logical_axes(mesh) if mesh is not None else {}).items():
        if name in given:
            if given[name] != [axis]:
                raise InvalidArgumentError(f"the rule for {name!r} maps it to {given[name]}, but the MeshResource "
                                           f"maps it to {axis!r}")
        else:
            extended.append((name, axis))
    return tuple(extended)


def _default_kernel_init():
    return nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")


#: The rng stream NVFP4's stochastic rounding draws its seed from, where apply is given it.
SR_RNG_NAME = "sr_rng"


def _sr_rng_state(module):
    """The random state, uint32 [4] (lnmlp/jax/_quantizer_set.py), of one call: a seed from the
    module's "sr_rng" stream and offset 0, or (0, 0) without that stream."""
    if not module.has_rng(SR_RNG_NAME):
        return jnp.zeros((4,), jnp.uint32)
    seed = jax.random.bits(module.make_rng(SR_RNG_NAME), (2,), jnp.uint32)
    return jnp.concatenate([seed, jnp.zeros((2,), jnp.uint32)])


class LayerNormMLP(nn.Module):
    """norm -> Dense(intermediate_dim * A) + bias -> activation(s) -> Dense(H) + bias, fused.

    ``__call__(inputs, deterministic=False)`` returns ``(out, ln_output)``, TransformerEngine's
    pair: ``ln_output`` is the norm output with ``return_layernorm_output=True``, else None. The
    attributes' defaults are TransformerEngine's (its ``flax/module.py``)."""

    intermediate_dim: int = 2048
    enable_layernorm: bool = True
    layernorm_type: str = "layernorm"
    epsilon: float = 1e-6
    zero_centered_gamma: bool = False
    scale_init: Optional[Callable] = None
    scale_axes: Tuple[str, ...] = ("embed",)
    ln_bias_init: Callable = nn.initializers.zeros
    ln_bias_axes: Tuple[str, ...] = ("embed",)
    kernel_init: Optional[Callable] = None
    kernel_axes_1: Tuple[str, ...] = ("embed", "act", "mlp")
    kernel_axes_2: Tuple[str, ...] = ("mlp", "embed")
    use_bias: bool = False
    bias_init: Callable = nn.initializers.zeros
    bias_axes_1: Tuple[str, ...] = ("act", "mlp")
    bias_axes_2: Tuple[str, ...] = ("embed",)
    return_layernorm_output: bool = False
    activations: Sequence[str] = ("gelu",)
    activation_params: Optional[dict] = None
    # Dropout between the activation and GEMM2: its rng collection and the dimensions that share a
    # mask, for a rate > 0 (which runs only where it is the identity: deterministic=True).
    intermediate_dropout_rng_name: str = "dropout"
    intermediate_dropout_rate: float = 0.0
    intermediate_hidden_dropout_dims: Sequence[int] = ()
    # LoRA: not in the fused block (enabling it is refused).
    enable_low_rank_adaptation: bool = False
    low_rank_adaptation_dim: int = 32
    low_rank_adaptation_alpha: Optional[float] = None
    axis: int = -1
    dtype: Any = jnp.float32
    layernorm_input_axes: Optional[Tuple[str, ...]] = None
    dot_1_input_axes: Optional[Tuple[str, ...]] = None
    dot_2_input_axes: Optional[Tuple[str, ...]] = None
    ffn1_ckpt_name: str = "ffn1"
    ffn2_ckpt_name: str = "ffn2"
    transpose_batch_sequence: bool = False
    # Under FP8 it names the saved residual too, which holds the quantized operands (docs/jax.md).
    quantization_checkpoint_name: Optional[str] = None
    fp8_recipe: Optional[Recipe] = None  # lnmlp.jax.DelayedScaling(), ... ; None: the autocast context's

    def _check(self, inputs, deterministic):
        if not self.enable_layernorm:
            raise NotSupportedError(
                "LayerNormMLP: enable_layernorm=False is not supported: the fused block always normalises its "
                "input (lnmlp has no identity norm); use two Dense layers for a block without the norm")
        if self.enable_low_rank_adaptation:
            raise NotSupportedError("LayerNormMLP: enable_low_rank_adaptation=True is not supported: the fused "
                                    "block has no place for LoRA's extra GEMMs")
        rate = self.intermediate_dropout_rate
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 <= rate <= 1.0:
            raise InvalidArgumentError(f"LayerNormMLP: intermediate_dropout_rate must be in [0, 1], got {rate!r}")
        if rate > 0.0 and not deterministic:
            raise NotSupportedError(
                f"LayerNormMLP: intermediate_dropout_rate={rate} with deterministic=False is not supported: the "
                "fused block has no dropout between the activation and GEMM2 yet (with deterministic=True, or a "
                "rate of 0, the dropout is the identity and the block runs)")
        if self.axis not in (-1, inputs.ndim - 1):
            raise NotSupportedError(f"LayerNormMLP: the hidden dimension must be the last (axis={self.axis})")

    @nn.compact
    def __call__(self, inputs, deterministic: bool = False):
        self._check(inputs, deterministic)
        H = inputs.shape[-1]
        A, F = len(_plan.normalize_activations(self.activations)), self.intermediate_dim
        scale_init = self.scale_init or (nn.initializers.zeros if self.zero_centered_gamma else nn.initializers.ones)
        kernel_init = self.kernel_init or _default_kernel_init()

        def param(name, init, shape, axes):
            return self.param(name, nn.with_logical_partitioning(init, axes), shape, self.dtype)

        def stacked_kernel_init(key, shape, dtype):
            # One [H, F] kernel per activation, each with fan-in H and a key split off the last, as
            # TransformerEngine initialises them.
            kernels = []
            for _ in range(shape[1]):
                key, one = jax.random.split(key)
                kernels.append(kernel_init(one, (shape[0], shape[2]), dtype))
            return jnp.stack(kernels, axis=1)

        gamma = param("scale", scale_init, (H,), self.scale_axes)
        beta = param("ln_bias", self.ln_bias_init, (H,), self.ln_bias_axes) if self.layernorm_type == "layernorm" \
            else None
        k1 = param("wi_kernel", stacked_kernel_init, (H, A, F), self.kernel_axes_1)
        k2 = param("wo_kernel", kernel_init, (F, H), self.kernel_axes_2)
        b1 = param("wi_bias", self.bias_init, (A, F), self.bias_axes_1) if self.use_bias else None
        b2 = param("wo_bias", self.bias_init, (H,), self.bias_axes_2) if self.use_bias else None

        quantizer_set = None
        # The module's own recipe, else the enclosing autocast(enabled=True)'s, as TE's modules do.
        fp8_recipe = self.fp8_recipe if self.fp8_recipe is not None else _autocast.global_recipe()
        if fp8_recipe is not None:
            recipe = check_recipe(fp8_recipe)  # lnmlp's, or TransformerEngine's read as lnmlp's
            quantizer_set = QuantizerSet(recipe)
            if recipe.stateful:
                quantizer_set.state = _fp8_state(self, recipe)
            elif recipe.draws_random:
                quantizer_set.state = _sr_rng_state(self)

        out = _layernorm_mlp(inputs, gamma, beta, [k1, k2], [b1, b2], self.layernorm_type,
                             zero_centered_gamma=self.zero_centered_gamma, epsilon=self.epsilon,
                             norm_input_axes=self.layernorm_input_axes, kernel_1_axes=self.kernel_axes_1,
                             kernel_2_axes=self.kernel_axes_2, ffn1_ckpt_name=self.ffn1_ckpt_name,
                             ffn2_ckpt_name=self.ffn2_ckpt_name, activation_type=tuple(self.activations),
                             quantizer_set=quantizer_set, act_params=self.activation_params,
                             norm_output=self.return_layernorm_output,
                             quantization_checkpoint_name=self.quantization_checkpoint_name)
        return out if self.return_layernorm_output else (out, None)
