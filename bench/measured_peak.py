"""The CPU's measured GEMM peak, as lnmlp-bench measures it, for the framework benchmarks
(bench/jax/compare.py, bench/torch/compare.py) to print each row's fraction of it."""

import json
import os
import subprocess
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def measured_peak(T, H, F, act, dtype):
    """(GFLOP/s, what) of this CPU for `dtype`'s GEMMs ("f32" or "bf16") at that shape; None when
    the build has no lnmlp-bench."""
    exe = os.path.join(REPO, "build", "release", "bench", "lnmlp-bench")
    if not os.path.exists(exe):
        return None
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "b.json")
        subprocess.run([exe, "--tokens", str(T), "--hidden", str(H), "--ffn", str(F), "--act", act, "--dtype", dtype,
                        "--iters", "1", "--json", path], check=True, capture_output=True)
        with open(path) as f:
            b = json.load(f)
    return b.get("peak_gflops"), b.get("peak_what", "")
