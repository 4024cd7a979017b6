"""lnmlp.torch.LayerNormMLP under PyTorch's distributed wrappers, on 2 gloo CPU processes that the
test spawns (torch_dist_rank.py): FSDP2's fully_shard (fp32, and with a bf16 MixedPrecisionPolicy),
DDP (with and without gradient_as_bucket_view) and torch.distributed.checkpoint, whose 2-rank
checkpoint is loaded into this one process. Every rank's outputs, the gathered gradients of two
SGD steps and the final parameters are compared with one process training the unfused float64
PyTorch block (_torch_reference.py) on the whole batch."""


import numpy as np
import pytest

import _reference as ref

from _requirements import torch_or_skip  # noqa: E402

torch = torch_or_skip(distributed=True)

import lnmlp.torch as lt  # noqa: E402
import torch_dist_rank as rank_job  # noqa: E402
from _ranks import run_ranks  # noqa: E402
from _torch_reference import TorchLayerNormMLP  # noqa: E402

WORLD = 2


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """The ranks' saved results (one dict per rank) and the folder they wrote."""
    out = tmp_path_factory.mktemp("torch_dist")
    run_ranks(rank_job.__file__, WORLD, out, "gloo ranks")
    return [torch.load(out / f"rank{r}.pt") for r in range(WORLD)], out


@pytest.fixture(scope="module")
def reference():
    """One process, the whole batch, float64: per step y and the gradients, then the parameters."""
    model = rank_job.stack(lambda: TorchLayerNormMLP(rank_job.H, rank_job.F, "swiglu", dtype=torch.float64))
    model.load_state_dict({n: t.double() for n, t in rank_job.initial_state(model).items()})
    opt = torch.optim.SGD(model.parameters(), lr=rank_job.LR)
    out = {"y": [], "grads": []}
    for x, dy in rank_job.batches():
        opt.zero_grad()
        y = model(x.double())
        (y * dy.double()).sum().backward()
        out["y"].append(y.detach())
        out["grads"].append({n: p.grad.detach().clone() for n, p in model.named_parameters()})
        opt.step()
    out["params"] = {n: p.detach().clone() for n, p in model.named_parameters()}
    return out


def _np(t):
    return t.detach().double().numpy()


@pytest.mark.parametrize("case", list(rank_job.CASES))
def test_two_ranks_train_as_one_process_on_the_whole_batch(ranks, reference, case):
    results, _ = ranks
    wrapper, options = rank_job.CASES[case]
    dtype = "bfloat16" if options.get("param_dtype") == torch.bfloat16 else "float32"
    share = rank_job.TOKENS // WORLD
    for step in range(rank_job.STEPS):
        for r, res in enumerate(results):
            y_ref = reference["y"][step][r * share:(r + 1) * share]
            ref.assert_close(f"{case} step {step} rank {r} y", _np(res[case]["y"][step]), _np(y_ref), dtype)
        for n, g_ref in reference["grads"][step].items():
            got = results[0][case]["grads"][step][n]
            assert torch.equal(got, results[1][case]["grads"][step][n]), f"{case}: the ranks' {n} gradients differ"
            ref.assert_close(f"{case} step {step} d{n}", _np(got), _np(g_ref), dtype)
    for n, p_ref in reference["params"].items():
        got = results[0][case]["params"][n]
        assert got.is_contiguous() and tuple(got.shape) == tuple(p_ref.shape), n
        ref.assert_close(f"{case} trained {n}", _np(got), _np(p_ref), dtype)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")  # one process, as intended
def test_a_two_rank_distributed_checkpoint_loads_into_one_process(ranks, reference):
    import torch.distributed.checkpoint as dcp
    results, out = ranks
    model = rank_job.stack(lambda: lt.LayerNormMLP(rank_job.H, rank_job.F, activation="swiglu"))
    state = model.state_dict()
    dcp.load(state, checkpoint_id=str(out / "dcp"))  # no process group: one process reads every shard
    model.load_state_dict(state)
    for n, p in model.named_parameters():
        assert torch.equal(p.detach(), results[0]["fsdp2"]["params"][n]), f"{n} did not load as it was trained"
    x = rank_job.batches()[0][0]
    ref_model = rank_job.stack(lambda: TorchLayerNormMLP(rank_job.H, rank_job.F, "swiglu", dtype=torch.float64))
    ref_model.load_state_dict(reference["params"])
    with torch.no_grad():
        ref.assert_close("dcp-loaded y", _np(model(x)), _np(ref_model(x.double())), "float32")
    assert np.isfinite(_np(model(x))).all()
