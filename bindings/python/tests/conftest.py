import os
import sys

# OpenMP's default (active, spinning) wait policy makes the many small plans of these tests ~15x
# slower when other processes share the cores (seen: test_fp8_recipes.py 7 s -> 100 s on 2 loaded
# cores); passive waiting costs nothing at these sizes. Set before lnmlp loads its library.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")
# Eight CPU devices for the device-mesh tests (test_jax_mesh.py): set before jax is imported.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

# Test the package of this source tree (also when another copy is installed).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import _nvfp4_sim  # noqa: E402
import _reference  # noqa: E402


def pytest_terminal_summary(terminalreporter):
    if _nvfp4_sim.REPORT:
        terminalreporter.write_sep("-", "NVFP4 plans against the simulation: worst |got-sim| / max|sim|, exact share")
        for name, (worst, exact, n) in _nvfp4_sim.REPORT.items():
            terminalreporter.write_line(f"{name:7s} {worst:.2e}  {exact / n:6.1%} of {n} elements")
    if _reference.MESH_REPORT:
        terminalreporter.write_sep("-", "lnmlp.jax on CPU meshes: largest error against one device, HLO collectives")
        for line in _reference.MESH_REPORT:
            terminalreporter.write_line(line)
    if not _reference.MAX_ERRORS:
        return
    terminalreporter.write_sep("-", "largest normalised error per dtype (max|got-ref| / max|ref|)")
    for dt in ("float32", "float16", "bfloat16"):
        if dt in _reference.MAX_ERRORS:
            err, name = _reference.MAX_ERRORS[dt]
            terminalreporter.write_line(
                f"{dt:9s} {err:.3e}  (tolerance {_reference.TOLERANCES[dt]:.0e}; worst: {name})")
