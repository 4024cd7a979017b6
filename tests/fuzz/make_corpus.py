#!/usr/bin/env python3
"""Writes the seed corpora of the libFuzzer harnesses (tests/fuzz/corpus/<harness>/) in the byte
formats tests/fuzz/README.md documents, so that every seed reaches plan creation and execution.

    python3 tests/fuzz/make_corpus.py [--out DIR] [--format-blobs]

fuzz_state's seeds carry state blobs to import. By default they are exported by the library itself
after a few forward and backward passes, through the Python binding (bindings/python; the library is
$LNMLP_LIBRARY, else build/release/src/liblnmlp.so); --format-blobs (or no library) writes them
from the header's description of the format instead. The files are deterministic for one library
build; the committed ones came from build/release on x86-64 (AVX-512).
"""
import argparse
import math
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# ---- the encodings of fuzz_common.h ------------------------------------------------------------

# Reader::pick_float's table (tag byte t < 0xE0 picks KFLOATS[t % 32]).
KFLOATS = [0.0, 1e-6, 1e-5, 1e-3, 0.1, 0.5, 1.0, 1.702, 2.0, 7.0, 448.0, 57344.0, "-0", -1.0, -1e-6, "nan", "-nan",
           "inf", "-inf", "max", "-max", "min", "denorm", 1e30, 1e-30, 3.0, 0.25, 100.0, 1e38, -7.0, 65504.0,
           1.0 / 1024.0]
# fuzz_plan's pick_dim: t < 0xC0 gives 1 + t % 64, 0xC0.. these.
MEDIUM_DIMS = [65, 96, 100, 127, 128, 129, 130, 144, 160, 192, 255, 256, 257, 320, 384, 500, 511, 512, 513, 640,
               768, 1000, 1023, 1024, 1025, 1536, 2048, 2049, 3000, 4095, 4096, 4097]


def u8(v):
    return bytes([v & 0xFF])


def u16(v):
    return struct.pack("<H", v)


def u32(v):
    return struct.pack("<I", v & 0xFFFFFFFF)


def f32(v):
    return struct.pack("<f", v)


def pick(v, lo, hi):
    """Reader::pick(lo, hi) of the in-range value v (one tag byte)."""
    assert lo <= v <= hi and v - lo < 0xE0, (v, lo, hi)
    return u8(v - lo)


def hostile(k, raw=b""):
    """Reader::pick's hostile value number k (README.md's table); k 30 and 31 take raw bytes."""
    return u8(0xE0 + k) + raw


def flt(v):
    """Reader::pick_float: a table entry's index, or 0xE0 and the float's 4 bytes."""
    for i, t in enumerate(KFLOATS):
        if isinstance(t, float) and not isinstance(v, str) and struct.pack("<f", t) == struct.pack("<f", v):
            return u8(i)
        if isinstance(v, str) and v == t:
            return u8(i)
    return u8(0xE0) + f32(v)


def dim(v):
    if 1 <= v <= 64:
        return u8(v - 1)
    return u8(0xC0 + MEDIUM_DIMS.index(v))


def fill(mode=0, seed=1):
    """fuzz::fill's arguments: mode byte and seed (mode 1 would read raw bytes next)."""
    assert mode % 4 != 1
    return u8(mode) + u32(seed)


# ---- fuzz_plan -----------------------------------------------------------------------------------

OP = dict(shape=0, norm=1, zcg=2, epsilon=3, acts=4, clamped=5, bias=6, dtype=7, remat=8, backend=9, threads=10,
          wgrads=11, wdtype=12, recipe=13, fp8_format=14, delayed=15, scaling=16, ext_ws=17, sharding=18, comm=19,
          null_desc=20, stale_desc=21, query=22, prepared=23, norm_output=24, wlayout=25, gemm_math=26,
          nvfp4_options=27)
ACT = dict(linear=0, relu=1, gelu=2, silu=3, quick_gelu=4, squared_relu=5, sigmoid=6, clamped_silu=7,
           clamped_linear=8)
DT = dict(f32=0, bf16=1, f16=2)
RECIPE = dict(none=0, delayed=1, current=2, block=3, mxfp8=4, nvfp4=5)
REMAT = dict(save_all=0, save_ffn1=1, save_stats=2, forward_only=3)


