"""lnmlp: a fused transformer feed-forward sublayer, ``y = act(norm(x) @ W1 + b1) @ W2 + b2``,
forward and backward, on NumPy arrays (float32, float16, ml_dtypes.bfloat16).

Two ways in:

* :class:`Plan` -- one validated, allocated configuration, run many times
  (``y, saved = plan.forward(...)``; ``grads = plan.backward(dy, ..., saved)``), each call with
  its own number of tokens, 0 up to the plan's ``tokens`` (``plan.tensor_shape(name, tokens)``
  gives every tensor's shape as the library computes it);
* :func:`layernorm_mlp` / :func:`layernorm_mlp_vjp` -- TransformerEngine's functional signature,
  with plans cached by configuration.

:mod:`lnmlp.fp8` converts arrays to and from the FP8 formats (E4M3, E5M2); :mod:`lnmlp.nvfp4`
quantizes them as the NVFP4 recipe does.

FP8 training (docs/fp8.md defines exactly what is computed): the recipes :class:`DelayedScaling`,
:class:`Float8CurrentScaling`, :class:`Float8BlockScaling`, :class:`MXFP8BlockScaling` and
:class:`NVFP4BlockScaling` (TransformerEngine's names and defaults; NVFP4 on ``Plan`` only, for
now) go to ``Plan(..., recipe=...)``, or through
:func:`make_quantizer_set` to the functional API's ``quantizer_set=``. Under delayed scaling the
plan (Plan API) or the quantizer set (functional API) carries each quantizer's scale and amax
history: ``plan.quantizer_state(name)`` / ``plan.set_quantizer_state(...)`` /
``plan.export_state()`` / ``plan.import_state(blob)`` (experimental), ``qs.state()`` /
``qs.load_state(...)``; a caller may own it instead (``plan.forward(..., fp8_state=a)``,
``plan.attach_fp8_state(a)``).

Experimental (the C header's LNMLP_EXPERIMENTAL tier, which may change in any release; the C
names are listed in ``lnmlp._capi.EXPERIMENTAL``): sharding (``Plan(..., sharding=, comm=)``),
the state blob (``plan.export_state()`` / ``plan.import_state()``) and ``backend="cuda"``.

Micro-batches: ``Plan(..., accumulate_grads=True, grad_dtype="float32")`` with
``plan.backward(..., grads=plan.zero_weight_grads())`` accumulates the weight gradients into the
caller's arrays; ``weights_unchanged=True`` on forward / backward reuses the plan's widened or FP8
copies of the weights (TransformerEngine's ``is_first_microbatch=False``).
"""

from ._version import __version__
from ._lib import (ABI_VERSION, BackendError, Error, InternalError, InvalidArgumentError,
                   InvalidHandleError, LibraryNotFoundError, MisalignedError, NoWorkspaceError,
                   NotSupportedError, NullPointerError, OutOfMemoryError, PlanBusyError,
                   SizeOverflowError, WorkspaceTooSmallError, build_info, library_path,
                   library_version, query_support)
from ._plan import ACTIVATIONS, GATED_PAIRS, ActParams, Grads, Plan, normalize_activations
from ._functional import (clear_plan_cache, layernorm_mlp, layernorm_mlp_vjp, noop_quantizer_set,
                          plan_cache_info, set_plan_cache_size)
from .recipe import (QUANTIZERS, DelayedScaling, Float8BlockScaling, Float8CurrentScaling,
                     MXFP8BlockScaling, NVFP4BlockScaling, QuantizerSet, Recipe, make_quantizer_set)
from . import fp8, nvfp4

__all__ = [
    "__version__", "ABI_VERSION", "build_info", "library_path", "library_version", "query_support",
    "Plan", "Grads", "ActParams", "ACTIVATIONS", "GATED_PAIRS", "normalize_activations",
    "layernorm_mlp", "layernorm_mlp_vjp", "noop_quantizer_set", "clear_plan_cache",
    "plan_cache_info", "set_plan_cache_size", "fp8", "nvfp4",
    "Recipe", "DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling", "MXFP8BlockScaling",
    "NVFP4BlockScaling", "QuantizerSet", "make_quantizer_set", "QUANTIZERS",
    "Error", "InvalidArgumentError", "NullPointerError", "SizeOverflowError", "InvalidHandleError",
    "NotSupportedError", "OutOfMemoryError", "WorkspaceTooSmallError", "NoWorkspaceError",
    "MisalignedError", "PlanBusyError", "BackendError", "InternalError", "LibraryNotFoundError",
]
