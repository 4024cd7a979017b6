"""FP8 quantizer sets for lnmlp.jax: the recipe, and for delayed scaling its state as a jax array.

A :class:`QuantizerSet` is a pytree: the recipe is static, the delayed-scaling state -- float32
``[6, 1 + amax_history_len]``, per quantizer (``lnmlp.QUANTIZERS`` order: ln_out, w1, act_out,
w2, dy, dh) its scale, then its amax history, newest first, the library's LNMLP_TENSOR_FP8_STATE
layout -- is its one leaf. Nothing is hidden in the library or the plan: each layernorm_mlp call
takes the state in and, under differentiation, hands the updated one back the way
TransformerEngine's JAX functions do, in the quantizer set's cotangent slot: ``jax.grad`` with
respect to the set returns the set as it is after the step's forward (ln_out, w1, act_out, w2
updated) and backward (dy, dh updated). Use one set per layer, as in TransformerEngine.

With a recipe that rounds stochastically (NVFP4BlockScaling) the leaf is the random state instead,
uint32 ``[4]``: the 64-bit seed and offset (low word first) that backward's stochastic rounding
draws from, as ``lnmlp.Plan.set_rng_state`` takes them. Integers have no cotangent, so the set
does not move it on by itself: a training step takes ``qs.advanced()`` (the offset plus one, what a
Plan's backward does), or a fresh ``make_quantizer_set(recipe, seed=...)``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ..recipe import QUANTIZERS, Recipe, as_recipe, check_history, check_scale
from ..recipe import _SET_COUNT, _rng_word

__all__ = ["QuantizerSet", "GemmQuantizerSet", "make_quantizer_set", "make_quantizer_sets"]

#: The state rows of each GEMM's half of a set, as its (x, kernel, grad) quantizers: GEMM1 ("ffn1")
#: quantizes ln_out, w1 and dh; GEMM2 ("ffn2") act_out, w2 and dy.
GEMM_ROWS = ((0, 1, 5), (2, 3, 4))


@jax.tree_util.register_pytree_node_class
class QuantizerSet:
    """The quantizers of one layernorm_mlp call site: ``recipe`` (an lnmlp recipe) and ``state``
    (its delayed-scaling state, a float32 jax array; for a recipe that rounds stochastically its
    random state, a uint32 [4] jax array; or None for a stateless recipe)."""

    def __init__(self, recipe: Recipe, state=None):
        self.recipe = as_recipe(recipe)
        if self.recipe is None:
            from .._lib import InvalidArgumentError
            raise InvalidArgumentError(f"a quantizer set needs an lnmlp recipe (or TransformerEngine's), "
                                       f"got {type(recipe).__name__}")
        self.state = state

    def tree_flatten(self):
        return (self.state,), self.recipe

    @classmethod
    def tree_unflatten(cls, recipe, children):
        qs = object.__new__(cls)  # children may be tracers or placeholders: no checks here
        qs.recipe, qs.state = recipe, children[0]
        return qs

    def __repr__(self):
        return f"lnmlp.jax.QuantizerSet({self.recipe!r})"

    def split(self):
        """The set as TransformerEngine's pair of per-GEMM sets, ``(ffn1, ffn2)``
        (:class:`GemmQuantizerSet`), for ``layernorm_mlp(..., quantizer_sets=...)``. A random state
        goes to both halves whole (the block draws it once)."""
        if self.state is None or self.recipe.draws_random:
            return tuple(GemmQuantizerSet(g, self.recipe, self.state) for g in range(2))
        return tuple(GemmQuantizerSet(g, self.recipe, self.state[jnp.asarray(rows)]) for g, rows in enumerate(GEMM_ROWS))

    def _check_draws_random(self):
        if not self.recipe.draws_random:
            from .._lib import InvalidArgumentError
            raise InvalidArgumentError(f"{type(self.recipe).__name__} does not round stochastically: the set has "
                                       "no random state")

    def rng_state(self):
        """``(seed, offset)`` as ints: the random state backward draws from (a concrete array)."""
        self._check_draws_random()
        w = np.asarray(self.state, np.uint64)
        return int(w[0] | w[1] << np.uint64(32)), int(w[2] | w[3] << np.uint64(32))

    def with_rng_state(self, seed, offset=0):
        """The set with the random state ``(seed, offset)`` (ints in [0, 2**64)), e.g. to resume
        from a checkpoint."""
        self._check_draws_random()
        return QuantizerSet(self.recipe, rng_words(seed, offset))

    def advanced(self, steps=1):
        """The set with its random state's offset moved on by ``steps`` (traceable): what each
        backward of an lnmlp.Plan does, for the next training step."""
        self._check_draws_random()
        lo = self.state[2] + jnp.uint32(steps)
        hi = self.state[3] + (lo < self.state[2]).astype(jnp.uint32)  # the carry
        return QuantizerSet(self.recipe, jnp.stack([self.state[0], self.state[1], lo, hi]))

    def scale(self, quantizer):
        """One quantizer's scale (a scalar jax array)."""
        return self.state[QUANTIZERS.index(quantizer), 0]

    def amax_history(self, quantizer):
        """One quantizer's amax history, newest first."""
        return self.state[QUANTIZERS.index(quantizer), 1:]

    def state_dict(self) -> dict:
        """``{name: {"scale": float, "amax_history": numpy array}}``, as the NumPy API's
        ``QuantizerSet.state()`` gives it (``{}`` for a stateless recipe)."""
        if self.state is None:
            return {}
        s = np.asarray(self.state)
        return {n: {"scale": float(row[0]), "amax_history": row[1:].copy()} for n, row in zip(QUANTIZERS, s)}

    def load_state_dict(self, state: dict) -> "QuantizerSet":
        """A new set with the state of :meth:`state_dict` (checked as the NumPy API checks it)."""
        if self.state is None:
            return QuantizerSet(self.recipe)
        rows = [np.concatenate([[check_scale(n, state[n]["scale"])],
                                check_history(n, state[n]["amax_history"], self.recipe.amax_history_len)])
                for n in QUANTIZERS]
        return QuantizerSet(self.recipe, jnp.asarray(np.stack(rows).astype(np.float32)))


