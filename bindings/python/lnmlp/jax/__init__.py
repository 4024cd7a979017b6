"""lnmlp for JAX: TransformerEngine's ``layernorm_mlp`` as a native JAX op (``jax.jit``,
``jax.grad``, ``jax.vjp``, ``jax.vmap``), its forward and backward running in lnmlp through XLA
FFI custom calls, with FP8 quantizer sets whose delayed-scaling state is an ordinary jax array.
Importing this module imports jax; ``import lnmlp`` alone does not.
"""

from ..recipe import (DelayedScaling, Float8BlockScaling, Float8CurrentScaling, MXFP8BlockScaling,
                      NVFP4BlockScaling, QUANTIZERS)
from ._autocast import MeshResource, autocast, fp8_autocast
from ._ffi import XlaLibraryNotFoundError, library_path, plan_count
from ._layernorm_mlp import layernorm_mlp, noop_quantizer_set
from ._quantizer_set import GemmQuantizerSet, QuantizerSet, make_quantizer_set, make_quantizer_sets

__all__ = ["layernorm_mlp", "noop_quantizer_set", "make_quantizer_set", "make_quantizer_sets", "QuantizerSet",
           "GemmQuantizerSet", "DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling", "MXFP8BlockScaling",
           "NVFP4BlockScaling", "QUANTIZERS", "library_path", "plan_count", "XlaLibraryNotFoundError", "autocast",
           "fp8_autocast", "MeshResource"]
