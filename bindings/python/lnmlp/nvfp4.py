"""NVFP4 quantization (``lnmlp_nvfp4_quantize`` / ``lnmlp_nvfp4_dequantize``) on NumPy arrays.

TransformerEngine's ``NVFP4BlockScaling`` quantizer, without its random Hadamard transform and
stochastic rounding (docs/design.md, "NVFP4"): FP4 E2M1 codes (magnitudes 0, 0.5, 1, 1.5, 2, 3,
4, 6) in blocks of 16 consecutive elements of a row, or 16 x 16 tiles (``tiles=True``, the
recipe's weights), each block with an FP8 E4M3 scale, under one float32 global scale from the
tensor's amax. Codes come packed two to a byte (the even element in the low half), as
TransformerEngine stores them; ``unpack`` gives one ``ml_dtypes.float4_e2m1fn``-compatible code per
element.

    >>> codes, scales, amax = lnmlp.nvfp4.quantize(x)            # x: [rows, cols]
    >>> y = lnmlp.nvfp4.dequantize(codes, scales, x.shape[1], amax)
"""

from __future__ import annotations

import numpy as np

from . import _lib

__all__ = ["BLOCK", "quantize", "dequantize", "unpack"]

#: Elements per block along a row (and rows per tile with ``tiles=True``).
BLOCK = 16


def _matrix(x) -> np.ndarray:
    src = np.ascontiguousarray(x, dtype=np.float32)
    if src.ndim != 2:
        raise _lib.InvalidArgumentError(f"x must be a 2-D [rows, cols] array, got shape {src.shape}")
    return src


def quantize(x, tiles: bool = False, global_amax: float | None = None):
    """``(codes, scales, global_amax)`` of a 2-D array (converted to float32 first): ``codes``
    uint8 ``[rows, ceil(cols/2)]``, ``scales`` uint8 E4M3 bit patterns ``[rows, ceil(cols/16)]``
    (with tiles every row of a tile repeats its scale), ``global_amax`` the float the global scale
    came from: ``max |x|`` (NaN if x holds one) unless given."""
    src = _matrix(x)
    rows, cols = src.shape
    if global_amax is None:
        global_amax = np.float32(np.max(np.abs(src))) if src.size else np.float32(0.0)
    codes = np.empty((rows, (cols + 1) // 2), dtype=np.uint8)
    scales = np.empty((rows, (cols + BLOCK - 1) // BLOCK), dtype=np.uint8)
    _lib.check(_lib.get_lib().lnmlp_nvfp4_quantize(src.ctypes.data, rows, cols, BLOCK if tiles else 1,
                                                     float(global_amax), codes.ctypes.data, scales.ctypes.data))
    return codes, scales, np.float32(global_amax)


def _bytes(a, name: str, shape, also: str = "") -> np.ndarray:
    """a as contiguous uint8 of the given shape; `also` names an ml_dtypes type accepted as its bits."""
    arr = np.asarray(a)
    if arr.dtype != np.uint8:
        if not also or arr.dtype.name != also:
            raise _lib.InvalidArgumentError(
                f"{name} must be uint8 bit patterns{f' (or ml_dtypes.{also})' if also else ''}, got dtype {arr.dtype}")
        arr = arr.view(np.uint8)
    if arr.shape != shape:
        raise _lib.InvalidArgumentError(f"{name} must have shape {shape}, got {arr.shape}")
    return np.ascontiguousarray(arr)


def dequantize(codes, scales, cols: int, global_amax: float) -> np.ndarray:
    """The float32 ``[rows, cols]`` values quantize's codes stand for: ``(e2m1 * scale) / S_enc``."""
    rows = np.asarray(codes).shape[0] if np.ndim(codes) == 2 else -1
    if rows < 0 or cols < 0:
        raise _lib.InvalidArgumentError("codes must be a 2-D [rows, ceil(cols/2)] array and cols >= 0")
    c = _bytes(codes, "codes", (rows, (cols + 1) // 2))
    s = _bytes(scales, "scales", (rows, (cols + BLOCK - 1) // BLOCK), also="float8_e4m3fn")
    out = np.empty((rows, cols), dtype=np.float32)
    _lib.check(_lib.get_lib().lnmlp_nvfp4_dequantize(c.ctypes.data, s.ctypes.data, rows, cols, float(global_amax),
                                                       out.ctypes.data))
    return out


def unpack(codes, cols: int) -> np.ndarray:
    """One E2M1 code per element, uint8 ``[rows, cols]`` (``.view(ml_dtypes.float4_e2m1fn)`` reads them)."""
    c = np.asarray(codes, dtype=np.uint8)
    both = np.stack([c & 0xF, c >> 4], axis=-1).reshape(c.shape[0], -1)
    return np.ascontiguousarray(both[:, :cols])
