"""Loads liblnmlp_xla, the XLA FFI handlers of lnmlp.jax (bindings/python/xla_ffi), and registers
its custom call targets with jax, once per process.

Search order for the library: the ``LNMLP_XLA_LIBRARY`` environment variable; next to the
liblnmlp that :mod:`lnmlp._lib` loaded (the CMake build tree and the wheel put both in one
directory); the package directory.
"""

from __future__ import annotations

import ctypes
import os
import threading

import jax

from .. import _lib

FORWARD = "lnmlp_forward"
BACKWARD = "lnmlp_backward"
STATE_TYPE = "lnmlp_plan_state"
# XLA's platform names -> the suffix of liblnmlp_xla's handler symbols.
_PLATFORMS = {"cpu": "cpu", "CUDA": "cuda"}

_lock = threading.Lock()
_library = None


class XlaLibraryNotFoundError(_lib.LibraryNotFoundError):
    """liblnmlp_xla.so is not where lnmlp.jax looks for it (see lnmlp/jax/_ffi.py)."""


def library_path() -> str:
    """The path of liblnmlp_xla.so this process uses (or would use)."""
    env = os.environ.get("LNMLP_XLA_LIBRARY")
    if env:
        return env
    candidates = [os.path.join(os.path.dirname(os.path.realpath(_lib.library_path())), "liblnmlp_xla.so"),
                  os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "liblnmlp_xla.so")]
    for c in candidates:
        if os.path.exists(c):
            return c
    raise XlaLibraryNotFoundError(
        "liblnmlp_xla.so (lnmlp.jax's XLA FFI handlers) was not found; looked at "
        + ", ".join(candidates) + ". Build it with CMake while jax is installed (option "
        "LNMLP_XLA_FFI), or set LNMLP_XLA_LIBRARY to its path")


def _capsule(address: int):
    return jax.ffi.pycapsule(ctypes.c_void_p(address))


def ensure_registered() -> None:
    """Loads the library and registers the state type and both targets for every platform jax
    has here (idempotent, thread-safe)."""
    global _library
    with _lock:
        if _library is not None:
            return
        _lib.get_lib()  # liblnmlp first: its SONAME then satisfies liblnmlp_xla's dependency
        lib = ctypes.CDLL(library_path())
        for fn in ("lnmlp_xla_state_type_id", "lnmlp_xla_state_type_info"):
            getattr(lib, fn).restype = ctypes.c_void_p
        # Types must be registered after a jax backend exists, and before the targets using them.
        jax.devices()
        for platform, suffix in _PLATFORMS.items():
            if platform == "CUDA" and not _has_platform("gpu"):
                continue
            jax.ffi.register_ffi_type(
                STATE_TYPE, {"type_id": _capsule(lib.lnmlp_xla_state_type_id()),
                             "type_info": _capsule(lib.lnmlp_xla_state_type_info())}, platform=platform)
            instantiate = jax.ffi.pycapsule(getattr(lib, f"lnmlp_xla_instantiate_{suffix}"))
            for target, stage in ((FORWARD, "forward"), (BACKWARD, "backward")):
                execute = jax.ffi.pycapsule(getattr(lib, f"lnmlp_xla_{stage}_{suffix}"))
                jax.ffi.register_ffi_target(target, {"instantiate": instantiate, "execute": execute},
                                            platform=platform)
        _library = lib


def _has_platform(name: str) -> bool:
    try:
        return bool(jax.devices(name))
    except RuntimeError:
        return False


def plan_count() -> int:
    """How many lnmlp plans the XLA handlers hold: one per configuration on the CPU (every token
    count shares it), one per configuration and token count on a GPU."""
    ensure_registered()
    fn = _library.lnmlp_xla_plan_count
    fn.restype = ctypes.c_int64
    return int(fn())
