"""lnmlp.torch.LayerNormMLP against the same block written in plain PyTorch, eager and under
torch.compile(fullgraph=True), in one run.

Rows: a training step (forward + backward: y, then the gradients of x and of every parameter,
torch.autograd.grad with a fixed dy) at a transformer-sized shape, per device, dtype and
activation (gelu, and the gated geglu = (gelu, linear)): median milliseconds of --iters
repetitions after --warmup (the first of which compiles), GFLOP/s (the six GEMMs' 2*M*N*K each:
3 * 2*T*H*(A*F) + 3 * 2*T*F*H), the time relative to lnmlp's eager step, and on the CPU the
fraction of the CPU's measured peak for that dtype (lnmlp-bench measures it, when the build has
made it).

    python3 bench/torch/compare.py [--tokens 1024 --hidden 1024 --ffn 2048 --iters 7] [--quick]

The plain block is the textbook one, parameters in nn.Linear's layout: F.layer_norm, F.linear to
A*F columns, gelu (tanh approximation, lnmlp's), for geglu times the second half, F.linear back
to H; differentiated by autograd (eager) or AOTAutograd (compiled). Parameters and x are in the
row's dtype (a bf16 row is all bf16, as bench/jax/compare.py). CUDA rows are added when
torch.cuda.is_available() (timed with torch.cuda.synchronize() around each step).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as Fn

import lnmlp
import lnmlp.torch as lt

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "bench"))
from measured_peak import measured_peak  # noqa: E402
EPS = 1e-5
VARIANTS = {"gelu": 1, "geglu": 2}  # TransformerEngine's activation name -> A


def plain_block(x, gamma, beta, w1, b1, w2, b2, gated):
    """LayerNorm, fc1, gelu (times the linear half when gated), fc2: w1 [A*F, H], w2 [H, F]."""
    n = Fn.layer_norm(x, (x.shape[-1],), gamma, beta, EPS)
    h = Fn.linear(n, w1, b1)
    if gated:
        g, lin = h.chunk(2, dim=-1)
        a = Fn.gelu(g, approximate="tanh") * lin
    else:
        a = Fn.gelu(h, approximate="tanh")
    return Fn.linear(a, w2, b2)


def make_blocks(T, H, F, act, dtype, device, seed=0):
    """(lnmlp module, plain parameters with the same values, x, dy)."""
    torch.manual_seed(seed)
    m = lt.LayerNormMLP(H, F, eps=EPS, activation=act, params_dtype=dtype, device=device)
    with torch.no_grad():
        m.layer_norm_weight.add_(0.1 * torch.randn(H, device=device, dtype=dtype))
        m.layer_norm_bias.copy_(0.1 * torch.randn(H, device=device, dtype=dtype))
        m.fc1_bias.copy_(0.1 * torch.randn(m.fc1_bias.shape, device=device, dtype=dtype))
        m.fc2_bias.copy_(0.1 * torch.randn(H, device=device, dtype=dtype))
    # The same values in separate tensors (the module's are in nn.Linear's layout too).
    plain = [p.detach().contiguous().requires_grad_(True) for p in
             (m.layer_norm_weight, m.layer_norm_bias, m.fc1_weight, m.fc1_bias, m.fc2_weight, m.fc2_bias)]
    x = torch.randn(T, H, device=device, dtype=dtype, requires_grad=True)
    dy = torch.randn(T, H, device=device, dtype=dtype)
    return m, plain, x, dy


def step_fns(m, plain, x, dy, gated):
    """{name: step()} for lnmlp / plain, eager / compiled; each returns y and every gradient."""
    mparams = list(m.parameters())
    lnmlp_c = torch.compile(m, fullgraph=True)
    plain_fwd = lambda x, *p: plain_block(x, *p, gated)  # noqa: E731
    plain_c = torch.compile(plain_fwd, fullgraph=True)

    def lnmlp_step(fwd):
        def step():
            y = fwd(x)
            return y, torch.autograd.grad(y, [x, *mparams], dy)
        return step

    def plain_step(fwd):
        def step():
            y = fwd(x, *plain)
            return y, torch.autograd.grad(y, [x, *plain], dy)
        return step

    return {"lnmlp": lnmlp_step(m), "lnmlp compiled": lnmlp_step(lnmlp_c),
            "plain": plain_step(plain_fwd), "plain compiled": plain_step(plain_c)}


def median_ms(step, device, warmup, iters):
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):  # the first one compiles
        step()
    sync()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(times))



def cpu_model():
    info = {}
    for line in open("/proc/cpuinfo"):
        k, _, v = line.partition(":")
        info.setdefault(k.strip(), v.strip())
    return f"{info.get('model name', '?')} (family {info.get('cpu family', '?')} model {info.get('model', '?')})"


def cpu_busy(seconds=1.0):
    """The fraction of the machine's CPU time not idle over `seconds` (None without /proc/stat)."""
    def sample():
        v = [int(n) for n in open("/proc/stat").readline().split()[1:9]]
        return sum(v), v[3] + v[4]  # total, idle + iowait
    try:
        t0, i0 = sample()
        time.sleep(seconds)
        t1, i1 = sample()
    except OSError:
        return None
    return 1 - (i1 - i0) / max(t1 - t0, 1)


