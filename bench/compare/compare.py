#!/usr/bin/env python3
"""Side-by-side CPU comparison of lnmlp's fused block with PyTorch (eager, torch.compile), JAX (jit)
and plain NumPy, plus lnmlp under each FP8 recipe and lnmlp's scaling with tokens and threads; and,
with --serving, the serving table: the forward alone at T = 1 to 64 against the memory bandwidth.

    bash bench/compare/run.sh [--quick] [options]      # builds, sets up the venv, runs this
    bash bench/compare/run.sh --serving [--quick]      # the serving table (serving.py)

Each implementation runs in its own worker process (this file with --worker), one after another,
so that its peak memory is its own. Results: a table on stdout, progress on stderr, and
cpu-compare.json/.png, cpu-scaling.json/.png in --out-dir (docs/, or build/compare-quick for
--quick). docs/cpu-compare.md explains what is measured and how.
"""

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import nullcontext
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))

import report  # noqa: E402
import serving  # noqa: E402
import workers  # noqa: E402

SHAPES = {"a": dict(hidden=1024, ffn=4096, norm="layernorm", act="gelu"),
          "b": dict(hidden=1024, ffn=2730, norm="rmsnorm", act="swiglu")}
DTYPES = ("f32", "bf16")
PEERS = ("torch", "torch.compile", "jax", "numpy")
RECIPES = ("delayed", "current", "block", "mxfp8")
SCALING_SHAPE = dict(hidden=1024, ffn=4096, norm="layernorm", act="gelu", recipe="none")
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small T, few iterations (development; about 3 min)")
    p.add_argument("--tokens", help="comma-separated T of the comparison (default 4096,256; --quick 256)")
    p.add_argument("--contended-tokens", help="comma-separated T of the contended comparison: f32, lnmlp "
                   "and its peers with one of the workers' CPUs kept busy by a spinner process (default "
                   "256; --quick none; 'none' for none)")
    p.add_argument("--iters", type=int, help="timed runs per implementation, median reported (default 5; --quick 2)")
    p.add_argument("--warmup", type=int, help="untimed runs first (default 2; --quick 1)")
    p.add_argument("--threads", type=int, default=2, help="threads for every framework (default 2)")
    p.add_argument("--impls", default="lnmlp," + ",".join(PEERS) + ",fp8",
                   help="comma-separated subset of: lnmlp, torch, torch.compile, jax, numpy, fp8")
    p.add_argument("--shapes", default="a,b", help="a = layernorm gelu F=4096, b = rmsnorm swiglu F=2730")
    p.add_argument("--dtypes", default=",".join(DTYPES))
    p.add_argument("--no-scaling", action="store_true", help="skip the tokens/threads sweep")
    p.add_argument("--scaling-only", action="store_true", help="only the tokens/threads sweep")
    p.add_argument("--serving", action="store_true", help="only the serving table: forward alone, T = 1, 4, 16, "
                   "64, f32 and bf16, lnmlp vs PyTorch eager, torch.compile and JAX jit, weights' GB/s against the "
                   "measured memory bandwidth (cpu-serving.json/.png)")
    p.add_argument("--scaling-tokens", help="comma-separated T of the sweep (default 64..16384; --quick 64..1024)")
    p.add_argument("--step-limit", type=float, help="seconds: a peer estimated slower than this per "
                   "fwd+bwd is not run but shown with its estimate (default 60; --quick 10)")
    p.add_argument("--worker-timeout", type=float, help="seconds before a worker is stopped (default 900; --quick 180)")
    p.add_argument("--bench", default=str(REPO / "build/release/bench/lnmlp-bench"), help="lnmlp-bench binary")
    p.add_argument("--out-dir", help="where the JSON and PNG files go (default docs/; --quick build/compare-quick)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    quick = args.quick
    defaults = dict(tokens="256" if quick else "4096,256", contended_tokens="none" if quick else "256",
                    iters=2 if quick else 5, warmup=1 if quick else 2,
                    step_limit=10.0 if quick else 60.0, worker_timeout=180.0 if quick else 900.0,
                    out_dir=str(REPO / ("build/compare-quick" if quick else "docs")),
                    scaling_tokens="64,128,256,512,1024" if quick else ",".join(str(64 << i) for i in range(9)))
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    args.scaling_tokens = [int(t) for t in args.scaling_tokens.split(",")]
    args.tokens = [int(t) for t in args.tokens.split(",")]
    args.contended_tokens = [] if args.contended_tokens == "none" else \
        [int(t) for t in args.contended_tokens.split(",")]
    for name in ("impls", "shapes", "dtypes"):
        setattr(args, name, [s.strip() for s in getattr(args, name).split(",") if s.strip()])
    return args


# --- processes ------------------------------------------------------------------------------------
def pinned_cpus(threads):
    """The CPUs every worker is pinned to: the first `threads` of ours (XLA sizes its thread pool
    by the affinity mask), or all of them when there are not more than that."""
    cpus = sorted(os.sched_getaffinity(0))
    return cpus if len(cpus) <= threads else cpus[:threads]


def worker_env(threads):
    env = dict(os.environ)
    env.update({k: str(threads) for k in THREAD_ENV})
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


class Progress:
    """One status line on stderr: job counter, elapsed time, what runs now."""

    def __init__(self, total):
        self.total, self.done, self.t0 = total, 0, time.time()
        self.tty = sys.stderr.isatty()

    def _prefix(self):
        m, s = divmod(int(time.time() - self.t0), 60)
        return f"[{self.done + 1:2d}/{self.total} {m:2d}:{s:02d}]"

    def show(self, what, detail=""):
        if self.tty:
            sys.stderr.write(f"\r\033[K{self._prefix()} {what} {detail}")
            sys.stderr.flush()

    def finish(self, what, outcome):
        line = f"{self._prefix()} {what}: {outcome}"
        sys.stderr.write(("\r\033[K" if self.tty else "") + line + "\n")
        sys.stderr.flush()
        self.done += 1


class Runner:
    def __init__(self, args, tmp):
        self.args, self.tmp = args, Path(tmp)
        self.cpus = pinned_cpus(args.threads)
        self.env = worker_env(args.threads)
        self.progress = Progress(count_jobs(args))
        self.n = 0

    def _pin(self):
        os.sched_setaffinity(0, self.cpus)

    def _spawn(self, cmd, what, contended=False):
        """Runs cmd; shows its '@progress' lines, logs the rest; stops it after the timeout. With
        `contended`, a spinner process keeps the last of the workers' CPUs busy meanwhile.
        Returns (exit code, log path, timed out)."""
        self.n += 1
        with Spinner(self.cpus[-1]) if contended else nullcontext():
            return self._run(cmd, what)

    def _run(self, cmd, what):
        log = self.tmp / f"job{self.n:03d}.log"
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=self.env, preexec_fn=self._pin, cwd=REPO)
        timer = threading.Timer(self.args.worker_timeout, proc.kill)
        timer.start()
        with open(log, "w") as f:
            for line in proc.stdout:
                if line.startswith("@progress "):
                    self.progress.show(what, line[10:].strip())
                else:
                    f.write(line)
        rc = proc.wait()
        timed_out = not timer.is_alive()
        timer.cancel()
        return rc, log, timed_out

    def worker(self, spec, what, contended=False):
        result_path = self.tmp / f"result{self.n + 1:03d}.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec),
               "--result", str(result_path)]
        self.progress.show(what)
        rc, log, timed_out = self._spawn(cmd, what, contended)
        if result_path.exists():
            result = json.loads(result_path.read_text())
        elif timed_out:
            result = dict(status="n/a", reason=f"stopped after {self.args.worker_timeout:.0f} s")
        else:
            result = dict(status="n/a", reason=f"worker exited with {rc}: {last_line(log)}")
        if result["status"] != "ok":
            result["log"] = str(log)
        return result

    def bench(self, cfg, what):
        """lnmlp-bench --json once for this configuration: measured peak, outside-GEMM fraction."""
        out = self.tmp / f"bench{self.n + 1:03d}.json"
        cmd = [self.args.bench, "--tokens", cfg["tokens"], "--hidden", cfg["hidden"], "--ffn", cfg["ffn"],
               "--act", cfg["act"], "--norm", cfg["norm"], "--dtype", cfg["dtype"], "--recipe", cfg["recipe"],
               "--iters", 3, "--threads", self.args.threads, "--json", out]
        self.progress.show(what)
        rc, log, _ = self._spawn([str(c) for c in cmd], what)
        try:
            return json.loads(out.read_text())
        except (OSError, ValueError) as e:
            return dict(status="n/a", reason=f"lnmlp-bench exited with {rc}: {last_line(log) or e}")

    def machine(self, what):
        """lnmlp-bench --machine: the peaks and the memory bandwidth on the workers' threads."""
        out = self.tmp / f"machine{self.n + 1:03d}.json"
        self.progress.show(what)
        rc, log, _ = self._spawn([self.args.bench, "--machine", "--threads", str(self.args.threads), "--json",
                                  str(out)], what)
        try:
            result = json.loads(out.read_text())
        except (OSError, ValueError) as e:
            result = dict(reason=f"lnmlp-bench exited with {rc}: {last_line(log) or e}")
        self.progress.finish(what, f"{result['triad_gbs']:.1f} GB/s" if "triad_gbs" in result else result["reason"])
        return result