class PlanSeed:
    """A fuzz_plan input: setter ops, then (the plan created) queries, workspace, inputs, iterations.
    Tracks the configuration so that it writes exactly the bytes the harness reads."""

    def __init__(self):
        self.ops = []
        self.cfg = dict(T=0, H=0, F=0, norm=0, A=1, b1=0, b2=0, acc=0, recipe=0, hist=1024, ext=0)

    def op(self, name, args=b""):
        self.ops.append(u8(OP[name]) + args)
        return self

    def shape(self, T, H, F):
        self.cfg.update(T=T, H=H, F=F)
        return self.op("shape", dim(T) + dim(H) + dim(F))

    def norm(self, rms):
        self.cfg["norm"] = rms
        return self.op("norm", pick(rms, 0, 1))

    def acts(self, *names):
        a = [ACT[n] for n in names] + [ACT["linear"]] * (2 - len(names))
        self.cfg["A"] = len(names)
        return self.op("acts", pick(len(names), 1, 2) + u8(0) + pick(a[0], 0, 8) + pick(a[1], 0, 8))

    def bias(self, b1, b2):
        self.cfg.update(b1=b1, b2=b2)
        return self.op("bias", pick(b1, 0, 1) + pick(b2, 0, 1))

    def dtype(self, d):
        return self.op("dtype", pick(DT[d], 0, 2))

    def remat(self, r):
        return self.op("remat", pick(REMAT[r], 0, 3))

    def recipe(self, r):
        self.cfg["recipe"] = RECIPE[r]
        return self.op("recipe", pick(RECIPE[r], 0, 5))

    def delayed(self, margin, hist, algo):
        self.cfg["hist"] = hist
        return self.op("delayed", pick(margin, -2, 2) + pick(hist, 1, 16) + pick(algo, 0, 1))

    def wgrads(self, acc, dtype):
        self.cfg["acc"] = acc
        return self.op("wgrads", pick(acc, 0, 1) + pick(dtype, -1, 2))

    def ext_ws(self, on):
        self.cfg["ext"] = on
        return self.op("ext_ws", pick(on, 0, 1))

    def prepared(self, *tokens):
        return self.op("prepared", pick(len(tokens), 0, 32) + u8(0) + b"".join(dim(t) for t in tokens))

    def encode(self, iterations, wmode=0, bad_tensor=18, query_tokens=None, section=2, seed=7):
        """iterations: dicts with tokens, flags, state (mode byte), fwd / bwd (mutation bytes), and
        bwd_runs=False where the forward fails with valid tokens and flags (no backward then)."""
        c = self.cfg
        out = u8(len(self.ops)) + b"".join(self.ops)
        qt = c["T"] if query_tokens is None else query_tokens
        out += pick(qt, 0, c["T"]) if qt < 0xE0 else hostile(22)
        out += pick(section, 0, 10) + pick(c["T"] if c["T"] < 0xE0 else 0, 0, c["T"]) + pick(bad_tensor, 18, 19)
        out += u8(wmode)
        # Runner: gamma, beta (LayerNorm), w1, b1, w2, b2 as present.
        present = ["gamma"] + (["beta"] if c["norm"] == 0 else []) + ["w1"] + (["b1"] if c["b1"] else []) + ["w2"] + \
            (["b2"] if c["b2"] else [])
        for i, _ in enumerate(present):
            out += fill(0 if i % 2 == 0 else 2, seed + i)
        out += u8(len(iterations) - 1)
        for k, it in enumerate(iterations):
            out += it.get("tokens_bytes", pick(it["tokens"], 0, c["T"]))
            out += it.get("flags_bytes", pick(it.get("flags", 0), 0, 1))
            state = it.get("state", 0)
            out += u8(state)
            if state % 4 >= 2:
                stride = 1 + (c["hist"] if c["recipe"] == 1 else 1)
                for q in range(6):
                    out += u8(20 + q) + bytes((3 * q + i) % 16 for i in range(stride - 1))
            out += it.get("fwd", u8(0)) + it.get("bwd", u8(0))
            out += fill(it.get("x_mode", 0), seed + 100 + k)  # x
            if not it.get("bwd_runs", True):  # backward runs after a forward that succeeded, or bad tokens or flags
                continue
            out += fill(it.get("dy_mode", 0), seed + 200 + k)  # dy
            if c["acc"]:
                for j in range(2 + c["b1"] + c["b2"]):
                    out += fill(0, seed + 300 + 10 * k + j)
        return out


