"""The worker side of bench/compare/compare.py: one implementation of the block, timed in its own
process so that its peak memory is its own.

Every implementation computes the same thing on the same inputs (docs/cpu-compare.md):

    y = act(norm(x) @ W1 + b1) @ W2 + b2, then dx, dgamma, dbeta, dW1, db1, dW2, db2 given dy,

with W1 stored [H, A, F] (A = 2 for a gated pair: h[:, 0, :] goes through silu, h[:, 1, :] is
linear, as in the project's docs/design.md and TransformerEngine) and gelu the tanh approximation. Only
the worker's own framework is imported; compare.py has pinned the process to its CPUs.
"""

import json
import os
import resource
import statistics
import sys
import time
import traceback
from dataclasses import dataclass

import numpy as np

EPS = 1e-6
MIB = 1 << 20


class NotAvailable(Exception):
    """This implementation cannot run this configuration (shown as n/a with the message)."""


class TooSlow(Exception):
    """Estimated slower than the step limit: not run, shown with the estimate."""

    def __init__(self, reason, estimate_s):
        super().__init__(reason)
        self.estimate_s = estimate_s


# --- configuration and inputs ---------------------------------------------------------------------
@dataclass(frozen=True)
class Config:
    tokens: int
    hidden: int
    ffn: int
    norm: str          # "layernorm" or "rmsnorm"
    act: str           # "gelu" or "swiglu"
    dtype: str         # "f32" or "bf16"
    recipe: str = "none"

    @property
    def gated(self):
        return self.act == "swiglu"

    @property
    def num_acts(self):
        return 2 if self.gated else 1

    @property
    def has_beta(self):
        return self.norm == "layernorm"


def step_flops(cfg):
    """FLOPs of one forward + backward, counted as 3x the forward GEMMs (forward, dgrad, wgrad)."""
    return 3 * (2 * cfg.tokens * cfg.hidden * cfg.num_acts * cfg.ffn + 2 * cfg.tokens * cfg.ffn * cfg.hidden)


def flat_weights(inputs, cfg):
    """The inputs with W1 as [H, A*F] and b1 as [A*F] (views): h[:, :F] is the first activation."""
    return dict(inputs, w1=inputs["w1"].reshape(cfg.hidden, -1), b1=inputs["b1"].reshape(-1))


def numpy_dtype(name):
    if name == "f32":
        return np.dtype(np.float32)
    import ml_dtypes
    return np.dtype(ml_dtypes.bfloat16)


def make_inputs(cfg, seed=2024):
    """The block's inputs as NumPy arrays of cfg's dtype: unit-variance x and dy, weights scaled by
    1/sqrt(fan-in) as in a trained layer, gamma ~ 1 (as lnmlp-bench draws them)."""
    rng = np.random.default_rng(seed)
    T, H, F, A = cfg.tokens, cfg.hidden, cfg.ffn, cfg.num_acts
    dt = numpy_dtype(cfg.dtype)

    def normal(shape, scale=1.0, shift=0.0):
        return (shift + scale * rng.standard_normal(shape, dtype=np.float32)).astype(dt)

    inputs = {"x": normal((T, H)), "gamma": normal(H, 0.1, 1.0)}
    if cfg.has_beta:
        inputs["beta"] = normal(H, 0.1)
    inputs.update(w1=normal((H, A, F), H ** -0.5), b1=normal((A, F), 0.1),
                  w2=normal((F, H), F ** -0.5), b2=normal(H, 0.1), dy=normal((T, H)))
    return inputs


