"""One rank of test_torch_tensor_parallel.py's tensor-parallel group, and what the test shares with it.

`python3 torch_tp_rank.py RANK WORLD PORT OUT` makes a gloo group of WORLD CPU processes, one
tensor-parallel group of all of them, and for each case in CASES builds lnmlp.torch.LayerNormMLP
with TransformerEngine's tensor-parallel arguments (tp_group, set_parallel_mode=True, and
sequence_parallel), loads this rank's shards of the whole model's state (load_state_dict, strict,
as a TE/Megatron tensor-parallel checkpoint loads per rank), runs forward and backward on this
rank's input (under sequence parallelism its rows along the first dimension) and saves the
output, the input's gradient and every parameter's gradient to OUT/rank<RANK>.pt. The test
compares them with the float64 reference on the whole model and batch.
"""

import os
import sys

import torch

S, B, H, F = 8, 2, 32, 64  # x [S, B, H]: sequence first, as TE's (and Megatron's) sequence parallelism splits it
# name -> (dtype, sequence_parallel, compiled, the module's further arguments)
CASES = {"tp_f32": (torch.float32, False, False, {}), "tp_sp_f32": (torch.float32, True, False, {}),
         "tp_bf16": (torch.bfloat16, False, False, {}), "tp_sp_bf16": (torch.bfloat16, True, False, {}),
         "tp_sp_f32_compiled": (torch.float32, True, True, {}),
         "tp_sp_f32_ln_out": (torch.float32, True, False, {"return_layernorm_output": True}),
         "tp_f32_delay_wgrad": (torch.float32, False, False, {"delay_wgrad_compute": True})}


def whole_state():
    """The whole model's parameters (TE's names and shapes for tp_size 1), float32 on the CPU."""
    from _torch_reference import TorchLayerNormMLP, random_state
    return random_state(TorchLayerNormMLP(H, F, "swiglu"), seed=21, scale=0.2)


def inputs():
    """(x [S, B, H], dy [S, B, H]) of the whole batch, float32."""
    g = torch.Generator().manual_seed(22)
    return torch.randn(S, B, H, generator=g), torch.randn(S, B, H, generator=g)


def shard(state, rank, world):
    """This rank's TE shards of the whole state: fc1's rows of each gated half, fc2's columns."""
    f = F // world
    cols = slice(rank * f, (rank + 1) * f)
    out = dict(state)
    out["fc1_weight"] = state["fc1_weight"].view(2, F, H)[:, cols].reshape(2 * f, H)
    out["fc1_bias"] = state["fc1_bias"].view(2, F)[:, cols].reshape(2 * f)
    out["fc2_weight"] = state["fc2_weight"][:, cols].contiguous()
    return out


def rows(t, rank, world):
    """This rank's rows of a [S, B, H] tensor under sequence parallelism (first dimension)."""
    s = t.shape[0] // world
    return t[rank * s:(rank + 1) * s]


def run_case(dtype, sequence_parallel, compiled, options, rank, world, group):
    import lnmlp.torch as lt
    model = lt.LayerNormMLP(H, F, activation="swiglu", params_dtype=dtype, tp_group=group, set_parallel_mode=True,
                            sequence_parallel=sequence_parallel, **options)
    state = {n: t.to(dtype) for n, t in shard(whole_state(), rank, world).items()}
    model.load_state_dict(state, strict=True)
    x, dy = inputs()
    if sequence_parallel:
        x, dy = rows(x, rank, world), rows(dy, rank, world)
    x = x.to(dtype).requires_grad_()
    run = torch.compile(model, fullgraph=True) if compiled else model
    y = run(x)
    ln_out = None
    if options.get("return_layernorm_output"):
        y, ln_out = y
    (y.float() * dy).sum().backward()
    model.backward_dw()  # delay_wgrad_compute's weight gradients (nothing otherwise)
    return {"y": y.detach().float(), "dx": x.grad.float(), "ln_out": ln_out,
            "grads": {n: p.grad.detach().float() for n, p in model.named_parameters()}}


