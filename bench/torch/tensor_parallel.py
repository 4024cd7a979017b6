"""A tensor-parallel training step on 2 gloo CPU processes: lnmlp.torch.LayerNormMLP against plain
PyTorch tensor parallelism (torch.distributed.tensor.parallel) on the same block, in one run.

Rows: per dtype and layout (TP; TP + SP, the tokens split too), the median milliseconds of a
training step (forward, then backward of sum(y * dy): the input's and every parameter's
gradients) over --iters after --warmup, the same on both ranks (a barrier before each step,
rank 0's clock), the collectives one step runs and the bytes one rank sends into them (each
collective's input: all-reduce T*H, all-gather its own rows, reduce-scatter the whole), and the
time relative to lnmlp's.

The block: LayerNorm, a SwiGLU MLP (gate and up H -> F, down F -> H, biases), x [T, H] (SP: this
rank's T/2 rows). lnmlp: LayerNormMLP(activation="swiglu", tp_group, set_parallel_mode=True[,
sequence_parallel=True]), the library's sharded plan with its collectives through
torch.distributed. Plain PyTorch: nn.LayerNorm and three nn.Linear, parallelized as torchtitan
does Llama's feed-forward: gate and up ColwiseParallel, down RowwiseParallel, the MLP's input
prepared once (PrepareModuleInput: replicated, or under SP gathered from Shard(0) after a
SequenceParallel norm; down's output reduce-scattered to Shard(0)). Both run eagerly in the
row's dtype (parameters and x). Collectives and bytes are counted as they run: lnmlp's where its
communicator calls torch.distributed, plain PyTorch's in a TorchDispatchMode over the functional
collectives DTensor issues.

    PYTHONPATH=bindings/python python3 bench/torch/tensor_parallel.py [--tokens 1024 --hidden 1024 --ffn 2048]
"""

from __future__ import annotations

import collections
import gc
import os
import socket
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as Fn
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
EPS = 1e-5


class PlainFFN(torch.nn.Module):
    """LayerNorm, then down(silu(gate(n)) * up(n)): the block in plain PyTorch."""

    def __init__(self, H, F, dtype):
        super().__init__()
        self.norm = torch.nn.LayerNorm(H, eps=EPS, dtype=dtype)
        self.mlp = torch.nn.Module()
        self.mlp.gate = torch.nn.Linear(H, F, dtype=dtype)
        self.mlp.up = torch.nn.Linear(H, F, dtype=dtype)
        self.mlp.down = torch.nn.Linear(F, H, dtype=dtype)
        self.mlp.forward = lambda n: self.mlp.down(Fn.silu(self.mlp.gate(n)) * self.mlp.up(n))

    def forward(self, x):
        return self.mlp(self.norm(x))


def plain_tp(H, F, dtype, sp, mesh):
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)
    torch.manual_seed(0)
    model = PlainFFN(H, F, dtype)
    plan = {"mlp": PrepareModuleInput(input_layouts=(Shard(0) if sp else Replicate(),),
                                      desired_input_layouts=(Replicate(),)),
            "mlp.gate": ColwiseParallel(), "mlp.up": ColwiseParallel(),
            "mlp.down": RowwiseParallel(output_layouts=Shard(0) if sp else Replicate())}
    if sp:
        plan["norm"] = SequenceParallel(sequence_dim=0)
    return parallelize_module(model, mesh, plan)


def lnmlp_tp(H, F, dtype, sp, group):
    import lnmlp.torch as lt
    torch.manual_seed(0)
    return lt.LayerNormMLP(H, F, eps=EPS, activation="swiglu", params_dtype=dtype, tp_group=group,
                           set_parallel_mode=True, sequence_parallel=sp, device="cpu")


class _Traffic:
    """Collectives and the bytes this rank puts into them, by kind."""

    def __init__(self):
        self.count, self.bytes = collections.Counter(), collections.Counter()

    def add(self, kind, tensor):
        self.count[kind] += 1
        self.bytes[kind] += tensor.numel() * tensor.element_size()


class _FunctionalCollectives(TorchDispatchMode):
    """Counts DTensor's functional collectives (plain PyTorch's tensor parallelism)."""

    KINDS = {"all_reduce": "all-reduce", "all_gather_into_tensor": "all-gather",
             "reduce_scatter_tensor": "reduce-scatter"}

    def __init__(self, traffic):
        super().__init__()
        self.traffic = traffic

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "_c10d_functional" and func._opname in self.KINDS:
            self.traffic.add(self.KINDS[func._opname], args[0])
        return func(*args, **(kwargs or {}))


