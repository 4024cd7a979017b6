#!/usr/bin/env python3
"""The same block as lnmlp-gpu-bench, in PyTorch eager, torch.compile and JAX (jit), when they are
installed: y = act(norm(x) @ W1 + b1) @ W2 + b2, forward + backward (every gradient), the same
shapes and dtype, timed on the GPU. Prints a table line and a JSON line per case with the same
fields as lnmlp-gpu-bench. Frameworks (or a GPU) that are missing are skipped with a message.

    python3 bench/gpu/torch_peer.py [--quick] [--tokens T] [--hidden H] [--act gelu|swiglu]
                                    [--dtype bf16|f16|f32] [--iters N] [--warmup N]
                                    [--frameworks eager,compile,jax]
"""
import argparse
import json
import statistics
import sys
import time

PEAK_TFLOPS = 989.0  # dense bf16, H100 / H200 SXM


def cases(args):
    if args.hidden:
        act = args.act or "gelu"
        ffn = args.ffn or (args.hidden * 7 // 2 if act == "swiglu" else 4 * args.hidden)
        return [(args.tokens, args.hidden, ffn, act)]
    out = []
    for h in (4096,) if args.quick else (4096, 8192):
        out.append((args.tokens, h, 4 * h, "gelu"))
        out.append((args.tokens, h, h * 7 // 2, "swiglu"))
    return out


def flops(t, h, f, act):
    a = 2 if act == "swiglu" else 1
    fwd = 2.0 * t * h * a * f + 2.0 * t * f * h
    return fwd, 2.0 * fwd


def report(bench, device, t, h, f, act, dtype, fwd_ms, bwd_ms, total_ms, saved_per_token, iters):
    fwd, bwd = flops(t, h, f, act)
    tflops = (fwd + bwd) / (total_ms * 1e-3) / 1e12
    fwd_s = "   n/a  " if fwd_ms is None else "%8.3f" % fwd_ms
    bwd_s = "   n/a  " if bwd_ms is None else "%8.3f" % bwd_ms
    print("%-13s %-7s T=%-6d H=%-5d F=%-6d %-5s fwd %s ms  bwd %s ms  total %8.3f ms  %7.1f TFLOP/s (%5.1f%% of %g)"
          "  saved %s B/token" % (bench, act, t, h, f, dtype, fwd_s, bwd_s, total_ms, tflops,
                                  100 * tflops / PEAK_TFLOPS, PEAK_TFLOPS,
                                  "n/a" if saved_per_token is None else saved_per_token))
    print(json.dumps({"bench": bench, "device": device, "act": act, "dtype": dtype, "remat": "framework",
                      "tokens": t, "hidden": h, "ffn": f, "fwd_ms": fwd_ms, "bwd_ms": bwd_ms,
                      "total_ms": total_ms, "tflops": round(tflops, 2), "peak_tflops": PEAK_TFLOPS,
                      "peak_fraction": round(tflops / PEAK_TFLOPS, 4), "saved_bytes_per_token": saved_per_token,
                      "iters": iters}))
    sys.stdout.flush()


def run_torch(args, compiled):
    try:
        import torch
        import torch.nn.functional as fn
    except ImportError:
        print("torch_peer: PyTorch is not installed; skipping torch %s" % ("compile" if compiled else "eager"))
        return
    if not torch.cuda.is_available():
        print("torch_peer: PyTorch sees no CUDA device; skipping")
        return
    dev = torch.device("cuda")
    dt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[args.dtype]
    torch.backends.cuda.matmul.allow_tf32 = False
    name = torch.cuda.get_device_name(0)

    def block(x, gamma, beta, w1, b1, w2, b2, gated, f):
        if gated:  # Llama-style: RMSNorm, swiglu, no biases
            n = fn.rms_norm(x, (x.shape[-1],), gamma, eps=1e-6) if hasattr(fn, "rms_norm") else \
                x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * gamma
            h = n @ w1
            a = fn.silu(h[:, :f]) * h[:, f:]
            return a @ w2
        n = fn.layer_norm(x, (x.shape[-1],), gamma, beta, eps=1e-6)
        h = n @ w1 + b1
        return fn.gelu(h, approximate="tanh") @ w2 + b2

    for (t, h, f, act) in cases(args):
        gated = act == "swiglu"
        a = 2 if gated else 1
        g = torch.Generator(device=dev).manual_seed(0)

        def rnd(*shape, scale=1.0, grad=True):
            v = ((torch.rand(*shape, generator=g, device=dev, dtype=torch.float32) * 2 - 1) * scale).to(dt)
            return v.requires_grad_(grad)

        x, dy = rnd(t, h), rnd(t, h, scale=0.5, grad=False)
        gamma, beta = rnd(h), rnd(h, scale=0.1)
        w1, b1 = rnd(h, a * f, scale=0.02), rnd(a * f, scale=0.1)
        w2, b2 = rnd(f, h, scale=0.02), rnd(h, scale=0.1)
        fwd = torch.compile(block) if compiled else block
        params = [x, gamma, w1, w2] + ([] if gated else [beta, b1, b2])

        saved_bytes = [0]

        def pack(tensor):
            saved_bytes[0] += tensor.numel() * tensor.element_size()
            return tensor

        start, mid, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        f_ms, b_ms = [], []
        for i in range(args.warmup + args.iters):
            for p in params:
                p.grad = None
            saved_bytes[0] = 0
            start.record()
            if not compiled and i == 0:
                with torch.autograd.graph.saved_tensors_hooks(pack, lambda v: v):
                    y = fwd(x, gamma, beta, w1, b1, w2, b2, gated, f)
            else:
                y = fwd(x, gamma, beta, w1, b1, w2, b2, gated, f)
            mid.record()
            y.backward(dy)
            end.record()
            torch.cuda.synchronize()
            if i == 0 and not compiled:
                # Saved activations per token, without the parameters (which autograd also saves).
                param_bytes = sum(p.numel() * p.element_size() for p in (gamma, beta, w1, b1, w2, b2))
                per_token = max(0, saved_bytes[0] - param_bytes - x.numel() * x.element_size()) // t
            if i >= args.warmup:
                f_ms.append(start.elapsed_time(mid))
                b_ms.append(mid.elapsed_time(end))
        fm, bm = statistics.median(f_ms), statistics.median(b_ms)
        report("torch_compile" if compiled else "torch_eager", name, t, h, f, act, args.dtype, round(fm, 4),
               round(bm, 4), round(fm + bm, 4), None if compiled else per_token, args.iters)
        del x, dy, gamma, beta, w1, b1, w2, b2, y, params
        torch.cuda.empty_cache()


def run_jax(args):
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        print("torch_peer: JAX is not installed; skipping jax")
        return
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    if not gpus:
        print("torch_peer: JAX sees no GPU; skipping jax")
        return
    dt = {"bf16": jnp.bfloat16, "f16": jnp.float16, "f32": jnp.float32}[args.dtype]
    name = getattr(gpus[0], "device_kind", "gpu")

    for (t, h, f, act) in cases(args):
        gated = act == "swiglu"
        a = 2 if gated else 1

        def block(x, gamma, beta, w1, b1, w2, b2):
            xf = x.astype(jnp.float32)
            if gated:
                n = (xf * jax.lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + 1e-6)).astype(dt) * gamma
                hh = jnp.dot(n, w1, preferred_element_type=jnp.float32).astype(dt)
                act_out = jax.nn.silu(hh[:, :f]) * hh[:, f:]
                return jnp.dot(act_out, w2, preferred_element_type=jnp.float32).astype(dt)
            mu = jnp.mean(xf, -1, keepdims=True)
            var = jnp.mean((xf - mu) ** 2, -1, keepdims=True)
            n = ((xf - mu) * jax.lax.rsqrt(var + 1e-6)).astype(dt) * gamma + beta
            hh = (jnp.dot(n, w1, preferred_element_type=jnp.float32) + b1).astype(dt)
            act_out = jax.nn.gelu(hh, approximate=True)
            return (jnp.dot(act_out, w2, preferred_element_type=jnp.float32) + b2).astype(dt)

        @jax.jit
        def fwd_bwd(x, gamma, beta, w1, b1, w2, b2, dy):
            y, vjp = jax.vjp(block, x, gamma, beta, w1, b1, w2, b2)
            return y, vjp(dy)

        key = jax.random.PRNGKey(0)
        ks = jax.random.split(key, 8)

        def rnd(k, shape, scale):
            return (jax.random.uniform(k, shape, jnp.float32, -scale, scale)).astype(dt)

        args_ = (rnd(ks[0], (t, h), 1.0), rnd(ks[1], (h,), 1.0), rnd(ks[2], (h,), 0.1), rnd(ks[3], (h, a * f), 0.02),
                 rnd(ks[4], (a * f,), 0.1), rnd(ks[5], (f, h), 0.02), rnd(ks[6], (h,), 0.1), rnd(ks[7], (t, h), 0.5))
        times = []
        for i in range(args.warmup + args.iters):
            t0 = time.perf_counter()
            jax.block_until_ready(fwd_bwd(*args_))
            if i >= args.warmup:
                times.append((time.perf_counter() - t0) * 1e3)
        tm = statistics.median(times)
        report("jax_jit", name, t, h, f, act, args.dtype, None, None, round(tm, 4), None, args.iters)
        del args_


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--hidden", type=int, default=0)
    p.add_argument("--ffn", type=int, default=0)
    p.add_argument("--act", default="")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="hidden 4096 only")
    p.add_argument("--frameworks", default="eager,jax,compile")
    args = p.parse_args()
    wanted = set(args.frameworks.split(","))
    for fw in ("eager", "jax", "compile"):  # torch.compile last: its compilation is the slow part
        if fw not in wanted:
            continue
        try:
            if fw == "jax":
                run_jax(args)
            else:
                run_torch(args, compiled=(fw == "compile"))
        except Exception as e:  # one framework's failure must not hide the others' results
            print("torch_peer: %s failed: %s: %s" % (fw, type(e).__name__, e))
            sys.stdout.flush()


if __name__ == "__main__":
    main()
