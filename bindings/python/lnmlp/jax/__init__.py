"""lnmlp for JAX: TransformerEngine's ``layernorm_mlp`` as a native JAX op (``jax.jit``,
``jax.grad``, ``jax.vjp``, ``jax.vmap``), its forward and backward running in lnmlp through XLA
FFI custom calls. Importing this module imports jax; ``import lnmlp`` alone does not.
"""

from ._ffi import XlaLibraryNotFoundError, library_path
from ._layernorm_mlp import layernorm_mlp, noop_quantizer_set

__all__ = ["layernorm_mlp", "noop_quantizer_set", "library_path", "XlaLibraryNotFoundError"]
