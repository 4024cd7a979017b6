"""FP8 formats (lnmlp_fp8_encode / lnmlp_fp8_decode, through lnmlp.fp8) bit-exact against ml_dtypes.

The oracle for encoding is ml_dtypes' cast of ``np.clip(x, -max, max)`` (x in float32): ml_dtypes'
own float32 -> float8 cast does not saturate (e4m3fn overflow gives NaN, e5m2 overflow gives inf),
while lnmlp saturates to ± max finite, and by the library's choice ±inf saturates too. Clipping
first cannot change the rounding of a value that should round to max: it only touches |x| > max,
and every such x rounds (nearest-even, saturating) to max. Both facts are checked below at max,
just above it, at the midpoint above it and beyond. Zeros and everything else are compared as
bits; a NaN is the one place lnmlp departs from ml_dtypes on purpose: ml_dtypes keeps its sign
(S.1111.111 for e4m3fn, S.11111.10 for e5m2), lnmlp writes the canonical 0x7f of both formats, as
NVIDIA GPUs and TransformerEngine do (so the oracle maps NaN there). Decoding gives the quiet
float32 NaN of the code's sign, as ml_dtypes.
"""

import ml_dtypes
import numpy as np
import pytest

import lnmlp
from lnmlp import _capi, _lib, fp8

ML = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
MAX = {"e4m3": np.float32(448.0), "e5m2": np.float32(57344.0)}
MAX_CODE = {"e4m3": 0x7E, "e5m2": 0x7B}
NAN_CODE = {"e4m3": 0x7F, "e5m2": 0x7F}  # canonical, no sign (ml_dtypes: S.1111.111, S.11111.10)
MIN_SUB = {"e4m3": np.float32(2.0**-9), "e5m2": np.float32(2.0**-16)}
MIN_NORMAL = {"e4m3": np.float32(2.0**-6), "e5m2": np.float32(2.0**-14)}
FORMATS = ["e4m3", "e5m2"]
INF = np.float32(np.inf)


def f32(x):
    return np.asarray(x, dtype=np.float32)


def oracle_encode(x, fmt):
    """ml_dtypes' cast of x clipped to ± max, every NaN the canonical code."""
    x = f32(x)
    with np.errstate(invalid="ignore", over="ignore"):
        codes = np.clip(x, -MAX[fmt], MAX[fmt]).astype(ML[fmt]).view(np.uint8)
    return np.where(np.isnan(x), np.uint8(NAN_CODE[fmt]), codes)


def oracle_decode(codes, fmt):
    return np.asarray(codes, dtype=np.uint8).view(ML[fmt]).astype(np.float32)


def bits(a):
    return f32(a).view(np.uint32)


def assert_codes_equal(got, want, x):
    got, want, x = np.asarray(got), np.asarray(want), f32(x)
    bad = np.flatnonzero(got.ravel() != want.ravel())
    if bad.size:
        i = bad[:8]
        pytest.fail(f"{bad.size} mismatches; x = {x.ravel()[i]} (bits {[hex(b) for b in bits(x).ravel()[i]]}): "
                    f"got {[hex(c) for c in got.ravel()[i]]}, want {[hex(c) for c in want.ravel()[i]]}")


def check_encode(x, fmt, scale=1.0):
    x = f32(x)
    with np.errstate(over="ignore", invalid="ignore"):
        scaled = x * np.float32(scale)  # the product in float32, as the library takes it
    got = fp8.encode(x, fmt, scale=scale)
    assert got.dtype == np.uint8 and got.shape == x.shape
    assert_codes_equal(got, oracle_encode(scaled, fmt), scaled)
    return got


def finite_values(fmt):
    """The non-negative finite values of the format, increasing."""
    v = oracle_decode(np.arange(128, dtype=np.uint8), fmt)
    v = v[np.isfinite(v)]
    assert np.all(np.diff(v) > 0)
    return v


# ---- decoding -------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS)
def test_decode_every_code(fmt):
    codes = np.arange(256, dtype=np.uint8)
    got, want = fp8.decode(codes, fmt), oracle_decode(codes, fmt)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(bits(got), bits(want))  # NaN codes included, as bits
    nan_codes = [0x7F, 0xFF] if fmt == "e4m3" else [0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF]
    assert sorted(np.flatnonzero(np.isnan(got))) == nan_codes
    if fmt == "e5m2":
        assert got[0x7C] == INF and got[0xFC] == -INF
    else:
        assert np.all(np.isfinite(got[~np.isnan(got)]))
    assert got[0x80] == 0 and np.signbit(got[0x80])  # negative zero
    assert got[MAX_CODE[fmt]] == MAX[fmt]
    # an ml_dtypes array of the format is accepted as its bits
    np.testing.assert_array_equal(bits(fp8.decode(codes.view(ML[fmt]), fmt)), bits(want))


