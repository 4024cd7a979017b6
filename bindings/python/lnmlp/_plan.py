"""lnmlp.Plan: a validated, allocated fused LayerNorm-MLP, run forward and backward many times."""

from __future__ import annotations

import ctypes
import threading
from collections import namedtuple
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
_BACKENDS = {"cpu": 0, "cuda": 1}


@dataclass(frozen=True)
class ActParams:
    """Parameters of the clamped SwiGLU pair ("clamped_silu", "clamped_linear"):
    ``a' = min(a, limit); out = a' sigmoid(alpha a') * (clip(b, -limit, limit) + offset)``."""
    limit: float = 7.0
    alpha: float = 1.702
    offset: float = 1.0


#: Gradients returned by Plan.backward (a tuple; fields by name; ``._asdict()`` gives a dict).
Grads = namedtuple("Grads", ["dx", "dgamma", "dbeta", "dw1", "db1", "dw2", "db2"])


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


def _normalize_act_params(act_params):
    if act_params is None:
        return None
    if isinstance(act_params, ActParams):
        return act_params
    if isinstance(act_params, dict):
        unknown = set(act_params) - {"limit", "alpha", "offset"}
        if unknown:
            raise InvalidArgumentError(
                f"act_params has unknown keys {sorted(unknown)}; expected limit, alpha, offset")
        return ActParams(**act_params)
    # any object with the attributes (e.g. TransformerEngine's ClampedSwigluParams)
    d = ActParams()
    return ActParams(*(float(getattr(act_params, k, getattr(d, k))) for k in ("limit", "alpha", "offset")))


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
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise InvalidArgumentError(f"sharding's {nm} must be an int, got {v!r}")
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

    Mirrors the C descriptor (include/lnmlp.h). Shapes: x, y [..., H] with prod(leading) == tokens;
    gamma, beta [H] (beta None for rmsnorm); w1 [H, A, F]; b1 [A, F]; w2 [F, H]; b2 [H]. A is the
    number of activations (1, or 2 for a gated pair). Every array has the plan's dtype and is
    C-contiguous. One plan must be used by one thread at a time (calls on one Plan object are
    serialised by a lock). ``close()`` frees the C plan; so does garbage collection.

    ``forward`` returns ``(y, saved)``: ``saved`` (a uint8 array, aligned as the plan requires)
    carries what backward needs; pass it to ``backward`` with the same x and weights, unmodified.

    ``recipe`` (None, or :class:`lnmlp.DelayedScaling`, :class:`lnmlp.Float8CurrentScaling`,
    :class:`lnmlp.Float8BlockScaling`, :class:`lnmlp.MXFP8BlockScaling`) runs the GEMMs in FP8
    (docs/fp8.md). Under delayed scaling the plan owns each quantizer's scale and amax history:
    ``forward`` updates ln_out, w1, act_out, w2, ``backward`` dy, dh; read and write them with
    :meth:`quantizer_state` / :meth:`set_quantizer_state`, or checkpoint them with
    :meth:`export_state` / :meth:`import_state`.

    ``sharding=(group_size, rank, sequence_parallel)`` makes the plan one rank of a tensor-parallel
    group (docs/sharding.md; CPU backend): tokens, hidden and ffn stay the group's sizes, while the
    arrays are this rank's shard: w1 [H, A, F/P], b1 [A, F/P], w2 [F/P, H], and under sequence
    parallelism x, y, dy, dx hold tokens/P rows. ``comm`` is the group's communicator: an mpi4py
    communicator (``MPI.COMM_WORLD``), whose size and rank must match ``sharding``.
    """

    def __init__(self, tokens, hidden, ffn, *, norm_type="layernorm", zero_centered_gamma=False,
                 epsilon=1e-6, activation_type=("relu",), act_params=None, use_bias1=False,
                 use_bias2=False, dtype=np.float32, remat="save_all", num_threads=0, backend="cpu",
                 recipe=None, sharding=None, comm=None):
        self._handle = None  # set first, so __del__ is safe whatever fails below
        self._lock = threading.RLock()
        lib = _lib.get_lib()
        self._destroy_fn = lib.lnmlp_plan_destroy  # kept for __del__ at interpreter shutdown
        for nm, v in (("tokens", tokens), ("hidden", hidden), ("ffn", ffn)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise InvalidArgumentError(f"{nm} must be an int, got {v!r}")
        self.tokens, self.hidden, self.ffn = int(tokens), int(hidden), int(ffn)
        self.norm_type = norm_type.lower() if isinstance(norm_type, str) else norm_type
        norm = _choice("norm_type", norm_type, _NORMS)
        self.zero_centered_gamma = bool(zero_centered_gamma)
        self.epsilon = float(epsilon)
        self.activation_type = normalize_activations(activation_type)
        self.num_activations = len(self.activation_type)
        self.act_params = _normalize_act_params(act_params)
        if self.act_params is not None and self.activation_type != GATED_PAIRS["clamped_swiglu"]:
            raise InvalidArgumentError(
                "act_params applies only to the clamped SwiGLU pair "
                f"('clamped_silu', 'clamped_linear'), but activation_type is {self.activation_type!r}")
        self.use_bias1, self.use_bias2 = bool(use_bias1), bool(use_bias2)
        self.dtype = _normalize_dtype(dtype)
        self.remat = remat.lower() if isinstance(remat, str) else remat
        remat_v = _choice("remat", remat, _REMATS)
        self.backend = backend.lower() if isinstance(backend, str) else backend
        backend_v = _choice("backend", backend, _BACKENDS)
        self.num_threads = int(num_threads)
        self.recipe = check_recipe(recipe)
        self.sharding = _normalize_sharding(sharding)
        P, _, sp = self.sharding
        self.local_tokens = self.tokens // P if sp else self.tokens
        self.local_ffn = self.ffn // P

        desc = ctypes.c_void_p()
        comm_handle = ctypes.c_void_p()
        _lib.check(lib.lnmlp_desc_create(ctypes.byref(desc)))
        try:
            c = _lib.check
            c(lib.lnmlp_desc_set_backend(desc, backend_v, 0))
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
            if self.num_threads:
                c(lib.lnmlp_desc_set_num_threads(desc, self.num_threads))
            if self.recipe is not None:
                _lib.require("lnmlp_desc_set_fp8_format", "FP8 recipes")
                self.recipe._apply(lib, desc, c)
            if comm is not None:
                _lib.require("lnmlp_comm_create_mpi", "communicators")
                c(lib.lnmlp_comm_create_mpi(_mpi_comm_address(comm), ctypes.byref(comm_handle)))
                c(lib.lnmlp_desc_set_communicator(desc, comm_handle))
            if self.sharding != (1, 0, False):
                c(lib.lnmlp_desc_set_sharding(desc, P, self.sharding[1], int(sp)))
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
        self.state_bytes = 0
        self.amax_history_length = 0
        if _lib.has_function("lnmlp_plan_get_state_bytes"):
            self.state_bytes = self._query(lib.lnmlp_plan_get_state_bytes)
            n = ctypes.c_int32()
            _lib.check(lib.lnmlp_plan_get_amax_history_length(self._handle, ctypes.byref(n)))
            self.amax_history_length = n.value

    # --- lifetime ---------------------------------------------------------------------------------
    def _query(self, fn):
        out = ctypes.c_int64()
        _lib.check(fn(self._handle, ctypes.byref(out)))
        return out.value

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
                f"sharding={self.sharding!r}) [{state}]")

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
        for a stateless recipe."""
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
        raises InvalidArgumentError and changes nothing."""
        if isinstance(blob, np.ndarray):
            blob = blob.tobytes()
        if not isinstance(blob, (bytes, bytearray, memoryview)):
            raise InvalidArgumentError(f"blob must be bytes, got {type(blob).__name__}")
        data = bytes(blob)
        with self._lock:
            handle = self._live()
            buf = ctypes.create_string_buffer(data, len(data)) if data else None
            _lib.check(_lib.get_lib().lnmlp_plan_import_state(handle, buf, len(data)))

    # --- argument checks --------------------------------------------------------------------------
    def _ptr(self, name, arr, shape):
        """The data pointer of a required tensor after checking type, dtype, shape, layout."""
        if self.backend == "cuda":
            return self._device_ptr(name, arr, shape)
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
        if arr.dtype != self.dtype:
            raise InvalidArgumentError(
                f"{name} has dtype {arr.dtype}, but the plan's dtype is {self.dtype.name}")
        if tuple(arr.shape) != tuple(shape):
            raise InvalidArgumentError(
                f"{name} has shape {tuple(arr.shape)}, but the plan needs {tuple(shape)}")
        if not arr.flags.c_contiguous:
            raise InvalidArgumentError(
                f"{name} is not C-contiguous; pass numpy.ascontiguousarray({name})")
        if not arr.flags.aligned:
            raise MisalignedError(f"{name} is not aligned to its element size")
        return arr.ctypes.data

    def _device_ptr(self, name, obj, shape):
        if obj is None:
            raise NullPointerError(f"{name} is None, but this plan needs it")
        ptr, got_shape, kind, device_type = device_array_info(name, obj)
        if device_type != _KDL_CUDA:
            raise InvalidArgumentError(f"{name} is not a CUDA device array (DLPack device {device_type})")
        ok = (kind[1] in _CAI_TYPESTRS[self.dtype]) if kind[0] == "cai" else (kind[1:] == _DL_CODES[self.dtype])
        if not ok:
            raise InvalidArgumentError(f"{name} has element type {kind[1:]}, but the plan's dtype is {self.dtype.name}")
        if tuple(got_shape) != tuple(shape):
            raise InvalidArgumentError(f"{name} has shape {tuple(got_shape)}, but the plan needs {tuple(shape)}")
        return ptr

    def _opt_ptr(self, name, arr, shape, enabled, what):
        if not enabled:
            if arr is not None:
                raise InvalidArgumentError(f"{name} was given, but {what}; pass None")
            return None
        if arr is None:
            raise NullPointerError(f"{name} is None, but this plan needs it ({what})")
        return self._ptr(name, arr, shape)

    def _x_shape(self, name, arr):
        """Checks x (or dy) has [..., H] with tokens rows; returns its full shape."""
        shape = tuple(getattr(arr, "shape", ()))
        if self.backend == "cuda" and not isinstance(arr, np.ndarray):
            shape = device_array_info(name, arr)[1]
        if len(shape) < 1 or shape[-1] != self.hidden or int(np.prod(shape[:-1], dtype=np.int64)) != self.local_tokens:
            raise InvalidArgumentError(
                f"{name} has shape {shape}, but the plan needs [..., {self.hidden}] with "
                f"{self.local_tokens} tokens (the product of the leading dims)")
        return shape

    def _param_ptrs(self, gamma, beta, w1, w2):
        H, A, F = self.hidden, self.num_activations, self.local_ffn
        pg = self._ptr("gamma", gamma, (H,))
        if self.norm_type == "rmsnorm":
            if beta is not None:
                raise InvalidArgumentError("beta was given, but rmsnorm has no beta; pass None")
            pb = None
        else:
            if beta is None:
                raise NullPointerError("beta is None, but layernorm needs it")
            pb = self._ptr("beta", beta, (H,))
        return pg, pb, self._ptr("w1", w1, (H, A, F)), self._ptr("w2", w2, (F, H))

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
        if isinstance(arr, np.ndarray):
            return arr.ctypes.data
        return device_array_info("output", arr)[0]  # pragma: no cover

    # --- execution --------------------------------------------------------------------------------
    def forward(self, x, gamma, beta, w1, b1, w2, b2):
        """y = act(norm(x) @ w1 + b1) @ w2 + b2. Returns ``(y, saved)``; y has x's shape;
        saved is a uint8 array for backward (None when the plan saves nothing)."""
        with self._lock:
            handle = self._live()
            xshape = self._x_shape("x", x)
            px = self._ptr("x", x, xshape)
            pg, pb, pw1, pw2 = self._param_ptrs(gamma, beta, w1, w2)
            pb1 = self._opt_ptr("b1", b1, (self.num_activations, self.local_ffn), self.use_bias1,
                                "the plan has use_bias1=False" if not self.use_bias1 else "use_bias1=True")
            pb2 = self._opt_ptr("b2", b2, (self.hidden,), self.use_bias2,
                                "the plan has use_bias2=False" if not self.use_bias2 else "use_bias2=True")
            y = self._empty(xshape)
            saved = self._aligned_bytes(self.saved_bytes) if self.saved_bytes else None
            _lib.check(_lib.get_lib().lnmlp_plan_forward(
                handle, px, pg, pb, pw1, pb1, pw2, pb2, self._ptr_of(y),
                None if saved is None else self._ptr_of(saved), None))
            return y, saved

    def _saved_ptr(self, saved):
        if self.saved_bytes == 0:
            return None
        if saved is None:
            raise NullPointerError("saved is None; pass the saved buffer forward returned")
        if self.backend == "cuda":  # pragma: no cover
            ptr, shape, _, _ = device_array_info("saved", saved)
            n = int(np.prod(shape)) if shape else 0
        else:
            if not isinstance(saved, np.ndarray) or saved.dtype != np.uint8 or saved.ndim != 1:
                raise InvalidArgumentError("saved must be the 1-D uint8 array forward returned")
            if not saved.flags.c_contiguous:
                raise InvalidArgumentError("saved is not contiguous; pass the array forward returned")
            n = saved.nbytes
            ptr = saved.ctypes.data
        if n != self.saved_bytes:
            raise InvalidArgumentError(
                f"saved has {n} bytes, but this plan saves {self.saved_bytes}; pass the saved "
                f"buffer this plan's forward returned")
        if ptr % max(self.alignment, 1):
            if self.backend == "cuda":  # pragma: no cover
                raise MisalignedError(f"saved is not aligned to {self.alignment} bytes")
            copy = self._aligned_bytes(n)  # e.g. a copy made by the caller: realign it
            copy[...] = saved
            return copy
        return saved

    def backward(self, dy, x, gamma, beta, w1, b1, w2, saved):
        """Gradients given dy = dL/dy and forward's ``saved`` (with the same x and weights).

        Returns :class:`Grads` (dx, dgamma, dbeta, dw1, db1, dw2, db2); dbeta is None for
        rmsnorm, db1/db2 None when the bias is disabled; dx has x's shape. b1 is read only when
        remat="save_stats" and use_bias1 (it may be None otherwise)."""
        with self._lock:
            handle = self._live()
            xshape = self._x_shape("x", x)
            if tuple(self._x_shape("dy", dy)) != tuple(xshape):
                raise InvalidArgumentError(
                    f"dy has shape {tuple(dy.shape)}, but x has shape {tuple(xshape)}; they must match")
            pdy = self._ptr("dy", dy, xshape)
            px = self._ptr("x", x, xshape)
            pg, pb, pw1, pw2 = self._param_ptrs(gamma, beta, w1, w2)
            need_b1 = self.use_bias1 and self.remat == "save_stats"
            if not self.use_bias1 and b1 is not None:
                raise InvalidArgumentError("b1 was given, but the plan has use_bias1=False; pass None")
            pb1 = None
            if self.use_bias1 and (b1 is not None or need_b1):
                pb1 = self._opt_ptr("b1", b1, (self.num_activations, self.local_ffn), True,
                                    "remat='save_stats' recomputes GEMM1")
            saved = self._saved_ptr(saved)
            H, A, F = self.hidden, self.num_activations, self.local_ffn
            dx = self._empty(xshape)
            dgamma = self._empty((H,))
            dbeta = None if self.norm_type == "rmsnorm" else self._empty((H,))
            dw1 = self._empty((H, A, F))
            db1 = self._empty((A, F)) if self.use_bias1 else None
            dw2 = self._empty((F, H))
            db2 = self._empty((H,)) if self.use_bias2 else None
            p = lambda a: None if a is None else self._ptr_of(a)  # noqa: E731
            _lib.check(_lib.get_lib().lnmlp_plan_backward(
                handle, pdy, px, pg, pb, pw1, pb1, pw2, p(saved),
                p(dx), p(dgamma), p(dbeta), p(dw1), p(db1), p(dw2), p(db2), None))
            return Grads(dx, dgamma, dbeta, dw1, db1, dw2, db2)
