"""lnmlp.torch.LayerNormMLP and TransformerEngine's ``_extra_state``: TE's delayed-scaling checkpoints
load strictly and training goes on as TE's would, lnmlp writes what TE reads, and nothing but the
format's own types is ever unpickled.

TransformerEngine is not installable here, so its side is rebuilt from its source: the recipe
classes (``transformer_engine/common/recipe/__init__.py``: ``_FormatHelper``, ``Format``,
``DelayedScaling``'s fields and defaults) as modules of TE's names, the payload as
``TransformerEngineBaseModule.get_extra_state`` pickles it (``pytorch/module/base.py``), the slots
LayerNormMLP quantizes with (``pytorch/module/layernorm_mlp.py``, ``_get_quantizers``), and the
amax/scale update (``common/recipe/delayed_scaling.cu``) simulated in NumPy from a recorded amax
sequence."""

import dataclasses
import enum
import os
import pickle
import sys
import types
from typing import Callable, NamedTuple, Optional, Union

import numpy as np
import pytest

from _requirements import torch_or_skip  # noqa: E402

torch = torch_or_skip()

import lnmlp  # noqa: E402
import lnmlp.torch as lt  # noqa: E402

H, F, L = 16, 24, 4
E4M3_MAX, E5M2_MAX = 448.0, 57344.0
# lnmlp's quantizers (ln_out, w1, act_out, w2, dy, dh) -> TE LayerNormMLP's (fp8_meta key, slot):
# GEMM1_INPUT, GEMM1_WEIGHT, GEMM2_INPUT, GEMM2_WEIGHT; GRAD_OUTPUT2, GRAD_OUTPUT1.
TE_SLOTS = (("fwd", 0), ("fwd", 1), ("fwd", 3), ("fwd", 4), ("bwd", 2), ("bwd", 0))


@pytest.fixture
def te_recipe_module():
    """TE's recipe module as its source defines the parts a checkpoint pickles, under its names."""

    class _FormatHelper(NamedTuple):
        max_fwd: float
        max_bwd: float

    class Format(enum.Enum):
        E2M1 = _FormatHelper(max_fwd=6, max_bwd=6)
        E4M3 = _FormatHelper(max_fwd=448, max_bwd=448)
        E5M2 = _FormatHelper(max_fwd=57344, max_bwd=57344)
        HYBRID = _FormatHelper(max_fwd=448, max_bwd=57344)

    @dataclasses.dataclass(repr=False)
    class DelayedScaling:
        margin: int = 0
        fp8_format: Format = Format.HYBRID
        amax_history_len: int = 1024
        amax_compute_algo: Union[str, Callable] = "max"
        scaling_factor_compute_algo: Optional[Callable] = None
        reduce_amax: bool = True
        fp8_dpa: bool = False
        fp8_mha: bool = False
        backward_override: Optional[str] = None

    @dataclasses.dataclass(repr=False)
    class Float8CurrentScaling:
        fp8_format: Format = Format.HYBRID

    mod = types.ModuleType("transformer_engine.common.recipe")
    for cls in (_FormatHelper, Format, DelayedScaling, Float8CurrentScaling):
        cls.__module__ = mod.__name__
        cls.__qualname__ = cls.__name__
        setattr(mod, cls.__name__, cls)
    names = ("transformer_engine", "transformer_engine.common", "transformer_engine.common.recipe")
    assert not any(n in sys.modules for n in names), "a real TransformerEngine is imported"
    sys.modules.update({names[0]: types.ModuleType(names[0]), names[1]: types.ModuleType(names[1]), names[2]: mod})
    try:
        yield mod
    finally:
        for n in names:
            sys.modules.pop(n, None)


def te_extra_state(recipe, state: Optional[dict]) -> torch.Tensor:
    """What TE's get_extra_state returns for a LayerNormMLP with this recipe and fp8_meta tensors."""
    payload = {"recipe": recipe, **(state or {}),
               "extra_fp8_variables": {"fp8_checkpoint": True, "num_gemms": 2, "fp8_max_fwd": 448.0}}
    return torch.frombuffer(bytearray(pickle.dumps(payload)), dtype=torch.uint8)


