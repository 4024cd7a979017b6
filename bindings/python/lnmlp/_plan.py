"""lnmlp.Plan: a validated, allocated fused LayerNorm-MLP, run forward and backward many times."""

from __future__ import annotations

import ctypes
import threading
from collections import namedtuple
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from . import _lib
from ._lib import (InvalidArgumentError, InvalidHandleError, MisalignedError,
                   NotSupportedError, NullPointerError)
from .recipe import QUANTIZERS, check_history, check_recipe, check_scale, quantizer_index

try:
    import ml_dtypes
    _BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is a declared dependency
    _BF16 = None

__all__ = ["Plan", "ActParams", "Grads", "ACTIVATIONS", "GATED_PAIRS", "normalize_activations"]

# --- names -> C enum values (include/lnmlp.h) -------------------------------------------------------
_DTYPES = {np.dtype(np.float32): 0, np.dtype(np.float16): 2}
if _BF16 is not None:
    _DTYPES[_BF16] = 1
_DTYPE_ALIASES = {"float32": np.float32, "f32": np.float32, "fp32": np.float32,
                  "float16": np.float16, "f16": np.float16, "fp16": np.float16, "half": np.float16,
                  "bfloat16": _BF16, "bf16": _BF16}
_NORMS = {"layernorm": 0, "rmsnorm": 1}
#: Activation names and their LNMLP_ACT_* values.
ACTIVATIONS = {"linear": 0, "relu": 1, "gelu": 2, "silu": 3, "quick_gelu": 4, "squared_relu": 5,
               "sigmoid": 6, "clamped_silu": 7, "clamped_linear": 8}
#: The gated pairs users ask for by name.
GATED_PAIRS = {"geglu": ("gelu", "linear"), "swiglu": ("silu", "linear"),
               "reglu": ("relu", "linear"), "qgeglu": ("quick_gelu", "linear"),
               "sreglu": ("squared_relu", "linear"), "glu": ("sigmoid", "linear"),
               "clamped_swiglu": ("clamped_silu", "clamped_linear")}
_REMATS = {"save_all": 0, "save_ffn1": 1, "save_stats": 2, "forward_only": 3}
# W1 [H, A, F], W2 [F, H] (in x out: JAX's kernels), or W1 [A, F, H], W2 [H, F] (out x in: PyTorch's)
_WEIGHT_LAYOUTS = {"in_out": _lib.WEIGHT_LAYOUT_IN_OUT, "out_in": _lib.WEIGHT_LAYOUT_OUT_IN}
# lnmlp_desc_set_gemm_math's flags (the experimental tier), by name.
_GEMM_MATH = {"fp8_fast_accumulation": _lib.GEMM_MATH_FP8_FAST_ACCUMULATION, "tf32": _lib.GEMM_MATH_TF32}


def _gemm_math_flags(gemm_math):
    """The names of ``gemm_math`` (a name, or an iterable of names, of _GEMM_MATH), sorted, and
    their LNMLP_GEMM_MATH_* flags OR'ed."""
    names = (gemm_math,) if isinstance(gemm_math, str) else gemm_math
    try:
        names = tuple(sorted({str(n).lower() for n in names}))
    except TypeError:
        raise InvalidArgumentError(f"gemm_math must be a name or names of {sorted(_GEMM_MATH)}, "
                                   f"got {gemm_math!r}") from None
    unknown = [n for n in names if n not in _GEMM_MATH]
    if unknown:
        raise InvalidArgumentError(f"gemm_math: unknown {unknown} (expected names of {sorted(_GEMM_MATH)})")
    flags = 0
    for n in names:
        flags |= _GEMM_MATH[n]
    return names, flags
_BACKENDS = _lib._BACKENDS  # "cpu", "cuda" (the experimental tier) -> LNMLP_BACKEND_*
# LNMLP_DTYPE_* of lnmlp_plan_get_tensor_shape -> NumPy element types.
_ELEMENT_TYPES = {_lib.DTYPE_F32: np.dtype(np.float32), _lib.DTYPE_F16: np.dtype(np.float16),
                  _lib.DTYPE_U8: np.dtype(np.uint8)}
if _BF16 is not None:
    _ELEMENT_TYPES[_lib.DTYPE_BF16] = _BF16
# The tensors whose shapes do not depend on the call's tokens (queried once per plan).
_FIXED_TENSORS = (_lib.TENSOR_GAMMA, _lib.TENSOR_BETA, _lib.TENSOR_W1, _lib.TENSOR_B1, _lib.TENSOR_W2,
                  _lib.TENSOR_B2, _lib.TENSOR_DGAMMA, _lib.TENSOR_DBETA, _lib.TENSOR_DW1, _lib.TENSOR_DB1,
                  _lib.TENSOR_DW2, _lib.TENSOR_DB2, _lib.TENSOR_FP8_STATE)


def _written_array_address(name, arr, contiguous_fix, writer):
    """The address of an array lnmlp writes, once it is C-contiguous, writeable and aligned."""
    if not arr.flags.c_contiguous:
        raise InvalidArgumentError(f"{name} is not C-contiguous; {contiguous_fix}")
    if not arr.flags.writeable:
        raise InvalidArgumentError(f"{name} is read-only, but {writer}")
    if not arr.flags.aligned:
        raise MisalignedError(f"{name} is not aligned to its element size")
    return arr.ctypes.data


@dataclass(frozen=True)
class ActParams:
    """Parameters of the clamped SwiGLU pair ("clamped_silu", "clamped_linear"):
    ``a' = min(a, limit); out = a' sigmoid(alpha a') * (clip(b, -limit, limit) + offset)``."""
    limit: float = 7.0
    alpha: float = 1.702
    offset: float = 1.0


#: Gradients returned by Plan.backward (a tuple; fields by name; ``._asdict()`` gives a dict).
Grads = namedtuple("Grads", ["dx", "dgamma", "dbeta", "dw1", "db1", "dw2", "db2"])
# The weight gradients backward may write into caller arrays (grads=), in lnmlp_plan_backward's order.
_WEIGHT_GRADS = (("dw1", _lib.TENSOR_DW1), ("db1", _lib.TENSOR_DB1), ("dw2", _lib.TENSOR_DW2),
                 ("db2", _lib.TENSOR_DB2))


def normalize_activations(activation_type) -> tuple:
    """Canonical activation tuple: ("relu",), ("gelu", "linear"), ... .

    Accepts a single name ("gelu"), a pair name ("swiglu", "geglu", ...), or a sequence of one or
    two names. Names are case-insensitive; "-" is accepted for "_"."""
    if isinstance(activation_type, str):
        activation_type = (activation_type,)
    try:
        acts = tuple(activation_type)
    except TypeError:
        raise InvalidArgumentError(
            f"activation_type must be a name or a sequence of 1 or 2 names, got {activation_type!r}")
    if not all(isinstance(a, str) for a in acts):
        raise InvalidArgumentError(
            f"activation_type must contain activation names (str), got {activation_type!r}; "
            f"callables are not supported")
    acts = tuple(a.lower().replace("-", "_") for a in acts)
    if len(acts) == 1 and acts[0] in GATED_PAIRS:
        acts = GATED_PAIRS[acts[0]]
    if len(acts) not in (1, 2):
        raise InvalidArgumentError(
            f"activation_type must have 1 or 2 entries, got {len(acts)}: {activation_type!r}")
    for a in acts:
        if a not in ACTIVATIONS:
            raise InvalidArgumentError(
                f"unknown activation {a!r} in activation_type; known: "
                f"{', '.join(ACTIVATIONS)} and the pairs {', '.join(GATED_PAIRS)}")
    return acts


# act_params' fields under their names here and TransformerEngine's (ClampedSwigluParams).
_ACT_PARAM_NAMES = {"limit": "limit", "alpha": "alpha", "offset": "offset", "glu_linear_offset": "offset"}