# --- memory ---------------------------------------------------------------------------------------
def current_rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def max_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak_rss():
    """Resets the process's resident high-water mark (ru_maxrss) to its current RSS (Linux >= 4.0).
    Returns False where that is not possible; ru_maxrss then also covers input generation."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


# --- implementations ------------------------------------------------------------------------------
# Each one: __init__(cfg, inputs, threads) converts the inputs into its framework's own form
# (no working memory yet); prepare() allocates what it keeps (lnmlp's plan); step() runs forward +
# backward once and returns (forward seconds or None, total seconds); outputs() gives y and dx as
# float32 NumPy arrays.

class Lnmlp:
    """The fused block through the Python binding's plan, with outputs allocated once.

    lnmlp.Plan.forward/backward allocate their outputs on every call; to time the library and not
    NumPy's allocator, the plan's C functions are called directly on preallocated arrays (the
    binding's loaded library and its plan handle)."""

    def __init__(self, cfg, inputs, threads):
        import lnmlp
        self.lnmlp, self.cfg, self.inp, self.threads = lnmlp, cfg, inputs, threads

    def prepare(self):
        cfg, dtype = self.cfg, numpy_dtype(self.cfg.dtype)
        self.plan = self.lnmlp.Plan(
            cfg.tokens, cfg.hidden, cfg.ffn, norm_type=cfg.norm, activation_type=cfg.act,
            use_bias1=True, use_bias2=True, dtype=dtype, num_threads=self.threads,
            recipe=lnmlp_recipe(self.lnmlp, cfg.recipe))
        # outputs sized as the library gives their shapes (lnmlp_plan_get_tensor_shape)
        self.out = {k: np.empty(self.plan.tensor_shape(k, cfg.tokens), dtype)
                    for k in ("y", "dx", "dgamma", "dw1", "db1", "dw2", "db2")}
        if cfg.has_beta:
            self.out["dbeta"] = np.empty(self.plan.tensor_shape("dbeta"), dtype)
        self.saved = aligned_bytes(self.plan.tensor_shape("saved", cfg.tokens)[0], self.plan.alignment)
        self._bind_calls()

    def _bind_calls(self):
        from lnmlp import _lib
        lib, h, i, o, p = _lib.get_lib(), self.plan._handle, self.inp, self.out, address
        params = [p(i["x"]), p(i["gamma"]), p(i.get("beta")), p(i["w1"]), p(i["b1"]), p(i["w2"])]
        # Every call takes the plan's tokens and its own FP8 state. A training step: the forward
        # makes the plan's copies of the weights (FP8-quantized, or widened where the GEMMs need
        # it), and the backward of that forward reuses them (LNMLP_CALL_WEIGHTS_UNCHANGED, as
        # TransformerEngine's backward uses the weights its forward quantized).
        T = self.cfg.tokens
        self._fwd = (lib.lnmlp_plan_forward, h, T, *params, p(i["b2"]), p(o["y"]), p(self.saved),
                     None, _lib.CALL_DEFAULT, None)
        self._bwd = (lib.lnmlp_plan_backward, h, T, p(i["dy"]), *params, p(self.saved), p(o["dx"]),
                     p(o["dgamma"]), p(o.get("dbeta")), p(o["dw1"]), p(o["db1"]), p(o["dw2"]),
                     p(o["db2"]), None, _lib.CALL_WEIGHTS_UNCHANGED, None)
        self._check = _lib.check

    def step(self):
        t0 = time.perf_counter()
        self._check(self._fwd[0](*self._fwd[1:]))
        t1 = time.perf_counter()
        self._check(self._bwd[0](*self._bwd[1:]))
        return t1 - t0, time.perf_counter() - t0

    def outputs(self):
        return self.out["y"], self.out["dx"]


def lnmlp_recipe(lnmlp, name):
    """lnmlp's recipe object of a configuration's recipe name ("none": None)."""
    return {"none": lambda: None, "delayed": lnmlp.DelayedScaling, "current": lnmlp.Float8CurrentScaling,
            "block": lnmlp.Float8BlockScaling, "mxfp8": lnmlp.MXFP8BlockScaling}[name]()


def address(a):
    """A NumPy array's data address for a C call (None for an absent array)."""
    return None if a is None else a.ctypes.data


def aligned_bytes(nbytes, alignment):
    """A uint8 array of nbytes whose data is aligned to alignment bytes (not touched yet)."""
    align = max(int(alignment), 1)
    raw = np.empty(nbytes + align, dtype=np.uint8)
    off = (-raw.ctypes.data) % align
    return raw[off:off + nbytes]


class TorchEager:
    """PyTorch eager on the CPU, gradients by autograd."""
    compiled = False

    def __init__(self, cfg, inputs, threads):
        import torch
        torch.set_num_threads(threads)
        self.torch, self.cfg = torch, cfg
        inputs = flat_weights(inputs, cfg)
        self.dy = torch_tensor(torch, inputs.pop("dy"))
        self.params = {k: torch_tensor(torch, v).requires_grad_() for k, v in inputs.items()}
        block = torch_block_fn(cfg)
        self.block = torch.compile(block) if self.compiled else block
        self.y = None

    def prepare(self):
        pass

    def step(self):
        for t in self.params.values():
            t.grad = None
        t0 = time.perf_counter()
        self.y = self.block(**self.params)
        t1 = time.perf_counter()
        self.y.backward(self.dy)
        return t1 - t0, time.perf_counter() - t0

    def outputs(self):
        return to_f32(self.y.detach()), to_f32(self.params["x"].grad)

    def estimate_step_s(self):
        """fwd+bwd seconds estimated from this framework's GEMM rate in this dtype on a small
        product (PyTorch's bf16 matmul has no fast kernel on CPUs without bf16 instructions)."""
        torch, cfg = self.torch, self.cfg
        a = torch.ones(32, cfg.hidden, dtype=self.dy.dtype)
        b = torch.ones(cfg.hidden, cfg.ffn, dtype=self.dy.dtype)
        a @ b
        t0 = time.perf_counter()
        a @ b
        rate = 2 * 32 * cfg.hidden * cfg.ffn / (time.perf_counter() - t0)
        return step_flops(cfg) / rate, f"its {cfg.dtype} matmul runs at {rate * 1e-9:.2f} GFLOP/s here"


class TorchCompile(TorchEager):
    """torch.compile (Inductor) of the same forward; backward by AOTAutograd."""
    compiled = True


def torch_tensor(torch, a):
    """A torch tensor sharing a NumPy array's memory (bf16 through a uint16 view)."""
    if a.dtype == np.float32:
        return torch.from_numpy(a)
    return torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16)


