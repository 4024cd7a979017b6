"""The serving table of bench/compare (compare.py --serving): the block's forward alone at a few
tokens, as a server decoding a batch runs it, lnmlp against PyTorch eager, torch.compile and JAX jit,
with the weights' bytes read per second against the machine's measured memory bandwidth.

At T <= 64 the forward is memory-bound: it costs one read of W1 and W2 (H x A*F and F x H elements)
plus a little, so the figure of merit is how fast the weights stream: their bytes over the time of
a forward, against a STREAM triad measured in the same run (lnmlp-bench --machine). Bytes per
element: 4 for f32, 2 for bf16, 1 for the FP8 row (the form a server keeps its weights in across
calls; lnmlp's FP8 plan quantizes them once, LNMLP_CALL_WEIGHTS_UNCHANGED after the first call).
Weights that fit in the last-level cache can stream faster than memory: above 100 % is possible.

This module has both sides: the forward-only implementations a worker process times, and the
analysis, table and chart the parent makes of the workers' results (docs/cpu-compare.md, Serving).
"""

import statistics
import time

import numpy as np

import report
import workers

SHAPE = dict(hidden=1024, ffn=4096, norm="layernorm", act="gelu")
TOKENS = (1, 4, 16, 64)
DTYPES = ("f32", "bf16")
IMPLS = ("lnmlp", "torch", "torch.compile", "jax")
#: The FP8 row: lnmlp with bf16 I/O under this recipe, weights quantized once and reused.
FP8_RECIPE = "current"
#: Each row's timing: warm-up calls (torch.compile compiles in the first), then calls until the
#: budget is spent, at least MIN_CALLS and at most MAX_CALLS; the median is reported.
WARMUP, MIN_CALLS, MAX_CALLS = 5, 20, 5000
BUDGET_S = dict(full=1.5, quick=0.3)
BYTES_PER_WEIGHT = {"f32": 4, "bf16": 2, "fp8": 1}
#: The serving goals (issue 53), checked (never asserted) by print_targets: at T <= small_t the
#: weights read at >= bandwidth_fraction of the measured bandwidth; at every T, each lnmlp row
#: (the FP8 one included) >= speedup x faster than each peer named, same T, in that row's dtype.
TARGETS = dict(bandwidth_fraction=0.80, small_t=8, speedup=1.5, peers=("torch", "jax"))


# --- the worker side: forward-only implementations -----------------------------------------------
# Each: __init__(cfg, inputs, threads) builds what it keeps; forward() runs one forward and returns
# when its output is ready; output() gives y as float32.

class LnmlpForward:
    """A forward-only plan (remat="forward_only") for exactly T tokens, through the plan's C call on
    preallocated arrays; every call after the first declares the weights unchanged, so that a
    plan's copies of them (FP8 codes, widened operands) are made once."""

    def __init__(self, cfg, inputs, threads):
        import lnmlp
        from lnmlp import _lib
        dtype = workers.numpy_dtype(cfg.dtype)
        self.plan = lnmlp.Plan(cfg.tokens, cfg.hidden, cfg.ffn, norm_type=cfg.norm, activation_type=cfg.act,
                               use_bias1=True, use_bias2=True, dtype=dtype, remat="forward_only",
                               num_threads=threads, recipe=workers.lnmlp_recipe(lnmlp, cfg.recipe))
        self.y = np.empty(self.plan.tensor_shape("y", cfg.tokens), dtype)
        saved = self.plan.tensor_shape("saved", cfg.tokens)  # None: a forward-only plan may save nothing
        self.saved = workers.aligned_bytes(saved[0], self.plan.alignment) if saved and saved[0] else None
        self.inp, lib, p = inputs, _lib.get_lib(), workers.address
        args = [self.plan._handle, cfg.tokens, p(inputs["x"]), p(inputs["gamma"]), p(inputs.get("beta")),
                p(inputs["w1"]), p(inputs["b1"]), p(inputs["w2"]), p(inputs["b2"]), p(self.y), p(self.saved), None]
        self._first = (lib.lnmlp_plan_forward, *args, _lib.CALL_DEFAULT, None)
        self._next = (lib.lnmlp_plan_forward, *args, _lib.CALL_WEIGHTS_UNCHANGED, None)
        self._call, self._check = self._first, _lib.check

    def forward(self):
        self._check(self._call[0](*self._call[1:]))
        self._call = self._next

    def output(self):
        return self.y.astype(np.float32)


