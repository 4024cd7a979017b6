"""FP8 recipes and quantizer sets, named and defaulted as TransformerEngine's
(``transformer_engine.common.recipe``).

A recipe describes *how* to quantize (see docs/fp8.md for exactly what is computed):

* :class:`DelayedScaling` -- per-tensor scales from an amax history (stateful);
* :class:`Float8CurrentScaling` -- per-tensor scales from the tensor's own amax;
* :class:`Float8BlockScaling` -- 1x128 blocks (activations, gradients) and 128x128 tiles (weights);
* :class:`MXFP8BlockScaling` -- 1x32 blocks with power-of-two (E8M0) scales;
* :class:`NVFP4BlockScaling` -- FP4 (E2M1) in 1x16 blocks with E4M3 scales and a global scale,
  16x16 weight tiles, the random Hadamard transform and stochastic rounding (the CPU backend).

Give a recipe to :class:`lnmlp.Plan` (``recipe=``), which then owns the delayed-scaling state
(unless the caller passes its own array, ``fp8_state=``, or attaches one), or
make a :class:`QuantizerSet` with :func:`make_quantizer_set` for the functional API
(``layernorm_mlp(..., quantizer_set=qs)``), where the quantizer set carries the state from call to
call (the cached plans it runs on may be shared by several quantizer sets).

Recipes are immutable and hashable; equal recipes configure identical plans.
"""

from __future__ import annotations

import itertools
import math
import threading

import numpy as np

from ._lib import InvalidArgumentError, NotSupportedError

__all__ = ["Recipe", "DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling",
           "MXFP8BlockScaling", "NVFP4BlockScaling", "QuantizerSet", "make_quantizer_set", "QUANTIZERS",
           "FORWARD_QUANTIZERS", "BACKWARD_QUANTIZERS"]

#: The six quantizers in LNMLP_QUANTIZER_* order (their index is the C enum value).
QUANTIZERS = ("ln_out", "w1", "act_out", "w2", "dy", "dh")
#: Updated by a forward pass (delayed scaling).
FORWARD_QUANTIZERS = QUANTIZERS[:4]
#: Updated by a backward pass (delayed scaling).
BACKWARD_QUANTIZERS = QUANTIZERS[4:]

# LNMLP_RECIPE_*, LNMLP_FP8_FORMAT_*, LNMLP_AMAX_ALGO_* (include/lnmlp.h)
_RECIPE_DELAYED, _RECIPE_CURRENT, _RECIPE_BLOCK, _RECIPE_MXFP8, _RECIPE_NVFP4 = 1, 2, 3, 4, 5
_FORMATS = {"HYBRID": 0, "E4M3": 1}
_ALGOS = {"max": 0, "most_recent": 1}
# The descriptor's FP8 settings as lnmlp_desc_create leaves them (include/lnmlp.h).
_DEFAULT_SETTINGS = dict(recipe=0, fp8_format=-1, margin=0, amax_history_len=1024, amax_compute_algo=0,
                         power_2_scale=-1, amax_epsilon=0.0, nvfp4_options=0)


def _format(value) -> str:
    """"HYBRID" / "E4M3" from a string or an enum-like object (e.g. TE's ``Format.HYBRID``)."""
    name = getattr(value, "name", value)
    if isinstance(name, str) and name.upper() in _FORMATS:
        return name.upper()
    if isinstance(name, str) and name.upper() == "E5M2":
        raise InvalidArgumentError(
            "fp8_format 'E5M2' is not supported (forward tensors need E4M3); use 'HYBRID' "
            "(E4M3 forward, E5M2 gradients) or 'E4M3'")
    raise InvalidArgumentError(f"fp8_format must be 'HYBRID' or 'E4M3', got {value!r}")


def _int(name, value, lo, hi) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidArgumentError(f"{name} must be an int, got {value!r}")
    if not lo <= int(value) <= hi:
        raise InvalidArgumentError(f"{name} must be in [{lo}, {hi}], got {value}")
    return int(value)