def _normalize_act_params(act_params):
    """ActParams from None, ActParams, a dict or an object with the fields -- limit, alpha and
    offset, or TransformerEngine's glu_linear_offset (an object may also carry them in a
    ``clamped_swiglu`` attribute); missing fields take the defaults. Anything else, unknown keys,
    an object with none of the fields, or two different offsets, is an InvalidArgumentError:
    nothing is dropped silently."""
    if act_params is None or isinstance(act_params, ActParams):
        return act_params
    if isinstance(act_params, dict):
        unknown = set(act_params) - set(_ACT_PARAM_NAMES)
        if unknown:
            raise InvalidArgumentError(
                f"act_params has unknown keys {sorted(unknown)}; expected limit, alpha and offset "
                f"(or glu_linear_offset)")
        given = dict(act_params)
    else:
        obj = getattr(act_params, "clamped_swiglu", act_params)
        given = {k: getattr(obj, k) for k in _ACT_PARAM_NAMES if hasattr(obj, k)}
        if not given:
            raise InvalidArgumentError(
                f"act_params ({type(act_params).__name__}) has none of the fields limit, alpha, offset / "
                f"glu_linear_offset")
    fields = {}
    for k, v in given.items():
        name = _ACT_PARAM_NAMES[k]
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise InvalidArgumentError(f"act_params.{k} must be a number, got {v!r}")
        if name in fields and fields[name] != float(v):
            raise InvalidArgumentError("act_params gives two different offsets (offset and glu_linear_offset)")
        fields[name] = float(v)
    return ActParams(**fields)


def _normalize_dtype(dtype) -> np.dtype:
    if isinstance(dtype, str) and dtype.lower() in _DTYPE_ALIASES:
        dtype = _DTYPE_ALIASES[dtype.lower()]
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt is None or dt not in _DTYPES:
        raise InvalidArgumentError(
            f"dtype must be numpy.float32, numpy.float16 or ml_dtypes.bfloat16, got {dtype!r}")
    return dt


def _flag(name, value) -> bool:
    """A boolean argument: True / False (or 1 / 0); anything else raises InvalidArgumentError."""
    if isinstance(value, (bool, np.bool_, int, np.integer)) and value in (0, 1):
        return bool(value)
    raise InvalidArgumentError(f"{name} must be True or False, got {value!r}")


def _choice(name, value, table):
    key = value.lower() if isinstance(value, str) else value
    if key not in table:
        raise InvalidArgumentError(f"{name} must be one of {', '.join(table)}, got {value!r}")
    return table[key]


# --- device arrays (CUDA backend) -------------------------------------------------------------------
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_capsule_get = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_get.restype = ctypes.c_void_p
_capsule_get.argtypes = [ctypes.py_object, ctypes.c_char_p]
_KDL_CUDA = 2
# (kind, bits) of each dtype: DLPack codes 2 = float, 4 = bfloat
_DL_CODES = {np.dtype(np.float32): (2, 32), np.dtype(np.float16): (2, 16)}
_CAI_TYPESTRS = {np.dtype(np.float32): ("<f4",), np.dtype(np.float16): ("<f2",)}
if _BF16 is not None:
    _DL_CODES[_BF16] = (4, 16)
    _CAI_TYPESTRS[_BF16] = ("<V2", "|V2", "<bf16")


def device_array_info(name, obj):
    """(pointer, shape, dtype-ok-check tuple, device_type) of a device array given through
    ``__cuda_array_interface__`` or DLPack. Raises InvalidArgumentError when it is strided.
    Returns (ptr, shape, ("cai", typestr) or ("dlpack", code, bits), device_type)."""
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        shape = tuple(int(s) for s in cai["shape"])
        strides = cai.get("strides")
        if strides is not None:
            itemsize = int(cai["typestr"][2:]) if cai["typestr"][2:].isdigit() else 2
            expect, acc = [], itemsize
            for s in reversed(shape):
                expect.append(acc)
                acc *= s
            if tuple(strides) != tuple(reversed(expect)):
                raise InvalidArgumentError(f"{name} must be C-contiguous (strides {tuple(strides)})")
        return int(cai["data"][0] or 0), shape, ("cai", cai["typestr"]), _KDL_CUDA
    if hasattr(obj, "__dlpack__"):
        capsule = obj.__dlpack__()
        t = _DLTensor.from_address(_capsule_get(capsule, b"dltensor"))  # DLManagedTensor starts with DLTensor
        shape = tuple(t.shape[i] for i in range(t.ndim))
        if t.strides:
            strides, acc = [], 1
            for s in reversed(shape):
                strides.append(acc)
                acc *= s
            if tuple(t.strides[i] for i in range(t.ndim)) != tuple(reversed(strides)):
                raise InvalidArgumentError(f"{name} must be C-contiguous")
        return ((t.data or 0) + t.byte_offset, shape, ("dlpack", t.dtype.code, t.dtype.bits),
                t.device.device_type)
    raise InvalidArgumentError(
        f"{name} must be a CUDA device array (__cuda_array_interface__ or DLPack) for the "
        f"'cuda' backend, got {type(obj).__name__}")


# --- the plan -------------------------------------------------------------------------------------
def act_params_for(activations, act_params):
    """act_params as an ActParams (None when not given) for normalized ``activations``; an error
    when given for anything but the clamped SwiGLU pair. Every front end checks them here."""
    p = _normalize_act_params(act_params)
    if p is not None and tuple(activations) != GATED_PAIRS["clamped_swiglu"]:
        raise InvalidArgumentError(
            "act_params applies only to the clamped SwiGLU pair "
            f"('clamped_silu', 'clamped_linear'), but activation_type is {tuple(activations)!r}")
    return p


_INT64_MAX = 2**63 - 1


def _int_in(name, v, lo, hi):
    """v as an int in [lo, hi], checked before ctypes sees it (ctypes wraps out-of-range integers
    silently: 2**64 + 8 would reach the library as 8)."""
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise InvalidArgumentError(f"{name} must be an int, got {v!r}")
    if not lo <= int(v) <= hi:
        raise InvalidArgumentError(f"{name} must be in [{lo}, {hi}], got {v}")
    return int(v)


def _prepared_tokens(counts):
    """``prepared_tokens`` as a sorted tuple of distinct ints (an iterable of ints; the library
    checks their range, and refuses more than 32 of them)."""
    try:
        items = list(counts)
    except TypeError:
        raise InvalidArgumentError(f"prepared_tokens must be token counts (ints), got {counts!r}") from None
    return tuple(sorted({_int_in("a prepared token count", t, -_INT64_MAX - 1, _INT64_MAX) for t in items}))


def _normalize_sharding(sharding):
    """None -> (1, 0, False); (group_size, rank, sequence_parallel) checked for type."""
    if sharding is None:
        return (1, 0, False)
    try:
        g, r, sp = sharding
    except (TypeError, ValueError):
        raise InvalidArgumentError(
            f"sharding must be (group_size, rank, sequence_parallel), got {sharding!r}") from None
    for nm, v in (("group_size", g), ("rank", r)):
        _int_in(f"sharding's {nm}", v, -_INT64_MAX - 1, _INT64_MAX)
    if int(g) < 1 or not 0 <= int(r) < int(g):
        raise InvalidArgumentError(f"sharding needs group_size >= 1 and 0 <= rank < group_size, got {sharding!r}")
    return (int(g), int(r), bool(sp))


def _mpi_comm_address(comm):
    """The address of an mpi4py communicator's MPI_Comm (what lnmlp_comm_create_mpi takes)."""
    try:
        from mpi4py import MPI
    except ImportError:
        raise InvalidArgumentError("comm must be an mpi4py communicator, but mpi4py is not installed") from None
    if not isinstance(comm, MPI.Comm):
        raise InvalidArgumentError(f"comm must be an mpi4py communicator (mpi4py.MPI.Comm), got {type(comm).__name__}")
    return ctypes.c_void_p(MPI._addressof(comm))


