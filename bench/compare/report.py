"""Figures derived from the workers' raw results, the printed tables, the JSON files and the charts
of bench/compare/compare.py."""

import json
import re
from pathlib import Path

import numpy as np

from workers import Config, step_flops

#: max|peer - lnmlp| / max|lnmlp| above which a peer disagrees (a bug to find): both sides carry
#: their dtype's rounding (f32 ~1e-6, bf16 2^-8 per rounding, several roundings in the block);
#: FP8 rows are compared with lnmlp bf16 under TransformerEngine's E4M3 tolerance (0.25).
TOLERANCES = {"f32": 1e-4, "bf16": 5e-2, "fp8": 0.25}
NAMES = {"lnmlp": "lnmlp", "torch": "PyTorch eager", "torch.compile": "torch.compile",
         "jax": "JAX jit", "numpy": "NumPy, manual bwd"}
#: The targets (docs/cpu-compare.md), checked (never asserted) by print_targets: the best peer's time over lnmlp's
#: per dtype and T (f32 at T = 256 and >= 4096; bf16 at any T), lnmlp f32's share of the measured
#: peak at T >= 4096, each FP8 recipe's time over lnmlp bf16's, and the time outside the GEMMs at
#: T >= 4096.
TARGETS = dict(f32_speedup_large_t=1.15, f32_speedup_small_t=1.25, bf16_speedup=1.25, f32_peak_fraction=0.88,
               fp8_vs_bf16=1.10, outside_gemms=0.05, large_t=4096, small_t=256)


def impl_name(row):
    recipe = row["config"]["recipe"]
    return NAMES[row["impl"]] + ("" if recipe == "none" else f" fp8 {recipe}")


def config_label(cfg, contended=False):
    return (f"T={cfg['tokens']} H={cfg['hidden']} F={cfg['ffn']} {cfg['norm']} {cfg['act']} "
            f"{cfg['dtype']}" + (" CONTENDED" if contended else ""))


def group_key(row):
    """The rows measured against one lnmlp reference: same shape, T, dtype, contention."""
    c = row["config"]
    return row["shape"], c["tokens"], c["dtype"], row.get("contended", False)


def rel_err(got, ref):
    return float(np.max(np.abs(got - ref)) / max(np.max(np.abs(ref)), 1e-30))


def load_dump(row, which):
    return np.load(row["dump"] + f".{which}.npy")


# --- the comparison -------------------------------------------------------------------------------
def analyse(rows):
    """Adds to each row: GFLOP/s, % of the measured peak, lnmlp's speed-up over it (or an FP8 row's
    time relative to lnmlp bf16), and its y / dx error against lnmlp's on the same inputs."""
    refs = {group_key(r): r for r in rows
            if r["impl"] == "lnmlp" and r["config"]["recipe"] == "none" and r["status"] == "ok"}
    for row in rows:
        ref = refs.get(group_key(row))
        row["name"] = impl_name(row)
        row["flops"] = step_flops(Config(**row["config"]))
        add_speed(row, ref)
        if row["status"] == "ok" and ref is not None and row is not ref:
            add_errors(row, ref)
    for row in rows:
        row.pop("dump", None)
    return rows


def add_speed(row, ref):
    bench = row.get("bench") or (ref or {}).get("bench") or {}
    if row["status"] == "ok":
        row["gflops"] = row["flops"] / row["median_ms"] * 1e-6
        if bench.get("peak_gflops"):
            row["peak_gflops"], row["peak_what"] = bench["peak_gflops"], bench["peak_what"]
            row["peak_fraction"] = row["gflops"] / bench["peak_gflops"]
    ms = row.get("median_ms") or row.get("estimate_ms")
    if ref is None or ms is None or row is ref:
        return
    if row["impl"] == "lnmlp":  # an FP8 recipe against lnmlp bf16
        row["time_vs_bf16"] = ms / ref["median_ms"]
    else:
        row["lnmlp_speedup"] = ms / ref["median_ms"]


