"""lnmlp.jax against the same block written in plain JAX, both under jax.jit, in one run.

Rows:
  * a training step (forward + backward: y and the gradients of x and every parameter) at a
    transformer-sized shape, per dtype: median milliseconds, GFLOP/s (the six GEMMs' 2*M*N*K
    each), the fraction of the CPU's measured peak for that dtype (lnmlp-bench measures it, when
    the build has made it), and the residual bytes per token each keeps for backward
    (jax.ad_checkpoint.print_saved_residuals);
  * first, the call overhead at a tiny shape (T=1): a jitted forward of each, in microseconds.

    PYTHONPATH=bindings/python python3 bench/jax/compare.py [--tokens 1024 --hidden 1024 --ffn 2048 --iters 7]

The plain-JAX block is the textbook one: layer norm, x @ W1 + b1 split in two halves, gelu(a) * b,
@ W2 + b2, differentiated by jax.grad (XLA fuses what it can).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import sys
import time


import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import lnmlp  # noqa: E402
import lnmlp.jax as lj  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "bench"))
from measured_peak import measured_peak  # noqa: E402
ACTS = ("gelu", "linear")


def plain_block(x, gamma, beta, k1, b1, k2, b2):
    mu = jnp.mean(x, -1, keepdims=True)
    var = jnp.mean(jnp.square(x - mu), -1, keepdims=True)
    n = (x - mu) * jax.lax.rsqrt(var + 1e-6) * gamma + beta
    h = jnp.einsum("th,haf->taf", n, k1) + b1
    a = jax.nn.gelu(h[:, 0], approximate=True) * h[:, 1]
    return a @ k2 + b2


def lnmlp_block(x, gamma, beta, k1, b1, k2, b2):
    return lj.layernorm_mlp(x, gamma, beta, [k1, k2], [b1, b2], "layernorm", activation_type=ACTS)


def params(T, H, F, dtype, seed=0):
    rng = np.random.default_rng(seed)
    a = lambda *s, scale=1.0: jnp.asarray(rng.standard_normal(s) * scale, dtype)  # noqa: E731
    return (a(T, H), 1 + a(H, scale=0.1), a(H, scale=0.1), a(H, 2, F, scale=H ** -0.5), a(2, F, scale=0.1),
            a(F, H, scale=F ** -0.5), a(H, scale=0.1))


def median_ms(fn, args, iters):
    jax.block_until_ready(fn(*args))  # compile, warm up
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(times))


def residual_bytes(loss, args):
    """Bytes of what jax keeps for backward beyond the arguments and constants."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        jax.ad_checkpoint.print_saved_residuals(loss, *args)
    total = 0
    for line in out.getvalue().splitlines():
        m = re.match(r"(\w+)\[([\d,]*)\]", line)
        if m and "from the argument" not in line and "from a constant" not in line:
            n = int(np.prod([int(v) for v in m.group(2).split(",") if v])) if m.group(2) else 1
            total += n * {"u8": 1, "bf16": 2, "f16": 2, "f32": 4}.get(m.group(1), 4)
    return total



def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--ffn", type=int, default=2048)
    ap.add_argument("--iters", type=int, default=7)
    args = ap.parse_args()
    T, H, F = args.tokens, args.hidden, args.ffn
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"# jax {jax.__version__} ({jax.default_backend()}), lnmlp {lnmlp.__version__}, {os.cpu_count()} cores, {cpu}")
    print("# call overhead: a jitted forward at T=1, H=64, F=128, float32, median of 2000 calls")
    print("#   (measured first: after large lnmlp calls in the same process it rises; docs/jax.md, 'Known')")
    ps = params(1, 64, 128, jnp.float32)
    for name, block in (("lnmlp", lnmlp_block), ("plain", plain_block)):
        fwd = jax.jit(block)
        print(f"  {name:7s} {1e3 * median_ms(fwd, ps, 2000):8.1f} us")
    print(f"# training step (forward + backward) T={T} H={H} F={F} layernorm (gelu, linear); median of "
          f"{args.iters}")
    flops = 3 * 2 * T * H * F * 3  # forward: GEMM1 2*T*H*2F + GEMM2 2*T*F*H; backward twice that
    print(f"{'dtype':9s} {'block':7s} {'ms':>9s} {'GFLOP/s':>9s} {'of peak':>8s} {'residual B/token':>17s}")
    for dtype_name, dtype in (("float32", jnp.float32), ("bfloat16", jnp.bfloat16)):
        peak = measured_peak(T, H, F, "geglu", {"float32": "f32", "bfloat16": "bf16"}[dtype_name])
        ps = params(T, H, F, dtype)
        for name, block in (("lnmlp", lnmlp_block), ("plain", plain_block)):
            loss = lambda *p: jnp.sum(block(*p).astype(jnp.float32))  # noqa: E731
            step = jax.jit(jax.grad(loss, argnums=tuple(range(7))))
            ms = median_ms(step, ps, args.iters)
            gf = flops / ms / 1e6
            frac = f"{gf / peak[0]:7.1%}" if peak and peak[0] else "      -"
            print(f"{dtype_name:9s} {name:7s} {ms:9.2f} {gf:9.1f} {frac:>8s} {residual_bytes(loss, ps) / T:17.0f}",
                  flush=True)
        if peak and peak[0]:
            print(f"#   measured peak for {dtype_name}: {peak[0]:.0f} GFLOP/s ({peak[1]})")


if __name__ == "__main__":
    main()