class Spinner:
    """A process that keeps one CPU busy (a shared node's other job) while a worker runs: a busy
    loop at the same priority, pinned to that CPU."""

    def __init__(self, cpu):
        self.cpu = cpu

    def __enter__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                     preexec_fn=lambda: os.sched_setaffinity(0, [self.cpu]))
        return self

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait()


def last_line(path):
    lines = [ln.strip() for ln in Path(path).read_text(errors="replace").splitlines() if ln.strip()]
    return lines[-1][:160] if lines else ""


# --- the comparison -------------------------------------------------------------------------------
def configs(args):
    """(shape, config, contended) of every comparison: each T, shape and dtype quiet, then the
    contended T in f32 (lnmlp and its peers only)."""
    for tokens in args.tokens:
        for shape in args.shapes:
            for dtype in args.dtypes:
                yield shape, dict(SHAPES[shape], tokens=tokens, dtype=dtype, recipe="none"), False
    for tokens in args.contended_tokens:
        for shape in args.shapes:
            yield shape, dict(SHAPES[shape], tokens=tokens, dtype="f32", recipe="none"), True


def fp8_configs(args, cfg, contended):
    if "fp8" not in args.impls or cfg["dtype"] != "bf16" or contended:
        return []
    return [dict(cfg, recipe=r) for r in RECIPES]