def plan_seeds():
    s = {}
    s["layernorm_relu_f32"] = PlanSeed().shape(4, 8, 16).encode([dict(tokens=4)])
    s["rmsnorm_swiglu_bf16_biases_ffn1"] = (
        PlanSeed().shape(6, 16, 24).norm(1).acts("silu", "linear").bias(1, 1).dtype("bf16").remat("save_ffn1")
        .encode([dict(tokens=6), dict(tokens=0), dict(tokens=3, flags=1)]))
    s["geglu_f16_stats_accumulate_f32_grads"] = (
        PlanSeed().shape(5, 12, 20).acts("gelu", "linear").bias(1, 0).dtype("f16").remat("save_stats")
        .wgrads(1, 0).op("zcg", pick(1, 0, 1)).op("epsilon", flt(1e-5))
        .encode([dict(tokens=5), dict(tokens=2)]))
    s["delayed_fp32_weights_bf16_state_array"] = (
        PlanSeed().shape(8, 16, 16).dtype("bf16").recipe("delayed").delayed(1, 4, 0).op("wdtype", pick(0, -1, 2))
        .op("fp8_format", pick(1, -1, 1))
        .encode([dict(tokens=8), dict(tokens=8, state=2), dict(tokens=4, flags=1)]))
    s["current_external_workspace"] = (
        PlanSeed().shape(7, 32, 8).recipe("current").op("scaling", pick(1, -1, 1) + flt(1e-3)).ext_ws(1)
        .op("threads", pick(1, 0, 2)).encode([dict(tokens=7), dict(tokens=1)], wmode=4))
    s["block_scaling_squared_relu"] = (
        PlanSeed().shape(16, 64, 64).recipe("block").acts("squared_relu").bias(0, 1)
        .encode([dict(tokens=16), dict(tokens=9)]))
    s["mxfp8_e4m3_forward_only"] = (
        PlanSeed().shape(4, 32, 64).recipe("mxfp8").op("fp8_format", pick(1, -1, 1)).remat("forward_only")
        .dtype("bf16").encode([dict(tokens=4)]))
    s["nvfp4_bf16_rht_sr_1d_weights"] = (
        PlanSeed().shape(20, 32, 48).dtype("bf16").recipe("nvfp4").acts("silu", "linear").bias(1, 1)
        .op("nvfp4_options", pick(0, 0, 1) + pick(0, 0, 1) + pick(1, 0, 1))
        .encode([dict(tokens=20), dict(tokens=7), dict(tokens=0)]))
    # Backward placed (lnmlp_plan_set_rng_place): 7 tokens from 10 of 40, F part 1 of 2 (runs); 20
    # tokens from 4 of 22 (past the whole: refused).
    s["nvfp4_placed_in_the_random_stream"] = (
        PlanSeed().shape(20, 32, 48).dtype("bf16").recipe("nvfp4").acts("gelu").bias(1, 1)
        .encode([dict(tokens=7, bwd=u8(8) + pick(10, 0, 40) + pick(40, 0, 80) + pick(1, 0, 3) + pick(2, 1, 4)),
                 dict(tokens=20, bwd=u8(8) + pick(4, 0, 40) + pick(22, 0, 80) + pick(0, 0, 3) + pick(1, 1, 4))]))
    s["clamped_swiglu"] = (
        PlanSeed().shape(3, 8, 8).acts("clamped_silu", "clamped_linear").op("clamped", flt(7.0) + flt(1.702) + flt(1.0))
        .encode([dict(tokens=3)]))
    s["cuda_backend_fails_cleanly"] = PlanSeed().shape(2, 4, 4).op("backend", u8(0xC0) + pick(0, 0, 1)).encode([])
    s["hostile_setters_then_plan"] = (
        PlanSeed().op("epsilon", flt("nan")).op("acts", hostile(1) + u8(0) + u8(1) + u8(1)).op("threads", hostile(10))
        .op("delayed", pick(0, -2, 2) + hostile(15) + pick(0, 0, 1)).op("sharding", pick(2, 1, 2) + pick(1, 0, 1) + u8(0))
        .op("shape", dim(0 + 1) + u8(0xE1) + dim(1)).op("null_desc", u8(3)).op("stale_desc", u8(5)).op("comm", u8(1))
        .op("query", pick(1, 0, 1) + pick(7, 0, 9) + u8(0)).op("sharding", pick(1, 1, 2) + pick(0, 0, 1) + u8(0))
        .shape(4, 4, 4).encode([dict(tokens=4, fwd=u8(0xC0) + u8(1) + u8(0))]))
    s["bad_tokens_flags_and_pointers"] = (
        PlanSeed().shape(4, 8, 8).bias(1, 1)
        .encode([dict(tokens=0, tokens_bytes=hostile(1), fwd=u8(0)),
                 dict(tokens=2, flags_bytes=hostile(1)),
                 dict(tokens=4, bwd=u8(0xC2) + u8(11) + u8(0))]))  # dw1 misaligned: backward refused
    s["output_aliases_input"] = (
        PlanSeed().shape(4, 8, 8).norm(1)
        .encode([dict(tokens=4, fwd=u8(0xC3) + u8(7) + u8(0), bwd_runs=False),  # y = x: forward refused
                 dict(tokens=3, bwd=u8(0xC3) + u8(9) + u8(2))]))  # dgamma = gamma: backward refused
    s["external_workspace_never_attached"] = PlanSeed().shape(4, 8, 8).ext_ws(1).encode([dict(tokens=4)], wmode=7)
    s["huge_shape_refused"] = PlanSeed().op("shape", u8(0xE2) + dim(1) + dim(1)).encode([])
    s["medium_shape_created_not_run"] = PlanSeed().shape(512, 128, 1000).encode([])
    s["prepared_counts_norm_output_out_in"] = (
        PlanSeed().shape(16, 16, 32).acts("silu", "linear").bias(1, 1).prepared(4, 9, 16, 9).op("norm_output", pick(1, 0, 1))
        .op("wlayout", pick(1, 0, 1)).op("gemm_math", pick(3, 0, 3)).remat("save_stats")
        .encode([dict(tokens=9), dict(tokens=4, flags=1), dict(tokens=5)], section=2))
    s["norm_output_forward_only_delayed"] = (
        PlanSeed().shape(8, 16, 16).recipe("delayed").delayed(0, 2, 0).remat("forward_only").op("norm_output", pick(1, 0, 1))
        .encode([dict(tokens=8), dict(tokens=3)], section=5))
    s["prepared_count_above_tokens_refused"] = PlanSeed().shape(8, 8, 8).prepared(3, 9).encode([])
    return s