def _bool(name, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidArgumentError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def _epsilon(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InvalidArgumentError(f"amax_epsilon must be a float, got {value!r}")
    v = float(value)
    with np.errstate(over="ignore"):
        v32 = float(np.float32(v))
    if not (math.isfinite(v) and v >= 0.0 and math.isfinite(v32)):
        raise InvalidArgumentError(f"amax_epsilon must be finite (in float32) and >= 0, got {value!r}")
    return v


class Recipe:
    """Base class of the FP8 recipes (immutable; compare and hash by value)."""

    _fields: tuple = ()
    stateful = False  #: whether the recipe keeps per-quantizer state (delayed scaling only)
    draws_random = False  #: whether backward rounds stochastically (NVFP4's gradients)

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is immutable; make a new one")

    def _set(self, **kw):
        for k, v in kw.items():
            object.__setattr__(self, k, v)

    def _key(self):
        return (type(self).__name__,) + tuple(getattr(self, f) for f in self._fields)

    def __eq__(self, other):
        return isinstance(other, Recipe) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        args = ", ".join(f"{f}={getattr(self, f)!r}" for f in self._fields)
        return f"lnmlp.{type(self).__name__}({args})"

    def _settings(self) -> dict:
        """The descriptor's FP8 settings for this recipe, as include/lnmlp.h numbers them: recipe,
        fp8_format, margin, amax_history_len, amax_compute_algo, power_2_scale, amax_epsilon,
        nvfp4_options (the library's defaults for the ones the recipe does not use). The plan API applies them
        (:meth:`_apply`), lnmlp.jax passes them to its XLA custom calls."""
        return dict(_DEFAULT_SETTINGS, **self._own_settings())

    def _own_settings(self) -> dict:  # pragma: no cover - overridden
        raise NotImplementedError

    def _apply(self, lib, desc, check):
        s = self._settings()
        check(lib.lnmlp_desc_set_recipe(desc, s["recipe"]))
        check(lib.lnmlp_desc_set_fp8_format(desc, s["fp8_format"]))
        check(lib.lnmlp_desc_set_delayed_scaling(desc, s["margin"], s["amax_history_len"], s["amax_compute_algo"]))
        check(lib.lnmlp_desc_set_scaling_options(desc, s["power_2_scale"], s["amax_epsilon"]))


class DelayedScaling(Recipe):
    """Per-tensor scales from an amax history (TransformerEngine's ``DelayedScaling``).

    Each quantizer keeps ``scale`` (initially 1) and the amaxes of its last ``amax_history_len``
    tensors (initially zeros, newest first). A pass quantizes with the current scale, records the
    tensor's amax, then sets ``scale = (fmt_max / amax_h) / 2**margin`` with ``amax_h`` the history
    max (``amax_compute_algo="max"``) or the newest entry (``"most_recent"``); a zero or
    non-finite ``amax_h`` keeps the scale.

    margin: int in [-126, 127]; fp8_format: "HYBRID" (E4M3 forward, E5M2 gradients) or "E4M3";
    amax_history_len: 1 .. 65536; amax_compute_algo: "max" or "most_recent" (callables are not
    supported).
    """

    _fields = ("margin", "fp8_format", "amax_history_len", "amax_compute_algo")
    stateful = True

    def __init__(self, margin=0, fp8_format="HYBRID", amax_history_len=1024, amax_compute_algo="max"):
        algo = amax_compute_algo
        if not isinstance(algo, str) or algo.lower() not in _ALGOS:
            raise InvalidArgumentError(
                f"amax_compute_algo must be 'max' or 'most_recent', got {amax_compute_algo!r}")
        self._set(margin=_int("margin", margin, -126, 127), fp8_format=_format(fp8_format),
                  amax_history_len=_int("amax_history_len", amax_history_len, 1, 65536),
                  amax_compute_algo=algo.lower())

    def _own_settings(self):
        return dict(recipe=_RECIPE_DELAYED, fp8_format=_FORMATS[self.fp8_format], margin=self.margin,
                    amax_history_len=self.amax_history_len, amax_compute_algo=_ALGOS[self.amax_compute_algo])


class Float8CurrentScaling(Recipe):
    """Per-tensor scales from the tensor's own amax (TransformerEngine's ``Float8CurrentScaling``):
    ``scale = fmt_max / max(amax, amax_epsilon)``, rounded down to a power of two when
    ``power_2_scale``; 1 for a zero or non-finite amax. Stateless."""

    _fields = ("fp8_format", "power_2_scale", "amax_epsilon")

    def __init__(self, fp8_format="HYBRID", power_2_scale=False, amax_epsilon=0.0):
        self._set(fp8_format=_format(fp8_format), power_2_scale=_bool("power_2_scale", power_2_scale),
                  amax_epsilon=_epsilon(amax_epsilon))

    _recipe = _RECIPE_CURRENT

    def _own_settings(self):
        return dict(recipe=self._recipe, fp8_format=_FORMATS[self.fp8_format], power_2_scale=int(self.power_2_scale),
                    amax_epsilon=self.amax_epsilon)


class Float8BlockScaling(Float8CurrentScaling):
    """DeepSeek-V3-style block scaling (TransformerEngine's ``Float8BlockScaling``): activations
    and gradients in 1x128 blocks along the GEMM's contracted dimension, weights in 128x128
    tiles, one fp32 scale per block (as current scaling, from the block's amax; power-of-two by
    default). Stateless."""

    _recipe = _RECIPE_BLOCK

    def __init__(self, fp8_format="E4M3", power_2_scale=True, amax_epsilon=0.0):
        super().__init__(fp8_format, power_2_scale, amax_epsilon)


class MXFP8BlockScaling(Recipe):
    """OCP MXFP8 (TransformerEngine's ``MXFP8BlockScaling``): 1x32 blocks along the contracted
    dimension, ``scale_inv = 2**ceil(log2(amax_block / fmt_max))`` stored as E8M0. Stateless."""

    _fields = ("fp8_format",)

    def __init__(self, fp8_format="E4M3"):
        self._set(fp8_format=_format(fp8_format))

    def _own_settings(self):
        return dict(recipe=_RECIPE_MXFP8, fp8_format=_FORMATS[self.fp8_format])


def _env_flag(name) -> bool:
    """TransformerEngine's reading of an NVTE_* switch: set to "1"."""
    import os
    return os.getenv(name, "0") == "1"


def _env_str(name, default) -> str:
    import os
    return os.getenv(name, default)


def refuse_nvfp4_options_not_in_lnmlp(recipe, row_scaled_activation, nvfp4_4over6):
    """NotSupportedError for TransformerEngine's NVFP4 options that lnmlp does not have, unless at
    their defaults: row-scaled activations (an amax per row) and 4over6 adaptive block scaling."""
    if row_scaled_activation:
        raise NotSupportedError(f"{recipe}(row_scaled_activation=True) is not supported: lnmlp quantizes each "
                                "tensor with one global amax (TransformerEngine's default)")
    if nvfp4_4over6 is not None and str(nvfp4_4over6).lower() != "none":
        raise NotSupportedError(f"{recipe}(nvfp4_4over6={nvfp4_4over6!r}) is not supported: lnmlp scales each "
                                "block to 6 (TransformerEngine's default, 'none'); 4over6 is not implemented")


class NVFP4BlockScaling(Recipe):
    """NVFP4 (TransformerEngine's ``NVFP4BlockScaling``): FP4 E2M1 elements in 1x16 blocks along
    the contracted dimension, an E4M3 scale per block and an fp32 global scale per tensor from its
    amax; weights in 16x16 tiles (``disable_2d_quantization=False``); the weight-gradient GEMMs'
    inputs first transformed by a random Hadamard transform along the tokens (``disable_rht=False``);
    the gradients dy and dh rounded stochastically (``disable_stochastic_rounding=False``), drawing
    from the plan's random state (:meth:`lnmlp.Plan.set_rng_state`). Each ``disable_*`` defaults,
    as TE's, to its environment variable ``NVTE_NVFP4_DISABLE_RHT``,
    ``NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING``, ``NVTE_NVFP4_DISABLE_2D_QUANTIZATION`` being "1".
    ``fp4_format`` must be "E2M1" and ``fp8_format`` (the block scales') "E4M3". Stateless apart from
    the random state. Both backends (the CUDA one emulating the FP4 GEMMs), sharded plans too, with
    ``ffn / group size`` a multiple of 16; lnmlp.jax, on meshes too (docs/jax.md).

    TE's other options are taken at their defaults only (NotSupportedError otherwise, from the
    argument or, as TE reads it, the environment): ``row_scaled_activation=False``
    (``NVTE_NVFP4_ROW_SCALED_ACTIVATION``) and ``nvfp4_4over6="none"`` (``NVTE_NVFP4_4OVER6``):
    lnmlp has neither row-scaled activations nor 4over6 block scaling (docs/fp8.md)."""

    _fields = ("disable_rht", "disable_stochastic_rounding", "disable_2d_quantization", "fp4_format",
               "fp8_format")

    def __init__(self, disable_rht=None, disable_stochastic_rounding=None, disable_2d_quantization=None,
                 fp4_format="E2M1", fp8_format="E4M3", row_scaled_activation=None, nvfp4_4over6=None):
        def flag(name, value, env):
            return _env_flag(env) if value is None else _bool(name, value)

        refuse_nvfp4_options_not_in_lnmlp(
            "NVFP4BlockScaling", flag("row_scaled_activation", row_scaled_activation, "NVTE_NVFP4_ROW_SCALED_ACTIVATION"),
            _env_str("NVTE_NVFP4_4OVER6", "none") if nvfp4_4over6 is None else nvfp4_4over6)

        fp4 = getattr(fp4_format, "name", fp4_format)
        if not (isinstance(fp4, str) and fp4.upper() == "E2M1"):
            raise InvalidArgumentError(f"fp4_format must be 'E2M1' (NVFP4's elements), got {fp4_format!r}")
        fp8 = getattr(fp8_format, "name", fp8_format)
        if not (isinstance(fp8, str) and fp8.upper() == "E4M3"):
            raise InvalidArgumentError(f"fp8_format must be 'E4M3' (NVFP4's block scales), got {fp8_format!r}")
        self._set(disable_rht=flag("disable_rht", disable_rht, "NVTE_NVFP4_DISABLE_RHT"),
                  disable_stochastic_rounding=flag("disable_stochastic_rounding", disable_stochastic_rounding,
                                                   "NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING"),
                  disable_2d_quantization=flag("disable_2d_quantization", disable_2d_quantization,
                                               "NVTE_NVFP4_DISABLE_2D_QUANTIZATION"),
                  fp4_format="E2M1", fp8_format="E4M3")

    @property
    def draws_random(self):
        return not self.disable_stochastic_rounding

    def _own_settings(self):
        # nvfp4_options: lnmlp_desc_set_nvfp4_options's three flags as bits 0, 1, 2 (lnmlp.jax's attribute).
        options = int(self.disable_rht) | int(self.disable_stochastic_rounding) << 1 | \
            int(self.disable_2d_quantization) << 2
        return dict(recipe=_RECIPE_NVFP4, fp8_format=_FORMATS["E4M3"], nvfp4_options=options)

    def _apply(self, lib, desc, check):
        super()._apply(lib, desc, check)
        check(lib.lnmlp_desc_set_nvfp4_options(desc, int(self.disable_rht), int(self.disable_stochastic_rounding),
                                               int(self.disable_2d_quantization)))


def as_recipe(obj):
    """obj as an lnmlp Recipe: itself, or TransformerEngine's recipe object of the same name read as
    the lnmlp recipe it equals (``_te_recipe.py``; a field lnmlp cannot honour raises
    NotSupportedError naming it); None for anything else."""
    if isinstance(obj, Recipe):
        return obj
    from ._te_recipe import from_transformer_engine, is_transformer_engine_object
    return from_transformer_engine(obj) if is_transformer_engine_object(obj) else None


def check_recipe(recipe):
    """None, or a recipe as :func:`as_recipe` reads it; anything else is an InvalidArgumentError."""
    if recipe is None:
        return None
    r = as_recipe(recipe)
    if r is None:
        raise InvalidArgumentError(
            f"recipe must be None or an lnmlp recipe (DelayedScaling, Float8CurrentScaling, "
            f"Float8BlockScaling, MXFP8BlockScaling, or TransformerEngine's of those names), "
            f"got {type(recipe).__name__}")
    return r


def quantizer_index(name) -> int:
    """LNMLP_QUANTIZER_* value of a quantizer name (or an int 0..5)."""
    if isinstance(name, str) and name.lower() in QUANTIZERS:
        return QUANTIZERS.index(name.lower())
    if isinstance(name, (int, np.integer)) and not isinstance(name, bool) and 0 <= int(name) < 6:
        return int(name)
    raise InvalidArgumentError(f"quantizer must be one of {', '.join(QUANTIZERS)} (or 0..5), got {name!r}")


def check_history(name, history, length) -> np.ndarray:
    """A float32 copy of an amax history after checking it: 1-D, `length` entries, each >= 0,
    +inf or NaN (amaxes as a pass records them)."""
    try:
        h = np.array(history, dtype=np.float32, copy=True)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"the amax history of {name} must be an array of floats")
    if h.ndim != 1 or h.shape[0] != length:
        raise InvalidArgumentError(
            f"the amax history of {name} must be a 1-D array of {length} entries (the recipe's "
            f"amax_history_len), got shape {h.shape}")
    if np.any(h < 0):  # NaN compares False: NaN entries are allowed
        raise InvalidArgumentError(
            f"the amax history of {name} has negative entries; amaxes are >= 0, +inf or NaN")
    return h


def check_scale(name, scale) -> np.float32:
    if isinstance(scale, bool):
        raise InvalidArgumentError(f"the scale of {name} must be a float, got {scale!r}")
    try:
        s = np.float32(scale)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"the scale of {name} must be a float, got {scale!r}")
    if np.ndim(s) != 0 or not (np.isfinite(s) and s > 0):
        raise InvalidArgumentError(f"the scale of {name} must be finite and > 0, got {scale!r}")
    return s