def te_simulate(amaxes: np.ndarray, margin=0) -> dict:
    """TE's fp8_meta after len(amaxes) steps: each step its quantizers write the amax into history
    row 0, then delayed_scaling.cu's update rolls each column (new[i] = old[i+1], new[L-1] =
    old[0]), takes the max over those L values for the scale (fmt_max / amax / 2^margin; kept
    when the amax is 0) and zeroes row 0. amaxes: [steps, 6] in lnmlp's quantizer order."""
    tensors = {d: [np.ones(n, np.float32), np.zeros((L, n), np.float32)] for d, n in (("fwd", 6), ("bwd", 4))}
    for step in amaxes:
        for q, (d, slot) in enumerate(TE_SLOTS):
            scale, hist = tensors[d]
            hist[0, slot] = step[q]
            rolled = np.concatenate([hist[1:, slot], hist[:1, slot]])
            amax = rolled.max()
            fmt_max = E4M3_MAX if d == "fwd" else E5M2_MAX
            if amax > 0:
                scale[slot] = np.float32(fmt_max) / np.float32(amax) / np.float32(2.0 ** margin)
            rolled[0] = 0
            hist[:, slot] = rolled
    return {f"{k}_{d}": torch.from_numpy(v.copy()) for d, (s, h) in tensors.items()
            for k, v in (("scale", s), ("amax_history", h))}


def train(m, xs, recipe=None):
    """Steps of forward + backward; the state after each, and the outputs."""
    states, ys = [], []
    for x in xs:
        if recipe is None:
            y = m(x)
        else:
            with lt.fp8_autocast(fp8_recipe=recipe):
                y = m(x)
        y.square().sum().backward()
        states.append(m.fp8_state.clone())
        ys.append(y.detach())
    return states, ys


def params(m):
    return {k: v for k, v in m.state_dict().items() if k != "_extra_state"}


def test_a_te_delayed_scaling_checkpoint_loads_and_training_goes_on_as_in_te(te_recipe_module):
    torch.manual_seed(3)
    recipe = lnmlp.DelayedScaling(amax_history_len=L)
    a = lt.LayerNormMLP(H, F, activation="gelu", fp8_recipe=recipe)
    xs = [torch.randn(12, H) for _ in range(7)]
    states, ys_a = train(a, xs)
    amaxes = np.stack([s[:, 1].numpy() for s in states[:5]])  # each step's amax, newest entry
    te = te_simulate(amaxes)
    te_recipe = te_recipe_module.DelayedScaling(amax_history_len=L)
    sd = dict(params(a), _extra_state=te_extra_state(te_recipe, te))

    b = lt.LayerNormMLP(H, F, activation="gelu", fp8_recipe=recipe)
    b.load_state_dict(sd, strict=True)
    # TE's scales are lnmlp's, bit for bit; its history lnmlp's but the oldest entry (dropped unused).
    torch.testing.assert_close(b.fp8_state[:, 0], states[4][:, 0], rtol=0, atol=0)
    torch.testing.assert_close(b.fp8_state[:, 1:L], states[4][:, 1:L], rtol=0, atol=0)
    with torch.no_grad():
        a.fp8_state.copy_(states[4])  # a goes on from step 5's state too (the weights are unchanged)
    for x in xs[5:]:
        ya, yb = a(x), b(x)
        torch.testing.assert_close(yb, ya, rtol=0, atol=0)
        ya.square().sum().backward()
        yb.square().sum().backward()
        torch.testing.assert_close(b.fp8_state, a.fp8_state, rtol=0, atol=0)

    # A module without a recipe takes the checkpoint's (amax_history_len from TE's tensors).
    c = lt.LayerNormMLP(H, F, activation="gelu")
    c.load_state_dict(sd, strict=True)
    assert c.fp8_state.shape == (6, 1 + L) and c._state_recipe == recipe


def test_lnmlp_writes_what_te_reads(te_recipe_module):
    torch.manual_seed(4)
    recipe = lnmlp.DelayedScaling(amax_history_len=L, margin=1, amax_compute_algo="most_recent")
    m = lt.LayerNormMLP(H, F, activation="swiglu", fp8_recipe=recipe)
    states, _ = train(m, [torch.randn(8, H) for _ in range(6)])
    amaxes = np.stack([s[:, 1].numpy() for s in states])
    extra = m.state_dict()["_extra_state"]
    got = pickle.loads(extra.numpy().tobytes())  # TE's own loader, with TE's classes importable
    assert isinstance(got["recipe"], te_recipe_module.DelayedScaling)
    assert got["recipe"].fp8_format is te_recipe_module.Format.HYBRID
    assert (got["recipe"].margin, got["recipe"].amax_history_len, got["recipe"].amax_compute_algo) == \
        (1, L, "most_recent")
    assert got["extra_fp8_variables"]["num_gemms"] == 2
    want = te_simulate(amaxes, margin=1)
    for k in ("amax_history_fwd", "amax_history_bwd"):
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=0)
    for k, d in (("scale_fwd", "fwd"), ("scale_bwd", "bwd")):  # lnmlp's slots (most_recent: not TE-simulated)
        for q, (dd, slot) in enumerate(TE_SLOTS):
            if dd == d:
                assert float(got[k][slot]) == float(states[-1][q, 0])
    assert float(got["scale_fwd"][2]) == 1.0 and float(got["scale_bwd"][1]) == 1.0  # slots lnmlp has not