# FP8 under tensor parallelism, 2 ranks: name -> (recipe name, sequence_parallel); bf16, two steps.
FP8_CASES = {"tp_sp_delayed": ("DelayedScaling", True), "tp_delayed": ("DelayedScaling", False),
             "tp_sp_current": ("Float8CurrentScaling", True), "tp_sp_mxfp8": ("MXFP8BlockScaling", True),
             "tp_sp_block": ("Float8BlockScaling", True)}
# Data x tensor parallelism, 4 ranks on a 2-D mesh ("dp", "tp"): rank = 2 * data rank + tensor
# rank. name -> (dtype, recipe name or None, whether fp8_autocast's fp8_group is the 4 ranks, the
# data-parallel wrapper: "sum" (the weights' gradients summed over the data group, as DDP does; "sum
# compiled": the module under torch.compile(fullgraph=True)) or "fsdp2" (fully_shard over the
# mesh's "dp" dimension, each rank's tensor shards sharded again)).
DP_TP_CASES = {"dp_tp_f32": (torch.float32, None, False, "sum"), "dp_tp_bf16": (torch.bfloat16, None, False, "sum"),
               "fsdp2_tp_f32": (torch.float32, None, False, "fsdp2"),
               "dp_tp_delayed": (torch.bfloat16, "DelayedScaling", True, "sum"),
               "dp_tp_delayed_compiled": (torch.bfloat16, "DelayedScaling", True, "sum compiled"),
               "fsdp2_tp_delayed": (torch.bfloat16, "DelayedScaling", True, "fsdp2"),
               "dp_tp_current": (torch.bfloat16, "Float8CurrentScaling", True, "sum"),
               "dp_tp_mxfp8": (torch.bfloat16, "MXFP8BlockScaling", True, "sum"),
               "dp_tp_block": (torch.bfloat16, "Float8BlockScaling", True, "sum"),
               "dp_tp_delayed_no_fp8_group": (torch.bfloat16, "DelayedScaling", False, "sum")}
FP8_STEPS = 2


def fp8_batches():
    """Each step's whole (x [S, B, H], dy [S, B, H]), float32."""
    g = torch.Generator().manual_seed(23)
    return [(torch.randn(S, B, H, generator=g) * (1 + step), torch.randn(S, B, H, generator=g))
            for step in range(FP8_STEPS)]


def _whole(t):
    """A plain tensor (a DTensor's shards gathered), detached, fp32."""
    full = getattr(t, "full_tensor", None)
    return (full() if full is not None else t).detach().float().clone()


def _steps(model, parts, autocast, dtype=torch.bfloat16, inner=None, grad_scale=1):
    """FP8_STEPS forward + backward steps of model on parts (x, dy), the weights unchanged: per
    step y, dx, the gradients of inner's (model's) parameters (times grad_scale) and its
    delayed-scaling state after it."""
    inner = inner or model
    out = []
    for x, dy in parts:
        x = x.to(dtype).requires_grad_()
        for p in model.parameters():
            p.grad = None
        with autocast():
            y = model(x)
        (y.float() * dy).sum().backward()
        state = inner.fp8_state
        out.append({"y": y.detach().float(), "dx": x.grad.float(),
                    "grads": {n: _whole(p.grad) * grad_scale for n, p in inner.named_parameters()},
                    "state": None if state is None else state.clone()})
    return out


def run_fp8_case(recipe_name, sequence_parallel, rank, world, group):
    """The sharded module's steps on this rank's rows, and the whole module's on the whole batch
    (the same recipe; one process), which the test compares it with."""
    import lnmlp
    import lnmlp.torch as lt
    recipe = getattr(lnmlp, recipe_name)()
    whole = lt.LayerNormMLP(H, F, activation="swiglu", params_dtype=torch.bfloat16, fp8_recipe=recipe)
    whole.load_state_dict({n: t.to(torch.bfloat16) for n, t in whole_state().items()}, strict=True)
    model = lt.LayerNormMLP(H, F, activation="swiglu", params_dtype=torch.bfloat16, tp_group=group,
                            set_parallel_mode=True, sequence_parallel=sequence_parallel, fp8_recipe=recipe)
    model.load_state_dict({n: t.to(torch.bfloat16) for n, t in shard(whole_state(), rank, world).items()},
                          strict=True)
    batches = fp8_batches()
    parts = [(rows(x, rank, world), rows(dy, rank, world)) for x, dy in batches] if sequence_parallel else batches
    return {"sharded": _steps(model, parts, lt.fp8_autocast), "whole": _steps(whole, batches, lt.fp8_autocast)}