def to_f32(t):
    return t.float().numpy()


def torch_block_fn(cfg):
    import torch
    import torch.nn.functional as fn
    H, F = cfg.hidden, cfg.ffn

    def block(x, gamma, w1, b1, w2, b2, beta=None):
        if cfg.norm == "layernorm":
            n = fn.layer_norm(x, (H,), gamma, beta, EPS)
        else:
            n = fn.rms_norm(x, (H,), gamma, EPS)
        h = torch.addmm(b1, n, w1)
        a = fn.silu(h[:, :F]) * h[:, F:] if cfg.gated else fn.gelu(h, approximate="tanh")
        return torch.addmm(b2, a, w2)

    return block


class JaxJit:
    """JAX on the CPU: jax.jit of y and jax.vjp's gradients in one function."""

    def __init__(self, cfg, inputs, threads):
        import jax
        import jax.numpy as jnp
        jax.config.update("jax_platforms", "cpu")
        self.jax, self.cfg = jax, cfg
        flat = flat_weights(inputs, cfg)
        inputs.clear()  # keep only JAX's copies
        self.dy = jnp.asarray(flat.pop("dy"))
        self.params = {k: jnp.asarray(v) for k, v in flat.items()}
        block = jax_block_fn(cfg)

        def value_and_grads(params, dy):
            y, vjp = jax.vjp(block, params)
            return y, vjp(dy)[0]

        self.fn = jax.jit(value_and_grads)
        self.y = self.grads = None

    def prepare(self):
        pass

    def step(self):
        t0 = time.perf_counter()
        self.y, self.grads = self.jax.block_until_ready(self.fn(self.params, self.dy))
        return None, time.perf_counter() - t0

    def outputs(self):
        return (np.asarray(self.y).astype(np.float32),
                np.asarray(self.grads["x"]).astype(np.float32))


def jax_block_fn(cfg):
    import jax
    import jax.numpy as jnp
    F, f32 = cfg.ffn, jnp.float32

    def block(p):
        x = p["x"].astype(f32)
        if cfg.norm == "layernorm":
            xc = x - jnp.mean(x, -1, keepdims=True)
            n = xc * jax.lax.rsqrt(jnp.mean(xc * xc, -1, keepdims=True) + EPS) * p["gamma"] + p["beta"]
        else:
            n = x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + EPS) * p["gamma"]
        dt = p["x"].dtype
        h = jnp.dot(n.astype(dt), p["w1"], preferred_element_type=f32) + p["b1"]
        a = jax.nn.silu(h[:, :F]) * h[:, F:] if cfg.gated else jax.nn.gelu(h, approximate=True)
        return (jnp.dot(a.astype(dt), p["w2"], preferred_element_type=f32) + p["b2"]).astype(dt)

    return block


