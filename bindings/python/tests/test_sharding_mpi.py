"""One MPI test: bindings/python/tests/mpi/sharded_plan_mpi.py under `mpirun -np 2` (skipped when
mpi4py or mpirun is missing, or the library was built without MPI)."""
import os
import shutil
import subprocess
import sys

import pytest

import lnmlp


def _mpi_built():
    return "MPI communicator: built" in lnmlp.build_info()


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not found")
def test_sharded_plan_over_mpi4py():
    pytest.importorskip("mpi4py")
    if not _mpi_built():
        pytest.skip("liblnmlp was built without MPI (LNMLP_MPI)")
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(lnmlp.__file__)))  # this lnmlp, in the ranks too
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1",
               PYTHONPATH=os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p))
    script = os.path.join(os.path.dirname(__file__), "mpi", "sharded_plan_mpi.py")
    r = subprocess.run(["mpirun", "-np", "2", sys.executable, script], env=env, capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "sharded plan over mpi4py: ok" in r.stdout


def test_sharding_arguments_are_checked():
    with pytest.raises(lnmlp.InvalidArgumentError, match="communicator"):
        lnmlp.Plan(8, 16, 12, sharding=(2, 0, False))  # a group needs a communicator
    with pytest.raises(lnmlp.InvalidArgumentError):
        lnmlp.Plan(8, 16, 12, sharding=(2, 2, False))  # rank out of range
    with pytest.raises(lnmlp.InvalidArgumentError):
        lnmlp.Plan(8, 16, 12, sharding=(2, 0))  # not a triple
    with pytest.raises(lnmlp.InvalidArgumentError, match="mpi4py"):
        lnmlp.Plan(8, 16, 12, sharding=(1, 0, False), comm="not a communicator")
    assert lnmlp.query_support("cpu", "sharding") is True