def count_jobs(args):
    if args.serving:
        return len(list(serving.configs())) + 2  # and lnmlp-bench --machine before and after
    n = 0
    if not args.scaling_only:
        for _, cfg, contended in configs(args):
            lnmlp_runs = ("lnmlp" in args.impls) + len(fp8_configs(args, cfg, contended))
            n += (1 if contended else 2) * lnmlp_runs + sum(p in args.impls for p in PEERS)
    if not args.no_scaling:
        n += 2 * len(scaling_threads(args))
    return n


def describe(shape, cfg, impl, contended=False):
    recipe = "" if cfg["recipe"] == "none" else f" fp8 {cfg['recipe']}"
    busy = " contended" if contended else ""
    return f"({shape}) {cfg['act']} {cfg['dtype']} T={cfg['tokens']}{busy}: {impl}{recipe}"


def run_comparison(runner, args):
    rows = []
    for shape, cfg, contended in configs(args):
        impls = [i for i in ("lnmlp",) + PEERS if i in args.impls]
        for impl in impls:
            rows.append(run_one(runner, args, shape, cfg, impl, contended))
        for fcfg in fp8_configs(args, cfg, contended):
            rows.append(run_one(runner, args, shape, fcfg, "lnmlp"))
    return rows


def run_one(runner, args, shape, cfg, impl, contended=False):
    what = describe(shape, cfg, impl, contended)
    dump = runner.tmp / (f"{shape}-{cfg['tokens']}-{cfg['dtype']}-{cfg['recipe']}-{impl}" +
                         ("-contended" if contended else ""))
    spec = dict(config=cfg, impl=impl, threads=args.threads, warmup=args.warmup, iters=args.iters,
                dump=str(dump), step_limit_s=args.step_limit)
    row = dict(shape=shape, config=cfg, impl=impl, contended=contended, dump=str(dump),
               **runner.worker(spec, what, contended))
    runner.progress.finish(what, outcome(row))
    if impl == "lnmlp" and not contended:  # the time outside GEMMs is measured on a quiet machine
        bench_what = what + " (lnmlp-bench)"
        row["bench"] = runner.bench(cfg, bench_what)
        b = row["bench"]
        runner.progress.finish(bench_what, f"outside GEMMs {b['outside_gemms_fraction']:.1%}, peak "
                               f"{b['peak_gflops']:.0f} GFLOP/s" if "peak_gflops" in b else b.get("reason"))
    return row


def outcome(row):
    if row["status"] == "ok":
        return f"{row['median_ms']:.1f} ms, peak +{row['peak_extra_mib']:.0f} MiB"
    est = row.get("estimate_ms")
    return f"n/a ({row['reason']})" + (f", est. {est / 1e3:.0f} s" if est else "")


