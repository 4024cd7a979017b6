"""Loading of the lnmlp shared library, its ctypes declarations, and error translation.

Search order for the library (the first hit wins):

1. the ``LNMLP_LIBRARY`` environment variable (a path to ``liblnmlp.so*``);
2. a copy bundled inside the package (``lnmlp/liblnmlp.so*``, put there when a wheel is built);
3. the CMake build tree recorded when the package was built (``lnmlp/_build_config.py``);
4. the CMake build tree of the source checkout this package lives in
   (``<repo>/build/release/src/liblnmlp.so``);
5. the system loader (``ctypes.util.find_library("lnmlp")``, then ``liblnmlp.so.2``).

The loaded library's ABI version (``lnmlp_get_version``) must equal :data:`ABI_VERSION`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import threading

__all__ = [
    "ABI_VERSION", "Error", "InvalidArgumentError", "NullPointerError", "SizeOverflowError",
    "InvalidHandleError", "NotSupportedError", "OutOfMemoryError", "WorkspaceTooSmallError",
    "NoWorkspaceError", "MisalignedError", "PlanBusyError", "BackendError", "InternalError",
    "LibraryNotFoundError", "get_lib", "check", "library_path", "library_version", "build_info",
    "query_support",
]

#: The ABI version this binding was written against (LNMLP_ABI_VERSION in include/lnmlp.h).
ABI_VERSION = 2

#: The shared library's SONAME for :data:`ABI_VERSION`.
SONAME = f"liblnmlp.so.{ABI_VERSION}"

# --- status codes (include/lnmlp.h) --------------------------------------------------------------
SUCCESS = 0
ERROR_INVALID_ARGUMENT = 1
ERROR_NULL_POINTER = 2
ERROR_SIZE_OVERFLOW = 3
ERROR_INVALID_HANDLE = 4
ERROR_NOT_SUPPORTED = 5
ERROR_OUT_OF_MEMORY = 6
ERROR_WORKSPACE_TOO_SMALL = 7
ERROR_NO_WORKSPACE = 8
ERROR_MISALIGNED = 9
ERROR_PLAN_BUSY = 10
ERROR_BACKEND = 11
ERROR_INTERNAL = 12

# --- tensors of a call (LNMLP_TENSOR_*), for lnmlp_plan_get_tensor_shape ----------------------------
TENSOR_X = 0
TENSOR_GAMMA = 1
TENSOR_BETA = 2
TENSOR_W1 = 3
TENSOR_B1 = 4
TENSOR_W2 = 5
TENSOR_B2 = 6
TENSOR_Y = 7
TENSOR_SAVED = 8
TENSOR_DY = 9
TENSOR_DX = 10
TENSOR_DGAMMA = 11
TENSOR_DBETA = 12
TENSOR_DW1 = 13
TENSOR_DB1 = 14
TENSOR_DW2 = 15
TENSOR_DB2 = 16
TENSOR_FP8_STATE = 17
TENSOR_COUNT = 18
#: Tensor names (lower case, as the Python API names its arguments) -> LNMLP_TENSOR_* values.
TENSORS = {"x": TENSOR_X, "gamma": TENSOR_GAMMA, "beta": TENSOR_BETA, "w1": TENSOR_W1, "b1": TENSOR_B1,
           "w2": TENSOR_W2, "b2": TENSOR_B2, "y": TENSOR_Y, "saved": TENSOR_SAVED, "dy": TENSOR_DY,
           "dx": TENSOR_DX, "dgamma": TENSOR_DGAMMA, "dbeta": TENSOR_DBETA, "dw1": TENSOR_DW1,
           "db1": TENSOR_DB1, "dw2": TENSOR_DW2, "db2": TENSOR_DB2, "fp8_state": TENSOR_FP8_STATE}

# element types lnmlp_plan_get_tensor_shape reports (LNMLP_DTYPE_*)
DTYPE_F32 = 0
DTYPE_BF16 = 1
DTYPE_F16 = 2
DTYPE_U8 = 3  # the saved buffer's bytes
#: The most dimensions of a tensor (LNMLP_MAX_TENSOR_RANK).
MAX_TENSOR_RANK = 3
#: lnmlp_plan_get_tensor_shape's ``tokens`` for the plan's most tokens (LNMLP_TOKENS_MAX).
TOKENS_MAX = -1
#: The flags of a forward / backward call (LNMLP_CALL_*, OR'ed): none (LNMLP_CALL_DEFAULT) ...
CALL_DEFAULT = 0
#: ... and LNMLP_CALL_WEIGHTS_UNCHANGED: W1 and W2 hold the values they had when the plan last made its
#: copies of them (widened or FP8-quantized), so the call reuses those copies (TransformerEngine's
#: is_first_microbatch=False). Plan.forward / Plan.backward pass it for ``weights_unchanged=True``.
CALL_WEIGHTS_UNCHANGED = 1

_STATUS_NAMES = {
    0: "LNMLP_SUCCESS", 1: "LNMLP_ERROR_INVALID_ARGUMENT", 2: "LNMLP_ERROR_NULL_POINTER",
    3: "LNMLP_ERROR_SIZE_OVERFLOW", 4: "LNMLP_ERROR_INVALID_HANDLE", 5: "LNMLP_ERROR_NOT_SUPPORTED",
    6: "LNMLP_ERROR_OUT_OF_MEMORY", 7: "LNMLP_ERROR_WORKSPACE_TOO_SMALL",
    8: "LNMLP_ERROR_NO_WORKSPACE", 9: "LNMLP_ERROR_MISALIGNED", 10: "LNMLP_ERROR_PLAN_BUSY",
    11: "LNMLP_ERROR_BACKEND", 12: "LNMLP_ERROR_INTERNAL",
}


# --- errors ----------------------------------------------------------------------------------------
class Error(Exception):
    """Base class of every lnmlp error.

    Attributes: ``status`` (the int32 status code), ``status_name`` (``lnmlp_status_string``)
    and ``message`` (the library's ``lnmlp_last_error`` text, or the binding's own message for
    argument checks done in Python before calling the library).
    """

    status = -1

    def __init__(self, message: str, status: int | None = None, status_name: str | None = None):
        if status is not None:
            self.status = int(status)
        self.status_name = status_name or _STATUS_NAMES.get(self.status, "LNMLP_UNKNOWN_STATUS")
        self.message = message
        super().__init__(f"{message} [{self.status_name}]")


class InvalidArgumentError(Error, ValueError):
    status = ERROR_INVALID_ARGUMENT


class NullPointerError(Error, ValueError):
    status = ERROR_NULL_POINTER


class SizeOverflowError(Error, OverflowError):
    status = ERROR_SIZE_OVERFLOW


class InvalidHandleError(Error):
    status = ERROR_INVALID_HANDLE


class NotSupportedError(Error, NotImplementedError):
    status = ERROR_NOT_SUPPORTED


class OutOfMemoryError(Error, MemoryError):
    status = ERROR_OUT_OF_MEMORY


class WorkspaceTooSmallError(Error):
    status = ERROR_WORKSPACE_TOO_SMALL


class NoWorkspaceError(Error):
    status = ERROR_NO_WORKSPACE


class MisalignedError(Error, ValueError):
    status = ERROR_MISALIGNED


class PlanBusyError(Error):
    status = ERROR_PLAN_BUSY


class BackendError(Error):
    status = ERROR_BACKEND


class InternalError(Error):
    status = ERROR_INTERNAL


class LibraryNotFoundError(Error, ImportError):
    """The shared library could not be found or loaded, or its ABI version does not match."""


_ERROR_CLASSES = {cls.status: cls for cls in (
    InvalidArgumentError, NullPointerError, SizeOverflowError, InvalidHandleError,
    NotSupportedError, OutOfMemoryError, WorkspaceTooSmallError, NoWorkspaceError,
    MisalignedError, PlanBusyError, BackendError, InternalError)}


# --- ctypes declarations ---------------------------------------------------------------------------
_i32, _i64, _f32, _vp = ctypes.c_int32, ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
_P = ctypes.POINTER

# Every function of include/lnmlp.h: name -> (restype, argtypes).
_PROTOTYPES = {
    "lnmlp_get_version": (_i32, [_P(_i32), _P(_i32), _P(_i32), _P(_i32)]),
    "lnmlp_status_string": (ctypes.c_char_p, [_i32]),
    "lnmlp_last_error": (ctypes.c_char_p, []),
    "lnmlp_query_support": (_i32, [_i32, _i32, _P(_i32)]),
    "lnmlp_get_build_info": (_i32, [_P(ctypes.c_char_p)]),
    "lnmlp_desc_create": (_i32, [_P(_vp)]),
    "lnmlp_desc_destroy": (_i32, [_vp]),
    "lnmlp_desc_set_shape": (_i32, [_vp, _i64, _i64, _i64]),
    "lnmlp_desc_set_norm": (_i32, [_vp, _i32]),
    "lnmlp_desc_set_zero_centered_gamma": (_i32, [_vp, _i32]),
    "lnmlp_desc_set_epsilon": (_i32, [_vp, _f32]),
    "lnmlp_desc_set_activations": (_i32, [_vp, _i32, _P(_i32)]),
    "lnmlp_desc_set_clamped_swiglu": (_i32, [_vp, _f32, _f32, _f32]),
    "lnmlp_desc_set_bias": (_i32, [_vp, _i32, _i32]),
    "lnmlp_desc_set_dtype": (_i32, [_vp, _i32]),
    "lnmlp_desc_set_remat": (_i32, [_vp, _i32]),
    "lnmlp_desc_set_backend": (_i32, [_vp, _i32, _i32]),
    "lnmlp_desc_set_num_threads": (_i32, [_vp, _i32]),
    "lnmlp_desc_set_weight_gradients": (_i32, [_vp, _i32, _i32]),
    "lnmlp_desc_set_recipe": (_i32, [_vp, _i32]),
    "lnmlp_desc_set_fp8_format": (_i32, [_vp, _i32]),
    "lnmlp_desc_set_delayed_scaling": (_i32, [_vp, _i32, _i32, _i32]),
    "lnmlp_desc_set_scaling_options": (_i32, [_vp, _i32, _f32]),
    "lnmlp_desc_set_sharding": (_i32, [_vp, _i32, _i32, _i32]),
    "lnmlp_desc_set_communicator": (_i32, [_vp, _vp]),
    "lnmlp_comm_create_callbacks": (_i32, [_vp, _P(_vp)]),  # a table of C function pointers
    "lnmlp_comm_create_mpi": (_i32, [_vp, _P(_vp)]),
    "lnmlp_comm_create_nccl": (_i32, [_vp, _P(_vp)]),
    "lnmlp_comm_destroy": (_i32, [_vp]),
    "lnmlp_desc_set_external_workspace": (_i32, [_vp, _i32]),
    "lnmlp_plan_create": (_i32, [_vp, _P(_vp)]),
    "lnmlp_plan_destroy": (_i32, [_vp]),
    "lnmlp_plan_get_workspace_bytes": (_i32, [_vp, _P(_i64)]),
    "lnmlp_plan_get_saved_bytes": (_i32, [_vp, _P(_i64)]),
    "lnmlp_plan_get_saved_bytes_per_token": (_i32, [_vp, _P(_i64)]),
    "lnmlp_plan_get_alignment": (_i32, [_vp, _P(_i64)]),
    "lnmlp_plan_attach_workspace": (_i32, [_vp, _vp, _i64]),
    "lnmlp_plan_get_tensor_shape": (_i32, [_vp, _i32, _i64, _P(_i32), _P(_i64), _P(_i32)]),
    "lnmlp_plan_attach_fp8_state": (_i32, [_vp, _vp]),
    "lnmlp_plan_get_amax_history_length": (_i32, [_vp, _P(_i32)]),
    "lnmlp_plan_get_quantizer_state": (_i32, [_vp, _i32, _P(_f32), _vp, _i32]),
    "lnmlp_plan_set_quantizer_state": (_i32, [_vp, _i32, _f32, _vp, _i32]),
    "lnmlp_plan_get_state_bytes": (_i32, [_vp, _P(_i64)]),
    "lnmlp_plan_export_state": (_i32, [_vp, _vp, _i64]),
    "lnmlp_plan_import_state": (_i32, [_vp, _vp, _i64]),
    # (plan, tokens, x, gamma, beta, w1, b1, w2, b2, y, saved, fp8_state, flags, stream)
    "lnmlp_plan_forward": (_i32, [_vp, _i64] + [_vp] * 10 + [_i32, _vp]),
    # (plan, tokens, dy, x, gamma, beta, w1, b1, w2, saved, dx, dgamma, dbeta, dw1, db1, dw2, db2,
    #  fp8_state, flags, stream)
    "lnmlp_plan_backward": (_i32, [_vp, _i64] + [_vp] * 16 + [_i32, _vp]),
    "lnmlp_fp8_encode": (_i32, [_i32, _vp, _i64, _f32, _vp]),
    "lnmlp_fp8_decode": (_i32, [_i32, _vp, _i64, _f32, _vp]),
}


# --- loading ---------------------------------------------------------------------------------------
_PKG_DIR = os.path.dirname(os.path.abspath(__file__))


def _candidates():
    """(description, path-or-name) pairs in search order."""
    env = os.environ.get("LNMLP_LIBRARY")
    if env:
        yield "LNMLP_LIBRARY", env
        return  # an explicit choice is never silently replaced by another library
    for name in [SONAME] + sorted(glob.glob(os.path.join(_PKG_DIR, "liblnmlp.so*"))):
        path = os.path.join(_PKG_DIR, name)
        if os.path.exists(path):
            yield "bundled", path
    try:
        from . import _build_config  # written by setup.py when the package was built
        yield "recorded build tree", _build_config.LIBRARY_PATH
    except ImportError:
        pass
    repo = os.path.dirname(os.path.dirname(os.path.dirname(_PKG_DIR)))
    yield "source checkout build tree", os.path.join(repo, "build", "release", "src", "liblnmlp.so")
    found = ctypes.util.find_library("lnmlp")
    if found:
        yield "system loader", found
    yield "system loader", SONAME


_lock = threading.Lock()
_lib = None
_lib_path = None


def _load():
    tried = []
    for how, path in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append(f"{how}: {path} (no such file)")
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as exc:
            tried.append(f"{how}: {path} ({exc})")
            if how == "LNMLP_LIBRARY":
                break
            continue
        return lib, path
    raise LibraryNotFoundError(
        "could not load liblnmlp; build it with `cmake --build --preset release --target lnmlp` "
        "or set LNMLP_LIBRARY to its path. Tried:\n  " + "\n  ".join(tried), status=-1)


# FP8-recipe and communicator functions a library built before them lacks: the binding still loads, and using a recipe
# raises NotSupportedError (require()).
_OPTIONAL = frozenset({
    "lnmlp_desc_set_fp8_format", "lnmlp_desc_set_delayed_scaling", "lnmlp_desc_set_scaling_options",
    "lnmlp_plan_get_amax_history_length", "lnmlp_plan_get_quantizer_state",
    "lnmlp_plan_set_quantizer_state", "lnmlp_plan_get_state_bytes", "lnmlp_plan_export_state",
    "lnmlp_plan_import_state",
    # communicators (sharding), newer still
    "lnmlp_desc_set_communicator", "lnmlp_comm_create_callbacks", "lnmlp_comm_create_mpi",
    "lnmlp_comm_create_nccl", "lnmlp_comm_destroy",
    # weight-gradient accumulation and fp32 weight gradients (Plan(accumulate_grads=..., grad_dtype=...))
    "lnmlp_desc_set_weight_gradients"})


def has_function(name: str) -> bool:
    """Whether the loaded library exports `name` (all but the _OPTIONAL ones always do)."""
    return name in get_lib()._lnmlp_declared


def require(name: str, what: str) -> None:
    if not has_function(name):
        raise NotSupportedError(f"{library_path()} is too old for {what}: it lacks {name}", status=ERROR_NOT_SUPPORTED)


def _declare(lib, path):
    missing = [n for n in _PROTOTYPES if not hasattr(lib, n) and n not in _OPTIONAL]
    if missing:
        raise LibraryNotFoundError(f"{path} lacks the functions {', '.join(missing)}", status=-1)
    declared = set()
    for name, (restype, argtypes) in _PROTOTYPES.items():
        if not hasattr(lib, name):
            continue
        declared.add(name)
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    v = [_i32() for _ in range(4)]
    lib.lnmlp_get_version(*(ctypes.byref(x) for x in v))
    major, minor, patch, abi = (x.value for x in v)
    if abi != ABI_VERSION:
        raise LibraryNotFoundError(
            f"{path} has ABI version {abi} (library {major}.{minor}.{patch}), but this lnmlp "
            f"Python package needs ABI version {ABI_VERSION}; install a matching library or "
            f"point LNMLP_LIBRARY at one", status=-1)
    lib._lnmlp_version = (major, minor, patch, abi)
    lib._lnmlp_declared = frozenset(declared)
    return lib


def get_lib():
    """The loaded, declared and version-checked ctypes library (loaded on first use)."""
    global _lib, _lib_path
    if _lib is None:
        with _lock:
            if _lib is None:
                lib, path = _load()
                _lib = _declare(lib, path)
                _lib_path = path
    return _lib


def library_path() -> str:
    """The path (or loader name) of the loaded library."""
    get_lib()
    return _lib_path


def library_version():
    """(major, minor, patch, abi) of the loaded library."""
    return get_lib()._lnmlp_version


def status_string(status: int) -> str:
    return get_lib().lnmlp_status_string(int(status)).decode("utf-8", "replace")


def error_for(status: int, message: str | None = None) -> Error:
    """The Error subclass instance for a failing status (message: the library's last error)."""
    lib = get_lib()
    if message is None:
        message = lib.lnmlp_last_error().decode("utf-8", "replace")
    cls = _ERROR_CLASSES.get(int(status), Error)
    return cls(message or "(no message)", status=int(status), status_name=status_string(status))


def check(status: int) -> None:
    """Raises the Error subclass for a failing status; returns None on success."""
    if status != SUCCESS:
        raise error_for(status)


def build_info() -> str:
    """The library's human-readable build description (lnmlp_get_build_info)."""
    lib = get_lib()
    s = ctypes.c_char_p()
    check(lib.lnmlp_get_build_info(ctypes.byref(s)))
    return s.value.decode("utf-8", "replace")


_BACKENDS = {"cpu": 0, "cuda": 1}
_FEATURES = {
    "backend": 0, "dtype_f32": 1, "dtype_bf16": 2, "dtype_f16": 3, "recipe_delayed": 4,
    "recipe_current": 5, "recipe_block": 6, "recipe_mxfp8": 7, "sharding": 8,
    "external_workspace": 9,
}


def query_support(backend: str = "cpu", feature: str = "backend") -> bool:
    """Whether ``backend`` ("cpu"/"cuda") can run ``feature`` (e.g. "backend", "dtype_bf16",
    "recipe_delayed", "sharding", "external_workspace") in this build on this machine."""
    if backend not in _BACKENDS:
        raise InvalidArgumentError(f"backend must be one of {sorted(_BACKENDS)}, got {backend!r}")
    if feature not in _FEATURES:
        raise InvalidArgumentError(f"feature must be one of {sorted(_FEATURES)}, got {feature!r}")
    out = _i32()
    check(get_lib().lnmlp_query_support(_BACKENDS[backend], _FEATURES[feature], ctypes.byref(out)))
    return bool(out.value)
