#!/usr/bin/env python3
"""Two builds of lnmlp-bench against each other on the same machine, interleaved.

    python3 bench/ab_compare.py --a OLD/bench/lnmlp-bench --b NEW/bench/lnmlp-bench [--rounds 3]
                                [--iters 3] [--set standard|quick|fp8|calls|serving|few] [--only TEXT]
                                [--label-a old --label-b new] [--env-a VAR=VALUE] [--env-b VAR=VALUE]
                                [--args-a ARGS] [--args-b ARGS]

--env-b LNMLP_CPU_ISA=x86-64 with the same binary as --a compares the CPU kernels' baseline
level against the level the CPU gets (what a build without run-time dispatch would run).
--args-b "--weight-layout out_in" with the same binary as --a compares PyTorch's out x in weights
(lnmlp_desc_set_weight_layout) against the default in x out ones.
--set calls runs calls of 1, 37, 256, 1000 and 4096 tokens on plans made for 4096 (a server's
batches); --set serving runs forward-only calls of 1 to 256 tokens (weights declared unchanged), and
--env-a LNMLP_CPU_PACKED_WEIGHTS=off with the same binary as --b measures the packed weights;
--set few runs training steps of 16 to 256 tokens; --args-b=--prepare with the same binary as --a compares counts whose GEMMs the plan
prepared at creation (lnmlp_desc_set_prepared_tokens) against counts that make them in the first
call: see the "first call" and "plan creation" columns.

Each configuration runs A then B, `rounds` times (A B A B ...), so a drift of the shared machine
hits both alike; every run is a whole lnmlp-bench process (its own warm-up, medians of `iters`
interleaved iterations, and its GEMMs-alone peer timed in the same process). Prints, per
configuration, the median forward + backward time of each build over the rounds, B / A, and each
build's share of time outside its GEMMs. The CPU model is printed first: quote it with the figures.
Uses the Python standard library only.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

STANDARD = [
    ("T=4096 layernorm gelu f32", ["--dtype", "f32"]),
    ("T=4096 layernorm gelu bf16", ["--dtype", "bf16"]),
    ("T=4096 layernorm gelu f16", ["--dtype", "f16"]),
    ("T=4096 rmsnorm swiglu F=2730 f32", ["--dtype", "f32", "--norm", "rmsnorm", "--act", "swiglu", "--ffn", "2730"]),
    ("T=4096 rmsnorm swiglu F=2730 bf16", ["--dtype", "bf16", "--norm", "rmsnorm", "--act", "swiglu", "--ffn", "2730"]),
    ("T=4096 gelu f32 save_stats", ["--dtype", "f32", "--remat", "save_stats"]),
    ("T=4096 gelu bf16 fp8 delayed", ["--dtype", "bf16", "--recipe", "delayed"]),
    ("T=4096 gelu bf16 fp8 block", ["--dtype", "bf16", "--recipe", "block"]),
    ("T=4096 gelu bf16 fp8 mxfp8", ["--dtype", "bf16", "--recipe", "mxfp8"]),
    ("T=1024 layernorm gelu f32", ["--dtype", "f32", "--tokens", "1024"]),
    ("T=512 layernorm gelu f32", ["--dtype", "f32", "--tokens", "512"]),
    ("T=512 layernorm gelu bf16", ["--dtype", "bf16", "--tokens", "512"]),
    ("T=256 layernorm gelu f32", ["--dtype", "f32", "--tokens", "256"]),
    ("T=256 layernorm gelu bf16", ["--dtype", "bf16", "--tokens", "256"]),
]
QUICK = [c for c in STANDARD if c[0].startswith("T=256")] + [STANDARD[0]]
CALLS = [(f"T={t} of a 4096 plan gelu {d}", ["--dtype", d, "--plan-tokens", "4096", "--tokens", str(t)])
         for d in ("f32", "bf16") for t in (1, 37, 256, 1000, 4096)]
FP8 = [c for c in STANDARD if "fp8" in c[0]] + [
    (f"T=256 gelu bf16 fp8 {r}", ["--dtype", "bf16", "--recipe", r, "--tokens", "256"])
    for r in ("delayed", "current", "block", "mxfp8")]
# Training steps of few tokens (where GEMMs of two threads are not sliced by size).
FEW = [(f"T={t} layernorm gelu {d}", ["--dtype", d, "--tokens", str(t)]) for d in ("f32", "bf16")
       for t in (16, 64, 128, 256)] + [
    ("T=256 rmsnorm swiglu F=2730 f32", ["--dtype", "f32", "--norm", "rmsnorm", "--act", "swiglu", "--ffn", "2730",
                                         "--tokens", "256"]),
    ("T=256 gelu f32 out x in", ["--dtype", "f32", "--tokens", "256", "--weight-layout", "out_in"])]
# A server's forward-only calls (--remat forward_only: every timed call declares the weights
# unchanged), at the serving table's token counts: the ms columns are one forward call.
SERVING = [(f"forward T={t} gelu {d}", ["--dtype", d, "--remat", "forward_only", "--tokens", str(t), "--calls", "200"])
           for d in ("f32", "bf16") for t in (1, 4, 16, 64, 256)]


def step_ms(run):
    """A run's time: forward + backward, or one forward call (forward-only runs)."""
    return run["total_ms"] if "total_ms" in run else run["forward_us"] / 1000