def step_arguments(doc):
    """A parser with the training-step benchmarks' common arguments: the shape (--tokens, --hidden,
    --ffn) and the timing (--iters, --warmup); `doc` is the script's description."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--ffn", type=int, default=2048)
    ap.add_argument("--iters", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    return ap


def main():
    ap = step_arguments(__doc__)
    ap.add_argument("--quick", action="store_true", help="a short run: T=256 H=512 F=1024, 3 iterations")
    ap.add_argument("--device", choices=("all", "cpu", "cuda"), default="all",
                    help="cpu, cuda, or all (the CPU, and CUDA when available)")
    args = ap.parse_args()
    if args.quick:
        args.tokens, args.hidden, args.ffn, args.iters, args.warmup = 256, 512, 1024, 3, 1
    T, H, F = args.tokens, args.hidden, args.ffn
    devices = []
    if args.device in ("all", "cpu"):
        devices.append(torch.device("cpu"))
    if args.device in ("all", "cuda") and torch.cuda.is_available():
        devices.append(torch.device("cuda", torch.cuda.current_device()))
    elif args.device == "cuda":
        raise SystemExit("--device cuda: torch.cuda.is_available() is False")
    print(f"# torch {torch.__version__}, lnmlp {lnmlp.__version__}, {os.cpu_count()} cores "
          f"({torch.get_num_threads()} torch threads), {cpu_model()}")
    busy = cpu_busy()
    if busy is not None:
        print(f"# the cores were {busy:.0%} busy in the second before the run (other processes slow every row)")
    for dev in devices:
        if dev.type == "cuda":
            print(f"# CUDA: {torch.cuda.get_device_name(dev)}")
    print(f"# training step (forward + backward) T={T} H={H} F={F} LayerNorm; median of {args.iters} after "
          f"{args.warmup} warm-up")
    print(f"{'device':6s} {'dtype':9s} {'act':6s} {'block':15s} {'ms':>9s} {'GFLOP/s':>9s} {'vs lnmlp':>9s} "
          f"{'of peak':>8s}")
    for dev in devices:
        for dtype_name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
            for act, A in VARIANTS.items():
                flops = 3 * 2 * T * H * (A * F) + 3 * 2 * T * F * H
                peak = measured_peak(T, H, F, act, {torch.float32: "f32", torch.bfloat16: "bf16"}[dtype]) if dev.type == "cpu" else None
                torch._dynamo.reset()
                m, plain, x, dy = make_blocks(T, H, F, act, dtype, dev)
                steps = step_fns(m, plain, x, dy, gated=A == 2)
                base = None
                for name, step in steps.items():
                    ms = median_ms(step, dev, args.warmup, args.iters)
                    base = base or ms
                    gf = flops / ms / 1e6
                    frac = f"{gf / peak[0]:7.1%}" if peak and peak[0] else "      -"
                    print(f"{dev.type:6s} {dtype_name:9s} {act:6s} {name:15s} {ms:9.2f} {gf:9.1f} "
                          f"{ms / base:8.2f}x {frac:>8s}", flush=True)
                if peak and peak[0]:
                    print(f"#   measured peak for {dtype_name}: {peak[0]:.0f} GFLOP/s ({peak[1]})")


if __name__ == "__main__":
    main()