class TorchForward:
    """PyTorch eager (or torch.compile's Inductor) of the same block under torch.inference_mode."""
    compiled = False

    def __init__(self, cfg, inputs, threads):
        import torch
        torch.set_num_threads(threads)
        self.torch = torch
        flat = workers.flat_weights(inputs, cfg)
        flat.pop("dy")
        self.params = {k: workers.torch_tensor(torch, v) for k, v in flat.items()}
        block = workers.torch_block_fn(cfg)
        self.block = torch.compile(block) if self.compiled else block
        self.y = None

    def forward(self):
        with self.torch.inference_mode():
            self.y = self.block(**self.params)

    def output(self):
        return workers.to_f32(self.y)


class TorchCompileForward(TorchForward):
    compiled = True


class JaxForward:
    """jax.jit of the same forward, waited for."""

    def __init__(self, cfg, inputs, threads):
        import jax
        import jax.numpy as jnp
        jax.config.update("jax_platforms", "cpu")
        self.jax = jax
        flat = workers.flat_weights(inputs, cfg)
        flat.pop("dy")
        self.params = {k: jnp.asarray(v) for k, v in flat.items()}
        self.fn = jax.jit(workers.jax_block_fn(cfg))
        self.y = None

    def forward(self):
        self.y = self.jax.block_until_ready(self.fn(self.params))

    def output(self):
        return np.asarray(self.y).astype(np.float32)


IMPLEMENTATIONS = {"lnmlp": LnmlpForward, "torch": TorchForward, "torch.compile": TorchCompileForward,
                   "jax": JaxForward}