def outside_fraction(run):
    if "outside_gemms_fraction" in run:
        return run["outside_gemms_fraction"]
    return 1 - run["gemms_alone_us"] / run["forward_us"]


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def run(bench, args, iters, env):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as t:
        path = t.name
    try:
        cmd = [bench, "--iters", str(iters), "--check-tokens", "4", "--json", path] + args
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       env=dict(os.environ, **env))
        with open(path) as f:
            return json.load(f)
    finally:
        os.unlink(path)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--a", required=True, help="lnmlp-bench of build A (the baseline)")
    p.add_argument("--b", required=True, help="lnmlp-bench of build B")
    p.add_argument("--label-a", default="A")
    p.add_argument("--label-b", default="B")
    p.add_argument("--env-a", action="append", default=[], metavar="VAR=VALUE", help="environment of A's runs")
    p.add_argument("--env-b", action="append", default=[], metavar="VAR=VALUE", help="environment of B's runs")
    p.add_argument("--args-a", default="", metavar="ARGS", help="more lnmlp-bench arguments for A's runs")
    p.add_argument("--args-b", default="", metavar="ARGS", help="more lnmlp-bench arguments for B's runs")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--set", choices=["standard", "quick", "fp8", "calls", "serving", "few"], default="standard")
    p.add_argument("--only", default="", help="run only the configurations whose name contains this")
    o = p.parse_args()
    env_a = dict(e.split("=", 1) for e in o.env_a)
    env_b = dict(e.split("=", 1) for e in o.env_b)
    configs = {"standard": STANDARD, "quick": QUICK, "fp8": FP8, "calls": CALLS, "serving": SERVING, "few": FEW}[o.set]
    configs = [c for c in configs if o.only in c[0]]
    print(f"{cpu_model()}, {os.cpu_count()} CPUs; {o.rounds} rounds of A B, lnmlp-bench --iters {o.iters} each")
    print(f"A = {o.label_a}: {o.a} {o.args_a} {' '.join(o.env_a)}\nB = {o.label_b}: {o.b} {o.args_b} {' '.join(o.env_b)}")
    head = (f"{'configuration':36} {o.label_a + ' ms':>12} {o.label_b + ' ms':>12} {'B/A':>7} {'outside A':>10} "
            f"{'outside B':>10} {'1st call A':>11} {'1st call B':>11} {'plan A':>8} {'plan B':>8}")
    print(head)
    print("-" * len(head))
    for name, args in configs:
        a, b = [], []
        for r in range(o.rounds):
            print(f"  {name}: round {r + 1}/{o.rounds}   ", end="\r", file=sys.stderr, flush=True)
            a.append(run(o.a, args + o.args_a.split(), o.iters, env_a))
            b.append(run(o.b, args + o.args_b.split(), o.iters, env_b))
        ta = statistics.median(step_ms(x) for x in a)
        tb = statistics.median(step_ms(x) for x in b)
        ratios = [step_ms(y) / step_ms(x) for x, y in zip(a, b)]
        oa = statistics.median(outside_fraction(x) for x in a)
        ob = statistics.median(outside_fraction(x) for x in b)
        # Older builds write no first call.
        fa, fb = (statistics.median(x.get("first_call_ms", float("nan")) for x in runs) for runs in (a, b))
        pa, pb = (statistics.median(x.get("plan_create_ms", float("nan")) for x in runs) for runs in (a, b))
        digits = 3 if o.set == "serving" else 1  # a forward call at a few tokens is well below a millisecond
        print(f"{name:36} {ta:12.{digits}f} {tb:12.{digits}f} {statistics.median(ratios):7.3f} {100 * oa:9.1f}% {100 * ob:9.1f}%"
              f" {fa:11.1f} {fb:11.1f} {pa:8.1f} {pb:8.1f}   (B/A per round {min(ratios):.3f}..{max(ratios):.3f})")
    print("(ms: median over the rounds of each run's median forward + backward (serving: one forward call); B/A: median of the per-round "
          "ratios; outside: the block's time outside its GEMMs, from each run's own GEMMs-alone peer; 1st call: "
          "the first forward + backward, where a token count not prepared makes its GEMMs; plan: plan creation)")


if __name__ == "__main__":
    main()