def test_a_format_pickled_by_name_loads_too(te_recipe_module):
    """Python versions pickle an Enum member as Format(value) or as getattr(Format, name); both are
    read (getattr admitted for TE's Format alone)."""
    Format = te_recipe_module.Format

    class ByName:
        def __reduce__(self):
            return getattr, (Format, "E4M3")

    te = te_simulate(np.full((2, 6), 3.0, np.float32))
    recipe = te_recipe_module.DelayedScaling(amax_history_len=L, fp8_format=ByName())
    extra = te_extra_state(recipe, te)
    assert b"getattr" in extra.numpy().tobytes()
    m = lt.LayerNormMLP(H, F, activation="gelu", device="cpu")
    m.load_state_dict(dict(params(m), _extra_state=extra))
    assert m._state_recipe == lnmlp.DelayedScaling(amax_history_len=L, fp8_format="E4M3")

    class OtherGetattr:
        def __reduce__(self):
            return getattr, (te_recipe_module.DelayedScaling, "__init__")

    bad = te_extra_state(te_recipe_module.DelayedScaling(amax_history_len=L, fp8_format=OtherGetattr()), te)
    with pytest.raises(lnmlp.InvalidArgumentError, match="getattr on something other than TE's Format"):
        m.load_state_dict(dict(params(m), _extra_state=bad))


def test_what_te_writes_without_delayed_state_loads_and_changes_nothing(te_recipe_module):
    m = lt.LayerNormMLP(H, F, activation="gelu", fp8_recipe=lnmlp.DelayedScaling(amax_history_len=L))
    before = m.fp8_state.clone()
    for extra in (torch.empty(0, dtype=torch.uint8),  # TE >= 2: no FP8, or a stateless recipe
                  te_extra_state(te_recipe_module.Float8CurrentScaling(), None),  # older TEs pickled those
                  torch.frombuffer(bytearray(pickle.dumps({})), dtype=torch.uint8)):
        m.load_state_dict(dict(params(m), _extra_state=extra), strict=True)
        assert torch.equal(m.fp8_state, before)


def test_a_te_1x_checkpoint_without_a_recipe_is_delayed_scaling():
    te = te_simulate(np.full((2, 6), 3.0, np.float32))
    payload = dict(te, scale_inv_fwd=1 / te["scale_fwd"], scale_inv_bwd=1 / te["scale_bwd"],
                   extra_fp8_variables={"num_gemms": 2})
    m = lt.LayerNormMLP(H, F, activation="gelu")
    m.load_state_dict(dict(params(m), _extra_state=torch.frombuffer(bytearray(pickle.dumps(payload)),
                                                                    dtype=torch.uint8)))
    assert torch.allclose(m.fp8_state[:4, 0], torch.tensor(448.0 / 3.0))
    assert torch.equal(m.fp8_state[:, 1:3], torch.full((6, 2), 3.0))


def test_an_older_lnmlp_checkpoint_with_fp8_state_still_loads():
    torch.manual_seed(6)
    recipe = lnmlp.DelayedScaling(amax_history_len=L)
    a = lt.LayerNormMLP(H, F, activation="gelu", fp8_recipe=recipe)
    train(a, [torch.randn(8, H) for _ in range(3)])
    old = dict(params(a), fp8_state=a.fp8_state.clone())  # the format before _extra_state
    b = lt.LayerNormMLP(H, F, activation="gelu")
    b.load_state_dict(old, strict=True)
    assert torch.equal(b.fp8_state, a.fp8_state)
    x = torch.randn(8, H)
    with lt.fp8_autocast(fp8_recipe=recipe):
        torch.testing.assert_close(b(x), a(x), rtol=0, atol=0)


class _Exploit:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return os.system, (f"touch {self.path}",)


def _custom_algo(history):  # pragma: no cover - never called: the checkpoint is refused
    return history.max()


