"""TransformerEngine PyTorch's ``_extra_state`` format for ``LayerNormMLP``, read and written
without TransformerEngine.

TE's modules (``transformer_engine/pytorch/module/base.py``, ``get_extra_state`` /
``set_extra_state``) put their FP8 metadata in the state_dict key ``<prefix>._extra_state``: an
empty uint8 tensor without FP8 or with a stateless recipe, otherwise the bytes of
``pickle.dumps(dict)`` as a uint8 tensor, the dict holding ``recipe`` (a
``transformer_engine.common.recipe`` object), ``extra_fp8_variables`` (plain values) and, for
delayed scaling, four float32 CPU tensors: ``scale_fwd`` [6] and ``amax_history_fwd`` [L, 6] (TE's
forward slots GEMM1_INPUT, GEMM1_WEIGHT, GEMM1_OUTPUT, GEMM2_INPUT, GEMM2_WEIGHT, GEMM2_OUTPUT),
``scale_bwd`` [4] and ``amax_history_bwd`` [L, 4] (GRAD_OUTPUT1, GRAD_INPUT1, GRAD_OUTPUT2,
GRAD_INPUT2). TE 1.x wrote the tensors without ``recipe`` (delayed scaling was its only recipe).

lnmlp's quantizers are TE's slots: ln_out GEMM1_INPUT, w1 GEMM1_WEIGHT, act_out GEMM2_INPUT, w2
GEMM2_WEIGHT, dy GRAD_OUTPUT2 (fc2's output gradient), dh GRAD_OUTPUT1 (fc1's). The scales mean the
same. The histories hold the same amaxes in another order: TE's quantizers write a step's amax
into row 0, and TE's update (``common/recipe/delayed_scaling.cu``) then rolls the column up by one
and zeroes row 0, so between steps rows L-1, L-2, ..., 1 hold the newest L-1 amaxes; lnmlp keeps
them newest first and pushes a step's amax in front. So lnmlp's history is TE's rows L-1 .. 1 and
one oldest entry, which both drop before their next scale update and so never changes a scale
(written as 0 both ways). A TE state with a nonzero row 0 holds amaxes TE has not folded into its
scales yet (saved inside ``fp8_autocast``, before its update), which lnmlp has no place for: it is
refused. TE's output and grad-input slots have no lnmlp quantizer: ignored on reading, scale 1 and
zero history on writing.

Reading never runs ``pickle.loads`` on checkpoint bytes: a restricted unpickler admits only what
the format needs -- torch's CPU tensor rebuild (its storage through ``torch.load(weights_only=
True)``), ``collections.OrderedDict``, and stand-ins for TE's recipe classes and ``Format`` enum
(plain attribute holders that ``lnmlp._te_recipe`` reads as it reads TE's own objects); any other
global is refused by name. Writing emits the same globals, so TE's ``set_extra_state`` loads it
(TE itself asks for ``NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1`` before unpickling any delayed-scaling
state, its own included).
"""

from __future__ import annotations

import collections
import io
import pickle
import warnings
from typing import NamedTuple, Optional, Tuple

import torch

from .._lib import InvalidArgumentError, NotSupportedError
from .._te_recipe import from_transformer_engine
from ..recipe import DelayedScaling, Recipe

_TE_RECIPE_MODULE = "transformer_engine.common.recipe"

# lnmlp's quantizers (QUANTIZERS order) -> (TE's fp8_meta key, slot).
_TE_SLOTS = (("fwd", 0), ("fwd", 1), ("fwd", 3), ("fwd", 4), ("bwd", 2), ("bwd", 0))
_TE_SLOT_COUNTS = {"fwd": 6, "bwd": 4}  # LayerNormMLP: 2 GEMMs, 3 forward and 2 backward slots each
_DELAYED_KEYS = ("scale_fwd", "amax_history_fwd", "scale_bwd", "amax_history_bwd")


class _TEObject:
    """A TransformerEngine recipe object as unpickled here: its attributes, nothing else."""

    def __setstate__(self, state):
        if not isinstance(state, dict):
            raise InvalidArgumentError(f"TE's _extra_state holds a {type(self).__name__} with a non-dict state")
        self.__dict__.update(state)


# The classes TE's recipes pickle, as stand-ins carrying TE's names (is_transformer_engine_object
# and from_transformer_engine recognise them as TE's own).
_TE_CLASSES = {name: type(name, (_TEObject,), {"__module__": _TE_RECIPE_MODULE})
               for name in ("DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling", "MXFP8BlockScaling",
                            "NVFP4BlockScaling", "QParams", "MMParams")}