def add_errors(row, ref):
    fp8 = row["config"]["recipe"] != "none"
    row["err_y"] = rel_err(load_dump(row, "y"), load_dump(ref, "y"))
    row["err_dx"] = rel_err(load_dump(row, "dx"), load_dump(ref, "dx"))
    row["tolerance"] = TOLERANCES["fp8" if fp8 else row["config"]["dtype"]]
    row["agrees"] = max(row["err_y"], row["err_dx"]) <= row["tolerance"]


def fmt(value, spec, missing="-"):
    return missing if value is None else format(value, spec)


def speed_cell(row):
    if "time_vs_bf16" in row:
        return f"t/bf16 {row['time_vs_bf16']:.2f}"
    if "lnmlp_speedup" in row:
        return ("~" if row["status"] != "ok" else "") + f"{row['lnmlp_speedup']:.2f}x"
    return "-"


def error_cell(row):
    if "err_y" not in row:
        return "ref" if row["impl"] == "lnmlp" and row["config"]["recipe"] == "none" else "-"
    flag = "" if row["agrees"] else f" DISAGREES (tol {row['tolerance']:g})"
    return f"{row['err_y']:.1e} / {row['err_dx']:.1e}{flag}"


def print_comparison(rows, machine, settings):
    print(f"\nlnmlp vs peers on {machine['cpu_model']} ({machine['cores']} cores), "
          f"{machine['threads']} threads each; fwd+bwd with every gradient, median of "
          f"{settings['iters']} runs after {settings['warmup']} warm-up")
    head = ("config", "implementation", "fwd+bwd ms", "GFLOP/s", "% peak", "lnmlp x", "peak MiB",
            "steady MiB", "err y / dx vs lnmlp")
    widths = (44, 24, 11, 8, 7, 13, 9, 10, 0)
    line = lambda cells: "  ".join(f"{c:<{w}}" if i < 2 else f"{c:>{w}}" if w else c  # noqa: E731
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    info = next((r["bench"]["build_info"] for r in rows if "build_info" in (r.get("bench") or {})), None)
    backend = re.search(r"CPU backend: (.*?); CPU kernels", info or "")
    if backend:  # the GEMM library and kernels lnmlp ran with
        print(f"lnmlp's GEMMs: {backend.group(1)}")
    print(line(head))
    print("-" * 150)
    last = None
    for r in rows:
        label = config_label(r["config"], r.get("contended"))
        shown = "" if label == last else f"({r['shape']}) {label}"
        last = label
        if r["status"] == "ok":
            cells = (shown, r["name"], f"{r['median_ms']:.1f}", f"{r['gflops']:.1f}",
                     fmt(r.get("peak_fraction"), ".1%"), speed_cell(r), f"{r['peak_extra_mib']:.0f}",
                     f"{r['steady_extra_mib']:.0f}", error_cell(r))
        else:
            est = f"~{r['estimate_ms']:.0f}" if r.get("estimate_ms") else "n/a"
            cells = (shown, r["name"], est, "", "", speed_cell(r), "", "", f"n/a: {r['reason']}")
        print(line(cells))
    print("(lnmlp x: the peer's time / lnmlp's, same config; t/bf16: an FP8 recipe's time / lnmlp bf16's, "
          f"target <= {TARGETS['fp8_vs_bf16']}; ~: estimated, not run; peak MiB: max RSS over warm-up and runs minus "
          "RSS before the first forward; steady: the same over the timed runs only; CONTENDED: one of "
          "the workers' CPUs kept busy by a spinner process meanwhile)")
    print_outside_gemms(rows)
    print_targets(rows)


def print_outside_gemms(rows):
    print("\nlnmlp's time outside its GEMMs (lnmlp-bench --json --iters 3, same config; target "
          f"<= {TARGETS['outside_gemms']:.0%} at T >= {TARGETS['large_t']}):")
    for r in rows:
        b = r.get("bench")
        if b is None:
            continue
        if "outside_gemms_fraction" not in b:
            print(f"  ({r['shape']}) {config_label(r['config'])} {r['name']}: n/a ({b.get('reason')})")
            continue
        above = b["outside_gemms_fraction"] > TARGETS["outside_gemms"] and r["config"]["tokens"] >= TARGETS["large_t"]
        flag = "  ABOVE TARGET" if above else ""
        print(f"  ({r['shape']}) {config_label(r['config']):<44} {r['name']:<18} block {b['total_ms']:9.1f} ms, "
              f"GEMMs alone {b['gemms_alone_ms']:9.1f} ms, outside {b['outside_gemms_fraction']:6.1%}, "
              f"peak {b['peak_gflops']:.0f} GFLOP/s ({b['peak_what']}){flag}")


def best_peer(rows, ref):
    """The fastest peer measured (not estimated) in ref's group, or None."""
    peers = [r for r in rows if group_key(r) == group_key(ref) and r["impl"] != "lnmlp" and r["status"] == "ok"]
    return min(peers, key=lambda r: r["median_ms"], default=None)


def target_checks(rows):
    """(what, measured, target, met) for every target a row of this run can be checked against."""
    t = TARGETS
    checks = []
    for ref in rows:
        if ref["impl"] != "lnmlp" or ref["config"]["recipe"] != "none" or ref["status"] != "ok":
            continue
        cfg, contended = ref["config"], ref.get("contended", False)
        label = f"({ref['shape']}) {config_label(cfg, contended)}"
        peer = best_peer(rows, ref)
        goal = (t["bf16_speedup"] if cfg["dtype"] == "bf16" else
                t["f32_speedup_large_t"] if cfg["tokens"] >= t["large_t"] else
                t["f32_speedup_small_t"] if cfg["tokens"] == t["small_t"] else None)
        if peer is not None:
            ratio = peer["median_ms"] / ref["median_ms"]
            checks.append((f"{label}: best peer ({peer['name']}) / lnmlp", f"{ratio:.2f}x",
                           f">= {goal:.2f}x" if goal and not contended else "-",
                           None if goal is None or contended else ratio >= goal))
        if contended:  # how much each implementation slows down on the shared machine
            quiet = {r["impl"]: r for r in rows if group_key(r) == group_key(ref)[:3] + (False,)
                     and r["config"]["recipe"] == "none" and r["status"] == "ok"}
            for r in rows:
                if group_key(r) == group_key(ref) and r["status"] == "ok" and r["impl"] in quiet:
                    slowdown = r["median_ms"] / quiet[r["impl"]]["median_ms"]
                    checks.append((f"{label}: {r['name']} contended / quiet", f"{slowdown:.2f}x", "-", None))
            continue
        if cfg["dtype"] == "f32" and cfg["tokens"] >= t["large_t"] and "peak_fraction" in ref:
            checks.append((f"{label}: lnmlp share of the measured peak", f"{ref['peak_fraction']:.1%}",
                           f">= {t['f32_peak_fraction']:.0%}", ref["peak_fraction"] >= t["f32_peak_fraction"]))
    for r in rows:
        if "time_vs_bf16" in r:
            checks.append((f"({r['shape']}) {config_label(r['config'])}: {r['name']} / lnmlp bf16",
                           f"{r['time_vs_bf16']:.3f}", f"<= {t['fp8_vs_bf16']:.2f}", r["time_vs_bf16"] <= t["fp8_vs_bf16"]))
        b = r.get("bench") or {}
        if "outside_gemms_fraction" in b and r["config"]["tokens"] >= t["large_t"]:
            f = b["outside_gemms_fraction"]
            checks.append((f"({r['shape']}) {config_label(r['config'])}: {r['name']} time outside GEMMs",
                           f"{f:.1%}", f"<= {t['outside_gemms']:.0%}", f <= t["outside_gemms"]))
    return checks


def print_targets(rows):
    print_checks("Against the targets (docs/cpu-compare.md), this run on this machine:", target_checks(rows))


def print_checks(title, checks):
    """(what, measured, goal, met or None) rows under a title; nothing when there are none."""
    if not checks:
        return
    print("\n" + title)
    width = max(len(c[0]) for c in checks)
    for what, got, goal, met in checks:
        verdict = "" if met is None else ("met" if met else "NOT MET")
        print(f"  {what:<{width}}  {got:>8}  {goal:>8}  {verdict}")


def write_json(path, machine, settings, results):
    doc = dict(machine=machine, settings=settings, versions=collect_versions(results), results=results)
    Path(path).write_text(json.dumps(doc, indent=1) + "\n")


def collect_versions(results):
    versions = {}
    for r in results:
        versions.update(r.get("versions", {}))
    try:
        import matplotlib
        versions["matplotlib"] = matplotlib.__version__
    except ImportError:
        pass
    return versions


# --- charts ---------------------------------------------------------------------------------------
LNMLP_COLOR, FP8_COLOR, PEER_COLOR = "#d95f02", "#fdae6b", "#7b8fa6"


def pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def bar_color(row):
    if row["impl"] != "lnmlp":
        return PEER_COLOR
    return LNMLP_COLOR if row["config"]["recipe"] == "none" else FP8_COLOR


def plot_comparison(path, rows, machine):
    plt = pyplot()
    groups = {}
    for r in rows:
        groups.setdefault(group_key(r), []).append(r)
    fig, axes = plt.subplots(len(groups), 1, figsize=(10, 1.2 + 0.42 * len(rows) + 0.5 * len(groups)),
                             gridspec_kw=dict(height_ratios=[len(g) for g in groups.values()]), squeeze=False)
    for ax, ((shape, _, _, contended), group) in zip(axes[:, 0], groups.items()):
        plot_group(ax, group, f"({shape}) {config_label(group[0]['config'], contended)}")
    axes[-1, 0].set_xlabel("forward + backward time, ms (lower is better)")
    fig.suptitle(f"lnmlp vs peers, fwd+bwd with all gradients: {machine['cpu_model']}, "
                 f"{machine['threads']} threads", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_group(ax, group, title):
    """Horizontal bars, one per implementation; bars beyond 4x lnmlp's time are cut at the edge."""
    ref = next((r["median_ms"] for r in group if r["impl"] == "lnmlp" and r["status"] == "ok"), None)
    measured = [r["median_ms"] for r in group if r["status"] == "ok"]
    top = max(measured) if measured else 1.0
    limit = min(top, 4 * ref) if ref else top
    right = 1.6 * limit
    ys = np.arange(len(group))[::-1]
    for y, r in zip(ys, group):
        ms = r.get("median_ms")
        if ms is None:
            ax.text(right * 0.01, y, bar_text(r), va="center", fontsize=8, color="#a00000")
            continue
        cut = ms > 1.05 * limit
        ax.barh(y, min(ms, right), color=bar_color(r), hatch="//" if cut else None,
                edgecolor="black" if r["impl"] == "lnmlp" else "none")
        x, align = (right * 0.99, "right") if cut else (ms + right * 0.01, "left")
        ax.text(x, y, bar_text(r) + (" (bar cut)" if cut else ""), va="center", ha=align, fontsize=8,
                bbox=dict(facecolor="white", edgecolor="none", pad=1) if cut else None)
    ax.set_yticks(ys)
    ax.set_yticklabels([r["name"] for r in group], fontsize=9)
    for tick, r in zip(ax.get_yticklabels(), group):
        if r["impl"] == "lnmlp" and r["config"]["recipe"] == "none":
            tick.set_fontweight("bold")
    ax.set_xlim(0, right)
    ax.set_title(title, fontsize=10, loc="left")
    ax.grid(axis="x", alpha=0.3)


def bar_text(r):
    if r["status"] != "ok":
        est = f"est. {r['estimate_ms'] / 1e3:.0f} s, " if r.get("estimate_ms") else ""
        return f"n/a ({est}{r['reason'][:70]})"
    text = f"{r['median_ms']:.0f} ms"
    s = r.get("lnmlp_speedup")
    if s is not None:
        text += f"  (lnmlp {s:.2f}x faster)" if s >= 1 else f"  (lnmlp {1 / s:.2f}x slower)"
    if "time_vs_bf16" in r:
        text += f"  ({r['time_vs_bf16']:.2f} x lnmlp bf16)"
    return text


# --- the scaling sweep ----------------------------------------------------------------------------
def analyse_scaling(runs, shape):
    """GFLOP/s per point; per-token cost relative to the large-T cost (the median per-token cost of
    the three largest T) and the fixed-cost share 1 - that ratio's inverse; the multi-thread
    speed-up over 1 thread at each T."""
    for run in runs:
        if run["status"] != "ok":
            continue
        pts = run["points"]
        for p in pts:
            p["gflops"] = step_flops(Config(**dict(shape, tokens=p["tokens"], dtype=run["dtype"]))) / p["median_ms"] * 1e-6
            p["ms_per_token"] = p["median_ms"] / p["tokens"]
        large = float(np.median([p["ms_per_token"] for p in sorted(pts, key=lambda p: p["tokens"])[-3:]]))
        for p in pts:
            p["per_token_vs_large_t"] = p["ms_per_token"] / large
            p["fixed_cost_share"] = 1 - 1 / p["per_token_vs_large_t"]
    add_thread_speedup(runs)
    return runs


def add_thread_speedup(runs):
    one = {(r["dtype"], p["tokens"]): p for r in runs if r["status"] == "ok" and r["threads"] == 1
           for p in r["points"]}
    for r in runs:
        if r["status"] == "ok" and r["threads"] > 1:
            for p in r["points"]:
                if (r["dtype"], p["tokens"]) in one:
                    p["speedup_vs_1_thread"] = one[(r["dtype"], p["tokens"])]["median_ms"] / p["median_ms"]


def print_scaling(runs):
    print("\nlnmlp scaling (H=1024 F=4096 layernorm gelu): per-token cost relative to the large-T "
          "per-token cost (median of the 3 largest T); fixed-cost share = 1 - 1/that")
    print(f"{'dtype':<6}{'threads':>8}{'T':>7}{'ms':>11}{'GFLOP/s':>9}{'per-token rel':>15}"
          f"{'fixed share':>13}{'speed-up vs 1 thr':>19}")
    for r in runs:
        if r["status"] != "ok":
            print(f"{r['dtype']:<6}{r['threads']:>8}  n/a: {r['reason']}")
            continue
        for p in r["points"]:
            print(f"{r['dtype']:<6}{r['threads']:>8}{p['tokens']:>7}{p['median_ms']:>11.2f}{p['gflops']:>9.1f}"
                  f"{p['per_token_vs_large_t']:>15.3f}{p['fixed_cost_share']:>13.1%}"
                  f"{fmt(p.get('speedup_vs_1_thread'), '.2f'):>19}")


def plot_scaling(path, runs, machine):
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.6))
    for r in runs:
        if r["status"] != "ok":
            continue
        t = [p["tokens"] for p in r["points"]]
        style = dict(marker="o", linestyle="-" if r["threads"] > 1 else "--",
                     color=LNMLP_COLOR if r["dtype"] == "f32" else "#1b9e77")
        label = f"{r['dtype']}, {r['threads']} thread{'s' if r['threads'] > 1 else ''}"
        ax1.plot(t, [p["gflops"] for p in r["points"]], label=label, **style)
        ax2.plot(t, [100 * p["fixed_cost_share"] for p in r["points"]], label=label, **style)
    ticks = sorted({p["tokens"] for r in runs if r["status"] == "ok" for p in r["points"]})
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(t) for t in ticks], fontsize=8)
        ax.set_xlabel("tokens T (log scale)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=9)
    ax1.set_ylabel("GFLOP/s (3x forward GEMM FLOPs per fwd+bwd)")
    ax1.set_ylim(bottom=0)
    ax1.set_title("lnmlp fwd+bwd throughput, H=1024 F=4096 gelu", fontsize=10)
    ax2.set_ylabel("fixed-cost share, %")
    ax2.axhline(0, color="black", linewidth=0.8)
    ax2.set_title("fixed-cost share: 1 - (per-token cost at large T) / (per-token cost at T)", fontsize=10)
    fig.suptitle(f"{machine['cpu_model']}, {machine['cores']} cores", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