def run_dp_tp_case(dtype, recipe_name, with_group, wrapper, mesh):
    """One case of DP_TP_CASES on this rank of the ("dp", "tp") mesh: its tensor shards, its data
    replica's half of the batch (along B), fp8_autocast's fp8_group the whole world (or none)."""
    import functools

    import lnmlp
    import lnmlp.torch as lt
    from torch.distributed.fsdp import fully_shard
    dp_rank, tp_rank = mesh["dp"].get_local_rank(), mesh["tp"].get_local_rank()
    recipe = getattr(lnmlp, recipe_name)() if recipe_name else None
    model = lt.LayerNormMLP(H, F, activation="swiglu", params_dtype=dtype, tp_group=mesh["tp"].get_group(),
                            set_parallel_mode=True, fp8_recipe=recipe)
    model.load_state_dict({n: t.to(dtype) for n, t in shard(whole_state(), tp_rank, 2).items()}, strict=True)
    group = torch.distributed.group.WORLD if with_group else None
    half = B // 2
    parts = [(x[:, dp_rank * half:(dp_rank + 1) * half].contiguous(), dy[:, dp_rank * half:(dp_rank + 1) * half])
             for x, dy in fp8_batches()]
    autocast = functools.partial(lt.fp8_autocast, enabled=recipe is not None, fp8_group=group)
    if wrapper == "fsdp2":
        # FSDP2 averages the gradients over the data ranks: times 2 (exact) is their sum.
        return _steps(fully_shard(model, mesh=mesh["dp"]), parts, autocast, dtype, inner=model, grad_scale=2)
    run = torch.compile(model, fullgraph=True) if wrapper == "sum compiled" else model
    steps = _steps(run, parts, autocast, dtype, inner=model)
    for step in steps:
        for g in step["grads"].values():
            torch.distributed.all_reduce(g, group=mesh["dp"].get_group())
    return steps


def saved_bound_misses(group, rank, world):
    """The ops' saved-buffer bound (per_token * t + slack, computed from a plan of this rank's
    sharded layout) against the exact saved bytes of this rank's sharded plan, for many call sizes
    t: the (recipe, remat, sequence_parallel, t) where the bound falls short (none, the test says)."""
    import lnmlp
    import lnmlp.torch as lt
    from lnmlp.torch import _comm, _ops
    misses = []
    comm = _comm.layout_communicator(world, rank)
    for recipe in (None, lnmlp.DelayedScaling(), lnmlp.MXFP8BlockScaling()):
        for remat in ("save_all", "save_ffn1", "save_stats"):
            for sp in (False, True):
                cfg = lt._functional.config("layernorm", False, 1e-5, ("silu", "linear"), None, recipe).with_(
                    remat=lnmlp._plan._REMATS[remat], tp_group=_comm.group_number(group), sequence_parallel=int(sp))
                most = 96
                with lnmlp.Plan(most * world if sp else most, H, F, activation_type=("silu", "linear"),
                                use_bias1=True, use_bias2=True, recipe=recipe, remat=remat,
                                sharding=(world, rank, sp), comm=comm) as plan:
                    for t in range(1, most + 1, 5):
                        exact = plan.tensor_shape("saved", t)[0]
                        if exact > _ops.saved_bytes_bound(cfg, t, H, 2, F // world, torch.float32, True, True):
                            misses.append((type(recipe).__name__, remat, sp, t))
    return misses


def main():
    rank, world, port, out_dir = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    if world == 4:  # data x tensor parallelism
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        results = {name: run_dp_tp_case(*case, mesh) for name, case in DP_TP_CASES.items()}
    else:
        group = dist.new_group(list(range(world)))
        results = {name: run_case(*case, rank, world, group) for name, case in CASES.items()}
        results.update({name: run_fp8_case(*case, rank, world, group) for name, case in FP8_CASES.items()})
        results["saved_bound_misses"] = saved_bound_misses(group, rank, world)
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()  # no collective left to a gloo worker during the teardown (bench/torch/tensor_parallel.py)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
