"""lnmlp.torch.LayerNormMLP with TransformerEngine's tensor parallelism (tp_group, set_parallel_mode,
sequence_parallel) on 2 gloo CPU processes that the test spawns (torch_tp_rank.py), each holding
its TE shards of one model. Every rank's output, input gradient and parameter gradients are
compared with the unfused float64 PyTorch block (_torch_reference.py) on the whole model and batch:
the output and dx (under sequence parallelism this rank's rows of them), the weights' gradients
as this rank's shards of the whole ones, and the norm's and fc2_bias's gradients whole, identical
on both ranks. Then what the module refuses, in this one process."""

import os

import numpy as np
import pytest

import _reference as ref

from _requirements import torch_or_skip  # noqa: E402

torch = torch_or_skip(distributed=True)

import lnmlp.torch as lt  # noqa: E402
import torch_tp_rank as rank_job  # noqa: E402
from _ranks import run_ranks, run_script  # noqa: E402
from _torch_reference import TorchLayerNormMLP  # noqa: E402
from lnmlp import InvalidArgumentError, NotSupportedError  # noqa: E402

WORLD = 2
_REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")
_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16"}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("torch_tp")
    run_ranks(rank_job.__file__, WORLD, out, "tensor-parallel gloo ranks")
    return [torch.load(out / f"rank{r}.pt") for r in range(WORLD)]


def _reference(dtype):
    """y, dx and the whole parameters' gradients of the float64 block on the whole batch, its
    parameters and input rounded to `dtype` first (what the ranks start from)."""
    model = TorchLayerNormMLP(rank_job.H, rank_job.F, "swiglu", dtype=torch.float64)
    model.load_state_dict({n: t.to(dtype).double() for n, t in rank_job.whole_state().items()})
    x, dy = rank_job.inputs()
    x = x.to(dtype).double().requires_grad_()
    y = model(x)
    (y * dy.double()).sum().backward()
    return y.detach(), x.grad, {n: p.grad for n, p in model.named_parameters()}


def _np(t):
    return t.detach().double().numpy()


@pytest.mark.parametrize("case", list(rank_job.CASES))
def test_each_rank_computes_its_part_of_the_whole_block(ranks, case):
    dtype, sequence_parallel, _, _ = rank_job.CASES[case]
    name = _DTYPE_NAMES[dtype]
    y_ref, dx_ref, grads_ref = _reference(dtype)
    shards_ref = [rank_job.shard(grads_ref, r, WORLD) for r in range(WORLD)]
    for r, res in enumerate(rank[case] for rank in ranks):
        part = (lambda t: rank_job.rows(t, r, WORLD)) if sequence_parallel else (lambda t: t)  # noqa: E731
        ref.assert_close(f"{case} rank {r} y", _np(res["y"]), _np(part(y_ref)), name)
        ref.assert_close(f"{case} rank {r} dx", _np(res["dx"]), _np(part(dx_ref)), name)
        assert set(res["grads"]) == set(grads_ref)
        for n, g in res["grads"].items():
            ref.assert_close(f"{case} rank {r} d{n}", _np(g), _np(shards_ref[r][n]), name)
    for n in ("layer_norm_weight", "layer_norm_bias", "fc2_bias"):  # whole on every rank, the same bits
        assert torch.equal(ranks[0][case]["grads"][n], ranks[1][case]["grads"][n]), f"{case}: d{n} differs by rank"


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    """The 4 ranks of the data x tensor-parallel cases (rank = 2 * data rank + tensor rank)."""
    out = tmp_path_factory.mktemp("torch_dp_tp")
    run_ranks(rank_job.__file__, 4, out, "data x tensor-parallel gloo ranks")
    return [torch.load(out / f"rank{r}.pt") for r in range(4)]


def _assert_fp8_close(name, got, want):
    """A sharded FP8 call against the whole one: ref.TOLERANCE_FP8_SHARDED (the order of fp32 sums
    moves a few elements across an FP8 rounding boundary; a rank quantizing with its own scale
    instead of the group's errs by far more)."""
    got, want = _np(got), _np(want)
    err = float(np.max(np.abs(got - want))) / max(float(np.max(np.abs(want))), 1e-30)
    assert err <= ref.TOLERANCE_FP8_SHARDED, f"{name}: normalised error {err:.3e}"