# ---- encoding -------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS)
def test_every_finite_code_round_trips(fmt):
    codes = np.arange(256, dtype=np.uint8)
    values = oracle_decode(codes, fmt)
    finite = np.isfinite(values)
    got = check_encode(values[finite], fmt)
    np.testing.assert_array_equal(got, codes[finite])  # -0.0 -> 0x80 included


@pytest.mark.parametrize("fmt", FORMATS)
def test_midpoints_tie_to_even_and_their_neighbours(fmt):
    v = finite_values(fmt).astype(np.float64)
    mids64 = (v[:-1] + v[1:]) / 2
    mids = f32(mids64)
    assert np.array_equal(mids.astype(np.float64), mids64)  # exact in float32
    got = check_encode(mids, fmt)
    assert np.all(got % 2 == 0), "a tie must go to the even code"
    below, above = np.nextafter(mids, -INF), np.nextafter(mids, INF)
    lower_codes = np.arange(len(mids), dtype=np.uint8)  # value k has code k for k < max_code + 1
    np.testing.assert_array_equal(check_encode(below, fmt), lower_codes)
    np.testing.assert_array_equal(check_encode(above, fmt), lower_codes + 1)
    for k in (2, 3, 8):  # a few more ulps either side
        check_encode(np.concatenate([mids - k * np.spacing(mids), mids + k * np.spacing(mids)]), fmt)
    # and the negatives
    check_encode(-np.concatenate([mids, below, above]), fmt)
    # the values themselves, one ulp either side
    vf = f32(v)
    check_encode(np.concatenate([np.nextafter(vf, -INF), np.nextafter(vf, INF)]), fmt)
    check_encode(-np.concatenate([np.nextafter(vf, -INF), np.nextafter(vf, INF)]), fmt)


@pytest.mark.parametrize("fmt", FORMATS)
def test_saturation_beyond_max(fmt):
    m = MAX[fmt]
    v = finite_values(fmt)
    mid_above = m + (m - v[-2]) / 2  # the midpoint between max and the next (non-finite) step
    x = f32([m, np.nextafter(m, INF), np.nextafter(mid_above, -INF), mid_above,
             np.nextafter(mid_above, INF), 2 * m, 1e30, np.finfo(np.float32).max])
    got = check_encode(x, fmt)
    assert np.all(got == MAX_CODE[fmt])
    assert np.all(check_encode(-x, fmt) == 0x80 | MAX_CODE[fmt])
    # Just below max rounds down, never above max.
    assert fp8.encode(np.nextafter(m, f32(0)), fmt)[()] == MAX_CODE[fmt]
    # ml_dtypes' own (non-saturating) cast, for the record: why the oracle clips.
    with np.errstate(invalid="ignore", over="ignore"):
        raw = x.astype(ML[fmt]).view(np.uint8)
    if fmt == "e4m3":
        # (max, mid_above] rounds to max (ties to the even 0x7e); beyond is NaN (0x7f)
        np.testing.assert_array_equal(raw[:4], [0x7E] * 4)
        assert np.all(raw[4:] == 0x7F)
    else:
        # below mid_above rounds to max; the tie and beyond go to infinity (0x7c is even)
        np.testing.assert_array_equal(raw[:3], [0x7B] * 3)
        assert np.all(raw[3:] == 0x7C)


@pytest.mark.parametrize("fmt", FORMATS)
def test_infinity_saturates(fmt):
    # The library's choice (TransformerEngine / __NV_SATFINITE): ±inf -> ± max finite, both formats.
    got = check_encode(f32([INF, -INF]), fmt)
    np.testing.assert_array_equal(got, [MAX_CODE[fmt], 0x80 | MAX_CODE[fmt]])


@pytest.mark.parametrize("fmt", FORMATS)
def test_nan_stays_nan(fmt):
    nans = np.array([0x7FC00000, 0x7F800001, 0x7FA00000, 0x7FE00000, 0x7FFFFFFF], dtype=np.uint32).view(np.float32)
    x = np.concatenate([nans, -nans])
    got = check_encode(x, fmt)
    np.testing.assert_array_equal(got, [NAN_CODE[fmt]] * 10)  # sign and payload dropped
    assert np.all(np.isnan(fp8.decode(got, fmt)))


