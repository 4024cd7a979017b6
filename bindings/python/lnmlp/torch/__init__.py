"""lnmlp for PyTorch: the fused LayerNorm/RMSNorm + MLP block as native PyTorch ops
(``torch.ops.lnmlp.forward`` / ``backward`` / ``backward_accumulate``, registered with
``torch.library.custom_op``, with fake implementations and autograd), TransformerEngine's
``layernorm_mlp`` signature on tensors, and the module :class:`LayerNormMLP` with
TransformerEngine PyTorch's constructor and parameter names.

CPU tensors run on lnmlp's CPU backend, CUDA tensors on its CUDA backend, on the current stream.
Works with autograd and ``torch.compile(fullgraph=True)``. FP8: the recipes (TransformerEngine's
names and defaults) through :func:`autocast` (or :func:`fp8_autocast`), a module's ``fp8_recipe=``, or a
:func:`make_quantizer_set` for the functional API. NVFP4's stochastic rounding draws from torch's
default generator (``torch.manual_seed`` reproduces it).
"""

from ..recipe import (QUANTIZERS, DelayedScaling, Float8BlockScaling, Float8CurrentScaling,
                      MXFP8BlockScaling, NVFP4BlockScaling)
from ._functional import QuantizerSet, layernorm_mlp, make_quantizer_set, noop_quantizer_set
from ._module import LayerNormMLP, autocast, fp8_autocast
from ._ops import plan_count

__all__ = ["layernorm_mlp", "LayerNormMLP", "autocast", "fp8_autocast", "QuantizerSet", "make_quantizer_set",
           "noop_quantizer_set", "plan_count", "QUANTIZERS", "DelayedScaling", "Float8CurrentScaling",
           "Float8BlockScaling", "MXFP8BlockScaling", "NVFP4BlockScaling"]