class NumpyManual:
    """Plain NumPy (its bundled BLAS) with a hand-written backward; float32 only."""

    def __init__(self, cfg, inputs, threads):
        if cfg.dtype != "f32":
            raise NotAvailable("NumPy has no bf16 BLAS")
        self.cfg, self.inp = cfg, flat_weights(inputs, cfg)
        self.y = self.grads = None

    def prepare(self):
        pass

    def step(self):
        t0 = time.perf_counter()
        self.y, saved = numpy_forward(self.cfg, self.inp)
        t1 = time.perf_counter()
        self.grads = numpy_backward(self.cfg, self.inp, saved)
        return t1 - t0, time.perf_counter() - t0

    def outputs(self):
        return self.y, self.grads["dx"]


GELU_K, GELU_C = np.float32(np.sqrt(2 / np.pi)), np.float32(0.044715)


def numpy_norm(cfg, p):
    x = p["x"]
    if cfg.norm == "layernorm":
        x = x - x.mean(-1, keepdims=True)
    rs = 1.0 / np.sqrt((x * x).mean(-1, keepdims=True) + np.float32(EPS))
    xhat = x * rs
    n = xhat * p["gamma"] + p["beta"] if cfg.has_beta else xhat * p["gamma"]
    return n, xhat, rs


def numpy_forward(cfg, p):
    n, xhat, rs = numpy_norm(cfg, p)
    h = n @ p["w1"] + p["b1"]
    if cfg.gated:
        g, lin = h[:, :cfg.ffn], h[:, cfg.ffn:]
        sig = 1.0 / (1.0 + np.exp(-g))
        a = g * sig * lin
    else:
        t = np.tanh(GELU_K * (h + GELU_C * h * h * h))
        a = 0.5 * h * (1.0 + t)
    y = a @ p["w2"] + p["b2"]
    return y, dict(n=n, xhat=xhat, rs=rs, h=h, a=a, aux=sig if cfg.gated else t)


def numpy_dact(cfg, da, s):
    """dL/dh from dL/da: silu(g) * lin for the gated pair, the tanh gelu otherwise."""
    h = s["h"]
    if cfg.gated:
        g, lin, sig = h[:, :cfg.ffn], h[:, cfg.ffn:], s["aux"]
        dg = da * lin * sig * (1.0 + g * (1.0 - sig))
        return np.concatenate([dg, da * g * sig], axis=1)
    t = s["aux"]
    return da * (0.5 * (1.0 + t) + 0.5 * h * (1.0 - t * t) * GELU_K * (1.0 + 3.0 * GELU_C * h * h))


def numpy_backward(cfg, p, s):
    dy = p["dy"]
    g = dict(db2=dy.sum(0), dw2=s["a"].T @ dy)
    dh = numpy_dact(cfg, dy @ p["w2"].T, s)
    g.update(db1=dh.sum(0), dw1=s["n"].T @ dh)
    dn = dh @ p["w1"].T
    g["dgamma"] = (dn * s["xhat"]).sum(0)
    if cfg.has_beta:
        g["dbeta"] = dn.sum(0)
    dxhat = dn * p["gamma"]
    xhat = s["xhat"]
    dx = dxhat - xhat * (dxhat * xhat).mean(-1, keepdims=True)
    if cfg.has_beta:
        dx -= dxhat.mean(-1, keepdims=True)
    g["dx"] = dx * s["rs"]
    return g


IMPLEMENTATIONS = {"lnmlp": Lnmlp, "torch": TorchEager, "torch.compile": TorchCompile,
                   "jax": JaxJit, "numpy": NumpyManual}


# --- the timed run --------------------------------------------------------------------------------
def progress(msg):
    """A progress line for the parent process (which shows it on its status line)."""
    sys.stderr.write("@progress " + msg + "\n")
    sys.stderr.flush()