@pytest.mark.parametrize("fmt", FORMATS)
def test_underflow_to_zero(fmt):
    s = MIN_SUB[fmt]
    half = s / np.float32(2)
    x = f32([half, np.nextafter(half, INF), np.nextafter(half, f32(0)), s / 4, s / 1024,
             np.finfo(np.float32).smallest_subnormal, 0.0])
    got = check_encode(x, fmt)
    np.testing.assert_array_equal(got, [0, 1, 0, 0, 0, 0, 0])  # exactly half: a tie, to even (0)
    np.testing.assert_array_equal(check_encode(-x, fmt), [0x80, 0x81, 0x80, 0x80, 0x80, 0x80, 0x80])


@pytest.mark.parametrize("fmt", FORMATS)
def test_subnormals(fmt):
    n_sub = 8 if fmt == "e4m3" else 4
    values = finite_values(fmt)[:n_sub]  # 0 and the subnormals
    assert values[-1] < MIN_NORMAL[fmt] and values[1] == MIN_SUB[fmt]
    np.testing.assert_array_equal(check_encode(values, fmt), np.arange(n_sub))
    # every 61st float32 in [0, 2 * min normal), both signs
    hi = int(bits(2 * MIN_NORMAL[fmt]))
    x = np.arange(0, hi, 61, dtype=np.uint32).view(np.float32)
    check_encode(x, fmt)
    check_encode(-x, fmt)
    # the round-up from the largest subnormal into the smallest normal
    top_mid = (values[-1] + MIN_NORMAL[fmt]) / np.float32(2)
    np.testing.assert_array_equal(check_encode(f32([np.nextafter(top_mid, INF)]), fmt), [n_sub])


@pytest.mark.parametrize("fmt", FORMATS)
def test_negative_zero(fmt):
    assert fp8.encode(f32(-0.0), fmt)[()] == 0x80
    assert fp8.encode(f32(0.0), fmt)[()] == 0x00
    z = fp8.decode(np.array([0x80], np.uint8), fmt)
    assert z[0] == 0 and np.signbit(z[0])
    check_encode(f32([-0.0, 0.0]), fmt)


@pytest.mark.parametrize("fmt", FORMATS)
def test_dense_random_bit_patterns(fmt):
    rng = np.random.default_rng(1234)
    # uniform over all float32 bit patterns (NaN, inf, everything), 2^19 of them, so the library's
    # OpenMP-parallel path runs too
    check_encode(rng.integers(0, 2**32, size=1 << 19, dtype=np.uint32).view(np.float32), fmt)
    # uniform over the bit patterns of the format's range (2^-20 .. 4 * max), both signs
    lo, hi = int(bits(np.float32(2.0**-20))), int(bits(4 * MAX[fmt]))
    x = rng.integers(lo, hi, size=1 << 19, dtype=np.uint32).view(np.float32)
    check_encode(np.where(rng.random(x.size) < 0.5, -x, x), fmt)


# ---- scales -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS)
def test_scales(fmt):
    rng = np.random.default_rng(7)
    x = f32(rng.standard_normal(20000) * np.exp(rng.uniform(-12, 12, 20000)))
    x = np.concatenate([x, f32([0.0, -0.0, INF, -INF, np.nan, MAX[fmt], MIN_SUB[fmt]])])
    for k in range(-24, 25, 3):
        check_encode(x, fmt, scale=2.0**k)
    for scale in (0.3, 1.7, 448 / 3.1, 57344 / 7.3, -2.5, 1e-7, 3e5):
        check_encode(x, fmt, scale=scale)
    # decoding with scale_inv: float(code) * scale_inv in float32
    codes = np.arange(256, dtype=np.uint8)
    for scale_inv in (2.0**-7, 0.3, 1 / 1.7, 1e6, -1.0):
        with np.errstate(over="ignore", invalid="ignore"):
            want = oracle_decode(codes, fmt) * np.float32(scale_inv)
        np.testing.assert_array_equal(bits(fp8.decode(codes, fmt, scale_inv=scale_inv)), bits(want))


def test_round_trip_with_scale_shape_and_default_format():
    x = f32(np.linspace(-3, 3, 24).reshape(2, 3, 4))
    codes = fp8.encode(x, scale=64.0)
    assert codes.shape == (2, 3, 4) and codes.dtype == np.uint8
    y = fp8.decode(codes, scale_inv=1 / 64.0)
    assert y.shape == (2, 3, 4) and y.dtype == np.float32
    np.testing.assert_array_equal(y, (x * 64).astype(ml_dtypes.float8_e4m3fn).astype(np.float32) / 64)
    assert lnmlp.fp8 is fp8 and fp8.encode(f32([]), "e5m2").shape == (0,)


