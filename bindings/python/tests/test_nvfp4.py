"""NVFP4 quantization (lnmlp.nvfp4, lnmlp_nvfp4_quantize) bit-exact against _nvfp4_sim, an
independent NumPy simulation of TransformerEngine's NVFP4 quantizer written from its definition
(the kernels' core_nvfp4.cuh, docs/design.md "NVFP4"), with ml_dtypes' float8_e4m3fn and
float4_e2m1fn casts.
"""

import numpy as np
import pytest

from lnmlp import _lib, nvfp4

from _nvfp4_sim import E2M1, E4M3, F32, FLT_MAX, fminf
from _nvfp4_sim import e2m1 as sim_e2m1
from _nvfp4_sim import e4m3 as sim_e4m3
from _nvfp4_sim import global_scale as sim_global_scale
from _nvfp4_sim import quantize as simulate


def check(x, tiles=False, global_amax=None):
    x = np.asarray(x, dtype=F32)
    codes, scales, amax = nvfp4.quantize(x, tiles=tiles, global_amax=global_amax)
    want_codes, want_scales = simulate(x, tiles, amax)
    np.testing.assert_array_equal(scales, want_scales)
    got = nvfp4.unpack(codes, x.shape[1])
    bad = np.argwhere(got != want_codes)
    assert bad.size == 0, (f"{len(bad)} codes differ, first at {bad[:4].tolist()}: "
                           f"x {[x[tuple(i)] for i in bad[:4]]} got {[got[tuple(i)] for i in bad[:4]]} "
                           f"want {[want_codes[tuple(i)] for i in bad[:4]]}")
    if x.shape[1] % 2:
        assert np.all(codes[:, -1] >> 4 == 0), "an odd row's last high half must be 0"
    return codes, scales, amax


@pytest.mark.parametrize("tiles", [False, True])
@pytest.mark.parametrize("shape", [(1, 16), (3, 37), (16, 32), (33, 47), (64, 256), (17, 1)])
@pytest.mark.parametrize("spread", [0.0, 8.0, 60.0])
def test_matches_the_simulation(shape, tiles, spread):
    rng = np.random.default_rng(hash((shape, tiles, spread)) % 2**32)
    x = (rng.standard_normal(shape) * np.exp2(rng.uniform(-spread, spread, shape))).astype(F32)
    check(x, tiles)