# ---- fuzz_state ----------------------------------------------------------------------------------

STATE_SHAPES = [(1, 1, 1), (2, 4, 8), (4, 8, 4), (3, 5, 7), (8, 16, 32), (16, 32, 16), (5, 33, 17), (32, 64, 64)]


def format_blob(hist, rng_seed):
    """A blob from the header's description: magic, int32 version 1, recipe 1 (DELAYED), history
    length, 6 quantizers, then per quantizer its float32 scale and history (newest first)."""
    out = b"LNMLPQS1" + struct.pack("<4i", 1, 1, hist, 6)
    x = rng_seed
    for q in range(6):
        amaxes = []
        for i in range(hist):
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF
            amaxes.append((x % 1000) / 100.0 if i < 8 else 0.0)
        fmt_max = 448.0 if q < 4 else 57344.0
        m = max(amaxes)
        out += f32(fmt_max / m if m > 0 else 1.0) + b"".join(f32(a) for a in amaxes)
    return out


def library_blob(lnmlp, np, shape, dtype, hist, algo, fmt, passes, seed):
    """The blob a DELAYED plan exports after `passes` forward+backward passes on random data."""
    T, H, F = shape
    rec = lnmlp.DelayedScaling(margin=0, fp8_format=fmt, amax_history_len=hist, amax_compute_algo=algo)
    rng = np.random.default_rng(seed)
    dt = {0: np.float32, 1: "bfloat16", 2: np.float16}[dtype]
    with lnmlp.Plan(T, H, F, dtype=dt, recipe=rec, num_threads=1) as plan:
        npdt = plan.dtype

        def arr(*s, scale=1.0):
            return (rng.standard_normal(s) * scale).astype(np.float32).astype(npdt)

        gamma, beta = arr(H, scale=0.1) + 1, arr(H, scale=0.1)
        w1, w2 = arr(H, 1, F, scale=H ** -0.5), arr(F, H, scale=F ** -0.5)
        for _ in range(passes):
            x, dy = arr(T, H), arr(T, H)
            y, saved = plan.forward(x, gamma, beta, w1, None, w2, None)
            plan.backward(dy, x, gamma, beta, w1, None, w2, saved)
        return bytes(plan.export_state())