def _counting_torch_distributed(traffic):
    """torch.distributed's three collectives that lnmlp's communicator calls, wrapped to count."""
    wrapped = {}
    for name, kind, arg in (("all_reduce", "all-reduce", 0), ("all_gather_into_tensor", "all-gather", 1),
                            ("reduce_scatter_tensor", "reduce-scatter", 1)):
        original = getattr(dist, name)

        def counted(*args, _original=original, _kind=kind, _arg=arg, **kwargs):
            traffic.add(_kind, args[_arg])
            return _original(*args, **kwargs)

        wrapped[name] = original
        setattr(dist, name, counted)
    return wrapped


def _steps(model, x, dy, iters, warmup, counting):
    """(median ms of iters steps after warmup, the traffic of one step)."""
    times = []
    for i in range(warmup + iters + 1):
        x.grad = None
        for p in model.parameters():
            p.grad = None
        dist.barrier()
        last = i == warmup + iters  # one more step, counted, after the timed ones
        traffic = _Traffic()
        with counting(traffic) if last else _nothing():
            t0 = time.perf_counter()
            y = model(x)
            (y.float() * dy).sum().backward()
            t = time.perf_counter() - t0
        if i >= warmup and not last:
            times.append(t)
    return 1e3 * float(np.median(times)), traffic


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *_):
        return False


class _count_lnmlp:
    def __init__(self, traffic):
        self.traffic = traffic

    def __enter__(self):
        self.saved = _counting_torch_distributed(self.traffic)

    def __exit__(self, *_):
        for name, original in self.saved.items():
            setattr(dist, name, original)
        return False


def _describe(traffic):
    kinds = [k for k in ("all-gather", "all-reduce", "reduce-scatter") if traffic.count[k]]
    return (", ".join(f"{traffic.count[k]} {k}" for k in kinds) or "none",
            sum(traffic.bytes.values()) / 2 ** 20)


def run(rank, world, port, args):
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (world,))
    T, H, F = args.tokens, args.hidden, args.ffn
    if rank == 0:
        from compare import cpu_model
        print(f"# {world} gloo processes, {args.threads} thread(s) each, on {cpu_model()}, {os.cpu_count()} cores; "
              f"torch {torch.__version__}")
        print(f"# training step T={T} H={H} F={F} LayerNorm + SwiGLU, biases; median of {args.iters} after "
              f"{args.warmup} warm-up; bytes: what one rank puts into the step's collectives")
        print(f"{'dtype':9s} {'layout':7s} {'block':14s} {'ms':>9s} {'vs lnmlp':>9s} {'MiB':>8s}  collectives")
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        for sp in (False, True):
            g = torch.Generator().manual_seed(1)
            rows = T // world if sp else T
            x = torch.randn(rows, H, generator=g).to(dtype).requires_grad_()
            dy = torch.randn(rows, H, generator=g)
            results = {}
            for name, make, counting in (("lnmlp", lambda: lnmlp_tp(H, F, dtype, sp, dist.group.WORLD), _count_lnmlp),
                                         ("plain PyTorch", lambda: plain_tp(H, F, dtype, sp, mesh),
                                          _FunctionalCollectives)):
                results[name] = _steps(make(), x, dy, args.iters, args.warmup, counting)
            if rank == 0:
                base = results["lnmlp"][0]
                for name, (ms, traffic) in results.items():
                    kinds, mib = _describe(traffic)
                    print(f"{dtype_name:9s} {'TP+SP' if sp else 'TP':7s} {name:14s} {ms:9.2f} {ms / base:9.2f} "
                          f"{mib:8.2f}  {kinds}", flush=True)
    # Every collective finished, and nothing left holding the group, before it goes: a gloo worker
    # still finishing one during the interpreter's teardown takes the GIL of a finalizing
    # interpreter and aborts the process ("terminate called without an active exception").
    dist.barrier()
    del mesh
    gc.collect()
    dist.destroy_process_group()


def main():
    from compare import step_arguments
    ap = step_arguments(__doc__)
    ap.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2), help="per process")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(run, args=(2, port, args), nprocs=2)


if __name__ == "__main__":
    main()