@pytest.mark.parametrize("case", list(rank_job.FP8_CASES))
def test_fp8_under_tensor_parallelism_is_the_whole_blocks_fp8(ranks, case):
    """Each rank's part of the whole module's outputs and gradients, with the same FP8 scaling
    state on every rank as the whole module keeps, bit for bit (the library reduces every amax
    over the tensor-parallel group inside the call), step after step."""
    sequence_parallel = rank_job.FP8_CASES[case][1]
    for step in range(rank_job.FP8_STEPS):
        for r in range(WORLD):
            got, whole = ranks[r][case]["sharded"][step], ranks[r][case]["whole"][step]
            part = (lambda t: rank_job.rows(t, r, WORLD)) if sequence_parallel else (lambda t: t)  # noqa: E731
            _assert_fp8_close(f"{case} step {step} rank {r} y", got["y"], part(whole["y"]))
            _assert_fp8_close(f"{case} step {step} rank {r} dx", got["dx"], part(whole["dx"]))
            shards = rank_job.shard(whole["grads"], r, WORLD)
            for n, g in got["grads"].items():
                _assert_fp8_close(f"{case} step {step} rank {r} d{n}", g, shards[n])
            if whole["state"] is not None:
                assert torch.equal(got["state"], whole["state"]), f"{case} step {step} rank {r}: state differs"


def _whole_module_steps(dtype, recipe_name, parts):
    """The whole module's steps in one process on parts (the grid's reference)."""
    import lnmlp
    recipe = getattr(lnmlp, recipe_name)() if recipe_name else None
    whole = lt.LayerNormMLP(rank_job.H, rank_job.F, activation="swiglu", params_dtype=dtype, fp8_recipe=recipe,
                            device="cpu")
    whole.load_state_dict({n: t.to(dtype) for n, t in rank_job.whole_state().items()})
    return rank_job._steps(whole, parts, lambda: lt.fp8_autocast(enabled=recipe is not None), dtype)


def _grid_reference(dtype, recipe_name):
    """Per data rank and step (y, dx, the gradients) of the whole module. Unquantized and under
    delayed scaling (its state agreed over the fp8_group) a data replica computes its part of one
    step on the whole batch. A stateless recipe quantizes each replica's half with the half's own
    scales, as TransformerEngine does: then the reference is the whole module on each half, its
    weight gradients summed over the halves."""
    import lnmlp
    half = rank_job.B // 2
    halves = [[(x[:, d * half:(d + 1) * half].contiguous(), dy[:, d * half:(d + 1) * half])
               for x, dy in rank_job.fp8_batches()] for d in range(2)]
    if recipe_name is None or getattr(lnmlp, recipe_name)().stateful:
        whole = _whole_module_steps(dtype, recipe_name, rank_job.fp8_batches())
        return [[dict(step, y=step["y"][:, d * half:(d + 1) * half], dx=step["dx"][:, d * half:(d + 1) * half])
                 for step in whole] for d in range(2)]
    per_half = [_whole_module_steps(dtype, recipe_name, parts) for parts in halves]
    return [[dict(per_half[d][s], grads={n: per_half[0][s]["grads"][n] + per_half[1][s]["grads"][n]
                                         for n in per_half[d][s]["grads"]})
             for s in range(rank_job.FP8_STEPS)] for d in range(2)]


@pytest.mark.parametrize("case", [c for c, (_, _, with_group, _) in rank_job.DP_TP_CASES.items()
                                  if with_group or rank_job.DP_TP_CASES[c][1] is None])