# fuzz_state's margins: entry (b2 >> 3) of this table.
STATE_MARGINS = [-2, -1, 0, 1, 2, 3, 4, 8, 16, 24, 30, 31, 32, 40, 64, 100, 120, 126, 127, -3, -4, -8, -16, -30, -31,
                 -32, -64, -100, -120, -125, -126, 50]


def state_header(shape_idx, dtype=0, rms=0, remat=0, b1=0, b2=0, fmt=0, algo=0, margin=0, hist=4):
    b0 = shape_idx
    b1_ = dtype | (rms << 2) | (remat << 3) | (b1 << 5) | (b2 << 6)
    b2_ = (fmt + 1) | (algo << 2) | (STATE_MARGINS.index(margin) << 3)
    assert 1 <= hist <= 16
    return bytes([b0, b1_, b2_, hist - 1])


def state_pass(shape_idx, tokens, backward=True, state_mode=0, rms=0, b1=0, b2=0, hist=4, seed=1, flags=0):
    T = STATE_SHAPES[shape_idx][0]
    out = u8(7) + u8(tokens % (T + 1)) + u8(state_mode) + u8(1 if backward else 0)
    if state_mode == 1:
        for q in range(6):
            out += u8(10 + q) + bytes((q + i) % 8 for i in range(hist))
    n_in = 8 - rms - (1 - b1) - (1 - b2)  # x, gamma, [beta], w1, [b1], w2, [b2], dy
    for i in range(n_in):
        out += fill(0 if i % 3 else 2, seed + i)
    return out + u8(flags)


def import_raw(blob, tag=0):
    return u8(0) + u16(len(blob)) + blob + u8(tag)


def state_seeds(lib):
    s = {}
    lnmlp, np = lib if lib else (None, None)
    fmt_names = {-1: "HYBRID", 0: "HYBRID", 1: "E4M3"}

    def blob(shape_idx, dtype, hist, algo, fmt, passes, seed):
        if lnmlp is None:
            return format_blob(hist, seed)
        return library_blob(lnmlp, np, STATE_SHAPES[shape_idx], dtype, hist, ["max", "most_recent"][algo],
                            fmt_names[fmt], passes, seed)

    # Import a library-exported blob, export, run passes, re-import the earlier export.
    s["import_exported_then_passes"] = (
        state_header(2, hist=4) + import_raw(blob(2, 0, 4, 0, 0, 3, 11)) + u8(5) + pick(0, 0, 0) + u8(0)
        + state_pass(2, 4, seed=3) + u8(8) + state_pass(2, 2, backward=False, seed=5))
    s["bf16_most_recent_set_get_attach"] = (
        state_header(4, dtype=1, algo=1, fmt=1, hist=8) + import_raw(blob(4, 1, 8, 1, 1, 2, 12))
        + u8(3) + pick(2, 0, 5) + flt(2.0) + pick(0, 0, 0) + u8(0) + u8(1) + flt(1.0) + flt(0.5) + flt("inf") + flt(0.0)
        + u8(4) + pick(2, 0, 5) + pick(0, 0, 0) + u8(0)
        + u8(6) + u8(0) + state_pass(4, 8, seed=9) + u8(6) + u8(2) + state_pass(4, 5, state_mode=1, hist=8, seed=10))
    s["rmsnorm_biases_caller_array_second_plan"] = (
        state_header(3, rms=1, b1=1, b2=1, hist=2) + import_raw(blob(3, 0, 2, 0, 0, 1, 13))
        + state_pass(3, 3, state_mode=1, rms=1, b1=1, b2=1, hist=2, seed=21) + u8(9)
        + state_pass(3, 0, rms=1, b1=1, b2=1, hist=2, seed=22))
    s["mutated_and_crafted_imports"] = (
        state_header(1, hist=3) + import_raw(blob(1, 0, 3, 0, 0, 2, 14))
        + u8(1) + u8(0) + u16(9) + u8(0x01) + u8(0)            # flip a version bit: refused
        + u8(1) + u8(1) + u16(27) + u8(0x80) + u16(31) + u8(0) + u8(0)  # sign of a scale: refused
        + u8(2) + u8(0) + b"".join(u8(30) + u8(0) + flt(1.0) + flt(2.0) + flt("nan") for _ in range(6))  # valid
        + u8(2) + u8(32) + b"".join(flt(-1.0) + u8(0) + flt(1.0) + flt(2.0) + flt(0.0) for _ in range(6)))  # refused
    s["f16_forward_only_export_sizes"] = (
        state_header(5, dtype=2, remat=3, hist=16) + import_raw(blob(5, 2, 16, 0, 0, 0, 15))
        + u8(5) + hostile(4) + u8(0) + u8(5) + hostile(1) + u8(0)
        + state_pass(5, 16, backward=False, seed=31) + u8(8))
    return s


