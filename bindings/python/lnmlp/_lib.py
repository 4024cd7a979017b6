"""Loading of the lnmlp shared library, and error translation. Its ctypes declarations (the
functions' prototypes and the constants of include/lnmlp.h) are generated into ``_capi.py`` by
tools/gen_bindings.py; this module applies them to the loaded library.

Search order for the library (the first hit wins):

1. the ``LNMLP_LIBRARY`` environment variable (a path to ``liblnmlp.so*``);
2. the copy inside the package (``lnmlp/liblnmlp.so.2``, built into the wheel by
   ``pip install ./bindings/python``);
3. the CMake build tree of the source checkout this package lives in
   (``<repo>/build/release/src/liblnmlp.so``);
4. the system loader (``ctypes.util.find_library("lnmlp")``, then ``liblnmlp.so.2``).

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

# The declarations of include/lnmlp.h -- its constants (LNMLP_ prefix dropped), the function
# prototypes -- are generated into _capi.py by tools/gen_bindings.py (a CTest checks it matches the
# header). The constants the binding has always exposed are re-exported here, so ``_lib.SUCCESS``,
# ``_lib.TENSOR_W1``, ... keep working.
from . import _capi
from ._capi import (  # noqa: F401  (re-exported)
    ABI_VERSION, CALL_DEFAULT, CALL_WEIGHTS_UNCHANGED, DTYPE_BF16, DTYPE_F16, DTYPE_F32, DTYPE_U8,
    ERROR_BACKEND, ERROR_INTERNAL, ERROR_INVALID_ARGUMENT, ERROR_INVALID_HANDLE, ERROR_MISALIGNED,
    ERROR_NO_WORKSPACE, ERROR_NOT_SUPPORTED, ERROR_NULL_POINTER, ERROR_OUT_OF_MEMORY,
    ERROR_PLAN_BUSY, ERROR_SIZE_OVERFLOW, ERROR_WORKSPACE_TOO_SMALL, MAX_TENSOR_RANK, SUCCESS,
    TENSOR_B1, TENSOR_B2, TENSOR_BETA, TENSOR_COUNT, TENSOR_DB1, TENSOR_DB2, TENSOR_DBETA,
    TENSOR_DGAMMA, TENSOR_DW1, TENSOR_DW2, TENSOR_DX, TENSOR_DY, TENSOR_FP8_STATE, TENSOR_GAMMA,
    TENSOR_SAVED, TENSOR_W1, TENSOR_W2, TENSOR_X, TENSOR_Y, TOKENS_MAX, WEIGHT_LAYOUT_IN_OUT,
    WEIGHT_LAYOUT_OUT_IN, GEMM_MATH_FP8_FAST_ACCUMULATION, GEMM_MATH_TF32)

#: The shared library's SONAME for :data:`ABI_VERSION` (the ABI version this binding was generated
#: against, LNMLP_ABI_VERSION).
SONAME = f"liblnmlp.so.{ABI_VERSION}"

#: Tensor names (lower case, as the Python API names its arguments) -> LNMLP_TENSOR_* values.
TENSORS = {"x": TENSOR_X, "gamma": TENSOR_GAMMA, "beta": TENSOR_BETA, "w1": TENSOR_W1, "b1": TENSOR_B1,
           "w2": TENSOR_W2, "b2": TENSOR_B2, "y": TENSOR_Y, "saved": TENSOR_SAVED, "dy": TENSOR_DY,
           "dx": TENSOR_DX, "dgamma": TENSOR_DGAMMA, "dbeta": TENSOR_DBETA, "dw1": TENSOR_DW1,
           "db1": TENSOR_DB1, "dw2": TENSOR_DW2, "db2": TENSOR_DB2, "fp8_state": TENSOR_FP8_STATE}

#: The saved buffer's section names (lower case) -> LNMLP_SAVED_* values (lnmlp_plan_get_saved_section).
SAVED_SECTIONS = {name[len("SAVED_"):].lower(): value for name, value in vars(_capi).items()
                  if name.startswith("SAVED_") and name != "SAVED_COUNT"}

# Status code -> its C name ("LNMLP_SUCCESS", "LNMLP_ERROR_..."), for errors raised before a call.
_STATUS_NAMES = {v: "LNMLP_" + k for k, v in vars(_capi).items()
                 if k == "SUCCESS" or k.startswith("ERROR_")}


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


def _declare(lib, path):
    missing = [n for n in _capi.PROTOTYPES if not hasattr(lib, n)]
    if missing:
        raise LibraryNotFoundError(f"{path} lacks the functions {', '.join(missing)}", status=-1)
    for name, (restype, argtypes) in _capi.PROTOTYPES.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    v = [ctypes.c_int32() for _ in range(4)]
    lib.lnmlp_get_version(*(ctypes.byref(x) for x in v))
    major, minor, patch, abi = (x.value for x in v)
    if abi != ABI_VERSION:
        raise LibraryNotFoundError(
            f"{path} has ABI version {abi} (library {major}.{minor}.{patch}), but this lnmlp "
            f"Python package needs ABI version {ABI_VERSION}; install a matching library or "
            f"point LNMLP_LIBRARY at one", status=-1)
    lib._lnmlp_version = (major, minor, patch, abi)
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


# The statuses of a call that failed while it ran (lnmlp.h, "A call that fails"): its outputs are
# undefined; every other failure changed nothing.
_FAILED_WHILE_RUNNING = frozenset({ERROR_OUT_OF_MEMORY, ERROR_BACKEND, ERROR_INTERNAL})


def check(status: int, outputs: str | None = None) -> None:
    """Raises the Error subclass for a failing status; returns None on success. ``outputs`` names
    the caller's arrays the call writes: when the call failed while it ran, the message says they
    are undefined now."""
    if status != SUCCESS:
        error = error_for(status)
        if outputs and int(status) in _FAILED_WHILE_RUNNING:
            error = error_for(status, f"{error.message}; {outputs} (the caller's arrays) are undefined now: "
                                      "an accumulating gradient may hold part of this call's sum")
        raise error


def build_info() -> str:
    """The library's human-readable build description (lnmlp_get_build_info)."""
    lib = get_lib()
    s = ctypes.c_char_p()
    check(lib.lnmlp_get_build_info(ctypes.byref(s)))
    return s.value.decode("utf-8", "replace")


