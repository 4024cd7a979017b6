"""Trains a small residual stack of lnmlp.jax blocks with jax.jit-ed steps, in float32, in bfloat16
and under FP8 recipes, from the same initialisation on the same data, and compares the losses.

Model:   h_0 = x,   h_{l+1} = h_l + layernorm_mlp(h_l)   (l < LAYERS),   pred = h_L @ W_out
Task:    regression on a fixed random "teacher", target = sin(x @ A) @ B (embedded, no downloads)
Loss:    mean squared error / var(target) (1.0 = predicting the mean); Adam (optax when it is
         installed, else the same update written with jax.tree), fp32 master parameters

Each run's block compute dtype is its "dtype": bfloat16 runs cast the fp32 master parameters to
bf16 inside lnmlp.jax.layernorm_mlp (their gradients come back in fp32); under FP8 the fp32 kernels
are not cast but quantized from their fp32 values, as TransformerEngine does. FP8 runs give every layer
its own quantizer set (lnmlp.jax.make_quantizer_set), carried through the jitted step as an
ordinary pytree: the step returns the updated sets, as TransformerEngine's JAX API does.

    python3 examples/jax/train.py [--steps 300] [--png docs/jax-training.png]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "passive")  # see examples/python/train_fp8.py

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import lnmlp.jax as lj  # noqa: E402

TOKENS, HIDDEN, FFN, LAYERS, OUT = 256, 128, 384, 4, 16
LR, BETAS, ADAM_EPS = 1e-3, (0.9, 0.999), 1e-8
EVAL_EVERY = 10

RUNS = {  # name -> (block dtype, FP8 recipe)
    "float32": (jnp.float32, None),
    "bfloat16": (jnp.bfloat16, None),
    "bf16 + DelayedScaling": (jnp.bfloat16, lj.DelayedScaling()),
    "bf16 + Float8CurrentScaling": (jnp.bfloat16, lj.Float8CurrentScaling()),
    "bf16 + MXFP8BlockScaling": (jnp.bfloat16, lj.MXFP8BlockScaling()),
}


def teacher(seed=0):
    """batch(rng, n): n inputs drawn from rng and the fixed teacher's targets for them."""
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((HIDDEN, 64)) / np.sqrt(HIDDEN)
    B = rng.standard_normal((64, OUT)) / 8.0

    def batch(rng, n):
        x = rng.standard_normal((n, HIDDEN))
        return jnp.asarray(x, jnp.float32), jnp.asarray(np.sin(x @ A) @ B, jnp.float32)

    return batch


def init(seed=1):
    rng = np.random.default_rng(seed)
    f32 = lambda a: jnp.asarray(a, jnp.float32)  # noqa: E731
    layers = [dict(gamma=f32(np.ones(HIDDEN)), beta=f32(np.zeros(HIDDEN)),
                   k1=f32(rng.standard_normal((HIDDEN, 2, FFN)) / np.sqrt(HIDDEN)), b1=f32(np.zeros((2, FFN))),
                   k2=f32(rng.standard_normal((FFN, HIDDEN)) / np.sqrt(FFN) / LAYERS), b2=f32(np.zeros(HIDDEN)))
              for _ in range(LAYERS)]
    return dict(layers=layers, out=f32(rng.standard_normal((HIDDEN, OUT)) / np.sqrt(HIDDEN)))


def forward(params, qsets, x, dtype):
    h = x.astype(dtype)
    for p, qs in zip(params["layers"], qsets):
        h = h + lj.layernorm_mlp(h, p["gamma"], p["beta"], [p["k1"], p["k2"]], [p["b1"], p["b2"]], "layernorm",
                                 activation_type=("gelu", "linear"), quantizer_set=qs)
    return h.astype(jnp.float32) @ params["out"]


def loss_fn(params, qsets, x, y, dtype, var):
    return jnp.mean((forward(params, qsets, x, dtype) - y) ** 2) / var


def adam():
    try:
        import optax
        return optax.adam(LR, b1=BETAS[0], b2=BETAS[1], eps=ADAM_EPS), "optax.adam"
    except ImportError:
        pass

    class Adam:  # optax.adam's update, written with jax.tree
        def init(self, params):
            z = jax.tree.map(jnp.zeros_like, params)
            return (z, z, jnp.zeros((), jnp.int32))

        def update(self, g, state, params=None):
            m, v, t = state
            t = t + 1
            m = jax.tree.map(lambda a, b: BETAS[0] * a + (1 - BETAS[0]) * b, m, g)
            v = jax.tree.map(lambda a, b: BETAS[1] * a + (1 - BETAS[1]) * b * b, v, g)
            c1, c2 = 1 - BETAS[0] ** t, 1 - BETAS[1] ** t
            upd = jax.tree.map(lambda a, b: -LR * (a / c1) / (jnp.sqrt(b / c2) + ADAM_EPS), m, v)
            return upd, (m, v, t)

    return Adam(), "Adam written with jax.tree"


def train(name, steps, batch, test, var, opt):
    dtype, recipe = RUNS[name]
    params = init()
    qsets = [None if recipe is None else lj.make_quantizer_set(recipe) for _ in range(LAYERS)]
    opt_state = opt.init(params)

    @jax.jit
    def step(params, qsets, opt_state, x, y):
        loss, (g, new_qsets) = jax.value_and_grad(loss_fn, argnums=(0, 1))(params, qsets, x, y, dtype, var)
        upd, opt_state = opt.update(g, opt_state, params)
        # The quantizer sets' "gradients" are the sets after this step (TransformerEngine's way).
        return jax.tree.map(lambda p, u: p + u, params, upd), new_qsets, opt_state, loss

    evaluate = jax.jit(lambda params, qsets: loss_fn(params, qsets, test[0], test[1], dtype, var))
    rng = np.random.default_rng(2)  # every run sees the same batches
    curve, t0 = [], time.perf_counter()
    for i in range(steps + 1):
        if i % EVAL_EVERY == 0:
            curve.append((i, float(evaluate(params, qsets))))
        if i < steps:
            params, qsets, opt_state, _ = step(params, qsets, opt_state, *batch(rng, TOKENS))
    return curve, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--png", default=None, help="write the loss curves here (needs matplotlib)")
    args = ap.parse_args()
    batch = teacher()
    test = batch(np.random.default_rng(1), 1024)
    var = float(jnp.var(test[1]))
    opt, opt_name = adam()
    print(f"# {LAYERS} residual lnmlp.jax blocks, T={TOKENS} H={HIDDEN} F={FFN} swiglu-style (gelu, linear), "
          f"{args.steps} jitted steps, {opt_name}, jax {jax.__version__} on {jax.default_backend()}")
    curves = {}
    print(f"{'run':30s} {'test loss':>10s} {'vs float32':>11s} {'seconds':>8s}")
    for name in RUNS:
        curve, secs = train(name, args.steps, batch, test, var, opt)
        curves[name] = curve
        final, base = curve[-1][1], curves["float32"][-1][1]
        print(f"{name:30s} {final:10.4f} {100 * (final - base) / base:+10.2f}% {secs:8.1f}", flush=True)
    if args.png:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("no matplotlib: no plot (pip install matplotlib)", file=sys.stderr)
            return
        fig, ax = plt.subplots(figsize=(7, 4))
        for name, c in curves.items():
            ax.plot([s for s, _ in c], [v for _, v in c], label=name)
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel("test loss (MSE / var)")
        ax.set_title("lnmlp.jax: residual blocks trained under jax.jit")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.png, dpi=100)
        print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
