"""What Float8CurrentScaling's stages cost on a mesh: a jitted training step (forward and backward)
of lnmlp.jax.layernorm_mlp under current scaling and under delayed scaling, each on one device
and split over a 1 x P tensor-parallel CPU mesh, timed in one run, interleaved. On the mesh current
scaling runs each call in stages (measuring calls whose amaxes are max-reduced, then the call:
docs/jax-mesh.md); delayed scaling, and either recipe on one device, run one call per pass. The
staging cost is current's mesh/one-device ratio against delayed's.

    PYTHONPATH=bindings/python python3 bench/jax/current_stages.py [options]

(options, with their defaults: --tokens 1024 --hidden 512 --ffn 1024 --devices 2 --iters 7)

(On a machine with fewer cores than devices, the devices share cores: compare ratios, not times.)
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--ffn", type=int, default=1024)
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--iters", type=int, default=7)
    args = ap.parse_args()
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    import lnmlp.jax as lj

    T, H, F = args.tokens, args.hidden, args.ffn
    rng = np.random.default_rng(0)
    f = lambda *s: jnp.asarray(rng.standard_normal(s) * 0.5, jnp.bfloat16)  # noqa: E731
    x, gamma, k1, k2, dy = f(T, H), 1 + f(H), f(H, 2, F), f(F, H), f(T, H)
    axes = dict(norm_input_axes=(None, None), kernel_1_axes=(None, None, "tensor"), kernel_2_axes=("tensor", None))
    mesh = jax.make_mesh((args.devices,), ("tensor",), axis_types=(jax.sharding.AxisType.Auto,))
    placed = [x, gamma, jax.device_put(k1, NamedSharding(mesh, P(None, None, "tensor"))),
              jax.device_put(k2, NamedSharding(mesh, P("tensor", None))), dy]

    def step_fn(recipe, split):
        def loss(x, gamma, k1, k2, dy, qs):
            y = lj.layernorm_mlp(x, gamma, None, [k1, k2], [None, None], "rmsnorm", activation_type=("silu", "linear"),
                                 quantizer_set=qs, **(axes if split else {}))
            return jnp.sum(y.astype(jnp.float32) * dy)

        return jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))

    runs = {}
    for name, recipe in (("delayed", lj.DelayedScaling()), ("current", lj.Float8CurrentScaling())):
        qs = lj.make_quantizer_set(recipe)
        runs[(name, "one device")] = (step_fn(recipe, False), [x, gamma, k1, k2, dy, qs], None)
        runs[(name, f"1x{args.devices} mesh")] = (step_fn(recipe, True), placed + [qs], mesh)

    def once(fn, inputs, m):
        if m is None:
            return jax.block_until_ready(fn(*inputs))
        with jax.set_mesh(m):
            return jax.block_until_ready(fn(*inputs))

    times = {k: [] for k in runs}
    for k, (fn, inputs, m) in runs.items():
        once(fn, inputs, m)  # compile and warm up
    for _ in range(args.iters):  # interleaved: the machine's drift hits every row alike
        for k, (fn, inputs, m) in runs.items():
            t0 = time.perf_counter()
            once(fn, inputs, m)
            times[k].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    print(f"T={T} H={H} F={F}, silu+linear, bf16, {args.devices} CPU devices, median of {args.iters} (ms)")
    print(f"{'recipe':10s} {'one device':>12s} {f'1x{args.devices} mesh':>12s} {'mesh / one':>11s}")
    ratios = {}
    for name in ("delayed", "current"):
        one, split = med[(name, "one device")], med[(name, f"1x{args.devices} mesh")]
        ratios[name] = split / one
        print(f"{name:10s} {one:12.1f} {split:12.1f} {ratios[name]:11.2f}")
    print(f"current scaling's stages on the mesh: {ratios['current'] / ratios['delayed']:.2f}x delayed scaling's "
          "mesh/one-device ratio")


if __name__ == "__main__":
    main()