def test_data_x_tensor_parallel_ranks_compute_their_parts_of_the_whole_block(grid, case):
    """2 data x 2 tensor ranks (the data-parallel gradients summed as DDP, or FSDP2 over the mesh's
    "dp" dimension): every rank's parts of the whole module's outputs and of its gradients, each
    step (_grid_reference); with delayed scaling and fp8_autocast(fp8_group=<the 4 ranks>) every
    rank ends each step with the state the whole module keeps on the whole batch, bit for bit."""
    dtype, recipe_name, _, _ = rank_job.DP_TP_CASES[case]
    want = _grid_reference(dtype, recipe_name)
    for step in range(rank_job.FP8_STEPS):
        for r in range(4):
            dp_rank, tp_rank = r // 2, r % 2
            got, w = grid[r][case][step], want[dp_rank][step]
            close = _assert_fp8_close if recipe_name else \
                (lambda name, g, w: ref.assert_close(name, _np(g), _np(w), _DTYPE_NAMES[dtype]))  # noqa: E731
            close(f"{case} step {step} rank {r} y", got["y"], w["y"])
            close(f"{case} step {step} rank {r} dx", got["dx"], w["dx"])
            shards = rank_job.shard(w["grads"], tp_rank, 2)
            for n, g in got["grads"].items():
                close(f"{case} step {step} rank {r} d{n}", g, shards[n])
            if w["state"] is not None:
                assert torch.equal(got["state"], w["state"]), f"{case} step {step} rank {r}: state differs"


def test_without_an_fp8_group_the_data_replicas_keep_their_own_states(grid):
    last = [grid[r]["dp_tp_delayed_no_fp8_group"][-1]["state"] for r in range(4)]
    assert torch.equal(last[0], last[1]), "the tensor-parallel group agrees without an fp8_group"
    assert not torch.equal(last[0], last[2]), "without an fp8_group the data replicas should keep their own states"


def test_the_saved_bound_covers_every_sharded_call(ranks):
    for r in range(WORLD):
        assert ranks[r]["saved_bound_misses"] == [], f"rank {r}: the ops' saved bound falls short"


def test_the_norm_output_is_this_ranks_rows_and_delayed_weight_gradients_are_backwards(ranks):
    """return_layernorm_output under sequence parallelism gives this rank's rows of the norm's
    output (the float64 LayerNorm of its rows); with it, and with delay_wgrad_compute and
    backward_dw(), y and every gradient are the bits of the same module without them."""
    x = rank_job.inputs()[0].double()
    state = {n: t.double() for n, t in rank_job.whole_state().items()}
    ln = torch.nn.functional.layer_norm(x, (rank_job.H,), state["layer_norm_weight"], state["layer_norm_bias"], 1e-5)
    for r in range(WORLD):
        with_ln, plain = ranks[r]["tp_sp_f32_ln_out"], ranks[r]["tp_sp_f32"]
        ref.assert_close(f"rank {r} ln_out", _np(with_ln["ln_out"]), _np(rank_job.rows(ln, r, WORLD)), "float32")
        delayed, whole_backward = ranks[r]["tp_f32_delay_wgrad"], ranks[r]["tp_f32"]
        for got, want in ((with_ln, plain), (delayed, whole_backward)):
            assert torch.equal(got["y"], want["y"]) and torch.equal(got["dx"], want["dx"])
            for n, g in want["grads"].items():
                assert torch.equal(got["grads"][n], g), n


def test_compiled_tensor_parallel_module_gives_eager_bits(ranks):
    for r in range(WORLD):
        eager, compiled = ranks[r]["tp_sp_f32"], ranks[r]["tp_sp_f32_compiled"]
        assert torch.equal(eager["y"], compiled["y"]) and torch.equal(eager["dx"], compiled["dx"])
        for n, g in eager["grads"].items():
            assert torch.equal(g, compiled["grads"][n]), n


def test_each_rank_holds_te_shard_shapes_and_attributes():
    m = lt.LayerNormMLP(16, 64, activation="swiglu", tp_size=4, set_parallel_mode=True, sequence_parallel=True,
                        device="cpu")
    shapes = {n: tuple(p.shape) for n, p in m.named_parameters()}
    assert shapes == {"layer_norm_weight": (16,), "layer_norm_bias": (16,), "fc1_weight": (32, 16),
                      "fc1_bias": (32,), "fc2_weight": (16, 16), "fc2_bias": (16,)}
    assert m.size_per_partition == 16 and m.sequence_parallel and m.tp_group is None
    assert (m.fc1_weight.partition_dim, m.fc1_bias.partition_dim, m.fc2_weight.partition_dim) == (0, 0, 1)
    assert m.fc1_weight.tensor_model_parallel and not m.layer_norm_weight.sequence_parallel
    with pytest.raises(InvalidArgumentError, match="set_tensor_parallel_group"):
        m(torch.zeros(4, 16))  # tp_size 4 and no group yet
    assert not lt.LayerNormMLP(16, 64, tp_size=1, sequence_parallel=True, device="cpu").sequence_parallel  # as TE