def time_impl(impl, warmup, iters):
    """Warm-up, then timed steps; memory relative to the RSS right before the first forward."""
    baseline = current_rss_bytes()
    can_reset = reset_peak_rss()
    impl.prepare()
    for i in range(warmup):
        progress(f"warm-up {i + 1}/{warmup}")
        impl.step()
    peak_warm = max_rss_bytes()
    reset_peak_rss()
    fwd, total = [], []
    for i in range(iters):
        progress(f"run {i + 1}/{iters}")
        f, t = impl.step()
        fwd.append(f)
        total.append(t)
    peak_timed = max_rss_bytes()
    return dict(
        total_ms=[t * 1e3 for t in total],
        forward_ms=None if fwd[0] is None else [f * 1e3 for f in fwd],
        median_ms=statistics.median(total) * 1e3,
        baseline_mib=baseline / MIB,
        peak_extra_mib=(max(peak_warm, peak_timed) - baseline) / MIB,
        steady_extra_mib=(peak_timed - baseline) / MIB,
        peak_reset=can_reset)


def run_impl(spec):
    """Worker entry for one (configuration, implementation): timings and y, dx dumps."""
    cfg = Config(**spec["config"])
    inputs = make_inputs(cfg)
    impl = IMPLEMENTATIONS[spec["impl"]](cfg, inputs, spec["threads"])
    del inputs
    if hasattr(impl, "estimate_step_s"):
        est, why = impl.estimate_step_s()
        if est > spec["step_limit_s"]:
            raise TooSlow(f"not run: {why}", est)
    result = time_impl(impl, spec["warmup"], spec["iters"])
    y, dx = impl.outputs()
    np.save(spec["dump"] + ".y.npy", np.asarray(y, dtype=np.float32))
    np.save(spec["dump"] + ".dx.npy", np.asarray(dx, dtype=np.float32))
    result["versions"] = framework_versions(spec["impl"])
    return result


def run_scaling(spec):
    """Worker entry for the scaling sweep: lnmlp alone over spec["tokens_list"] at one dtype and
    thread count; iterations chosen so that each point takes about spec["budget_s"]."""
    points = []
    for T in spec["tokens_list"]:
        cfg = Config(**dict(spec["config"], tokens=T))
        impl = Lnmlp(cfg, make_inputs(cfg), spec["threads"])
        impl.prepare()
        progress(f"T={T} warm-up")
        first = impl.step()[1]
        iters = int(min(spec["max_iters"], max(spec["min_iters"], spec["budget_s"] // max(first, 1e-9))))
        times = []
        for i in range(iters):
            progress(f"T={T} run {i + 1}/{iters}")
            times.append(impl.step()[1])
        points.append(dict(tokens=T, median_ms=statistics.median(times) * 1e3,
                           total_ms=[t * 1e3 for t in times]))
        impl.plan.close()
    return dict(points=points, versions=framework_versions("lnmlp"))


def framework_versions(impl):
    versions = {"numpy": np.__version__}
    if impl == "lnmlp":
        import lnmlp
        versions.update(lnmlp=lnmlp.__version__, lnmlp_build=lnmlp.build_info())
    elif impl.startswith("torch"):
        import torch
        versions["torch"] = torch.__version__
    elif impl == "jax":
        import jax
        import jaxlib
        versions.update(jax=jax.__version__, jaxlib=jaxlib.__version__)
    return versions


def worker_main(spec_json, result_path):
    """Runs one job and writes its result (or the reason it is n/a) as JSON to result_path."""
    spec = json.loads(spec_json)
    try:
        if spec.get("serving"):
            import serving
            result = serving.run_serving(spec)
        else:
            result = run_scaling(spec) if spec["impl"] == "scaling" else run_impl(spec)
        result["status"] = "ok"
    except NotAvailable as e:
        result = dict(status="n/a", reason=str(e))
    except TooSlow as e:
        result = dict(status="too slow", reason=str(e), estimate_ms=e.estimate_s * 1e3)
    except Exception as e:  # a peer that fails (e.g. torch.compile without a compiler) is n/a
        traceback.print_exc()
        first = (str(e).strip().splitlines() or [""])[0]
        result = dict(status="n/a", reason=f"{type(e).__name__}: {first}"[:160])
    with open(result_path, "w") as f:
        json.dump(result, f)