# --- the serving table ----------------------------------------------------------------------------
def run_serving(runner, args):
    """The serving rows (serving.configs), between two measurements of the machine; returns the rows
    and the machine's figures with the better bandwidth of the two (a busy moment only lowers it)."""
    before = runner.machine("lnmlp-bench --machine (before)")
    rows = []
    budget = serving.BUDGET_S["quick" if args.quick else "full"]
    for cfg, impl in serving.configs():
        what = f"serving {cfg['dtype']} T={cfg['tokens']}: {report.NAMES[impl]}" + \
            ("" if cfg["recipe"] == "none" else f" fp8 {cfg['recipe']}")
        dump = runner.tmp / f"serving-{cfg['tokens']}-{cfg['dtype']}-{cfg['recipe']}-{impl}"
        spec = dict(config=cfg, impl=impl, threads=args.threads, budget_s=budget, dump=str(dump), serving=True)
        row = dict(config=cfg, impl=impl, dump=str(dump), **runner.worker(spec, what))
        runner.progress.finish(what, f"{row['median_us']:.1f} us" if row["status"] == "ok" else
                               f"n/a ({row['reason']})")
        rows.append(row)
    after = runner.machine("lnmlp-bench --machine (after)")
    machine = max((before, after), key=lambda m: m.get("triad_gbs", 0.0))
    return rows, dict(machine, triad_gbs_runs=[m.get("triad_gbs") for m in (before, after)])


# --- the scaling sweep ----------------------------------------------------------------------------
def scaling_threads(args):
    return sorted({1, args.threads})


def run_scaling(runner, args):
    budget = dict(budget_s=1.0, min_iters=2, max_iters=5) if args.quick else \
        dict(budget_s=3.0, min_iters=2, max_iters=15)
    runs = []
    for dtype in DTYPES:
        for threads in scaling_threads(args):
            cfg = dict(SCALING_SHAPE, tokens=0, dtype=dtype)
            spec = dict(config=cfg, impl="scaling", threads=threads, tokens_list=args.scaling_tokens, **budget)
            what = f"scaling lnmlp {dtype}, {threads} thread{'s' if threads > 1 else ''}"
            r = runner.worker(spec, what)
            runner.progress.finish(what, "done" if r["status"] == "ok" else f"n/a ({r['reason']})")
            runs.append(dict(dtype=dtype, threads=threads, **r))
    return runs


# --- machine --------------------------------------------------------------------------------------
def machine_info(args, cpus):
    model = ""
    try:
        model = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return dict(cpu_model=model, cores=os.cpu_count(), pinned_cpus=cpus, threads=args.threads,
                platform=platform.platform(), python=platform.python_version(),
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                thread_settings=f"torch.set_num_threads({args.threads}), " +
                ", ".join(f"{k}={args.threads}" for k in THREAD_ENV) +
                f", workers pinned to CPUs {cpus} (XLA sizes its pool by the affinity mask)")


def main(argv):
    args = parse_args(argv)
    if args.worker:
        workers.worker_main(args.worker, args.result)
        return 0
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory(prefix="lnmlp-compare-") as tmp:
        runner = Runner(args, tmp)
        machine = machine_info(args, runner.cpus)
        settings = dict(quick=args.quick, tokens=args.tokens, contended_tokens=args.contended_tokens,
                        iters=args.iters, warmup=args.warmup, step_limit_s=args.step_limit,
                        tolerances=report.TOLERANCES, targets=report.TARGETS)
        if args.serving:
            rows, bandwidth = run_serving(runner, args)
            rows = serving.analyse(rows, bandwidth.get("triad_gbs"))
            serving.print_table(rows, machine, bandwidth)
            serving_settings = dict(quick=args.quick, budget_s=serving.BUDGET_S["quick" if args.quick else "full"],
                                    warmup_calls=serving.WARMUP, min_calls=serving.MIN_CALLS,
                                    max_calls=serving.MAX_CALLS, tolerances=report.TOLERANCES,
                                    targets=serving.TARGETS, bandwidth=bandwidth)
            report.write_json(out_dir / "cpu-serving.json", machine, serving_settings, rows)
            serving.plot(out_dir / "cpu-serving.png", rows, machine, bandwidth)
            written += ["cpu-serving.json", "cpu-serving.png"]
        elif not args.scaling_only:
            rows = report.analyse(run_comparison(runner, args))
            report.print_comparison(rows, machine, settings)
            report.write_json(out_dir / "cpu-compare.json", machine, settings, rows)
            report.plot_comparison(out_dir / "cpu-compare.png", rows, machine)
            written += ["cpu-compare.json", "cpu-compare.png"]
        if not args.no_scaling and not args.serving:
            sweep = report.analyse_scaling(run_scaling(runner, args), SCALING_SHAPE)
            report.print_scaling(sweep)
            report.write_json(out_dir / "cpu-scaling.json", machine, dict(shape=SCALING_SHAPE), sweep)
            report.plot_scaling(out_dir / "cpu-scaling.png", sweep, machine)
            written += ["cpu-scaling.json", "cpu-scaling.png"]
    print(f"\nwritten to {out_dir}/: {', '.join(written)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