class _FormatHelper(NamedTuple):
    """TE's ``Format`` values: the largest finite forward and backward values."""

    max_fwd: float
    max_bwd: float


class _Format:
    """TE's ``Format`` enum member, by its name (from its value, or from getattr(Format, name))."""

    _BY_VALUE = {(448, 448): "E4M3", (57344, 57344): "E5M2", (448, 57344): "HYBRID", (6, 6): "E2M1"}

    def __init__(self, value):
        if isinstance(value, str) and value in self._BY_VALUE.values():
            self.name = value
            return
        key = tuple(value) if isinstance(value, tuple) else None
        if key not in self._BY_VALUE:
            raise InvalidArgumentError(f"TE's _extra_state holds an unknown fp8_format {value!r}")
        self.name = self._BY_VALUE[key]

    def __reduce__(self):  # as TE's Enum pickles: Format(value)
        value = next(v for v, n in self._BY_VALUE.items() if n == self.name)
        return _Format, (_FormatHelper(*value),)


def _getattr_format(cls, name):
    """Python's other Enum pickling, getattr(Format, "HYBRID"): admitted for Format only."""
    if cls is not _Format or not isinstance(name, str):
        raise InvalidArgumentError("TE's _extra_state calls getattr on something other than TE's Format")
    return _Format(name)


def _rebuild_tensor(storage, offset, size, stride, requires_grad, hooks, *rest):
    if not isinstance(storage, torch.storage.TypedStorage) or storage.device.type != "cpu":
        raise InvalidArgumentError("TE's _extra_state holds a tensor without a CPU storage")
    return torch._utils._rebuild_tensor_v2(storage, offset, size, stride, False, collections.OrderedDict())


def _load_storage(data):
    if not isinstance(data, bytes):
        raise InvalidArgumentError("TE's _extra_state holds a tensor storage that is not bytes")
    return torch.load(io.BytesIO(data), weights_only=True)