# "cuda" (LNMLP_BACKEND_CUDA) is in the header's experimental tier (_capi.EXPERIMENTAL).
_BACKENDS = {"cpu": _capi.BACKEND_CPU, "cuda": _capi.BACKEND_CUDA}
# "backend", "dtype_f32", ..., "sharding", "external_workspace" -> LNMLP_FEATURE_*.
_FEATURES = {k[len("FEATURE_"):].lower(): v for k, v in vars(_capi).items() if k.startswith("FEATURE_")}


def query_support(backend: str = "cpu", feature: str = "backend") -> bool:
    """Whether ``backend`` ("cpu"/"cuda") can run ``feature`` (e.g. "backend", "dtype_bf16",
    "recipe_delayed", "sharding", "external_workspace") in this build on this machine.

    Experimental (the C header's LNMLP_EXPERIMENTAL tier, which may change in any release): the
    "cuda" backend and the "sharding" feature."""
    if backend not in _BACKENDS:
        raise InvalidArgumentError(f"backend must be one of {sorted(_BACKENDS)}, got {backend!r}")
    if feature not in _FEATURES:
        raise InvalidArgumentError(f"feature must be one of {sorted(_FEATURES)}, got {feature!r}")
    out = ctypes.c_int32()
    check(get_lib().lnmlp_query_support(_BACKENDS[backend], _FEATURES[feature], ctypes.byref(out)))
    return bool(out.value)