def test_what_lnmlp_refuses_in_a_te_checkpoint_it_names_and_changes_nothing(te_recipe_module, tmp_path):
    m = lt.LayerNormMLP(H, F, activation="gelu", fp8_recipe=lnmlp.DelayedScaling(amax_history_len=L))
    before = dict(params(m), fp8_state=m.fp8_state.clone())
    te = te_simulate(np.full((3, 6), 2.0, np.float32))
    R = te_recipe_module.DelayedScaling
    marker = tmp_path / "ran"
    pending = dict(te, amax_history_fwd=te["amax_history_fwd"].clone())
    pending["amax_history_fwd"][0, 1] = 5.0
    cases = [
        (torch.frombuffer(bytearray(pickle.dumps({"recipe": _Exploit(marker)})), dtype=torch.uint8),
         lnmlp.InvalidArgumentError, r"refers to (posix|os)\.system, which lnmlp does not load"),
        (te_extra_state(R(amax_history_len=L, amax_compute_algo=_custom_algo), te),
         lnmlp.InvalidArgumentError, "_custom_algo, which lnmlp does not load"),
        (te_extra_state(R(amax_history_len=L), pending), lnmlp.NotSupportedError, "saved inside fp8_autocast"),
        (te_extra_state(R(amax_history_len=L, margin=2), te), lnmlp.InvalidArgumentError,
         r"differs from this module's fp8_recipe in margin \(checkpoint 2, module 0\)"),
        (te_extra_state(R(amax_history_len=L, fp8_format=te_recipe_module.Format.E4M3), te),
         lnmlp.InvalidArgumentError, "fp8_format .checkpoint 'E4M3', module 'HYBRID'"),
        (te_extra_state(R(amax_history_len=2 * L),
                        {k: torch.zeros(2 * L, v.shape[1]) if v.dim() == 2 else v for k, v in te.items()}),
         lnmlp.InvalidArgumentError, r"amax_history_len \(checkpoint 8, module 4\)"),
        (te_extra_state(R(amax_history_len=L), dict(te, scale_bwd=torch.ones(3))), lnmlp.InvalidArgumentError,
         r"scale_bwd'\] must be a float32 tensor \(4,\)"),
        (torch.tensor([1, 2, 3], dtype=torch.uint8), lnmlp.InvalidArgumentError, "not TransformerEngine's format"),
    ]
    for extra, error, match in cases:
        sd = {k: v + 1 if v.is_floating_point() else v for k, v in params(m).items()}
        with pytest.raises(error, match=match):
            m.load_state_dict(dict(sd, _extra_state=extra))
        assert not marker.exists(), "the checkpoint's code ran"
        for k, v in dict(params(m), fp8_state=m.fp8_state).items():
            assert torch.equal(v, before[k]), f"{k} changed by a refused load"
    current = lt.LayerNormMLP(H, F, activation="gelu", fp8_recipe=lnmlp.Float8CurrentScaling())
    with pytest.raises(lnmlp.InvalidArgumentError, match="this module's fp8_recipe is Float8CurrentScaling"):
        current.load_state_dict(dict(params(current), _extra_state=te_extra_state(R(amax_history_len=L), te)))


def test_transformer_engines_recipe_objects_are_taken_as_the_lnmlp_recipes_they_equal(te_recipe_module):
    te = te_recipe_module.DelayedScaling(margin=1, amax_history_len=L, amax_compute_algo="most_recent")
    mine = lnmlp.DelayedScaling(margin=1, amax_history_len=L, amax_compute_algo="most_recent")
    assert lt.LayerNormMLP(H, F, device="cpu", fp8_recipe=te).fp8_recipe == mine
    assert lt.QuantizerSet(te).recipe == mine
    torch.manual_seed(21)
    a = lt.LayerNormMLP(H, F, device="cpu")
    b = lt.LayerNormMLP(H, F, device="cpu")
    b.load_state_dict(a.state_dict())
    x = torch.randn(5, H)
    with lt.fp8_autocast(fp8_recipe=te):
        ya = a(x)
    with lt.fp8_autocast(fp8_recipe=mine):
        yb = b(x)
    torch.testing.assert_close(ya, yb, rtol=0, atol=0)
    assert torch.equal(a.fp8_state, b.fp8_state)
    with pytest.raises(lnmlp.NotSupportedError, match="reduce_amax"):
        lt.fp8_autocast(fp8_recipe=te_recipe_module.DelayedScaling(reduce_amax=False)).__enter__()
