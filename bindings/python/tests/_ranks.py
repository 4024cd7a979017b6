"""Runs a test's processes: `python SCRIPT RANK WORLD PORT OUT_DIR` for each rank, with a free
localhost port for their rendezvous and this source tree's lnmlp first on their path, and fails the
test with a rank's output when one fails or they take too long (test_torch_distributed.py,
test_jax_distributed.py)."""

import os
import socket
import subprocess
import sys

import pytest

import lnmlp


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env():
    """The environment of a child process: one OpenMP thread, this source tree's lnmlp first on
    its path."""
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(lnmlp.__file__)))
    return dict(os.environ, OMP_NUM_THREADS="1",
                PYTHONPATH=os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p))


def run_script(path, *args, timeout=300):
    """Runs a repository script (an example, a benchmark) in a child process; fails the test with
    its output unless it exits 0; returns its standard output."""
    done = subprocess.run([sys.executable, path, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=child_env())
    assert done.returncode == 0, f"{os.path.basename(path)} failed:\n{done.stdout}{done.stderr}"
    return done.stdout


def run_ranks(script, world, out_dir, what, timeout=300):
    """Runs `world` processes of `script` writing into out_dir, and waits for all of them."""
    env = child_env()
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, script, str(r), str(world), str(port), str(out_dir)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(world)]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"the {what} did not finish in {timeout} s")
    for r, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"rank {r} of the {what} failed:\n{log}"