# ---- argument checking ------------------------------------------------------------------------------

def test_arguments_are_checked():
    lib = _lib.get_lib()
    x = f32([1.0, 2.0])
    out = np.full(2, 0xAA, np.uint8)
    outf = np.full(2, 7.0, np.float32)
    codes = np.array([0x38, 0x40], np.uint8)

    def raises(cls, words, status):
        with pytest.raises(cls) as e:
            _lib.check(status)
        for w in words:
            assert w in e.value.message

    enc, dec = lib.lnmlp_fp8_encode, lib.lnmlp_fp8_decode
    E4M3, E5M2 = _capi.DTYPE_FP8_E4M3, _capi.DTYPE_FP8_E5M2
    assert fp8.FORMATS == {"e4m3": E4M3, "e5m2": E5M2} == {"e4m3": 4, "e5m2": 5}
    raises(lnmlp.InvalidArgumentError, ["dtype 7"], enc(7, x.ctypes.data, 2, 1.0, out.ctypes.data))
    raises(lnmlp.InvalidArgumentError, ["dtype -1"], dec(-1, codes.ctypes.data, 2, 1.0, outf.ctypes.data))
    # The element type is an LNMLP_DTYPE_FP8_*: the other dtypes, the recipe formats' values
    # (LNMLP_FP8_FORMAT_*) and ABI 1's LNMLP_FP8_E4M3 = 0 / LNMLP_FP8_E5M2 = 1 (now F32 and BF16)
    # are refused, never taken for a format.
    for dtype in (_capi.DTYPE_F32, _capi.DTYPE_BF16, _capi.DTYPE_F16, _capi.DTYPE_U8):
        raises(lnmlp.InvalidArgumentError, [f"dtype {dtype} is not"], enc(dtype, x.ctypes.data, 2, 1.0, out.ctypes.data))
        raises(lnmlp.InvalidArgumentError, [f"dtype {dtype} is not"], dec(dtype, codes.ctypes.data, 2, 1.0, outf.ctypes.data))
    raises(lnmlp.InvalidArgumentError, ["count", "-3"], enc(E4M3, x.ctypes.data, -3, 1.0, out.ctypes.data))
    raises(lnmlp.InvalidArgumentError, ["count"], dec(E5M2, codes.ctypes.data, -1, 1.0, outf.ctypes.data))
    for bad in (0.0, -0.0, float("inf"), float("-inf"), float("nan")):
        raises(lnmlp.InvalidArgumentError, ["scale"], enc(E4M3, x.ctypes.data, 2, bad, out.ctypes.data))
        raises(lnmlp.InvalidArgumentError, ["scale_inv"], dec(E5M2, codes.ctypes.data, 2, bad, outf.ctypes.data))
    raises(lnmlp.NullPointerError, ["in is NULL"], enc(E4M3, None, 2, 1.0, out.ctypes.data))
    raises(lnmlp.NullPointerError, ["out is NULL"], enc(E5M2, x.ctypes.data, 2, 1.0, None))
    raises(lnmlp.NullPointerError, ["in is NULL"], dec(E4M3, None, 2, 1.0, outf.ctypes.data))
    raises(lnmlp.NullPointerError, ["out is NULL"], dec(E5M2, codes.ctypes.data, 2, 1.0, None))
    # nothing was written by the failing calls
    assert np.all(out == 0xAA) and np.all(outf == 7.0)
    # count 0 accepts NULL
    assert enc(E4M3, None, 0, 1.0, None) == 0 and dec(E5M2, None, 0, 1.0, None) == 0
    # the Python helpers
    with pytest.raises(lnmlp.InvalidArgumentError, match="fmt"):
        fp8.encode(x, "e3m4")
    with pytest.raises(lnmlp.InvalidArgumentError, match="fmt"):
        fp8.decode(codes, "E4M3")
    with pytest.raises(lnmlp.InvalidArgumentError, match="scale"):
        fp8.encode(x, scale=0.0)
    with pytest.raises(lnmlp.InvalidArgumentError, match="float8_e4m3fn"):
        fp8.decode(codes.view(ml_dtypes.float8_e5m2), "e4m3")
    with pytest.raises(lnmlp.InvalidArgumentError, match="uint8"):
        fp8.decode(codes.astype(np.int32), "e4m3")