class QuantizerSet:
    """The six quantizers of one layernorm_mlp layer under one recipe, for the functional API.

    With :class:`DelayedScaling` it carries the state: one float32 NumPy array held here, not in
    the cached plan, laid out as the library's LNMLP_TENSOR_FP8_STATE (per quantizer, in
    :data:`QUANTIZERS` order, its scale, then its amax history, newest first), which each plan
    call uses and updates in place (``fp8_state=``) -- a forward call (``layernorm_mlp``, or the
    forward part of ``layernorm_mlp_vjp``) updates ``ln_out, w1, act_out, w2``, the ``vjp(dy)``
    call ``dy, dh``. Use one quantizer set per layer, as in TransformerEngine. Other recipes are
    stateless: :meth:`state` returns ``{}``.

    With a recipe that rounds stochastically (:class:`NVFP4BlockScaling`) it carries the random
    state ``(seed, offset)`` its backward calls draw from (:meth:`rng_state`; each such call moves
    ``offset`` on by one): ``seed`` is given to :func:`make_quantizer_set`, or else the number of
    quantizer sets this process made before (0, 1, 2, ...), so that each layer's set draws its own
    stream and a program that makes its sets in the same order draws the same bits.

    Thread safety: calls that use one quantizer set are serialised by its lock.
    """

    def __init__(self, recipe: Recipe, seed=None):
        self.recipe = as_recipe(recipe)
        if self.recipe is None:
            raise InvalidArgumentError(
                f"make_quantizer_set needs an lnmlp recipe (or TransformerEngine's), got {type(recipe).__name__}")
        self._lock = threading.RLock()
        self._rng = (_rng_word("seed", next(_SET_COUNT) if seed is None else seed), 0)
        self._state = None
        if recipe.stateful:  # a fresh state: scales 1, histories 0
            self._state = np.zeros((len(QUANTIZERS), 1 + recipe.amax_history_len), np.float32)
            self._state[:, 0] = 1.0

    def __repr__(self):
        return f"lnmlp.QuantizerSet({self.recipe!r})"

    def rng_state(self):
        """``(seed, offset)``: the stream this set's next backward that rounds stochastically draws."""
        with self._lock:
            return self._rng

    def set_rng_state(self, seed, offset=0) -> None:
        """Sets the random state (ints in [0, 2**64)), e.g. to resume from a checkpoint."""
        new = (_rng_word("seed", seed), _rng_word("offset", offset))
        with self._lock:
            self._rng = new

    @property
    def amax_history_length(self) -> int:
        """The amax history length (0 for a stateless recipe)."""
        return self.recipe.amax_history_len if self.recipe.stateful else 0

    def state(self) -> dict:
        """``{name: {"scale": float, "amax_history": float32 array (newest first)}}`` for the six
        quantizers (copies); ``{}`` for a stateless recipe."""
        if self._state is None:
            return {}
        with self._lock:
            return {n: {"scale": float(row[0]), "amax_history": row[1:].copy()}
                    for n, row in zip(QUANTIZERS, self._state)}

    def load_state(self, state) -> None:
        """Restores a state returned by :meth:`state` (all six quantizers; histories of the
        recipe's length, entries >= 0, inf or NaN; scales finite and > 0). A bad state raises
        InvalidArgumentError and changes nothing."""
        if self._state is None:
            if state:
                raise InvalidArgumentError(
                    f"{type(self.recipe).__name__} keeps no quantizer state; the state must be empty")
            return
        if not isinstance(state, dict):
            raise InvalidArgumentError(f"state must be a dict, got {type(state).__name__}")
        if set(state) != set(QUANTIZERS):
            raise InvalidArgumentError(
                f"state must have exactly the quantizers {', '.join(QUANTIZERS)}; got {sorted(state)}")
        new = np.empty_like(self._state)
        for i, n in enumerate(QUANTIZERS):
            q = state[n]
            if not isinstance(q, dict) or set(q) != {"scale", "amax_history"}:
                raise InvalidArgumentError(f"state[{n!r}] must be a dict with 'scale' and 'amax_history'")
            new[i, 0] = check_scale(n, q["scale"])
            new[i, 1:] = check_history(n, q["amax_history"], self.recipe.amax_history_len)
        with self._lock:
            self._state[...] = new  # in place: the array is the one the plan calls update


def make_quantizer_set(recipe: Recipe, seed=None) -> QuantizerSet:
    """A :class:`QuantizerSet` for ``recipe``, to pass as ``quantizer_set=`` to
    :func:`lnmlp.layernorm_mlp` / :func:`lnmlp.layernorm_mlp_vjp` (TransformerEngine's
    ``QuantizerFactory.create_set``). Delayed scaling starts with scales 1 and zero histories;
    stochastic rounding (NVFP4) from ``(seed, 0)``, ``seed`` by default the count of sets made
    before in this process."""
    return QuantizerSet(recipe, seed)


_SET_COUNT = itertools.count()


def _rng_word(name, v) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= int(v) < 2 ** 64:
        raise InvalidArgumentError(f"{name} must be an int in [0, 2**64), got {v!r}")
    return int(v)
