"""An independent NumPy + ml_dtypes simulation of the NVFP4 recipe (TransformerEngine's
NVFP4BlockScaling), written from its definition -- TE's quantization kernels (core_nvfp4.cuh), its
recipe's choice of quantizers, and the random stream lnmlp documents (include/lnmlp.h,
lnmlp_plan_set_rng_state; docs/fp8.md, "NVFP4") -- sharing no code with the library.

Every quantization step is float32 arithmetic as TE's kernels do it. ml_dtypes' casts round to
nearest even but do not saturate as NVIDIA's cvt.rn.satfinite does, so values are clipped to the
format's max first (clipping cannot change the rounding of a value that should round to max: only
|v| > max is touched, and every such v rounds to max); a NaN element becomes +6 (code 0x7), which
E2M1 has no NaN for, as cvt does (ml_dtypes writes 0x8 there).
"""

import ml_dtypes
import numpy as np

F32 = np.float32
FLT_MAX = F32(np.finfo(np.float32).max)
E4M3, E2M1 = ml_dtypes.float8_e4m3fn, ml_dtypes.float4_e2m1fn
BLOCK = 16
# TE's sign vector of the weight-gradient Hadamard transform (its get_wgrad_sign_vector).
RHT_SIGNS = np.array([1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1], np.float64)
QUANTIZER_INDEX = {"ln_out": 0, "w1": 1, "act_out": 2, "w2": 3, "dy": 4, "dh": 5}
# What the plan tests measured, per tensor: [worst error / max|sim|, elements equal to the
# simulation rounded to the output dtype, elements] (conftest.py prints it).
REPORT = {}
E2M1_GRID = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


# --- the element and scale casts ---------------------------------------------------------------
def fminf(a, b):
    """C's fminf: the non-NaN operand where one is NaN."""
    a, b = F32(a), F32(b)
    return np.where(np.isnan(a), b, np.where(np.isnan(b), a, np.minimum(a, b))).astype(F32)


def nan_max_abs(a):
    return F32(np.max(np.abs(a))) if a.size else F32(0.0)


def global_scale(amax):
    """S_enc = min(448 * 6 / amax, FLT_MAX); 1 where amax is 0 or the quotient is 0."""
    amax = F32(amax)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = fminf(F32(448.0) * F32(6.0) / amax, FLT_MAX)
    return F32(1.0) if amax == 0 or s == 0 else F32(s)


def e4m3(v):
    return np.clip(F32(v), -448, 448).astype(E4M3).view(np.uint8)


def e2m1(v):
    v = np.asarray(v, dtype=F32)
    codes = np.clip(v, -6, 6).astype(E2M1).view(np.uint8) & 0xF
    return np.where(np.isnan(v), np.uint8(7), codes).astype(np.uint8)


def e2m1_value(codes):
    return np.asarray(codes, np.uint8).view(E2M1).astype(np.float64)


