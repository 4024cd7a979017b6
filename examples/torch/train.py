"""Trains a small residual stack of lnmlp.torch.LayerNormMLP blocks with torch.optim.Adam, in
float32 (eager and under torch.compile), in bfloat16 and under each FP8 recipe, from the same
initialisation on the same data, and compares the losses.

Model:   h_0 = x,   h_{l+1} = h_l + LayerNormMLP_l(h_l)   (l < LAYERS),   pred = h_L @ W_out
Task:    regression on a fixed random "teacher", target = sin(x @ A) @ B (embedded, no downloads)
Loss:    mean squared error / var(target) (1.0 = predicting the mean); torch.optim.Adam, fp32
         master parameters

Every run starts from one state_dict (TransformerEngine's parameter names and shapes) and draws
the same training batches (a fresh generator with the same seed) and the same test set. The
parameters stay float32 in every run: a bfloat16 run feeds the blocks x.to(torch.bfloat16), so
lnmlp casts the parameters to bf16 for the GEMMs (their gradients come back as fp32 tensors); under FP8
(lnmlp.torch.fp8_autocast, TransformerEngine's way) the fp32 weights are not cast but quantized
from their fp32 values, as TransformerEngine does. Each block keeps its own FP8 state (delayed
scaling: the module's buffer fp8_state). The compiled runs are torch.compile(model, fullgraph=True);
their seconds include compiling (the training graph and the evaluation graph). The compiled FP8
run gives its blocks the recipe at construction (LayerNormMLP(..., fp8_recipe=)), so that delayed
scaling's buffer exists before torch.compile traces the model; the eager FP8 runs use
lnmlp.torch.fp8_autocast. (Compiled float32 matches eager float32 bit for bit; a compiled bf16 model
does not quite, because inductor fuses the last residual add with h.float() and skips that add's
rounding to bf16 -- torch._inductor.config.emulate_precision_casts = True restores it.)

    python3 examples/torch/train.py [--steps 300] [--png docs/torch-training.png]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "passive")  # see examples/python/train_fp8.py

import numpy as np  # noqa: E402
import torch  # noqa: E402

import lnmlp.torch as lt  # noqa: E402

TOKENS, HIDDEN, FFN, LAYERS, OUT = 256, 128, 384, 4, 16
ACTIVATION = "geglu"  # (gelu, linear), as examples/jax/train.py
LR, BETAS, ADAM_EPS = 1e-3, (0.9, 0.999), 1e-8
EVAL_EVERY = 10

RUNS = {  # name -> (block input dtype, FP8 recipe, torch.compile)
    "float32": (torch.float32, None, False),
    "float32, torch.compile": (torch.float32, None, True),
    "bfloat16": (torch.bfloat16, None, False),
    "bf16 + DelayedScaling": (torch.bfloat16, lt.DelayedScaling(), False),
    "bf16 + Float8CurrentScaling": (torch.bfloat16, lt.Float8CurrentScaling(), False),
    "bf16 + Float8BlockScaling": (torch.bfloat16, lt.Float8BlockScaling(), False),
    "bf16 + MXFP8BlockScaling": (torch.bfloat16, lt.MXFP8BlockScaling(), False),
    "bf16 + DelayedScaling, compile": (torch.bfloat16, lt.DelayedScaling(), True),
}


class Teacher:
    """The fixed random target function and one stream of samples (1: training, 2: the test
    set); the same stream gives the same batches."""

    def __init__(self, stream, seed=0):
        rng = np.random.default_rng(seed)
        self.A = rng.standard_normal((HIDDEN, 64)) / np.sqrt(HIDDEN)
        self.B = rng.standard_normal((64, OUT)) / 8.0
        self.rng = np.random.default_rng([seed, stream])

    def batch(self, n):
        x = self.rng.standard_normal((n, HIDDEN))
        y = np.sin(x @ self.A) @ self.B
        return torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y.astype(np.float32))


class Model(torch.nn.Module):
    def __init__(self, dtype, fp8_recipe=None):
        super().__init__()
        self.dtype = dtype
        self.blocks = torch.nn.ModuleList(
            lt.LayerNormMLP(HIDDEN, FFN, activation=ACTIVATION, params_dtype=torch.float32, fp8_recipe=fp8_recipe)
            for _ in range(LAYERS))
        self.out = torch.nn.Parameter(torch.empty(HIDDEN, OUT))

    def forward(self, x):
        h = x.to(self.dtype)
        for block in self.blocks:
            h = h + block(h)
        return h.float() @ self.out


def initial_state(seed=1):
    """The one initialisation every run loads (TransformerEngine's parameter names and shapes)."""
    rng = np.random.default_rng(seed)
    t = lambda a: torch.from_numpy(np.asarray(a, np.float32))  # noqa: E731
    sd = {}
    for i in range(LAYERS):
        p = f"blocks.{i}."
        sd[p + "layer_norm_weight"] = t(np.ones(HIDDEN))
        sd[p + "layer_norm_bias"] = t(np.zeros(HIDDEN))
        sd[p + "fc1_weight"] = t(rng.standard_normal((2 * FFN, HIDDEN)) / np.sqrt(HIDDEN))  # [A*F, H]
        sd[p + "fc1_bias"] = t(np.zeros(2 * FFN))
        sd[p + "fc2_weight"] = t(rng.standard_normal((HIDDEN, FFN)) / np.sqrt(FFN) / LAYERS)  # [H, F]
        sd[p + "fc2_bias"] = t(np.zeros(HIDDEN))
    sd["out"] = t(rng.standard_normal((HIDDEN, OUT)) / np.sqrt(HIDDEN))
    return sd


def train(name, steps, test, var, init):
    dtype, recipe, compiled = RUNS[name]
    # Compiled: the recipe is the blocks' own; eager: fp8_autocast's (TransformerEngine's way).
    model = Model(dtype, fp8_recipe=recipe if compiled else None)
    r = model.load_state_dict(init, strict=False)  # fp8_state (delayed scaling): fresh, as the module made it
    assert not r.unexpected_keys and all(k.endswith(".fp8_state") for k in r.missing_keys), r
    fn = torch.compile(model, fullgraph=True) if compiled else model
    opt = torch.optim.Adam(model.parameters(), lr=LR, betas=BETAS, eps=ADAM_EPS)
    teacher = Teacher(stream=1)
    fp8 = lambda: lt.fp8_autocast(enabled=recipe is not None and not compiled, fp8_recipe=recipe)  # noqa: E731

    def loss_of(x, y):
        with fp8():
            return torch.mean((fn(x) - y) ** 2) / var

    curve, t0 = [], time.perf_counter()
    for i in range(steps + 1):
        if i % EVAL_EVERY == 0:
            with torch.no_grad():
                curve.append((i, float(loss_of(*test))))
        if i < steps:
            opt.zero_grad(set_to_none=True)
            loss_of(*teacher.batch(TOKENS)).backward()
            opt.step()
    return curve, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--png", default=None, help="write the loss curves here (needs matplotlib)")
    args = ap.parse_args()
    test = Teacher(stream=2).batch(1024)
    var = float(torch.var(test[1], unbiased=False))
    init = initial_state()
    print(f"# {LAYERS} residual lnmlp.torch.LayerNormMLP blocks, T={TOKENS} H={HIDDEN} F={FFN} {ACTIVATION}, "
          f"{args.steps} steps, torch.optim.Adam, torch {torch.__version__} on the CPU "
          f"({torch.get_num_threads()} threads)")
    curves = {}
    print(f"{'run':30s} {'test loss':>10s} {'vs float32':>11s} {'seconds':>8s}")
    for name in RUNS:
        curve, secs = train(name, args.steps, test, var, init)
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
            ax.plot([s for s, _ in c], [v for _, v in c], label=name,
                    linestyle="--" if RUNS[name][2] else "-")
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel("test loss (MSE / var)")
        ax.set_title("lnmlp.torch: residual LayerNormMLP blocks trained with Adam")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.png, dpi=100)
        print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