def time_forward(impl, budget_s):
    """Warm-up, then forwards until the budget is spent: each call's seconds."""
    for i in range(WARMUP):
        workers.progress(f"warm-up {i + 1}/{WARMUP}")
        impl.forward()
    workers.progress("timing")
    times, start = [], time.perf_counter()
    while len(times) < MAX_CALLS and (len(times) < MIN_CALLS or time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        impl.forward()
        times.append(time.perf_counter() - t0)
    return times


def run_serving(spec):
    """Worker entry for one serving row: the forward's time per call, and y dumped for the parent."""
    cfg = workers.Config(**spec["config"])
    impl = IMPLEMENTATIONS[spec["impl"]](cfg, workers.make_inputs(cfg), spec["threads"])
    times = time_forward(impl, spec["budget_s"])
    np.save(spec["dump"] + ".y.npy", impl.output())
    return dict(median_us=statistics.median(times) * 1e6, min_us=min(times) * 1e6, calls=len(times),
                versions=workers.framework_versions(spec["impl"]))


# --- the parent side: rows, analysis, table, chart -----------------------------------------------
def configs():
    """(config, impl) of every row: each dtype and T with lnmlp and its peers, then lnmlp's FP8
    row in bf16."""
    for dtype in DTYPES:
        for tokens in TOKENS:
            cfg = dict(SHAPE, tokens=tokens, dtype=dtype, recipe="none")
            for impl in IMPLS:
                yield cfg, impl
            if dtype == "bf16":
                yield dict(cfg, recipe=FP8_RECIPE), "lnmlp"


def kind(cfg):
    return "fp8" if cfg["recipe"] != "none" else cfg["dtype"]


def weight_bytes(cfg):
    c = workers.Config(**cfg)
    return (c.hidden * c.num_acts * c.ffn + c.ffn * c.hidden) * BYTES_PER_WEIGHT[kind(cfg)]


def row_name(row):
    return report.NAMES[row["impl"]] + ("" if row["config"]["recipe"] == "none" else f" fp8 {row['config']['recipe']}")


def reference_y(cfg):
    """The float64 forward on the workers' inputs (their seed), for the error column."""
    c = workers.Config(**cfg)
    inputs = {k: np.asarray(v, np.float64) for k, v in workers.make_inputs(c).items()}
    return workers.numpy_forward(c, workers.flat_weights(inputs, c))[0]


def analyse(rows, bandwidth_gbs):
    """Adds to each row its weights' GB/s and share of the bandwidth, lnmlp's speed-up over it (the
    peer's time over lnmlp's, same dtype and T) and its y error against the float64 forward."""
    lnmlp = {(r["config"]["dtype"], r["config"]["tokens"]): r for r in rows
             if r["impl"] == "lnmlp" and r["config"]["recipe"] == "none" and r["status"] == "ok"}
    refs = {}
    for row in rows:
        cfg = row["config"]
        row["name"] = row_name(row)
        row["weight_bytes"] = weight_bytes(cfg)
        if row["status"] != "ok":
            continue
        row["weights_gbs"] = row["weight_bytes"] / (row["median_us"] * 1e-6) * 1e-9
        if bandwidth_gbs:
            row["bandwidth_fraction"] = row["weights_gbs"] / bandwidth_gbs
        ref = lnmlp.get((cfg["dtype"], cfg["tokens"]))
        if ref is not None and row is not ref and cfg["recipe"] == "none":
            row["lnmlp_speedup"] = row["median_us"] / ref["median_us"]
        key = (cfg["dtype"], cfg["tokens"])
        if key not in refs:
            refs[key] = reference_y(cfg)
        y = np.load(row["dump"] + ".y.npy").astype(np.float64)
        row["err_y"] = float(np.max(np.abs(y - refs[key])) / np.max(np.abs(refs[key])))
        row["tolerance"] = report.TOLERANCES[kind(cfg)]  # max|y - y64| / max|y64|, per row kind
        row["agrees"] = row["err_y"] <= row["tolerance"]
    for row in rows:
        row.pop("dump", None)
    return rows


def print_table(rows, machine, bandwidth):
    bw = bandwidth.get("triad_gbs")
    print(f"\nServing: the forward alone, H={SHAPE['hidden']} F={SHAPE['ffn']} {SHAPE['norm']} {SHAPE['act']} "
          f"with biases, on {machine['cpu_model']} ({machine['cores']} cores), {machine['threads']} threads each")
    peak = report.fmt(bandwidth.get("fp32_peak_gflops"), ".0f")
    print(f"memory bandwidth {report.fmt(bw, '.1f')} GB/s (lnmlp-bench --machine: STREAM triad, best of the runs "
          f"before and after the table); fp32 peak {peak} GFLOP/s")
    head = f"{'dtype':<6}{'T':>4}  {'implementation':<22}{'forward us':>11}{'weights GB/s':>14}{'% bandwidth':>13}" \
           f"{'lnmlp x':>9}  err y vs float64"
    print(head)
    print("-" * (len(head) + 12))
    for r in rows:
        c = r["config"]
        lead = f"{c['dtype']:<6}{c['tokens']:>4}  {r['name']:<22}"
        if r["status"] != "ok":
            print(f"{lead}  n/a: {r['reason']}")
            continue
        flag = "" if r["agrees"] else f" DISAGREES (tol {r['tolerance']:g})"
        share, speedup = report.fmt(r.get("bandwidth_fraction"), ".0%"), report.fmt(r.get("lnmlp_speedup"), ".2f")
        print(f"{lead}{r['median_us']:>11.1f}{r['weights_gbs']:>14.1f}{share:>13}{speedup:>9}  {r['err_y']:.1e}{flag}")
    print("(median of each row's calls after warm-up; weights GB/s: W1 and W2's bytes -- 4 per element in f32, "
          "2 in bf16, 1 under FP8 -- over the forward's time; lnmlp x: the peer's time / lnmlp's, same dtype and T)")
    print_targets(rows)


def target_checks(rows):
    """(what, measured, goal, met) for each serving goal a row of this run can be checked against."""
    g, checks = TARGETS, []
    for r in rows:
        c = r["config"]
        if r["impl"] != "lnmlp" or r["status"] != "ok":
            continue
        label = f"{c['dtype']} T={c['tokens']} {r['name']}"
        if c["tokens"] <= g["small_t"] and "bandwidth_fraction" in r:
            f = r["bandwidth_fraction"]
            checks.append((f"{label}: weights read, share of the bandwidth", f"{f:.0%}",
                           f">= {g['bandwidth_fraction']:.0%}", f >= g["bandwidth_fraction"]))
        for peer in rows:
            pc = peer["config"]
            if (peer["impl"] in g["peers"] and peer["status"] == "ok" and pc["dtype"] == c["dtype"]
                    and pc["tokens"] == c["tokens"]):
                ratio = peer["median_us"] / r["median_us"]
                checks.append((f"{label}: {peer['name']} / lnmlp", f"{ratio:.2f}x", f">= {g['speedup']:.1f}x",
                               ratio >= g["speedup"]))
    return checks


def print_targets(rows):
    report.print_checks("Against the serving goals (docs/cpu-compare.md, Serving), this run on this machine:",
                        target_checks(rows))


def plot(path, rows, machine, bandwidth):
    plt = report.pyplot()
    fig, axes = plt.subplots(2, len(DTYPES), figsize=(12, 7.5), sharex=True, squeeze=False)
    colors = {"lnmlp": report.LNMLP_COLOR, "torch": "#7570b3", "torch.compile": "#1b9e77", "jax": "#e7298a"}
    for col, dtype in enumerate(DTYPES):
        top, bottom = axes[0, col], axes[1, col]
        series = {}
        for r in rows:
            if r["config"]["dtype"] == dtype and r["status"] == "ok":
                series.setdefault(r["name"], (r, []))[1].append(r)
        for name, (first, pts) in series.items():
            fp8 = first["config"]["recipe"] != "none"
            style = dict(marker="o", label=name, color=report.FP8_COLOR if fp8 else colors[first["impl"]],
                         linewidth=2.2 if first["impl"] == "lnmlp" else 1.4, linestyle="--" if fp8 else "-")
            t = [p["config"]["tokens"] for p in pts]
            top.plot(t, [p["median_us"] for p in pts], **style)
            if all("bandwidth_fraction" in p for p in pts):
                bottom.plot(t, [100 * p["bandwidth_fraction"] for p in pts], **style)
        top.set_yscale("log")
        top.set_ylabel("forward time per call, us (log)")
        top.set_title(f"{dtype}: forward at T tokens (lower is better)", fontsize=10)
        bottom.set_ylabel("weights read, % of the measured bandwidth")
        bottom.axhline(100, color="black", linewidth=0.8)
        bottom.set_title(f"{dtype}: weights' bytes / forward time (higher is better)", fontsize=10)
        for ax in (top, bottom):
            ax.set_xscale("log", base=2)
            ax.set_xticks(TOKENS, [str(t) for t in TOKENS])
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=8)
        bottom.set_xlabel("tokens per call T (log scale)")
        bottom.set_ylim(bottom=0)
    bw = bandwidth.get("triad_gbs")
    fig.suptitle(f"Serving, forward only, H={SHAPE['hidden']} F={SHAPE['ffn']} {SHAPE['act']}: "
                 f"{machine['cpu_model']}, {machine['threads']} threads, bandwidth {report.fmt(bw, '.1f')} GB/s",
                 fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