@jax.tree_util.register_pytree_node_class
class GemmQuantizerSet:
    """One GEMM's half of a :class:`QuantizerSet`, as TransformerEngine passes one quantizer set per
    GEMM (``quantizer_sets=(ffn1, ffn2)``): ``gemm`` 0 (GEMM1) or 1 (GEMM2), the recipe, and the
    delayed-scaling state of its x, kernel and grad quantizers, float32 ``[3, 1 + amax_history_len]``
    (rows :data:`GEMM_ROWS` of the whole set's state), or None. Under differentiation its cotangent
    is the half as it is after the step, as the whole set's is."""

    def __init__(self, gemm: int, recipe: Recipe, state=None):
        self.gemm, self.recipe, self.state = gemm, recipe, state

    def tree_flatten(self):
        return (self.state,), (self.gemm, self.recipe)

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(aux[0], aux[1], children[0])

    def __repr__(self):
        return f"lnmlp.jax.GemmQuantizerSet({'ffn1' if self.gemm == 0 else 'ffn2'}, {self.recipe!r})"


def join(ffn1: GemmQuantizerSet, ffn2: GemmQuantizerSet) -> QuantizerSet:
    """The one set whose halves are ``ffn1`` and ``ffn2`` (jax operations: differentiating through
    it hands each half its rows of the set's cotangent)."""
    qs = QuantizerSet(ffn1.recipe)
    if ffn1.state is not None and ffn1.recipe.draws_random:
        qs.state = ffn1.state
    elif ffn1.state is not None:
        rows = [None] * len(QUANTIZERS)
        for half in (ffn1, ffn2):
            for i, r in enumerate(GEMM_ROWS[half.gemm]):
                rows[r] = half.state[i]
        qs.state = jnp.stack(rows)
    return qs


def make_quantizer_sets(recipe: Recipe, seed=None) -> tuple:
    """``(ffn1, ffn2)``: the halves of a fresh :func:`make_quantizer_set`, to pass as
    ``quantizer_sets=`` (TransformerEngine's ``QuantizerFactory.create_set(n_quantizer_sets=2)``)."""
    return make_quantizer_set(recipe, seed).split()


def rng_words(seed, offset=0):
    """The random state leaf, uint32 [4], of (seed, offset) (ints in [0, 2**64))."""
    s, o = _rng_word("seed", seed), _rng_word("offset", offset)
    return jnp.asarray(np.array([s & 0xffffffff, s >> 32, o & 0xffffffff, o >> 32], np.uint32))


def make_quantizer_set(recipe: Recipe, seed=None) -> QuantizerSet:
    """A quantizer set for ``recipe`` (lnmlp.jax.DelayedScaling, Float8CurrentScaling,
    Float8BlockScaling, MXFP8BlockScaling, NVFP4BlockScaling; TransformerEngine's names and
    defaults), to pass as ``quantizer_set=``. Delayed scaling starts with scales 1 and zero
    histories; stochastic rounding (NVFP4) from ``(seed, 0)``, ``seed`` by default the count of
    sets made before in this process (as lnmlp.make_quantizer_set)."""
    qs = QuantizerSet(recipe)
    recipe = qs.recipe
    if recipe.stateful:
        state = np.zeros((len(QUANTIZERS), 1 + recipe.amax_history_len), np.float32)
        state[:, 0] = 1.0
        qs.state = jnp.asarray(state)
    elif recipe.draws_random:
        qs.state = rng_words(next(_SET_COUNT) if seed is None else seed)
    return qs