_ADMITTED = {("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
             ("torch.storage", "_load_from_bytes"): _load_storage,
             ("collections", "OrderedDict"): collections.OrderedDict,
             ("builtins", "getattr"): _getattr_format,
             (_TE_RECIPE_MODULE, "Format"): _Format,
             (_TE_RECIPE_MODULE, "_FormatHelper"): _FormatHelper,
             **{(_TE_RECIPE_MODULE, n): c for n, c in _TE_CLASSES.items()}}


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        found = _ADMITTED.get((module, name))
        if found is None:
            raise InvalidArgumentError(
                f"TE's _extra_state refers to {module}.{name}, which lnmlp does not load: it reads only TE's "
                "recipes, Format and CPU tensors (a custom amax_compute_algo or scaling_factor_compute_algo "
                "function, for one, cannot be loaded)")
        return found

    def persistent_load(self, pid):
        raise InvalidArgumentError("TE's _extra_state holds a persistent id, which its format never does")


class _TEPickler(pickle._Pickler):
    """pickle's own (pure-Python) pickler, writing the stand-ins under TE's names, so that
    TE's unpickler finds its own classes."""

    _NAMES = {**{c: (_TE_RECIPE_MODULE, n) for n, c in _TE_CLASSES.items()},
              _Format: (_TE_RECIPE_MODULE, "Format"), _FormatHelper: (_TE_RECIPE_MODULE, "_FormatHelper")}

    def save_global(self, obj, name=None):
        te_name = self._NAMES.get(obj) if isinstance(obj, type) else None
        if te_name is None:
            return super().save_global(obj, name)
        self.write(pickle.GLOBAL + f"{te_name[0]}\n{te_name[1]}\n".encode("ascii"))
        self.memoize(obj)
        return None


def _tensor(state: dict, key: str, shape) -> torch.Tensor:
    t = state.get(key)
    if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or tuple(t.shape) != tuple(shape):
        got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise InvalidArgumentError(f"TE's _extra_state[{key!r}] must be a float32 tensor {tuple(shape)} "
                                   f"(LayerNormMLP's FP8 slots), got {got}")
    return t


def decode(extra) -> Tuple[Optional[Recipe], Optional[torch.Tensor]]:
    """(the checkpoint's lnmlp recipe or None, its delayed-scaling state [6, 1 + L] on the CPU or
    None) from a TE-format ``_extra_state`` value. None or an empty tensor: (None, None)."""
    if extra is None:
        return None, None
    if isinstance(extra, io.BytesIO):
        raise NotSupportedError("TE's io.BytesIO _extra_state (an old TE format) is not supported: resave it "
                                "with a TE that writes a uint8 tensor")
    if not isinstance(extra, torch.Tensor) or extra.dtype != torch.uint8 or extra.dim() != 1:
        raise InvalidArgumentError("_extra_state must be a 1-D uint8 tensor (TransformerEngine's format), got "
                                   f"{extra.dtype if isinstance(extra, torch.Tensor) else type(extra).__name__}")
    if extra.numel() == 0:
        return None, None
    try:
        with warnings.catch_warnings():  # pickled tensors come as TypedStorage, which torch deprecates
            warnings.filterwarnings("ignore", message="TypedStorage is deprecated", category=UserWarning)
            state = _RestrictedUnpickler(io.BytesIO(extra.detach().cpu().numpy().tobytes())).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError) as e:
        if isinstance(e, InvalidArgumentError):
            raise
        raise InvalidArgumentError(f"_extra_state is not TransformerEngine's format: {e}") from None
    if state is None:
        return None, None
    if not isinstance(state, dict):
        raise InvalidArgumentError(f"TE's _extra_state must hold a dict, got {type(state).__name__}")
    if not any(k in state for k in _DELAYED_KEYS):
        return None, None  # empty, or a stateless recipe (older TEs pickled those too): nothing to load
    te_recipe = state.get("recipe")
    recipe = DelayedScaling() if te_recipe is None else from_transformer_engine(te_recipe)  # TE 1.x: delayed
    if not isinstance(recipe, DelayedScaling):
        raise InvalidArgumentError(f"TE's _extra_state holds delayed-scaling tensors for a {type(recipe).__name__}")
    hist_fwd = state.get("amax_history_fwd")
    length = hist_fwd.shape[0] if isinstance(hist_fwd, torch.Tensor) and hist_fwd.dim() == 2 else 0
    if length < 1:
        raise InvalidArgumentError("TE's _extra_state['amax_history_fwd'] must be a float32 tensor [L, 6], L >= 1")
    te = {d: (_tensor(state, f"scale_{d}", (n,)), _tensor(state, f"amax_history_{d}", (length, n)))
          for d, n in _TE_SLOT_COUNTS.items()}
    for d, (_, hist) in te.items():
        if torch.any(hist[0] != 0):
            raise NotSupportedError(
                f"TE's amax_history_{d} has amaxes in row 0 that TE has not yet folded into its scales (the "
                "checkpoint was saved inside fp8_autocast, before TE's scale update); lnmlp updates its scales "
                "right after each pass and has no place for them: save the checkpoint after fp8_autocast exits")
    out = torch.zeros(len(_TE_SLOTS), 1 + length, dtype=torch.float32)
    for row, (d, slot) in enumerate(_TE_SLOTS):
        scale, hist = te[d]
        out[row, 0] = scale[slot]
        out[row, 1:length] = hist[1:, slot].flip(0)  # TE rows L-1 .. 1: newest first
    if recipe.amax_history_len != length:
        recipe = DelayedScaling(margin=recipe.margin, fp8_format=recipe.fp8_format, amax_history_len=length,
                                amax_compute_algo=recipe.amax_compute_algo)
    return recipe, out


def encode(recipe: Optional[DelayedScaling], state: Optional[torch.Tensor]) -> torch.Tensor:
    """The TE-format ``_extra_state`` of a module: empty without delayed-scaling state, else TE's
    pickled dict (``recipe`` a TE DelayedScaling with lnmlp's settings)."""
    if state is None:
        return torch.empty(0, dtype=torch.uint8)
    length = state.shape[1] - 1
    s = state.detach().to("cpu", torch.float32)
    te = {d: (torch.ones(n), torch.zeros(length, n)) for d, n in _TE_SLOT_COUNTS.items()}
    for row, (d, slot) in enumerate(_TE_SLOTS):
        scale, hist = te[d]
        scale[slot] = s[row, 0]
        hist[1:, slot] = s[row, 1:length].flip(0)
    r = recipe if recipe is not None else DelayedScaling(amax_history_len=length)
    te_recipe = _TE_CLASSES["DelayedScaling"]()
    te_recipe.__dict__.update(margin=r.margin, fp8_format=_Format(r.fp8_format), amax_history_len=length,
                              amax_compute_algo=r.amax_compute_algo, scaling_factor_compute_algo=None,
                              reduce_amax=True, fp8_dpa=False, fp8_mha=False, backward_override=None)
    payload = {"recipe": te_recipe, "scale_fwd": te["fwd"][0], "amax_history_fwd": te["fwd"][1],
               "scale_bwd": te["bwd"][0], "amax_history_bwd": te["bwd"][1],
               "extra_fp8_variables": {"num_gemms": 2, "fp8_checkpoint": True}}
    buf = io.BytesIO()
    _TEPickler(buf, protocol=4).dump(payload)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