def test_what_tensor_parallelism_refuses():
    with pytest.raises(NotSupportedError, match="set_parallel_mode=True"):
        lt.LayerNormMLP(16, 64, tp_size=2, device="cpu")
    with pytest.raises(InvalidArgumentError, match="divisible"):
        lt.LayerNormMLP(16, 30, tp_size=4, set_parallel_mode=True, device="cpu")
    with pytest.raises(InvalidArgumentError, match="tp_size"):
        lt.LayerNormMLP(16, 64, tp_size=0, set_parallel_mode=True, device="cpu")
    with pytest.raises(InvalidArgumentError, match="ProcessGroup|not initialised"):
        lt.LayerNormMLP(16, 64, tp_group=object(), set_parallel_mode=True, device="cpu")
    with pytest.raises(NotSupportedError, match="return_layernorm_output_gathered"):
        lt.LayerNormMLP(16, 64, return_layernorm_output_gathered=True, device="cpu")


def test_fp8_autocast_takes_transformer_engines_arguments():
    import inspect
    assert list(inspect.signature(lt.fp8_autocast).parameters) == ["enabled", "calibrating", "fp8_recipe",
                                                                     "fp8_group", "_graph"]
    assert list(inspect.signature(lt.autocast).parameters) == ["enabled", "calibrating", "recipe",
                                                                 "amax_reduction_group", "_graph"]
    with pytest.raises(NotSupportedError, match="calibrating=True"):
        with lt.fp8_autocast(True, True):
            pass
    with pytest.raises(InvalidArgumentError, match="amax_reduction_group"):
        with lt.fp8_autocast(fp8_group=object()):
            pass


class _Tracker:
    """Megatron's RNG state tracker as TE calls it: fork() draws under the model-parallel
    generator (here a fixed seed), leaving the default generator as it was."""

    def __init__(self, seed):
        self.seed, self.forks = seed, 0

    def fork(self):
        import contextlib

        @contextlib.contextmanager
        def forked():
            self.forks += 1
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.seed)
                yield
        return forked()


def test_the_weights_are_drawn_under_the_rng_trackers_fork():
    torch.manual_seed(5)
    tracker = _Tracker(seed=77)
    m = lt.LayerNormMLP(16, 64, get_rng_state_tracker=lambda: tracker, device="cpu")
    after = torch.rand(1)
    assert tracker.forks == 2  # fc1_weight and fc2_weight, each under its own fork
    torch.manual_seed(77)
    want = torch.nn.init.normal_(torch.empty(64, 16), std=0.023)
    assert torch.equal(m.fc1_weight.detach(), want)
    torch.manual_seed(5)
    assert torch.equal(torch.rand(1), after)  # the default generator untouched


def test_the_llama_example_trains_beside_the_unmodified_model():
    """examples/torch/llama_tp.py: a HuggingFace Llama with lnmlp's tensor-parallel feed-forward
    sublayers on 2 ranks trains as the unmodified model does (the script fails otherwise)."""
    if os.environ.get("LNMLP_REQUIRE_TORCH") != "1":
        pytest.importorskip("transformers")
    out = run_script(os.path.join(_REPO, "examples", "torch", "llama_tp.py"), "--steps", 5)
    assert "largest relative loss difference over 5 steps" in out


def test_the_tensor_parallel_benchmark_runs():
    """bench/torch/tensor_parallel.py at a tiny shape: a row per layout and block, with the
    collectives each step ran (lnmlp's: 2 all-reduces without SP)."""
    out = run_script(os.path.join(_REPO, "bench", "torch", "tensor_parallel.py"), "--tokens", 64, "--hidden", 64,
                     "--ffn", 128, "--iters", 1, "--warmup", 0, "--dtypes", "float32")
    rows = [line for line in out.splitlines() if line.startswith("float32")]
    assert len(rows) == 4 and rows[0].split()[2] == "lnmlp" and rows[0].endswith("2 all-reduce"), out