class Plan:
    """A fused ``y = act(norm(x) @ W1 + b1) @ W2 + b2`` for one configuration, forward and backward.

    Mirrors the C descriptor (include/lnmlp.h). ``tokens`` is the most tokens one call may take:
    each call takes x, y [..., H] with any number of tokens t = prod(leading dims) from 0 to
    ``tokens`` (a call with t tokens computes exactly what a plan made for t tokens computes; more
    than ``tokens`` raises the library's InvalidArgumentError). gamma, beta [H] (beta None for
    rmsnorm); w1 [H, A, F]; b1 [A, F]; w2 [F, H]; b2 [H]. A is the number of activations (1, or 2
    for a gated pair). ``weight_layout="out_in"`` (``lnmlp_desc_set_weight_layout``) takes w1
    [A, F, H] and w2 [H, F] instead, and gives dw1 and dw2 so: PyTorch's ``nn.Linear`` weights as
    they are stored (the default "in_out" is JAX's kernels); both compute the same block. :meth:`tensor_shape` gives every shape as the library computes it. Every
    array has the plan's dtype and is C-contiguous. One plan must be used by one thread at a time
    (calls on one Plan object are serialised by a lock). ``close()`` frees the C plan; so does
    garbage collection.

    ``forward`` returns ``(y, saved)``: ``saved`` (a uint8 array, aligned as the plan requires,
    sized for the call's tokens) carries what backward needs; pass it to ``backward`` with the same
    x and weights, unmodified.

    ``recipe`` (None, or :class:`lnmlp.DelayedScaling`, :class:`lnmlp.Float8CurrentScaling`,
    :class:`lnmlp.Float8BlockScaling`, :class:`lnmlp.MXFP8BlockScaling`) runs the GEMMs in FP8
    (docs/fp8.md). Under delayed scaling the plan owns each quantizer's scale and amax history:
    ``forward`` updates ln_out, w1, act_out, w2, ``backward`` dy, dh; read and write them with
    :meth:`quantizer_state` / :meth:`set_quantizer_state`, or checkpoint them with
    :meth:`export_state` / :meth:`import_state` (experimental). A caller that keeps the state
    itself passes its float32 array (``tensor_shape("fp8_state")``, updated in place) to each call
    (``forward(..., fp8_state=a)``, ``backward(..., fp8_state=a)``) or attaches it to the plan
    (:meth:`attach_fp8_state`).

    ``sharding=(group_size, rank, sequence_parallel)`` makes the plan one rank of a tensor-parallel
    group (docs/sharding.md; CPU backend): tokens, hidden and ffn stay the group's sizes, while the
    arrays are this rank's shard: w1 [H, A, F/P], b1 [A, F/P], w2 [F/P, H], and under sequence
    parallelism x, y, dy, dx hold tokens/P rows. ``comm`` is the group's communicator: an mpi4py
    communicator (``MPI.COMM_WORLD``), whose size and rank must match ``sharding``; or an object
    holding an lnmlp communicator it made, as its ``lnmlp_comm_handle`` (a ``ctypes.c_void_p``;
    lnmlp.torch's process groups), which the plan keeps alive.

    Experimental (the C header's LNMLP_EXPERIMENTAL tier, which may change in any release; the
    names are in ``lnmlp._capi.EXPERIMENTAL``): ``sharding`` and ``comm`` (lnmlp_desc_set_sharding,
    the communicators), :meth:`export_state` / :meth:`import_state` (the state blob's format) and
    ``backend="cuda"`` (device arrays; not yet run on a GPU). The rest is the stable core.

    Micro-batches (``lnmlp_desc_set_weight_gradients``): ``accumulate_grads=True`` makes backward add
    into the caller's dw1, db1, dw2, db2 (``backward(..., grads=...)``, required then; each element
    becomes rnd(old + gradient), the gradient in fp32) instead of overwriting them; ``grad_dtype``
    is their dtype: None for the plan's dtype, or "float32" / numpy.float32 (an fp32 "main_grad"
    for a bfloat16 or float16 plan); another dtype raises InvalidArgumentError. :attr:`grad_dtype`
    is the dtype the library reports, and :meth:`zero_weight_grads` makes zeroed buffers.
    ``weight_dtype`` (``lnmlp_desc_set_weight_dtype``) is w1's and w2's: None for the plan's dtype,
    or "float32" for fp32 master weights with a bfloat16 / float16 plan under an FP8 recipe, which
    quantizes them directly (as TransformerEngine quantizes fp32 kernels); without a recipe the
    library refuses it (NotSupportedError). :attr:`weight_dtype` is the dtype the library reports.
    ``forward`` / ``backward(..., weights_unchanged=True)`` reuse the plan's copies of w1 and w2
    (widened or FP8-quantized) made by an earlier call with the same weights, as
    TransformerEngine's ``is_first_microbatch=False``.

    ``external_workspace=True`` makes a plan that allocates no workspace (for a caller that owns
    the memory, as lnmlp.jax's XLA calls do, or one that only asks for :attr:`workspace_bytes`);
    its forward and backward need the C API's lnmlp_plan_attach_workspace first. ``device`` is the
    CUDA device ordinal of a ``backend="cuda"`` plan (the CPU backend has only device 0).
    ``gemm_math`` (experimental, ``lnmlp_desc_set_gemm_math``) lets a CUDA plan's GEMMs trade
    exactness for speed: ``"fp8_fast_accumulation"`` (the forward GEMMs of per-tensor FP8 recipes
    accumulate in the tensor cores' precision, as TransformerEngine runs them) and/or ``"tf32"``
    (fp32 GEMMs on TF32 tensor cores, PyTorch's ``allow_tf32``); the default ``()`` is exact, and
    the CPU backend computes exactly whatever it is given.

    ``norm_output=True`` (``lnmlp_desc_set_norm_output``) makes forward also give the norm output
    ``rnd_D(norm(x))`` [t, H] in the plan's dtype (TransformerEngine's ``return_layernorm_output``),
    under every recipe and remat policy: it is a section of the saved buffer, read with
    :meth:`norm_output_from`. :meth:`saved_section` says where any section of the saved buffer is.

    ``prepared_tokens`` (``lnmlp_desc_set_prepared_tokens``): up to 32 token counts besides
    ``tokens`` (a call's, this rank's rows under sequence parallelism; each 1 .. the most a call
    takes) whose GEMMs the plan makes now. A call with ``tokens`` or one of them makes nothing;
    another count's first call makes its GEMMs then (slower, allocating, and on the CPU backend
    able to crash the process if memory runs out meanwhile): name the batch sizes a server uses.
    """

    def __init__(self, tokens, hidden, ffn, *, norm_type="layernorm", zero_centered_gamma=False,
                 epsilon=1e-6, activation_type=("relu",), act_params=None, use_bias1=False,
                 use_bias2=False, dtype=np.float32, remat="save_all", num_threads=0, backend="cpu",
                 recipe=None, sharding=None, comm=None, accumulate_grads=False, grad_dtype=None,
                 weight_dtype=None, external_workspace=False, device=0, weight_layout="in_out",
                 gemm_math=(), norm_output=False, prepared_tokens=()):
        self._handle = None  # set first, so __del__ is safe whatever fails below
        self._lock = threading.RLock()
        lib = _lib.get_lib()
        self._destroy_fn = lib.lnmlp_plan_destroy  # kept for __del__ at interpreter shutdown
        for nm, v in (("tokens", tokens), ("hidden", hidden), ("ffn", ffn)):
            _int_in(nm, v, -_INT64_MAX - 1, _INT64_MAX)  # the library says what it accepts within int64
        self.tokens, self.hidden, self.ffn = int(tokens), int(hidden), int(ffn)
        self.norm_type = norm_type.lower() if isinstance(norm_type, str) else norm_type
        norm = _choice("norm_type", norm_type, _NORMS)
        self.zero_centered_gamma = bool(zero_centered_gamma)
        self.epsilon = float(epsilon)
        self.activation_type = normalize_activations(activation_type)
        self.num_activations = len(self.activation_type)
        self.act_params = act_params_for(self.activation_type, act_params)
        self.use_bias1, self.use_bias2 = bool(use_bias1), bool(use_bias2)
        self.dtype = _normalize_dtype(dtype)
        self.remat = remat.lower() if isinstance(remat, str) else remat
        remat_v = _choice("remat", remat, _REMATS)
        self.weight_layout = weight_layout.lower() if isinstance(weight_layout, str) else weight_layout
        layout_v = _choice("weight_layout", weight_layout, _WEIGHT_LAYOUTS)
        self.gemm_math, gemm_math_v = _gemm_math_flags(gemm_math)
        self.backend = backend.lower() if isinstance(backend, str) else backend
        backend_v = _choice("backend", backend, _BACKENDS)
        self.num_threads = _int_in("num_threads", num_threads, 0, 65536)
        self.recipe = check_recipe(recipe)
        self.sharding = _normalize_sharding(sharding)
        P, _, sp = self.sharding
        self._fp8_state = None  # the caller's array attached with attach_fp8_state (kept alive here)
        self.accumulate_grads = _flag("accumulate_grads", accumulate_grads)
        self.external_workspace = _flag("external_workspace", external_workspace)
        self.norm_output = _flag("norm_output", norm_output)
        self.prepared_tokens = _prepared_tokens(prepared_tokens)
        grad_dtype_v = self._grad_dtype_code(grad_dtype)
        weight_dtype_v = self._float32_option_code("weight_dtype", weight_dtype)
        if isinstance(device, bool) or not isinstance(device, (int, np.integer)) or not 0 <= device < 2**31:
            raise InvalidArgumentError(f"device must be a device ordinal (an int >= 0), got {device!r}")
        device_v = self.device = int(device)

        desc = ctypes.c_void_p()
        comm_handle = ctypes.c_void_p()
        _lib.check(lib.lnmlp_desc_create(ctypes.byref(desc)))
        try:
            c = _lib.check
            c(lib.lnmlp_desc_set_backend(desc, backend_v, device_v))
            c(lib.lnmlp_desc_set_shape(desc, self.tokens, self.hidden, self.ffn))
            c(lib.lnmlp_desc_set_norm(desc, norm))
            c(lib.lnmlp_desc_set_zero_centered_gamma(desc, int(self.zero_centered_gamma)))
            c(lib.lnmlp_desc_set_epsilon(desc, self.epsilon))
            acts = (ctypes.c_int32 * self.num_activations)(*(ACTIVATIONS[a] for a in self.activation_type))
            c(lib.lnmlp_desc_set_activations(desc, self.num_activations, acts))
            if self.act_params is not None:
                p = self.act_params
                c(lib.lnmlp_desc_set_clamped_swiglu(desc, p.limit, p.alpha, p.offset))
            c(lib.lnmlp_desc_set_bias(desc, int(self.use_bias1), int(self.use_bias2)))
            c(lib.lnmlp_desc_set_dtype(desc, _DTYPES[self.dtype]))
            c(lib.lnmlp_desc_set_remat(desc, remat_v))
            c(lib.lnmlp_desc_set_weight_layout(desc, layout_v))
            if self.norm_output:
                c(lib.lnmlp_desc_set_norm_output(desc, 1))
            if gemm_math_v:
                c(lib.lnmlp_desc_set_gemm_math(desc, gemm_math_v))
            if self.prepared_tokens:
                counts = (ctypes.c_int64 * len(self.prepared_tokens))(*self.prepared_tokens)
                c(lib.lnmlp_desc_set_prepared_tokens(desc, len(self.prepared_tokens), counts))
            if self.num_threads:
                c(lib.lnmlp_desc_set_num_threads(desc, self.num_threads))
            if self.recipe is not None:
                self.recipe._apply(lib, desc, c)
            if weight_dtype_v != -1:
                c(lib.lnmlp_desc_set_weight_dtype(desc, weight_dtype_v))
            if self.accumulate_grads or grad_dtype_v != -1:
                c(lib.lnmlp_desc_set_weight_gradients(desc, int(self.accumulate_grads), grad_dtype_v))
            if comm is not None and hasattr(comm, "lnmlp_comm_handle"):
                self._comm = comm  # its callbacks must outlive the plan
                c(lib.lnmlp_desc_set_communicator(desc, comm.lnmlp_comm_handle))
            elif comm is not None:
                c(lib.lnmlp_comm_create_mpi(_mpi_comm_address(comm), ctypes.byref(comm_handle)))
                c(lib.lnmlp_desc_set_communicator(desc, comm_handle))
            if self.sharding != (1, 0, False):
                c(lib.lnmlp_desc_set_sharding(desc, P, self.sharding[1], int(sp)))
            if self.external_workspace:
                c(lib.lnmlp_desc_set_external_workspace(desc, 1))
            handle = ctypes.c_void_p()
            c(lib.lnmlp_plan_create(desc, ctypes.byref(handle)))
            self._handle = handle
        finally:
            lib.lnmlp_desc_destroy(desc)
            if comm_handle.value:
                lib.lnmlp_comm_destroy(comm_handle)  # the plan keeps the communicator alive
        self.workspace_bytes = self._query(lib.lnmlp_plan_get_workspace_bytes)
        self.saved_bytes = self._query(lib.lnmlp_plan_get_saved_bytes)
        self.saved_bytes_per_token = self._query(lib.lnmlp_plan_get_saved_bytes_per_token)
        self.alignment = self._query(lib.lnmlp_plan_get_alignment)
        # The shapes of the tensors whose size does not depend on the call's tokens, as the library
        # gives them (shards under sharding; None for a tensor the plan does not take).
        self._shapes, self._dtypes = {}, {}
        for t in _FIXED_TENSORS:
            self._shapes[t], self._dtypes[t] = self._tensor_shape(t, _lib.TOKENS_MAX, with_dtype=True)
        #: The most tokens (rows of x) one call may take: ``tokens``, or ``tokens / P`` for this
        #: rank under sequence parallelism.
        self.local_tokens, self._row_width = self._tensor_shape(_lib.TENSOR_X, _lib.TOKENS_MAX)
        #: This rank's columns of F (``ffn``, or ``ffn / P`` under sharding).
        self.local_ffn = self._shapes[_lib.TENSOR_W1][2 if self.weight_layout == "in_out" else 1]
        #: The element type of dw1, db1, dw2, db2 as the library reports it: the plan's dtype, or
        #: float32 for ``grad_dtype="float32"``.
        self.grad_dtype = self._dtypes[_lib.TENSOR_DW1]
        #: The element type of w1 and w2 as the library reports it: the plan's dtype, or float32 for
        #: ``weight_dtype="float32"``.
        self.weight_dtype = self._dtypes[_lib.TENSOR_W1]
        self.state_bytes = self._query(lib.lnmlp_plan_get_state_bytes)
        n = ctypes.c_int64()
        _lib.check(lib.lnmlp_plan_get_amax_history_length(self._handle, ctypes.byref(n)))
        self.amax_history_length = n.value

    # --- lifetime ---------------------------------------------------------------------------------
    def _query(self, fn):
        out = ctypes.c_int64()
        _lib.check(fn(self._handle, ctypes.byref(out)))
        return out.value

    def _grad_dtype_code(self, grad_dtype):
        """grad_dtype -> lnmlp_desc_set_weight_gradients' dtype."""
        return self._float32_option_code("grad_dtype", grad_dtype)

    def _float32_option_code(self, name, dtype):
        """A dtype option that is the plan's dtype or float32 (grad_dtype, weight_dtype) -> the C
        setter's dtype: -1 for None or the plan's dtype, LNMLP_DTYPE_F32 for float32; another float
        dtype is passed on for the library to refuse."""
        if dtype is None:
            return -1
        try:
            dt = _normalize_dtype(dtype)
        except InvalidArgumentError:
            raise InvalidArgumentError(
                f"{name} must be None (the plan's dtype, {self.dtype.name}) or numpy.float32 / "
                f"'float32', got {dtype!r}") from None
        return -1 if dt == self.dtype else _DTYPES[dt]

    # --- shapes -------------------------------------------------------------------------------------
    def _tensor_shape(self, tensor, tokens, with_dtype=False):
        """lnmlp_plan_get_tensor_shape: the shape tuple, or None when the plan does not take it
        (with_dtype: and its element type as a NumPy dtype)."""
        rank, dtype = ctypes.c_int64(), ctypes.c_int32()
        dims = (ctypes.c_int64 * _lib.MAX_TENSOR_RANK)()
        _lib.check(_lib.get_lib().lnmlp_plan_get_tensor_shape(
            self._live(), tensor, tokens, ctypes.byref(rank), dims, ctypes.byref(dtype)))
        shape = None if rank.value < 0 else tuple(int(dims[i]) for i in range(rank.value))
        if not with_dtype:
            return shape
        return shape, (None if shape is None else _ELEMENT_TYPES[dtype.value])

    def tensor_shape(self, tensor, tokens=None):
        """The shape (a tuple) of one tensor of a forward / backward call with ``tokens`` tokens
        (None: the plan's most, :attr:`local_tokens`), as ``lnmlp_plan_get_tensor_shape`` gives
        it; None for a tensor this plan does not take (beta and dbeta for rmsnorm, a disabled bias
        and its gradient, saved for remat="forward_only", fp8_state unless DelayedScaling).

        ``tensor`` is a name -- "x", "gamma", "beta", "w1", "b1", "w2", "b2", "y", "saved", "dy",
        "dx", "dgamma", "dbeta", "dw1", "db1", "dw2", "db2", "fp8_state" -- or its LNMLP_TENSOR_*
        value. Under sharding the shapes are this rank's (w1 [H, A, F/P], ...); x, y, dy, dx are
        ``(tokens, H)`` (the binding accepts any leading dims with that many rows); saved is
        ``(bytes,)`` of uint8; fp8_state is float32 ``(6, 1 + amax_history_length)``."""
        if isinstance(tensor, str) and tensor.lower() in _lib.TENSORS:
            t = _lib.TENSORS[tensor.lower()]
        elif (isinstance(tensor, (int, np.integer)) and not isinstance(tensor, bool)
              and 0 <= int(tensor) < _lib.TENSOR_COUNT):
            t = int(tensor)
        else:
            raise InvalidArgumentError(
                f"tensor must be one of {', '.join(_lib.TENSORS)} (or 0..{_lib.TENSOR_COUNT - 1}), got {tensor!r}")
        if tokens is None:
            tokens = _lib.TOKENS_MAX
        else:
            tokens = _int_in("tokens", tokens, -_INT64_MAX - 1, _INT64_MAX)
        with self._lock:
            return self._tensor_shape(t, int(tokens))

    def deferred_bytes(self, tokens=None) -> int:
        """The bytes of the deferred buffer of backward in two calls (``lnmlp_plan_backward_data``,
        then ``lnmlp_plan_backward_weights``) for a call with ``tokens`` tokens (None: the plan's
        most), as ``lnmlp_plan_get_deferred_bytes`` gives them; 0 for a plan that does not train."""
        tokens = _lib.TOKENS_MAX if tokens is None else _int_in("tokens", tokens, -_INT64_MAX - 1, _INT64_MAX)
        out = ctypes.c_int64()
        with self._lock:
            _lib.check(_lib.get_lib().lnmlp_plan_get_deferred_bytes(self._live(), int(tokens), ctypes.byref(out)))
        return out.value

    def saved_section(self, section, tokens=None):
        """Where one section of the saved buffer of a call with ``tokens`` tokens (None: the plan's
        most) is, as ``lnmlp_plan_get_saved_section`` gives it: ``(offset, shape, dtype)`` (the
        byte offset, a shape tuple and a NumPy dtype), or None where this plan saves no such
        section. ``section`` is a name -- "mean", "rstd", "norm_output", "ffn1", "act_out",
        "fp8_scales", "norm_output_codes", "norm_output_scales", "act_out_codes",
        "act_out_scales" -- or its LNMLP_SAVED_* value."""
        if isinstance(section, str) and section.lower() in _lib.SAVED_SECTIONS:
            s = _lib.SAVED_SECTIONS[section.lower()]
        elif (isinstance(section, (int, np.integer)) and not isinstance(section, bool)
              and 0 <= int(section) < len(_lib.SAVED_SECTIONS)):
            s = int(section)
        else:
            raise InvalidArgumentError(f"section must be one of {', '.join(_lib.SAVED_SECTIONS)} "
                                       f"(or 0..{len(_lib.SAVED_SECTIONS) - 1}), got {section!r}")
        tokens = _lib.TOKENS_MAX if tokens is None else _int_in("tokens", tokens, -_INT64_MAX - 1, _INT64_MAX)
        offset, rank, dtype = ctypes.c_int64(), ctypes.c_int64(), ctypes.c_int32()
        dims = (ctypes.c_int64 * _lib.MAX_TENSOR_RANK)()
        with self._lock:
            _lib.check(_lib.get_lib().lnmlp_plan_get_saved_section(
                self._live(), s, int(tokens), ctypes.byref(offset), ctypes.byref(rank), dims, ctypes.byref(dtype)))
        if rank.value < 0:
            return None
        return offset.value, tuple(int(dims[i]) for i in range(rank.value)), _ELEMENT_TYPES[dtype.value]

    def norm_output_from(self, saved, tokens):
        """The norm output [tokens, H] in the plan's dtype: a view into ``saved``, the buffer forward
        returned for a call with ``tokens`` tokens (CPU backend). Every token of the group under
        sequence parallelism (all-gathered). A plan made with ``norm_output=True`` has it under
        every recipe and remat policy, an unquantized "save_all" plan always; another plan raises
        InvalidArgumentError."""
        where = self.saved_section("norm_output", tokens)
        if where is None:
            raise InvalidArgumentError("this plan does not give the norm output; make it with norm_output=True")
        offset, shape, dtype = where
        if not isinstance(saved, np.ndarray) or saved.dtype != np.uint8 or saved.ndim != 1:
            raise InvalidArgumentError("saved must be the 1-D uint8 array forward returned")
        size = int(np.prod(shape)) * dtype.itemsize
        if saved.size < offset + size:
            raise InvalidArgumentError(f"saved holds {saved.size} bytes, but the norm output of {tokens} tokens "
                                       f"ends at byte {offset + size}: pass the buffer of that call")
        return saved[offset:offset + size].view(dtype).reshape(shape)

    @property
    def closed(self) -> bool:
        return self._handle is None

    def close(self) -> None:
        """Frees the C plan. Idempotent; later forward/backward raise InvalidHandleError."""
        lock = getattr(self, "_lock", None)
        if lock is None:
            return
        with lock:
            handle, self._handle = self._handle, None
            if handle is not None:
                self._destroy_fn(handle)
            self._fp8_state = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # never raise from a finalizer (e.g. at interpreter shutdown)
            pass

    def _live(self):
        if self._handle is None:
            raise InvalidHandleError("this lnmlp.Plan is closed; create a new Plan")
        return self._handle

    def __repr__(self):
        state = "closed" if self.closed else "open"
        return (f"lnmlp.Plan(tokens={self.tokens}, hidden={self.hidden}, ffn={self.ffn}, "
                f"norm_type={self.norm_type!r}, activation_type={self.activation_type!r}, "
                f"dtype={self.dtype.name}, use_bias1={self.use_bias1}, use_bias2={self.use_bias2}, "
                f"remat={self.remat!r}, backend={self.backend!r}, recipe={self.recipe!r}, "
                f"weight_layout={self.weight_layout!r}, sharding={self.sharding!r}, "
                f"accumulate_grads={self.accumulate_grads}, "
                f"grad_dtype={getattr(self, 'grad_dtype', self.dtype).name}) [{state}]")

    # --- the random state (stochastic rounding) ----------------------------------------------------
    def rng_state(self):
        """``(seed, offset)``: the stream the plan's stochastic rounding draws from next (NVFP4's
        gradients); each backward that draws moves ``offset`` on by one."""
        with self._lock:
            seed, offset = ctypes.c_uint64(), ctypes.c_uint64()
            _lib.check(_lib.get_lib().lnmlp_plan_get_rng_state(self._live(), ctypes.byref(seed), ctypes.byref(offset)))
            return int(seed.value), int(offset.value)

    def set_rng_state(self, seed, offset=0) -> None:
        """Sets the random state (``lnmlp_plan_set_rng_state``): ints in [0, 2**64). The draws of a
        backward follow from ``(seed, offset)`` alone, on any backend and thread count."""
        values = []
        for name, v in (("seed", seed), ("offset", offset)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= int(v) < 2 ** 64:
                raise InvalidArgumentError(f"{name} must be an int in [0, 2**64), got {v!r}")
            values.append(int(v))
        with self._lock:
            _lib.check(_lib.get_lib().lnmlp_plan_set_rng_state(self._live(), *values))

    def set_rng_place(self, first_token, whole_tokens=0, ffn_part=0, ffn_parts=1) -> None:
        """Where the plan's calls lie in the whole tensors the random stream is drawn over
        (``lnmlp_plan_set_rng_place``), for a split done by the caller: tokens from ``first_token``
        of ``whole_tokens`` (0: the call's count), F part ``ffn_part`` of ``ffn_parts``; the parts
        of a split then draw, between them, the unsplit call's bits."""
        values = []
        for name, v in (("first_token", first_token), ("whole_tokens", whole_tokens), ("ffn_part", ffn_part),
                        ("ffn_parts", ffn_parts)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not -2 ** 63 <= int(v) < 2 ** 63:
                raise InvalidArgumentError(f"{name} must be an int, got {v!r}")
            values.append(int(v))
        if not all(-2 ** 31 <= v < 2 ** 31 for v in values[2:]):
            raise InvalidArgumentError(f"ffn_part and ffn_parts must be 32-bit ints, got {values[2:]}")
        with self._lock:
            _lib.check(_lib.get_lib().lnmlp_plan_set_rng_place(self._live(), *values))

    # --- FP8 quantizer state (delayed scaling) -----------------------------------------------------
    def _require_state(self):
        if self.amax_history_length == 0:
            raise InvalidArgumentError(
                f"this plan's recipe ({self.recipe!r}) keeps no quantizer state; only "
                f"DelayedScaling does")

    def quantizer_state(self, name):
        """``(scale, amax_history)`` of one quantizer ("ln_out", "w1", "act_out", "w2", "dy",
        "dh"): the scale as a float, the history as a float32 array, newest first (copies).
        Delayed scaling only (InvalidArgumentError otherwise)."""
        q = quantizer_index(name)
        with self._lock:
            handle = self._live()
            self._require_state()
            scale = ctypes.c_float()
            hist = np.empty(self.amax_history_length, dtype=np.float32)
            _lib.check(_lib.get_lib().lnmlp_plan_get_quantizer_state(
                handle, q, ctypes.byref(scale), hist.ctypes.data, hist.size))
            return float(scale.value), hist

    def set_quantizer_state(self, name, scale, amax_history):
        """Replaces one quantizer's state: scale finite and > 0; amax_history a 1-D array of
        :attr:`amax_history_length` entries (newest first), each >= 0, +inf or NaN."""
        q = quantizer_index(name)
        with self._lock:
            self._live()
            self._require_state()
            s = check_scale(QUANTIZERS[q], scale)
            h = check_history(QUANTIZERS[q], amax_history, self.amax_history_length)
            self._set_quantizer_state_unchecked(q, s, h)

    def _set_quantizer_state_unchecked(self, q, scale, hist):
        hist = np.ascontiguousarray(hist, dtype=np.float32)
        _lib.check(_lib.get_lib().lnmlp_plan_set_quantizer_state(
            self._live(), q, float(scale), hist.ctypes.data, hist.size))

    def export_state(self) -> bytes:
        """The whole quantizer state as a versioned blob (``lnmlp_plan_export_state``); ``b""``
        for a stateless recipe.

        Experimental (the C header's LNMLP_EXPERIMENTAL tier): the blob's format may change in any
        release. :meth:`quantizer_state` is the stable way to read the state."""
        with self._lock:
            handle = self._live()
            if self.state_bytes == 0:
                return b""
            buf = ctypes.create_string_buffer(self.state_bytes)
            _lib.check(_lib.get_lib().lnmlp_plan_export_state(handle, buf, self.state_bytes))
            return buf.raw

    def import_state(self, blob) -> None:
        """Restores a blob from :meth:`export_state` of a plan with the same recipe and history
        length, bit for bit; a blob of another version, recipe, length or with invalid values
        raises InvalidArgumentError and changes nothing.

        Experimental (the C header's LNMLP_EXPERIMENTAL tier), as :meth:`export_state`;
        :meth:`set_quantizer_state` is the stable way to write the state."""
        if isinstance(blob, np.ndarray):
            blob = blob.tobytes()
        if not isinstance(blob, (bytes, bytearray, memoryview)):
            raise InvalidArgumentError(f"blob must be bytes, got {type(blob).__name__}")
        data = bytes(blob)
        with self._lock:
            handle = self._live()
            # An empty blob is a blob of the wrong length (InvalidArgumentError), not a NULL one.
            buf = ctypes.create_string_buffer(data, max(len(data), 1))
            _lib.check(_lib.get_lib().lnmlp_plan_import_state(handle, buf, len(data)))

    # --- argument checks --------------------------------------------------------------------------
    def _ptr(self, name, arr, shape, dtype=None):
        """The data pointer of a required tensor after checking type, dtype (the plan's unless
        given), shape, layout."""
        dtype = self.dtype if dtype is None else np.dtype(dtype)
        if self.backend == "cuda":
            return self._device_ptr(name, arr, shape, dtype)
        if arr is None:
            raise NullPointerError(f"{name} is None, but this plan needs it")
        if not isinstance(arr, np.ndarray):
            if hasattr(arr, "__cuda_array_interface__"):
                raise InvalidArgumentError(
                    f"{name} is a CUDA device array, but this plan's backend is 'cpu'; "
                    f"pass a NumPy array")
            raise InvalidArgumentError(
                f"{name} must be a numpy.ndarray, got {type(arr).__name__}; convert it with "
                f"numpy.asarray({name}, dtype=...)")
        if arr.dtype != dtype:
            raise InvalidArgumentError(
                f"{name} has dtype {arr.dtype}, but the plan's dtype is {dtype.name}"
                if dtype == self.dtype else f"{name} has dtype {arr.dtype}, but the plan takes {dtype.name}")
        if tuple(arr.shape) != tuple(shape):
            raise InvalidArgumentError(
                f"{name} has shape {tuple(arr.shape)}, but the plan needs {tuple(shape)}")
        if not arr.flags.c_contiguous:
            raise InvalidArgumentError(
                f"{name} is not C-contiguous; pass numpy.ascontiguousarray({name})")
        if not arr.flags.aligned:
            raise MisalignedError(f"{name} is not aligned to its element size")
        return arr.ctypes.data

    def _device_ptr(self, name, obj, shape, dtype=None):
        dtype = self.dtype if dtype is None else np.dtype(dtype)
        if obj is None:
            raise NullPointerError(f"{name} is None, but this plan needs it")
        ptr, got_shape, kind, device_type = device_array_info(name, obj)
        if device_type != _KDL_CUDA:
            raise InvalidArgumentError(f"{name} is not a CUDA device array (DLPack device {device_type})")
        ok = (kind[1] in _CAI_TYPESTRS[dtype]) if kind[0] == "cai" else (kind[1:] == _DL_CODES[dtype])
        if not ok:
            raise InvalidArgumentError(f"{name} has element type {kind[1:]}, but it must be {dtype.name}")
        if tuple(got_shape) != tuple(shape):
            raise InvalidArgumentError(f"{name} has shape {tuple(got_shape)}, but the plan needs {tuple(shape)}")
        return ptr

    def _opt_ptr(self, name, arr, shape, what):
        """The pointer of an optional tensor: None exactly when the plan does not take it (shape None)."""
        if shape is None:
            if arr is not None:
                raise InvalidArgumentError(f"{name} was given, but {what}; pass None")
            return None
        if arr is None:
            raise NullPointerError(f"{name} is None, but this plan needs it ({what})")
        return self._ptr(name, arr, shape)

    def _x_shape(self, name, arr):
        """Checks x (or dy) is [..., H]; returns its full shape and its tokens (the product of the
        leading dims). Whether the tokens fit the plan is the library's check."""
        shape = tuple(getattr(arr, "shape", ()))
        if self.backend == "cuda" and not isinstance(arr, np.ndarray):
            shape = device_array_info(name, arr)[1]
        if len(shape) < 1 or shape[-1] != self._row_width:
            raise InvalidArgumentError(
                f"{name} has shape {shape}, but the plan needs [..., {self._row_width}] with at most "
                f"{self.local_tokens} tokens (the product of the leading dims)")
        return shape, int(np.prod(shape[:-1], dtype=np.int64))

    def _param_ptrs(self, gamma, beta, w1, w2):
        sh = self._shapes
        pg = self._ptr("gamma", gamma, sh[_lib.TENSOR_GAMMA])
        if sh[_lib.TENSOR_BETA] is None:
            if beta is not None:
                raise InvalidArgumentError("beta was given, but rmsnorm has no beta; pass None")
            pb = None
        else:
            if beta is None:
                raise NullPointerError("beta is None, but layernorm needs it")
            pb = self._ptr("beta", beta, sh[_lib.TENSOR_BETA])
        wt = self._dtypes
        return (pg, pb, self._ptr("w1", w1, sh[_lib.TENSOR_W1], wt[_lib.TENSOR_W1]),
                self._ptr("w2", w2, sh[_lib.TENSOR_W2], wt[_lib.TENSOR_W2]))

    def _bias_ptrs(self, b1, b2):
        return (self._opt_ptr("b1", b1, self._shapes[_lib.TENSOR_B1],
                              "use_bias1=True" if self.use_bias1 else "the plan has use_bias1=False"),
                self._opt_ptr("b2", b2, self._shapes[_lib.TENSOR_B2],
                              "use_bias2=True" if self.use_bias2 else "the plan has use_bias2=False"))

    def _state_ptr(self, name, state):
        """The pointer of a caller-owned FP8 state array (None for None) after checking it against
        the plan's LNMLP_TENSOR_FP8_STATE shape: float32, C-contiguous, writeable."""
        if state is None:
            return None
        shape = self._shapes[_lib.TENSOR_FP8_STATE]
        if shape is None:
            raise InvalidArgumentError(
                f"{name} was given, but this plan's recipe ({self.recipe!r}) keeps no quantizer "
                f"state; only DelayedScaling does; pass None")
        if self.backend == "cuda":  # pragma: no cover - no CUDA backend in this build
            ptr = self._device_ptr(name, state, shape, np.float32)
            if ptr % 16:
                raise MisalignedError(f"{name} is not aligned to 16 bytes")
            return ptr
        if not isinstance(state, np.ndarray):
            raise InvalidArgumentError(
                f"{name} must be a float32 numpy.ndarray of shape {shape}, got {type(state).__name__}")
        if state.dtype != np.float32:
            raise InvalidArgumentError(f"{name} has dtype {state.dtype}, but the FP8 state is float32")
        if tuple(state.shape) != shape:
            raise InvalidArgumentError(
                f"{name} has shape {tuple(state.shape)}, but this plan's FP8 state is {shape} (per "
                f"quantizer, in lnmlp.QUANTIZERS order: the scale, then the amax history, newest first)")
        return _written_array_address(name, state, f"pass numpy.ascontiguousarray({name})",
                                      "lnmlp updates it in place")

    def _empty(self, shape, dtype=None):
        dtype = self.dtype if dtype is None else dtype
        if self.backend == "cuda":  # pragma: no cover - no CUDA backend in this build
            try:
                import cupy
            except ImportError:
                raise NotSupportedError("the 'cuda' backend needs cupy to allocate outputs")
            return cupy.empty(shape, dtype=dtype)
        return np.empty(shape, dtype=dtype)

    def _aligned_bytes(self, nbytes):
        """A uint8 array of nbytes whose data is aligned to the plan's alignment."""
        if self.backend == "cuda":  # pragma: no cover
            return self._empty((nbytes,), np.uint8)  # CUDA allocators align to >= 256 bytes
        align = max(int(self.alignment), 1)
        raw = np.empty(nbytes + align, dtype=np.uint8)
        off = (-raw.ctypes.data) % align
        return raw[off:off + nbytes]

    def _ptr_of(self, arr):
        if arr is None:
            return None
        if isinstance(arr, np.ndarray):
            return arr.ctypes.data
        return device_array_info("output", arr)[0]  # pragma: no cover

    def _refuse(self, fn, *args):
        """Calls forward / backward for a token count above the plan's most, which the library
        refuses (nothing is read or written; every token-sized output is NULL): raises its error."""
        _lib.check(fn(*args))
        raise _lib.InternalError(f"liblnmlp accepted {args[1]} tokens, more than the plan's "  # pragma: no cover
                                 f"{self.local_tokens}", status=_lib.ERROR_INTERNAL)

    # --- FP8 state owned by the caller (delayed scaling) --------------------------------------------
    def attach_fp8_state(self, state) -> None:
        """Makes ``state`` -- a float32 array of :meth:`tensor_shape` ("fp8_state"), i.e.
        ``(6, 1 + amax_history_length)``: per quantizer (``lnmlp.QUANTIZERS`` order) its scale, then
        its amax history, newest first -- the plan's quantizer state from now on
        (``lnmlp_plan_attach_fp8_state``): forward and backward update it in place, and
        :meth:`quantizer_state`, :meth:`set_quantizer_state`, :meth:`export_state` and
        :meth:`import_state` read and write it. The plan keeps a reference to the array while it is
        attached. ``None`` goes back to the plan's own state, which kept its values. A fresh state
        has scales 1 and zero histories. DelayedScaling plans only (InvalidArgumentError otherwise)."""
        with self._lock:
            handle = self._live()
            if state is None and self._shapes[_lib.TENSOR_FP8_STATE] is None:
                raise InvalidArgumentError(
                    f"this plan's recipe ({self.recipe!r}) keeps no quantizer state; only DelayedScaling does")
            ptr = self._state_ptr("state", state)
            _lib.check(_lib.get_lib().lnmlp_plan_attach_fp8_state(handle, ptr))
            self._fp8_state = state

    # --- execution --------------------------------------------------------------------------------
    def forward(self, x, gamma, beta, w1, b1, w2, b2, fp8_state=None, *, weights_unchanged=False):
        """y = act(norm(x) @ w1 + b1) @ w2 + b2 for x's tokens (the product of its leading dims, 0 to
        :attr:`local_tokens`). Returns ``(y, saved)``; y has x's shape; saved is a uint8 array for
        backward, sized for this call (None when the plan saves nothing).

        ``fp8_state`` (DelayedScaling only): None uses the plan's state (its own, or the array
        attached with :meth:`attach_fp8_state`); a float32 array of :meth:`tensor_shape`
        ("fp8_state") is used and updated in place for this call instead.

        ``weights_unchanged`` (TransformerEngine's ``is_first_microbatch=False``; passes
        LNMLP_CALL_WEIGHTS_UNCHANGED): True promises that w1 and w2 hold the values they had in the
        plan's call that last made its copies of them -- the widened copies (float16 plans; bfloat16
        on a CPU without bf16 GEMMs) or, under an FP8 recipe, the quantized copies with their scales
        -- so this call reuses those copies instead of making them again. Pass it for the
        micro-batches after the first one with the same weights, and for the backward of a forward
        with the same weights. Every call keeps the copies it makes (a copy not made yet is made),
        so the flag is always safe when the promise holds. On a CPU with AVX-512 GEMM kernels a
        flagged forward also reads w1 and w2 from packed copies (the GEMM library's own layout: at a
        few tokens the forward runs several times faster), made by the first flagged call; their
        GEMMs may sum in another order, so a flagged forward can differ from an unflagged one in the
        last bits (flagged calls agree with each other bit for bit). If the weights did change,
        the results come from the OLD weights' copies (a float32 plan without FP8 on a CPU that
        packs no weights keeps no copies and reads w1, w2 as given). Under delayed scaling the reused copies keep the scale they were made with, and the
        weights' amaxes recorded are those measured then. Under sharding every rank passes the same
        value. False (the default) makes the copies afresh, as
        TransformerEngine's ``is_first_microbatch=None`` / ``True``."""
        unchanged = _flag("weights_unchanged", weights_unchanged)
        with self._lock:
            handle = self._live()
            lib = _lib.get_lib()
            xshape, t = self._x_shape("x", x)
            px = self._ptr("x", x, xshape)
            pg, pb, pw1, pw2 = self._param_ptrs(gamma, beta, w1, w2)
            flags = _lib.CALL_WEIGHTS_UNCHANGED if unchanged else _lib.CALL_DEFAULT
            pb1, pb2 = self._bias_ptrs(b1, b2)
            pst = self._state_ptr("fp8_state", fp8_state)
            if t > self.local_tokens:
                self._refuse(lib.lnmlp_plan_forward, handle, t, px, pg, pb, pw1, pb1, pw2, pb2, None, None,
                             pst, flags, None)
            y = self._empty(xshape)
            saved_shape = self._tensor_shape(_lib.TENSOR_SAVED, t)
            saved = None if saved_shape is None else self._aligned_bytes(saved_shape[0])
            if t == 0:  # 0 tokens: the token-sized pointers are NULL
                px = py = psaved = None
            else:
                py, psaved = self._ptr_of(y), self._ptr_of(saved)
            _lib.check(lib.lnmlp_plan_forward(
                handle, t, px, pg, pb, pw1, pb1, pw2, pb2, py, psaved, pst, flags, None))
            return y, saved

    def _saved_ptr(self, saved, tokens):
        shape = self._tensor_shape(_lib.TENSOR_SAVED, tokens)
        if shape is None:
            return None
        if saved is None:
            raise NullPointerError("saved is None; pass the saved buffer forward returned")
        if self.backend == "cuda":  # pragma: no cover
            ptr, got, _, _ = device_array_info("saved", saved)
            n = int(np.prod(got)) if got else 0
        else:
            if not isinstance(saved, np.ndarray) or saved.dtype != np.uint8 or saved.ndim != 1:
                raise InvalidArgumentError("saved must be the 1-D uint8 array forward returned")
            if not saved.flags.c_contiguous:
                raise InvalidArgumentError("saved is not contiguous; pass the array forward returned")
            n = saved.nbytes
            ptr = saved.ctypes.data
        if n != shape[0]:
            raise InvalidArgumentError(
                f"saved has {n} bytes, but this plan saves {shape[0]} for {tokens} tokens; pass the "
                f"saved buffer this plan's forward returned for this x")
        if ptr % max(self.alignment, 1):
            if self.backend == "cuda":  # pragma: no cover
                raise MisalignedError(f"saved is not aligned to {self.alignment} bytes")
            copy = self._aligned_bytes(n)  # e.g. a copy made by the caller: realign it
            copy[...] = saved
            return copy
        return saved

    def zero_weight_grads(self):
        """New zero-filled arrays for the weight gradients, for :meth:`backward`'s ``grads``:
        ``{"dw1", "db1", "dw2", "db2"}`` of :meth:`tensor_shape`'s shapes and :attr:`grad_dtype`
        (db1 / db2 None when the bias is disabled). With ``accumulate_grads=True`` these are the
        buffers backward adds each micro-batch's gradients into."""
        with self._lock:
            self._live()
            out = {}
            for name, k in _WEIGHT_GRADS:
                if self._shapes[k] is None:
                    out[name] = None
                    continue
                a = self._empty(self._shapes[k], self._dtypes[k])
                a[...] = 0
                out[name] = a
            return out

    def _weight_grads(self, grads, inputs):
        """The caller's weight-gradient arrays from backward's ``grads`` (None: None), checked
        against the shapes and dtypes the library reports: [dw1, db1, dw2, db2]."""
        if grads is None:
            if self.accumulate_grads:
                raise NullPointerError(
                    "grads is None, but this plan accumulates weight gradients (accumulate_grads=True): "
                    "pass grads= with the arrays to add into, dw1, db1, dw2, db2 (a dict or a Grads; "
                    "plan.zero_weight_grads() makes zeroed ones)")
            return None
        if isinstance(grads, Mapping):
            unknown = sorted(str(k) for k in grads if k not in Grads._fields)
            if unknown:
                raise InvalidArgumentError(
                    f"grads has unknown keys {unknown}; expected dw1, db1, dw2, db2")
            get, label = grads.get, "grads[{!r}]".format
        else:
            get, label = (lambda k: getattr(grads, k, None)), "grads.{}".format
        what = "accumulated into" if self.accumulate_grads else "written"
        out = []
        for name, k in _WEIGHT_GRADS:
            arr, shape, dt, nm = get(name), self._shapes[k], self._dtypes[k], label(name)
            if shape is None:
                if arr is not None:
                    bias = "use_bias1" if name == "db1" else "use_bias2"
                    raise InvalidArgumentError(
                        f"{nm} was given, but the plan has {bias}=False; pass None or leave it out")
                out.append(None)
                continue
            if arr is None:
                raise NullPointerError(
                    f"{nm} is missing or None, but grads must hold every weight gradient this plan "
                    f"{what} (dw1, dw2{', db1' if self.use_bias1 else ''}{', db2' if self.use_bias2 else ''})")
            self._grad_out_ptr(nm, arr, shape, dt)
            out.append(arr)
        if self.backend != "cuda":
            given = [(label(n), a) for (n, _), a in zip(_WEIGHT_GRADS, out) if a is not None]
            for i, (na, a) in enumerate(given):
                for nb, b in given[i + 1:] + [(n, v) for n, v in inputs if isinstance(v, np.ndarray)]:
                    if np.may_share_memory(a, b):
                        raise InvalidArgumentError(f"{na} overlaps {nb}; pass separate arrays")
        return out

    def _grad_out_ptr(self, name, arr, shape, dtype):
        """Checks one caller array backward writes (type, dtype, shape, layout, writeable)."""
        if self.backend == "cuda":  # pragma: no cover - no CUDA backend in this build
            return self._device_ptr(name, arr, shape, dtype)
        if not isinstance(arr, np.ndarray):
            raise InvalidArgumentError(
                f"{name} must be a numpy.ndarray of shape {tuple(shape)} and dtype {dtype.name}, got "
                f"{type(arr).__name__}")
        if arr.dtype != dtype:
            why = ("grad_dtype='float32'" if dtype != self.dtype else "the plan's dtype")
            raise InvalidArgumentError(
                f"{name} has dtype {arr.dtype}, but this plan's weight gradients are {dtype.name} ({why})")
        if tuple(arr.shape) != tuple(shape):
            raise InvalidArgumentError(f"{name} has shape {tuple(arr.shape)}, but the plan needs {tuple(shape)}")
        return _written_array_address(name, arr, "pass a C-contiguous array", "backward writes it")

    def backward(self, dy, x, gamma, beta, w1, b1, w2, saved, fp8_state=None, *, weights_unchanged=False,
                 grads=None):
        """Gradients given dy = dL/dy and forward's ``saved`` (with the same x and weights).

        Returns :class:`Grads` (dx, dgamma, dbeta, dw1, db1, dw2, db2); dbeta is None for
        rmsnorm, db1/db2 None when the bias is disabled; dx has x's shape. With 0 tokens the
        parameter gradients are zeros (accumulated ones stay as they are). b1 is read only when
        remat="save_stats" and use_bias1 (it may be None otherwise). ``fp8_state`` as for
        :meth:`forward` (backward updates the dy and dh quantizers). dw1, db1, dw2, db2 have
        :attr:`grad_dtype`; the others the plan's dtype.

        ``grads``: None (new arrays), or the caller's arrays for the weight gradients: a dict (such
        as :meth:`zero_weight_grads` returns) or an object with attributes (such as a :class:`Grads`)
        holding ``dw1``, ``db1``, ``dw2``, ``db2`` (db1 / db2 None or left out when the bias is
        disabled; dx, dgamma, dbeta entries are ignored: those are always new arrays). Each must
        have :meth:`tensor_shape`'s shape and :attr:`grad_dtype`, be C-contiguous and writeable and
        overlap no other argument; anything else raises InvalidArgumentError before the call. When
        the plan has ``accumulate_grads=True`` they are required (NullPointerError without them)
        and backward adds this call's gradients into them, each element rnd(old + gradient) with
        the gradient in fp32 (gradient accumulation over micro-batches; 0 tokens leaves them as they
        are); otherwise backward overwrites them (out-arrays). The returned Grads holds these same
        arrays as dw1, db1, dw2, db2. If the call fails while it runs (OutOfMemoryError,
        BackendError, InternalError) these arrays are undefined afterwards, an accumulating one
        possibly holding part of the call's sum; any other error is raised before anything is
        written. The FP8 state is never left half-updated.

        ``weights_unchanged``: as for :meth:`forward` (the backward of a forward with the same
        weights passes True: it reuses the copies that forward made)."""
        unchanged = _flag("weights_unchanged", weights_unchanged)
        with self._lock:
            handle = self._live()
            lib = _lib.get_lib()
            xshape, t = self._x_shape("x", x)
            if tuple(self._x_shape("dy", dy)[0]) != tuple(xshape):
                raise InvalidArgumentError(
                    f"dy has shape {tuple(dy.shape)}, but x has shape {tuple(xshape)}; they must match")
            pdy = self._ptr("dy", dy, xshape)
            px = self._ptr("x", x, xshape)
            pg, pb, pw1, pw2 = self._param_ptrs(gamma, beta, w1, w2)
            flags = _lib.CALL_WEIGHTS_UNCHANGED if unchanged else _lib.CALL_DEFAULT
            b1_shape = self._shapes[_lib.TENSOR_B1]
            if b1_shape is None and b1 is not None:
                raise InvalidArgumentError("b1 was given, but the plan has use_bias1=False; pass None")
            pb1 = None
            if b1_shape is not None and (b1 is not None or self.remat == "save_stats"):
                pb1 = self._opt_ptr("b1", b1, b1_shape, "remat='save_stats' recomputes GEMM1")
            pst = self._state_ptr("fp8_state", fp8_state)
            user = self._weight_grads(grads, (("dy", dy), ("x", x), ("gamma", gamma), ("beta", beta),
                                              ("w1", w1), ("b1", b1), ("w2", w2), ("saved", saved),
                                              ("fp8_state", fp8_state)))
            if t > self.local_tokens:
                self._refuse(lib.lnmlp_plan_backward, handle, t, pdy, px, pg, pb, pw1, pb1, pw2, None, None,
                             None, None, None, None, None, None, pst, flags, None)
            saved = self._saved_ptr(saved, t)
            dx = self._empty(xshape)
            grads = [None if self._shapes[k] is None else self._empty(self._shapes[k], self._dtypes[k])
                     for k in (_lib.TENSOR_DGAMMA, _lib.TENSOR_DBETA)]
            if user is None:
                grads += [None if self._shapes[k] is None else self._empty(self._shapes[k], self._dtypes[k])
                          for _, k in _WEIGHT_GRADS]
            else:
                grads += user
            p = self._ptr_of
            if t == 0:  # 0 tokens: the token-sized pointers are NULL
                pdy = px = saved = dx_ptr = None
            else:
                dx_ptr = p(dx)
            _lib.check(lib.lnmlp_plan_backward(
                handle, t, pdy, px, pg, pb, pw1, pb1, pw2, p(saved), dx_ptr, *(p(g) for g in grads), pst,
                flags, None), outputs=None if user is None else "grads")
            return Grads(dx, *grads)