def test_every_e2m1_rounding_case():
    """Every E2M1 midpoint, its float32 neighbours, the grid points and beyond-max values, each block
    holding a 6 (global_amax 2688: S_enc 1; s_block = e4m3(6 / 6) = 1, so elements are cast as they
    are): the element cast against ml_dtypes'."""
    points = np.array([0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0], F32)
    vals = np.concatenate([points, np.nextafter(points, F32(0)), np.nextafter(points, F32(10)),
                           [1e-30, 6.3, 6.35]]).astype(F32)
    vals = np.concatenate([vals, -vals])
    per_block = 15
    blocks = -(-len(vals) // per_block)
    x = np.zeros((1, blocks * 16), F32)
    for b in range(blocks):
        chunk = vals[b * per_block:(b + 1) * per_block]
        x[0, b * 16:b * 16 + len(chunk)] = chunk
        x[0, b * 16 + 15] = 6.0
    codes, scales, _ = check(x, global_amax=F32(2688.0))
    assert np.all(scales == 0x38), "every block's scale should be E4M3 1.0 here"


def test_element_scale_is_the_kernels_reciprocal():
    """TE's kernels scale elements by 1 / (s_block * (1 / S_enc)); S_enc / s_block is the same in
    exact arithmetic but not always in float32. Find a block where the two differ and an element
    that lands exactly on an E2M1 midpoint under the first and off it under the second: lnmlp's code
    must be the first's."""
    rng = np.random.default_rng(11)
    with np.errstate(all="ignore"):
        for _ in range(10000):
            global_amax = F32(rng.uniform(1, 1000))
            block_amax = F32(global_amax * F32(rng.uniform(0.01, 1)))
            s_enc = sim_global_scale(global_amax)
            sb = sim_e4m3(fminf(block_amax * F32(s_enc * F32(F32(1) / F32(6))), FLT_MAX))
            sbf = sb.view(E4M3).astype(F32)
            kernel = F32(F32(1) / F32(sbf * F32(F32(1) / s_enc)))
            other = F32(s_enc / sbf)
            if kernel == other:
                continue
            mid = F32(2.5) if other > kernel else F32(3.5)  # ties to 2 (even), and to 4 (even)
            x = F32(mid / kernel)
            if F32(x * kernel) != mid or F32(x * other) == mid:
                continue
            break
        else:
            pytest.fail("no discriminating input found")
    row = np.zeros((1, 16), F32)
    row[0, 0], row[0, 1] = block_amax, x
    codes, _, _ = check(row, global_amax=global_amax)
    assert nvfp4.unpack(codes, 16)[0, 1] == (4 if mid == 2.5 else 6)
    assert sim_e2m1(F32(x * other)) != sim_e2m1(mid), "the input does not tell the two formulas apart"


def test_block_scale_is_the_kernels_product():
    """TE's kernels take s_block = e4m3(block_amax * (S_enc * (1/6))); its JAX reference computes
    e4m3((block_amax / 6) * S_enc), the same in exact arithmetic. Build a block whose fp32 product
    lands exactly on an E4M3 midpoint under the first and off it under the second (so the E4M3
    rounding differs): lnmlp's scale must be the first's."""
    rng = np.random.default_rng(12)
    inv6 = F32(F32(1) / F32(6))
    mids = np.array([1.0625, 1.1875, 1.3125, 1.4375, 1.5625, 1.6875, 1.8125, 1.9375], F32)  # E4M3 ties
    with np.errstate(all="ignore"):
        for _ in range(20000):
            global_amax = F32(rng.uniform(1, 1000))
            s_enc = sim_global_scale(global_amax)
            m = F32(s_enc * inv6)
            target = F32(mids[rng.integers(len(mids))] * F32(2.0 ** rng.integers(-4, 5)))
            amax = F32(target / m)
            found = False
            for k in range(-3, 4):  # the float32 values a few ulps around amax
                a = amax
                for _ in range(abs(k)):
                    a = F32(np.nextafter(a, F32(np.inf) if k > 0 else F32(0)))
                kernel = F32(a * m)
                jax_ref = F32(F32(a / F32(6)) * s_enc)
                if a <= global_amax and sim_e4m3(kernel) != sim_e4m3(jax_ref):
                    found = True
                    break
            if found:
                break
        else:
            pytest.fail("no discriminating input found")
    row = np.zeros((1, 16), F32)
    row[0, 0] = a
    _, scales, _ = check(row, global_amax=global_amax)
    assert scales[0, 0] == sim_e4m3(kernel) != sim_e4m3(jax_ref)


def test_special_blocks():
    x = np.zeros((2, 96), F32)
    x[0, 16:32] = np.arange(1, 17, dtype=np.uint32).view(F32) * F32(1000)  # float32 subnormals
    x[0, 32:48] = np.linspace(-3, 5, 16, dtype=F32)
    x[0, 40] = np.nan
    x[0, 48:64] = np.linspace(-0.3, 0.2, 16, dtype=F32)
    x[0, 50] = -np.inf
    x[0, 64:80] = np.float32(1e-6)
    x[0, 80:96] = np.linspace(-1e30, 1e30, 16, dtype=F32)
    x[1] = np.linspace(-2, 2, 96, dtype=F32)
    check(x)  # NaN global amax: S_enc = FLT_MAX
    x[0, 40] = 1.0
    check(x)  # inf global amax: S_enc = 1
    x[0, 50] = 2.0
    check(x)  # finite, with zero, subnormal and 1e30 blocks
    check(x, tiles=True)
    check(np.zeros((3, 20), F32))  # all zeros: global scale 1, every code 0


def test_dequantize_is_code_times_scales():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((7, 50)).astype(F32)
    codes, scales, amax = check(x)
    y = nvfp4.dequantize(codes, scales, 50, amax)
    e2m1 = nvfp4.unpack(codes, 50).view(E2M1).astype(F32)
    s = np.repeat(scales.view(E4M3).astype(F32), 16, axis=1)[:, :50]
    want = (e2m1 * s) * F32(F32(1.0) / sim_global_scale(amax))
    np.testing.assert_array_equal(y.view(np.uint32), want.astype(F32).view(np.uint32))
    # An element is within half a grid step of its block's scaled max grid, 1/6 of the block amax
    # at most (between 4 and 6 the step is 2), plus E4M3's rounding of the scale (1/16).
    assert np.max(np.abs(y - x)) <= np.max(np.abs(x)) * (1 / 6) * (1 + 1 / 16) + 1e-7


def test_bad_arguments():
    x = np.ones((2, 16), F32)
    with pytest.raises(_lib.InvalidArgumentError, match="2-D"):
        nvfp4.quantize(np.ones(16, F32))
    with pytest.raises(_lib.InvalidArgumentError, match="global_amax"):
        nvfp4.quantize(x, global_amax=-1.0)
    lib = _lib.get_lib()
    codes = np.zeros((2, 8), np.uint8)
    scales = np.zeros((2, 1), np.uint8)
    assert lib.lnmlp_nvfp4_quantize(x.ctypes.data, 2, 16, 8, 1.0, codes.ctypes.data, scales.ctypes.data) != 0
    assert b"block_rows" in lib.lnmlp_last_error()
    assert lib.lnmlp_nvfp4_quantize(None, 2, 16, 1, 1.0, codes.ctypes.data, scales.ctypes.data) != 0
    assert lib.lnmlp_nvfp4_quantize(x.ctypes.data, -1, 16, 1, 1.0, codes.ctypes.data, scales.ctypes.data) != 0
    assert lib.lnmlp_nvfp4_quantize(x.ctypes.data, 2**40, 2**40, 1, 1.0, codes.ctypes.data, scales.ctypes.data) != 0
    assert not codes.any() and not scales.any(), "a refused call wrote its outputs"
    assert lib.lnmlp_nvfp4_quantize(None, 0, 16, 1, 1.0, None, None) == 0
    with pytest.raises(_lib.InvalidArgumentError, match="shape"):
        nvfp4.dequantize(codes, np.zeros((2, 2), np.uint8), 16, 1.0)


def test_the_simulations_random_stream_is_philox4x32_10():
    """_nvfp4_sim's Philox against Random123's published known-answer vectors (kat_vectors,
    philox4x32 with 10 rounds), so that its stochastic rounding rests on the generator's definition
    and not on the library's."""
    from _nvfp4_sim import philox4x32_10
    kats = [((0, 0, 0, 0), (0, 0), (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)),
            ((0xffffffff,) * 4, (0xffffffff,) * 2, (0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd)),
            ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0xa4093822, 0x299f31d0),
             (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1))]
    for counter, key, want in kats:
        got = philox4x32_10([np.array([c], np.uint64) for c in counter], key)
        assert [int(w[0]) for w in got] == list(want)


def test_the_simulations_stochastic_rounding_is_unbiased():
    """_nvfp4_sim's stochastic rounding: over 2^16 draws each value's mean code value is the value
    itself within 5 standard errors (the rounding the plan tests compare the library with)."""
    from _nvfp4_sim import e2m1_stochastic, e2m1_value, random_bits
    n = 1 << 16
    bits = random_bits(3, 9, np.arange(n, dtype=np.uint64))
    for v in (0.1, 0.7, 1.2, 2.9, 3.3, 5.5, -4.5):
        got = e2m1_value(e2m1_stochastic(np.full(n, v, F32), bits))
        grid = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
        lo = grid[grid <= abs(v)].max()
        hi = grid[grid > abs(v)].min()
        assert set(np.abs(np.unique(got))) <= {lo, hi}
        p = (abs(v) - lo) / (hi - lo)
        se = (hi - lo) * np.sqrt(p * (1 - p) / n)
        assert abs(got.mean() - v) <= 5 * se + 1e-12, (v, got.mean())