# ---- fuzz_fp8 ------------------------------------------------------------------------------------

def fp8_seeds():
    vals = [0.0, -0.0, 1.0, -1.0, 448.0, 449.0, 464.0, 480.0, 57344.0, 61440.0, 65536.0, math.inf, -math.inf,
            math.nan, 2.0 ** -9, 2.0 ** -10, 3 * 2.0 ** -11, 2.0 ** -16, 2.0 ** -17, 1.0625, 1.1875, 1.125, 0.3,
            -240.5, 1e-40, 3.4e38, -3.4e38, 17.0, 18.0, 19.0]
    body = b"".join(f32(v) for v in vals)
    s = {}
    s["e4m3_scale_one"] = pick(4, 4, 5) + flt(1.0) + u8(0) + u8(0) + body
    s["e5m2_scale_one"] = pick(5, 4, 5) + flt(1.0) + u8(0) + u8(0) + body
    s["e4m3_scale_448"] = pick(4, 4, 5) + flt(448.0) + u8(0) + u8(0) + body
    s["e5m2_negative_scale"] = pick(5, 4, 5) + flt(-7.0) + u8(0) + u8(0) + body
    s["bad_dtype_and_count"] = hostile(4) + flt(1.0) + u8(0xF0) + u8(0x83) + body
    return s


def load_library():
    sys.path.insert(0, os.path.join(ROOT, "bindings", "python"))
    if "LNMLP_LIBRARY" not in os.environ:
        default = os.path.join(ROOT, "build", "release", "src", "liblnmlp.so")
        if os.path.exists(default):
            os.environ["LNMLP_LIBRARY"] = default
    try:
        import numpy as np
        import lnmlp
        lnmlp.Plan(1, 1, 1).close()
        return lnmlp, np
    except Exception as e:  # no numpy, no binding or no library: the format's blobs
        print(f"make_corpus: the library is not loadable ({e}); blobs from the header's format", file=sys.stderr)
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(HERE, "corpus"))
    ap.add_argument("--format-blobs", action="store_true", help="write the state blobs from the format description")
    args = ap.parse_args()
    lib = None if args.format_blobs else load_library()
    sets = {"fuzz_plan": plan_seeds(), "fuzz_state": state_seeds(lib), "fuzz_fp8": fp8_seeds()}
    for harness, seeds in sets.items():
        d = os.path.join(args.out, harness)
        os.makedirs(d, exist_ok=True)
        for name, data in seeds.items():
            with open(os.path.join(d, name), "wb") as f:
                f.write(data)
        print(f"{harness}: {len(seeds)} seeds in {os.path.relpath(d, ROOT)}"
              + (" (state blobs exported by the library)" if harness == "fuzz_state" and lib else ""))


if __name__ == "__main__":
    main()
