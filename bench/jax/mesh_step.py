"""A jitted training step of lnmlp.jax.layernorm_mlp on one CPU device and split over a mesh of
CPU devices (data x tensor, with sequence parallelism), timed in one run, interleaved, with the
largest difference of the mesh step's outputs from the one-device step's.

    PYTHONPATH=bindings/python python3 bench/jax/mesh_step.py [options]

(options, with their defaults: --data 2 --tensor 4 --tokens 2048 --hidden 1024 --ffn 2048 --iters 5)

XLA's CPU devices are threads of one process: on a machine with fewer cores than devices they share
the cores, so the mesh step measures the split's overheads (collectives, smaller GEMMs, the
gathered norm), not a speed-up.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=int, default=2)
    ap.add_argument("--tensor", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--ffn", type=int, default=2048)
    ap.add_argument("--iters", type=int, default=5)
    args = ap.parse_args()
    devices = args.data * args.tensor
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    import lnmlp.jax as lj

    T, H, F = args.tokens, args.hidden, args.ffn
    mesh = jax.make_mesh((args.data, args.tensor), ("data", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    # x and dy as [data, T / data, H]: the batch over "data", the sequence over "tensor" (SP).
    axes = dict(norm_input_axes=("data", "tensor", None), kernel_1_axes=(None, None, "tensor"),
                kernel_2_axes=("tensor", None))
    specs = (P("data", "tensor", None), P(), P(None, None, "tensor"), P("tensor", None), P("data", "tensor", None))
    B, S = args.data, T // args.data
    print(f"T={T} H={H} F={F}, rmsnorm silu+linear, one device vs a {args.data}x{args.tensor} mesh (sequence "
          f"parallel), {os.cpu_count()} cores, median of {args.iters} (ms)")
    print(f"{'dtype':10s} {'one device':>12s} {'mesh':>10s} {'mesh / one':>11s} {'max rel. diff':>14s}")
    for dtype in (jnp.float32, jnp.bfloat16):
        rng = np.random.default_rng(0)
        f = lambda *s: jnp.asarray(rng.standard_normal(s) * 0.5, dtype)  # noqa: E731
        inputs = [f(B, S, H), 1 + f(H), f(H, 2, F), f(F, H), f(B, S, H)]
        placed = [jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(inputs, specs)]

        def step_fn(split):
            def loss(x, gamma, k1, k2, dy):
                y = lj.layernorm_mlp(x, gamma, None, [k1, k2], [None, None], "rmsnorm",
                                     activation_type=("silu", "linear"), **(axes if split else {}))
                return jnp.sum(y.astype(jnp.float32) * dy.astype(jnp.float32))

            return jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))

        one, split = step_fn(False), step_fn(True)

        def run_split():
            with jax.set_mesh(mesh):
                return jax.block_until_ready(split(*placed))

        g1, gm = jax.block_until_ready(one(*inputs)), run_split()
        diff = max(float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))) /
                         jnp.max(jnp.abs(a.astype(jnp.float32)))) for a, b in zip(g1, gm))
        times = {"one": [], "mesh": []}
        for _ in range(args.iters):
            t0 = time.perf_counter()
            jax.block_until_ready(one(*inputs))
            times["one"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            run_split()
            times["mesh"].append(time.perf_counter() - t0)
        a, b = (statistics.median(times[k]) * 1e3 for k in ("one", "mesh"))
        print(f"{jnp.dtype(dtype).name:10s} {a:12.1f} {b:10.1f} {b / a:11.2f} {diff:14.1e}")


if __name__ == "__main__":
    main()
