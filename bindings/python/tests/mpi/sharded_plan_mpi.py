"""Run under `mpirun -np 2` (bindings/python/run_tests.sh does when mpi4py imports): every rank
builds the same problem, runs the unsharded plan and its shard of a plan sharded over
MPI.COMM_WORLD (with and without sequence parallelism), and checks its shard of y and of every
gradient against the unsharded plan's (f32; sharding only reorders fp32 sums), also for calls with
fewer rows than the plans' most and with none. Exit status 0 on success on every rank."""
import sys

import numpy as np
from mpi4py import MPI

import lnmlp

comm = MPI.COMM_WORLD
P, rank = comm.Get_size(), comm.Get_rank()
T, H, F = 8, 16, 12
rng = np.random.default_rng(7)
x = rng.standard_normal((T, H)).astype(np.float32)
dy = rng.standard_normal((T, H)).astype(np.float32)
gamma = (1 + 0.1 * rng.standard_normal(H)).astype(np.float32)
beta = (0.1 * rng.standard_normal(H)).astype(np.float32)
w1 = (0.3 * rng.standard_normal((H, 2, F))).astype(np.float32)
b1 = (0.1 * rng.standard_normal((2, F))).astype(np.float32)
w2 = (0.3 * rng.standard_normal((F, H))).astype(np.float32)
b2 = (0.1 * rng.standard_normal(H)).astype(np.float32)
kw = dict(activation_type=("silu", "linear"), use_bias1=True, use_bias2=True)

full = lnmlp.Plan(T, H, F, **kw)
y_ref, saved = full.forward(x, gamma, beta, w1, b1, w2, b2)
g_ref = full.backward(dy, x, gamma, beta, w1, b1, w2, saved)

failures = []
Fl = F // P
cols = slice(rank * Fl, (rank + 1) * Fl)
for sp in (False, True):
    rows = slice(rank * T // P, (rank + 1) * T // P) if sp else slice(0, T)
    plan = lnmlp.Plan(T, H, F, sharding=(P, rank, sp), comm=comm, **kw)
    w1s, b1s, w2s = np.ascontiguousarray(w1[:, :, cols]), np.ascontiguousarray(b1[:, cols]), np.ascontiguousarray(w2[cols])
    y, saved = plan.forward(np.ascontiguousarray(x[rows]), gamma, beta, w1s, b1s, w2s, b2)
    g = plan.backward(np.ascontiguousarray(dy[rows]), np.ascontiguousarray(x[rows]), gamma, beta, w1s, b1s, w2s, saved)
    checks = [("y", y, y_ref[rows]), ("dx", g.dx, g_ref.dx[rows]), ("dgamma", g.dgamma, g_ref.dgamma),
              ("dbeta", g.dbeta, g_ref.dbeta), ("dw1", g.dw1, g_ref.dw1[:, :, cols]), ("db1", g.db1, g_ref.db1[:, cols]),
              ("dw2", g.dw2, g_ref.dw2[cols]), ("db2", g.db2, g_ref.db2)]
    for name, got, ref in checks:
        err = float(np.max(np.abs(got - ref))) / max(float(np.max(np.abs(ref))), 1e-30)
        if not err <= 1e-5:
            failures.append(f"rank {rank} sp={sp}: {name} normalised error {err:.3g}")
    # a call with fewer rows (and with none): t rows per rank, 0 .. the plan's most
    for t in (3, 0):
        if sp:  # the group's tensors are the ranks' t rows each
            pick = np.concatenate([np.arange(q * T // P, q * T // P + t) for q in range(P)]).astype(np.int64)
            mine = slice(rank * t, (rank + 1) * t)
        else:
            pick, mine = np.arange(t), slice(0, t)
        xt, dyt = np.ascontiguousarray(x[pick]), np.ascontiguousarray(dy[pick])
        y_t, saved_t = full.forward(xt, gamma, beta, w1, b1, w2, b2)
        g_t = full.backward(dyt, xt, gamma, beta, w1, b1, w2, saved_t)
        xs, dys = np.ascontiguousarray(xt[mine]), np.ascontiguousarray(dyt[mine])
        y, saved = plan.forward(xs, gamma, beta, w1s, b1s, w2s, b2)
        g = plan.backward(dys, xs, gamma, beta, w1s, b1s, w2s, saved)
        checks = [("y", y, y_t[mine]), ("dx", g.dx, g_t.dx[mine]), ("dgamma", g.dgamma, g_t.dgamma),
                  ("dbeta", g.dbeta, g_t.dbeta), ("dw1", g.dw1, g_t.dw1[:, :, cols]), ("db1", g.db1, g_t.db1[:, cols]),
                  ("dw2", g.dw2, g_t.dw2[cols]), ("db2", g.db2, g_t.db2)]
        for name, got, ref in checks:
            if got.shape != ref.shape:
                failures.append(f"rank {rank} sp={sp} t={t}: {name} shape {got.shape} != {ref.shape}")
                continue
            if ref.size == 0:
                continue
            err = float(np.max(np.abs(got - ref))) / max(float(np.max(np.abs(ref))), 1e-30)
            if not err <= 1e-5:
                failures.append(f"rank {rank} sp={sp} t={t}: {name} normalised error {err:.3g}")
    plan.close()

everything = comm.allgather(failures)
if rank == 0:
    for f in sum(everything, []):
        print(f)
    print("sharded plan over mpi4py:", "ok" if not any(everything) else "FAILED")
sys.exit(1 if any(everything) else 0)
