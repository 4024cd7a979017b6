"""FP8 conversions (``lnmlp_fp8_encode`` / ``lnmlp_fp8_decode``) on NumPy arrays.

Formats: ``"e4m3"`` (OCP/NVIDIA e4m3fn: max 448, no infinities, NaN = S.1111.111) and ``"e5m2"``
(IEEE-like: max 57344, with infinities and NaNs). Codes are ``np.uint8`` bit patterns, the same
bits as ``ml_dtypes.float8_e4m3fn`` / ``ml_dtypes.float8_e5m2`` (``codes.view(...)``).

Encoding rounds to nearest, ties to even, and **saturates**: magnitudes beyond max finite, and
±infinity, become ± max finite, for both formats (TransformerEngine's saturating cast; note that
``ml_dtypes``' own cast does not saturate). NaN stays NaN.

    >>> codes = lnmlp.fp8.encode(x, "e4m3", scale=s)       # fp8(x * s), computed in float32
    >>> y = lnmlp.fp8.decode(codes, "e4m3", scale_inv=1/s)  # float(codes) * (1/s)
"""

from __future__ import annotations

import numpy as np

from . import _capi, _lib

__all__ = ["FORMATS", "MAX", "encode", "decode"]

#: Format name -> its LNMLP_DTYPE_FP8_* element type (what lnmlp_fp8_encode / decode take).
FORMATS = {"e4m3": _capi.DTYPE_FP8_E4M3, "e5m2": _capi.DTYPE_FP8_E5M2}
#: Format name -> largest finite value.
MAX = {"e4m3": 448.0, "e5m2": 57344.0}
_ML_DTYPES_NAME = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}


def _format(fmt) -> int:
    if fmt not in FORMATS:
        raise _lib.InvalidArgumentError(f"fmt must be one of {sorted(FORMATS)}, got {fmt!r}")
    return FORMATS[fmt]


def encode(x, fmt: str = "e4m3", scale: float = 1.0) -> np.ndarray:
    """``fp8(x * scale)`` as a ``np.uint8`` array of x's shape (x is converted to float32 first)."""
    f = _format(fmt)
    src = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty(src.shape, dtype=np.uint8)
    _lib.check(_lib.get_lib().lnmlp_fp8_encode(f, src.ctypes.data, src.size, float(scale), out.ctypes.data))
    return out


def decode(codes, fmt: str = "e4m3", scale_inv: float = 1.0) -> np.ndarray:
    """``float(codes) * scale_inv`` as a ``np.float32`` array of codes' shape. ``codes`` are uint8
    bit patterns (an ml_dtypes float8 array of the matching format is accepted too)."""
    f = _format(fmt)
    arr = np.asarray(codes)
    if arr.dtype != np.uint8:
        if arr.dtype.name != _ML_DTYPES_NAME[fmt]:
            raise _lib.InvalidArgumentError(
                f"codes must be uint8 {fmt} bit patterns (or ml_dtypes.{_ML_DTYPES_NAME[fmt]}), "
                f"got dtype {arr.dtype}")
        arr = arr.view(np.uint8)
    src = np.ascontiguousarray(arr)
    out = np.empty(src.shape, dtype=np.float32)
    _lib.check(_lib.get_lib().lnmlp_fp8_decode(f, src.ctypes.data, src.size, float(scale_inv), out.ctypes.data))
    return out