# --- the random stream ---------------------------------------------------------------------------
def philox4x32_10(c, k):
    """Philox4x32-10 (Salmon et al., SC 2011) of counters c (4 uint64 arrays of 32-bit words) under
    key k (2 words)."""
    mask = np.uint64(0xFFFFFFFF)
    c0, c1, c2, c3 = (np.asarray(w, np.uint64) for w in c)
    k0, k1 = (np.uint64(w) for w in k)
    for _ in range(10):
        p0 = np.uint64(0xD2511F53) * c0
        p1 = np.uint64(0xCD9E8D57) * c2
        c0, c1, c2, c3 = ((p1 >> np.uint64(32)) ^ c1 ^ k0, p1 & mask, (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & mask)
        k0 = (k0 + np.uint64(0x9E3779B9)) & mask
        k1 = (k1 + np.uint64(0xBB67AE85)) & mask
    return c0, c1, c2, c3


def random_bits(seed, offset, index):
    """The 32 bits of element `index` (uint64 array) of the stream (seed, offset): word index % 4 of
    Philox keyed by the seed at counter (index // 4, offset), 64-bit values as (low, high) words."""
    index = np.asarray(index, np.uint64)
    block = index >> np.uint64(2)
    mask = np.uint64(0xFFFFFFFF)
    out = philox4x32_10((block & mask, block >> np.uint64(32), np.full_like(block, offset & 0xFFFFFFFF),
                         np.full_like(block, offset >> 32)), (seed & 0xFFFFFFFF, seed >> 32))
    word = (index & np.uint64(3)).astype(np.int64)
    return np.choose(word, out).astype(np.uint64)


def e2m1_stochastic(v, bits):
    """Stochastic rounding: |v| between grid neighbours lo < hi rounds up exactly when the element's
    32 random bits are below floor((|v| - lo) / (hi - lo) * 2^32); |v| >= 6 saturates; NaN -> +6."""
    v = np.asarray(v, dtype=F32)
    a = np.abs(v).astype(np.float64)
    lo_i = np.clip(np.searchsorted(E2M1_GRID, a, side="right") - 1, 0, 7)
    lo = E2M1_GRID[lo_i]
    hi = E2M1_GRID[np.minimum(lo_i + 1, 7)]
    with np.errstate(invalid="ignore", divide="ignore"):
        threshold = np.floor((a - lo) / np.where(hi > lo, hi - lo, 1.0) * 2.0 ** 32)
    up = (bits.astype(np.float64) < threshold) & (a < 6.0)
    mag = np.where(a >= 6.0, 7, lo_i + up).astype(np.uint8)
    codes = np.where(np.signbit(v), mag | np.uint8(8), mag)
    return np.where(np.isnan(v), np.uint8(7), codes).astype(np.uint8)


# --- quantization -------------------------------------------------------------------------------
def quantize(x, tiles, global_amax, stream=None):
    """TE's NVFP4 quantizer of x [rows, cols] in 1x16 blocks along its rows (16x16 tiles with
    `tiles`): (codes [rows, cols] unpacked, scales [rows, ceil(cols/16)]). stream = (seed, offset,
    first_index): stochastic rounding, element (r, c) drawing index first_index + r * cols + c."""
    x = np.asarray(x, dtype=F32)
    rows, cols = x.shape
    s_enc = global_scale(global_amax)
    s_dec = F32(F32(1.0) / s_enc)
    inv6 = F32(F32(1.0) / F32(6.0))
    blocks = -(-cols // BLOCK)
    codes = np.zeros((rows, cols), np.uint8)
    scales = np.zeros((rows, blocks), np.uint8)
    tr = BLOCK if tiles else 1
    if stream is not None:
        seed, offset, first = stream
        index = np.uint64(first) + np.arange(rows * cols, dtype=np.uint64).reshape(rows, cols)
        bits = random_bits(seed, offset, index)
    with np.errstate(all="ignore"):
        for r0 in range(0, rows, tr):
            for b in range(blocks):
                sl = (slice(r0, r0 + tr), slice(b * BLOCK, (b + 1) * BLOCK))
                blk = x[sl]
                amax = nan_max_abs(blk)
                sb = e4m3(fminf(amax * F32(s_enc * inv6), FLT_MAX))
                scale = fminf(F32(1.0) / F32(sb.view(E4M3).astype(F32) * s_dec), FLT_MAX)
                scales[sl[0], b] = sb
                scaled = F32(blk * scale)
                codes[sl] = e2m1(scaled) if stream is None else e2m1_stochastic(scaled, bits[sl])
    return codes, scales


def hadamard16():
    h = np.array([[1.0]])
    while h.shape[0] < BLOCK:
        h = np.block([[h, h], [h, -h]])
    return h


def rht_rows(x):
    """y = x diag(s) H16 / 4 on each whole 1x16 block of each row (float64, rounded to float32
    once); a partial last block stays as it is."""
    x = np.asarray(x, dtype=np.float64)
    y = x.copy()
    m = np.diag(RHT_SIGNS) @ hadamard16() / 4.0
    whole = x.shape[1] // BLOCK * BLOCK
    for c in range(0, whole, BLOCK):
        y[:, c:c + BLOCK] = x[:, c:c + BLOCK] @ m
    return F32(y)


def operand(t, name, contract_axis, weight, rht=True, two_d=True, stochastic=True, seed=0, offset=0):
    """The float64 GEMM operand of t (2-D, float32) quantized by the recipe for a GEMM contracting
    `contract_axis`: e2m1 * s_block * amax / (6 * 448) per element (the GEMM contract's block sums
    times alpha = amax_a amax_b / (6 * 448)^2, split between the operands; the library's alpha
    rounds once in float32, a difference of float32 rounding), in t's layout. The inputs of the
    weight-gradient GEMMs (contract_axis 0, not weights) are Hadamard-transformed along it under
    `rht`; dy and dh round stochastically under `stochastic` from (seed, offset), each
    representation drawing from its own range of indices (2 * quantizer + columnwise) << 48."""
    t = np.asarray(t, dtype=F32)
    q = QUANTIZER_INDEX[name]
    tiles = weight and two_d
    transposed = contract_axis == 0 and not tiles
    m = t.T if transposed else t  # the matrix quantized along its rows
    if transposed and rht and not weight:
        m = rht_rows(m)
    m = np.ascontiguousarray(m, dtype=F32)
    amax = nan_max_abs(m)
    stream = None
    if stochastic and name in ("dy", "dh"):
        stream = (seed, offset, (2 * q + (1 if contract_axis == 0 else 0)) << 48)
    codes, scales = quantize(m, tiles, amax, stream)
    block_scales = np.repeat(scales.view(E4M3).astype(np.float64), BLOCK, axis=1)[:, :m.shape[1]]
    deq = e2m1_value(codes) * block_scales * (np.float64(amax) / (6.0 * 448.0))
    return deq.T if transposed else deq
