"""One rank of test_torch_distributed.py's gloo process group, and what the test shares with it.

`python3 torch_dist_rank.py RANK WORLD PORT OUT` trains a residual stack of two
lnmlp.torch.LayerNormMLP blocks under each distributed wrapper in CASES, on this rank's share of
every step's batch, and saves per case what the test compares with one process on the whole batch:
the rank's outputs, the whole gradients after each step (DTensor shards gathered) and the whole
parameters after the last one, to OUT/rank<RANK>.pt. The FSDP2 case also saves a
torch.distributed.checkpoint to OUT/dcp, which the test loads into one process.

Each rank's loss is WORLD * sum(y * dy) over its tokens, so that the wrappers' average over ranks
is the gradient of sum(y * dy) over the whole batch, which the reference computes in one process.
"""

import os
import sys

import torch

H, F, TOKENS, STEPS, LR = 32, 48, 16, 2, 0.05
# name -> (wrapper, its options)
CASES = {"fsdp2": ("fsdp2", {}), "fsdp2_bf16": ("fsdp2", {"param_dtype": torch.bfloat16}),
         "ddp": ("ddp", {}), "ddp_bucket_view": ("ddp", {"gradient_as_bucket_view": True})}


def stack(block):
    from _torch_reference import Residual
    return Residual([block() for _ in range(2)])


def initial_state(model):
    from _torch_reference import random_state
    return random_state(model, seed=11, scale=0.2)


def batches():
    """Every step's whole batch: (x [TOKENS, H], dy [TOKENS, H]) in float32."""
    g = torch.Generator().manual_seed(12)
    return [(torch.randn(TOKENS, H, generator=g), torch.randn(TOKENS, H, generator=g)) for _ in range(STEPS)]


def _whole(t):
    """A tensor as a plain full tensor (a DTensor's shards gathered), detached, fp32, on the CPU."""
    full = getattr(t, "full_tensor", None)
    return (full() if full is not None else t).detach().float().cpu().clone()


def _wrap(model, wrapper, options, world):
    if wrapper == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model, **options)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mesh = init_device_mesh("cpu", (world,))
    policy = MixedPrecisionPolicy(param_dtype=options.get("param_dtype"))
    for b in model.blocks:
        fully_shard(b, mesh=mesh, mp_policy=policy)
    return fully_shard(model, mesh=mesh, mp_policy=policy)


def run_case(wrapper, options, rank, world):
    import lnmlp.torch as lt
    model = stack(lambda: lt.LayerNormMLP(H, F, activation="swiglu"))
    model.load_state_dict(initial_state(model))
    model = _wrap(model, wrapper, options, world)
    inner = getattr(model, "module", model)  # DDP's wrapped model, for the parameters' own names
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    share = TOKENS // world
    out = {"y": [], "grads": []}
    for x, dy in batches():
        x, dy = x[rank * share:(rank + 1) * share], dy[rank * share:(rank + 1) * share]
        opt.zero_grad()
        y = model(x)
        assert y._base is None, "the model's output is a view"
        (y.float() * dy).sum().mul(world).backward()
        out["y"].append(_whole(y))
        out["grads"].append({n: _whole(p.grad) for n, p in inner.named_parameters()})
        opt.step()
    out["params"] = {n: _whole(p) for n, p in inner.named_parameters()}
    return model, out


def main():
    rank, world, port, out_dir = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    results = {}
    for name, (wrapper, options) in CASES.items():
        model, results[name] = run_case(wrapper, options, rank, world)
        if name == "fsdp2":
            # Each rank writes its own shards; the test loads them into one process.
            dcp.save(get_model_state_dict(model), checkpoint_id=os.path.join(out_dir, "dcp"))
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
