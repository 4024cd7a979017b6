"""Trains a small residual stack of lnmlp blocks in fp32, in bf16 and under each FP8 recipe and
NVFP4, from the same initialisation on the same data, and compares the loss curves.

Model:   h_0 = x,   h_{l+1} = h_l + layernorm_mlp(h_l)   (l < LAYERS),   pred = h_L @ W_out
Task:    regression on a fixed random "teacher", target = sin(x @ A) @ B (embedded, no downloads)
Loss:    mean squared error / var(target) (1.0 = predicting the mean), Adam in NumPy

Every layer runs through lnmlp.layernorm_mlp_vjp with its own quantizer set
(lnmlp.make_quantizer_set(recipe)), as TransformerEngine gives each layer its own quantizers. The
blocks' I/O is float32 except in the bf16 row, whose blocks take and return bfloat16 (the weights
cast from the float32 master copy each step, the residual stream and the optimiser in float32).

    python3 examples/python/train_fp8.py [--steps 300] [--png docs/fp8-training.png]

Prints the table of final losses (and the relative difference to fp32) and writes the loss curves
to the PNG (needs matplotlib: pip install matplotlib).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import ml_dtypes
import numpy as np

# OpenMP threads that spin while waiting (the default policy) slow the small GEMMs of this example
# by an order of magnitude when other processes share the cores; passive waiting costs nothing
# here. Must be set before lnmlp loads its library.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import lnmlp  # noqa: E402

TOKENS, HIDDEN, FFN, LAYERS, OUT = 256, 128, 384, 4, 16
LR, BETAS, ADAM_EPS = 1e-3, (0.9, 0.999), 1e-8
EVAL_EVERY = 10

BF16 = np.dtype(ml_dtypes.bfloat16)
# name -> (recipe, the blocks' I/O dtype)
RECIPES = {
    "fp32 (no FP8)": (None, np.float32),
    "bf16 (no FP8)": (None, BF16),
    "DelayedScaling": (lnmlp.DelayedScaling(), np.float32),              # HYBRID, history 1024, max
    "Float8CurrentScaling": (lnmlp.Float8CurrentScaling(), np.float32),  # HYBRID
    "Float8BlockScaling": (lnmlp.Float8BlockScaling(), np.float32),      # E4M3, power-of-two scales
    "MXFP8BlockScaling": (lnmlp.MXFP8BlockScaling(), np.float32),        # E4M3, E8M0 scales
    "NVFP4BlockScaling": (lnmlp.NVFP4BlockScaling(), np.float32),        # RHT, stochastic rounding, 2-D weights
}


class Teacher:
    """A fixed random function; `stream` selects the sample stream (0: training, 1: evaluation)."""

    def __init__(self, stream=0, seed=1234):
        rng = np.random.default_rng(seed)
        self.A = (rng.standard_normal((HIDDEN, 64)) / np.sqrt(HIDDEN) * 0.7).astype(np.float32)
        self.B = (rng.standard_normal((64, OUT)) / np.sqrt(64)).astype(np.float32)
        self.rng = np.random.default_rng([seed, stream])

    def batch(self, n=TOKENS):
        x = self.rng.standard_normal((n, HIDDEN)).astype(np.float32)
        return x, (np.sin(x @ self.A) @ self.B).astype(np.float32)


def init_params(seed=0):
    rng = np.random.default_rng(seed)
    layers = []
    for _ in range(LAYERS):
        layers.append(dict(
            gamma=np.ones(HIDDEN, np.float32), beta=np.zeros(HIDDEN, np.float32),
            w1=(rng.standard_normal((HIDDEN, 1, FFN)) / np.sqrt(HIDDEN)).astype(np.float32),
            b1=np.zeros((1, FFN), np.float32),
            w2=(rng.standard_normal((FFN, HIDDEN)) / np.sqrt(FFN) / np.sqrt(LAYERS)).astype(np.float32),
            b2=np.zeros(HIDDEN, np.float32)))
    head = (rng.standard_normal((HIDDEN, OUT)) / np.sqrt(HIDDEN) * 0.1).astype(np.float32)
    return dict(layers=layers, head=head)


def forward(params, x, qsets, dtype=np.float32, with_vjp=True):
    h, vjps = x, []
    for p, qs in zip(params["layers"], qsets):
        c = lambda a: a.astype(dtype)  # noqa: E731 (the blocks' I/O dtype)
        args = (c(h), c(p["gamma"]), c(p["beta"]), [c(p["w1"]), c(p["w2"])], [c(p["b1"]), c(p["b2"])], "layernorm")
        if with_vjp:
            out, vjp = lnmlp.layernorm_mlp_vjp(*args, activation_type=("gelu",), quantizer_set=qs)
            vjps.append(vjp)
        else:
            out = lnmlp.layernorm_mlp(*args, activation_type=("gelu",), quantizer_set=qs)
        h = h + out.astype(np.float32)
    return h, h @ params["head"], vjps


def loss_of(pred, target, var):
    return float(np.mean((pred - target) ** 2) / var)


class Adam:
    def __init__(self, params):
        self.t = 0
        self.m = [np.zeros_like(a) for a in self._leaves(params)]
        self.v = [np.zeros_like(a) for a in self._leaves(params)]

    @staticmethod
    def _leaves(tree):
        out = []
        for p in tree["layers"]:
            out += [p[k] for k in ("gamma", "beta", "w1", "b1", "w2", "b2")]
        return out + [tree["head"]]

    def step(self, params, grads):
        self.t += 1
        b1, b2 = BETAS
        for i, (p, g) in enumerate(zip(self._leaves(params), self._leaves(grads))):
            self.m[i] = b1 * self.m[i] + (1 - b1) * g
            self.v[i] = b2 * self.v[i] + (1 - b2) * g * g
            mh = self.m[i] / (1 - b1 ** self.t)
            vh = self.v[i] / (1 - b2 ** self.t)
            p -= (LR * mh / (np.sqrt(vh) + ADAM_EPS)).astype(np.float32)


def train(recipe, dtype, steps, eval_set):
    params = init_params()
    teacher = Teacher()
    qsets = [None if recipe is None else lnmlp.make_quantizer_set(recipe) for _ in range(LAYERS)]
    opt = Adam(params)
    xe, te = eval_set
    var = float(te.var())
    train_curve, eval_curve = [], []
    for step in range(steps + 1):
        if step % EVAL_EVERY == 0 or step == steps:
            # evaluate with the recipe's own forward, on copies of the quantizer sets (so the
            # evaluation does not move the training state)
            eq = [None if q is None else lnmlp.make_quantizer_set(recipe) for q in qsets]
            for q, e in zip(qsets, eq):
                if q is not None:
                    e.load_state(q.state())
            eval_curve.append((step, loss_of(forward(params, xe, eq, dtype, with_vjp=False)[1], te, var)))
        if step == steps:
            break
        x, target = teacher.batch()
        h, pred, vjps = forward(params, x, qsets, dtype)
        train_curve.append(loss_of(pred, target, var))
        dpred = (2.0 / (pred.size * var) * (pred - target)).astype(np.float32)
        grads = dict(head=h.T @ dpred, layers=[None] * LAYERS)
        dh = dpred @ params["head"].T
        for l in reversed(range(LAYERS)):
            dx, dgamma, dbeta, (dw1, dw2), (db1, db2) = vjps[l](np.ascontiguousarray(dh, dtype))
            f32 = lambda a: a.astype(np.float32)  # noqa: E731
            grads["layers"][l] = dict(gamma=f32(dgamma), beta=f32(dbeta), w1=f32(dw1), b1=f32(db1), w2=f32(dw2),
                                      b2=f32(db2))
            dh = dh + f32(dx)  # the residual path
        opt.step(params, grads)
    return np.array(train_curve), eval_curve


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=300)
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--png", default=os.path.join(here, "..", "..", "docs", "fp8-training.png"))
    args = ap.parse_args(argv)

    eval_set = Teacher(stream=1).batch(1024)
    print(f"lnmlp {lnmlp.__version__}, library {lnmlp.library_path()}")
    print(f"model: {LAYERS} x (x + layernorm_mlp(x)), gelu, T={TOKENS} H={HIDDEN} F={FFN}, head -> {OUT}; "
          f"Adam lr {LR}, {args.steps} steps")
    results = {}
    for name, (recipe, dtype) in RECIPES.items():
        t0 = time.time()
        results[name] = train(recipe, dtype, args.steps, eval_set) + (time.time() - t0,)
        tr, ev, secs = results[name]
        print(f"  {name:22s} final eval loss {ev[-1][1]:.5f}  ({secs:.1f} s)", flush=True)

    base_eval = results["fp32 (no FP8)"][1][-1][1]
    base_train = results["fp32 (no FP8)"][0][-20:].mean()
    print()
    bf16_eval = results["bf16 (no FP8)"][1][-1][1]
    print("| recipe | final eval loss | vs fp32 | vs bf16 | train loss (last 20 steps) | vs fp32 | time (s) |")
    print("|---|---|---|---|---|---|---|")
    for name, (tr, ev, secs) in results.items():
        e, t = ev[-1][1], tr[-20:].mean()
        print(f"| {name} | {e:.5f} | {100 * (e - base_eval) / base_eval:+.2f}% | "
              f"{100 * (e - bf16_eval) / bf16_eval:+.2f}% | {t:.5f} | "
              f"{100 * (t - base_train) / base_train:+.2f}% | {secs:.1f} |")

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("\nmatplotlib is not installed (pip install matplotlib): no plot written", file=sys.stderr)
        return 0
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.5))
    k = 10
    for name, (tr, ev, _) in results.items():
        smooth = np.convolve(tr, np.ones(k) / k, mode="valid")
        a1.plot(np.arange(k - 1, len(tr)), smooth, label=name, lw=1.2)
        a2.plot([s for s, _ in ev], [v for _, v in ev], label=name, lw=1.2)
    a1.set_title(f"training loss ({k}-step moving average)")
    a2.set_title("eval loss (1024 held-out tokens)")
    for a in (a1, a2):
        a.set_xlabel("step")
        a.set_ylabel("MSE / var(target)")
        a.set_yscale("log")
        a.grid(True, alpha=0.3)
        a.legend()
    fig.suptitle(f"lnmlp: {LAYERS} residual layernorm_mlp layers, fp32 and bf16 vs the FP8 and NVFP4 recipes")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(args.png)), exist_ok=True)
    fig.savefig(args.png, dpi=110)
    print(f"\nwrote {os.path.relpath(args.png)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
