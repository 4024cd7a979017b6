"""The two XLA FFI custom calls of lnmlp.jax, lnmlp's forward and backward (handlers in
bindings/python/xla_ffi), for one static configuration each (``Spec``), with their batching rules.

Each call's configuration -- shapes, norm, activations, biases, dtype, what forward saves -- is a
static ``Spec``; XLA gets it as the custom call's attributes and instantiates (or reuses) the
lnmlp plan for it. Forward returns y and the plan's ``saved`` bytes, the residual backward reads;
on a GPU XLA allocates the plan's workspace as one more output of each call (on the CPU the plan
owns it: xla_ffi/plan_cache.cpp says why).

Under ``jax.vmap`` a call batched in x (and dy) only is one call with the batch folded into the
tokens; any other batching (batched weights, a cotangent batched alone as ``jax.jacrev`` does) runs
the batch one element after another with ``jax.lax.map``.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from .. import _capi, _lib, _plan
from .. import recipe as _recipe
from ..recipe import Recipe
from . import _ffi

@dataclasses.dataclass(frozen=True)
class Spec:
    """One call's configuration: what the lnmlp plan behind it is made for (hashable: it keys the
    size and custom-call caches, and XLA gets it as attributes)."""

    tokens: int
    hidden: int
    ffn: int
    norm_type: str
    zero_centered_gamma: bool
    epsilon: float
    activations: tuple
    act_params: tuple  # (limit, alpha, offset) of the clamped SwiGLU; the defaults otherwise
    has_bias1: bool
    has_bias2: bool
    dtype: str  # "float32", "bfloat16" or "float16"
    remat: str  # "save_all" for a call that is differentiated, "forward_only" for one that is not
    backend: str  # "cpu" or "cuda"
    recipe: Recipe = None  # the FP8 recipe (None: no quantization)
    # "float32": fp32 kernels under an FP8 recipe with a bf16/f16 x, quantized directly (their
    # gradients fp32 too); None: the kernels are in x's dtype.
    weight_dtype: str = None
    # Forward also gives the norm output, a section of the saved buffer (return_layernorm_output).
    norm_output: bool = False
    # The call's LNMLP_CALL_AMAX_* flags: Float8CurrentScaling or NVFP4BlockScaling in stages on a
    # mesh (_sharding.py), whose state operand and result are then the amax array (amax_count). Not
    # the plan's: it keys the call.
    amax_flags: int = 0
    # The saved buffer's sections apart (LNMLP_CALL_SAVED_SECTIONS): forward returns, and backward
    # takes, a tuple of one array per section (a zero-element stand-in where the plan saves none)
    # in place of the saved bytes, so that each can be sharded as its own tensor. Not the plan's.
    saved_apart: bool = False

    @property
    def takes_state(self):
        """The call updates a state operand in place: delayed scaling's, or the amax array."""
        return self.stateful or self.amax_flags != 0

    @property
    def stateful(self):
        return self.recipe is not None and self.recipe.stateful

    @property
    def draws_random(self):
        """Backward rounds stochastically (NVFP4): it takes the random operand (random_operand)
        after its state operand; the quantizer set's random state is no state of forward's."""
        return self.recipe is not None and self.recipe.draws_random

    @property
    def nvfp4(self):
        return self.recipe is not None and type(self.recipe).__name__ == "NVFP4BlockScaling"

    @property
    def amax_count(self):
        """The floats of the amax array of a call in stages: one per quantizer, NVFP4 two (the
        tensor's and its columnwise representation's)."""
        return _capi.QUANTIZER_COUNT * (2 if self.nvfp4 else 1)

    def with_(self, **changes):
        return dataclasses.replace(self, **changes)

    def plan_kwargs(self):
        ap = dict(zip(("limit", "alpha", "offset"), self.act_params))
        clamped = self.activations == _plan.GATED_PAIRS["clamped_swiglu"]
        return dict(tokens=max(self.tokens, 1), hidden=self.hidden, ffn=self.ffn, norm_type=self.norm_type,
                    zero_centered_gamma=self.zero_centered_gamma, epsilon=self.epsilon,
                    activation_type=self.activations, act_params=ap if clamped else None,
                    use_bias1=self.has_bias1, use_bias2=self.has_bias2, dtype=self.dtype, remat=self.remat,
                    backend=self.backend, recipe=self.recipe, weight_dtype=self.weight_dtype,
                    grad_dtype=self.weight_dtype, norm_output=self.norm_output)

    def attributes(self):
        """The custom call's attributes, with the exact types liblnmlp_xla's handlers decode."""
        i32, i64, f32 = np.int32, np.int64, np.float32
        acts = [_plan.ACTIVATIONS[a] for a in self.activations]
        fp8 = self.recipe._settings() if self.recipe is not None else _recipe._DEFAULT_SETTINGS
        return dict(tokens=i64(max(self.tokens, 1)), hidden=i64(self.hidden), ffn=i64(self.ffn),
                    norm=i32(_plan._NORMS[self.norm_type]), zero_centered_gamma=i32(self.zero_centered_gamma),
                    epsilon=f32(self.epsilon), act0=i32(acts[0]), act1=i32(acts[1] if len(acts) > 1 else -1),
                    clamp_limit=f32(self.act_params[0]), clamp_alpha=f32(self.act_params[1]),
                    clamp_offset=f32(self.act_params[2]), has_bias1=i32(self.has_bias1),
                    has_bias2=i32(self.has_bias2), dtype=i32(_plan._DTYPES[np.dtype(jnp.dtype(self.dtype))]),
                    remat=i32(_plan._REMATS[self.remat]), recipe=i32(fp8["recipe"]),
                    fp8_format=i32(fp8["fp8_format"]), margin=i32(fp8["margin"]),
                    amax_history_len=i64(fp8["amax_history_len"]), amax_compute_algo=i32(fp8["amax_compute_algo"]),
                    power_2_scale=i32(fp8["power_2_scale"]), amax_epsilon=f32(fp8["amax_epsilon"]),
                    backend=i32(_plan._BACKENDS[self.backend]), device=i32(0),
                    weight_dtype=i32(-1 if self.weight_dtype is None else
                                     _plan._DTYPES[np.dtype(jnp.dtype(self.weight_dtype))]),
                    norm_output=i32(self.norm_output), amax_flags=i32(self.amax_flags),
                    saved_apart=i32(self.saved_apart), nvfp4_options=i32(fp8["nvfp4_options"]))


# The outputs of each custom call, as lnmlp_plan_get_tensor_shape names them (a tensor the plan
# does not take is a zero-element stand-in).
_FORWARD_OUTPUTS = ("y", "saved")
_BACKWARD_OUTPUTS = ("dx", "dgamma", "dbeta", "dw1", "db1", "dw2", "db2")


@functools.lru_cache(maxsize=512)
def _plan_facts(spec: Spec):
    """What the library's queries say of spec's calls, from one plan made for them: {name:
    jax.ShapeDtypeStruct} of a call's outputs for its tokens -- the tensors above, "fp8_state",
    "sections" (a tuple: each LNMLP_SAVED_* section as an array of its own, a zero-element uint8
    stand-in where the plan saves none) and "workspace" (on a GPU the plan's workspace plus its
    alignment, the handler rounding XLA's buffer start up to it; on the CPU nothing, the plan
    owning its workspace: xla_ffi/plan_cache.cpp says why) -- and the norm output's byte offset
    in the saved buffer (None without it)."""
    types = {}
    with _plan.Plan(**spec.plan_kwargs(), external_workspace=True) as p:
        for name in _FORWARD_OUTPUTS + _BACKWARD_OUTPUTS + ("fp8_state",):
            shape, dtype = p._tensor_shape(_lib.TENSORS[name], spec.tokens, with_dtype=True)
            types[name] = jax.ShapeDtypeStruct(shape if shape is not None else (0,),
                                               dtype if dtype is not None else np.float32)
        sections = [p.saved_section(s, spec.tokens) for s in range(len(_lib.SAVED_SECTIONS))]
        types["sections"] = tuple(jax.ShapeDtypeStruct((0,), jnp.uint8) if s is None else
                                  jax.ShapeDtypeStruct(s[1], s[2]) for s in sections)
        workspace = 0 if spec.backend == "cpu" else p.workspace_bytes + p.alignment
        section = p.saved_section("norm_output", spec.tokens) if spec.norm_output else None
    types["workspace"] = jax.ShapeDtypeStruct((workspace,), jnp.uint8)
    return types, None if section is None else section[0]


def _output_types(spec: Spec):
    """{name: jax.ShapeDtypeStruct} of a call's outputs (_plan_facts; the amax array for a call
    with LNMLP_CALL_AMAX_* flags)."""
    types = _plan_facts(spec.with_(amax_flags=0, saved_apart=False))[0]
    if spec.amax_flags:
        types = {**types, "fp8_state": jax.ShapeDtypeStruct((spec.amax_count,), np.float32)}
    return types


def sections_shaped(spec: Spec, sections):
    """A forward call's sections apart as tensors that shard with the tokens and F: the FP8 codes'
    flat bytes as the matrix they are (the CPU backend's row-major [tokens, columns], the CUDA
    backend's K-major [columns, tokens]); the other sections as the library shapes them. (The
    handlers take a section of any shape with its element count.) Arrays or ShapeDtypeStructs."""
    index = _lib.SAVED_SECTIONS
    columns = {index["norm_output_codes"]: spec.hidden, index["act_out_codes"]: spec.ffn}
    shaped = []
    for i, a in enumerate(sections):
        if i in columns and a.size and a.size == spec.tokens * columns[i]:
            shape = (spec.tokens, columns[i]) if spec.backend == "cpu" else (columns[i], spec.tokens)
            a = a.reshape(shape) if hasattr(a, "reshape") else jax.ShapeDtypeStruct(shape, a.dtype)
        shaped.append(a)
    return tuple(shaped)


def norm_output_of(spec: Spec, saved):
    """The norm output [tokens, H] in spec's dtype, out of a forward call's saved bytes (a slice,
    reinterpreted: the section lnmlp_plan_get_saved_section gives), or its section apart."""
    if spec.saved_apart:
        return saved[_lib.SAVED_SECTIONS["norm_output"]].reshape(spec.tokens, spec.hidden)
    dtype = jnp.dtype(spec.dtype)
    facts = _plan_facts(spec.with_(amax_flags=0, saved_apart=False))
    offset, size = facts[1], spec.tokens * spec.hidden * dtype.itemsize
    codes = jax.lax.slice_in_dim(saved, offset, offset + size).reshape(spec.tokens, spec.hidden, dtype.itemsize)
    return jax.lax.bitcast_convert_type(codes, dtype)


def absent(dtype):
    """The zero-element stand-in of a tensor the configuration does not take."""
    return jnp.zeros((0,), dtype)


def no_state():
    return jnp.zeros((0,), jnp.float32)


def random_operand(rng_state, first_token=0, whole_tokens=0, ffn_part=0, ffn_parts=1):
    """The backward call's random operand, uint32 [10] (xla_ffi/handlers.cpp's set_random_stream):
    the quantizer set's random state (uint32 [4]: seed, offset) and the call's place in the whole
    tensors (lnmlp_plan_set_rng_place; first_token and ffn_part may be traced)."""
    def words(v):
        v = jnp.asarray(v, jnp.uint32)  # token counts below 2^32 (a stream holds 2^48 elements)
        return [v, jnp.zeros((), jnp.uint32)]

    place = words(first_token) + words(whole_tokens) + [jnp.asarray(ffn_part, jnp.uint32),
                                                        jnp.asarray(ffn_parts, jnp.uint32)]
    return jnp.concatenate([jnp.asarray(rng_state, jnp.uint32), jnp.stack(place)])


# ---- the custom calls, each with its batching rule -------------------------------------------------

def _sequential(fn, axis_size, in_batched, args):
    """fn over the batch, one element at a time (jax.lax.map); unbatched args are shared."""
    batched = [a for a, b in zip(args, in_batched) if b]

    def one(xs):
        it = iter(xs)
        return fn(*[next(it) if b else a for a, b in zip(args, in_batched)])

    outs = jax.lax.map(one, batched)
    return outs, (True,) * len(outs)


def _saved_outputs(spec: Spec, out):
    """The types of forward's saved result(s): the saved bytes, or with saved_apart the sections."""
    return out["sections"] if spec.saved_apart else (out["saved"],)


@functools.lru_cache(maxsize=512)
def forward_call(spec: Spec):
    """(x, gamma, beta, w1, b1, w2, b2, state) -> (y, saved, state) for spec's tokens; saved is the
    tuple of sections with spec.saved_apart."""
    out = _output_types(spec)
    saved_types = _saved_outputs(spec, out)
    # The state (argument 7) is updated in place: XLA aliases it to the last output.
    call = jax.ffi.ffi_call(
        _ffi.FORWARD, (out["y"], *saved_types, out["workspace"], out["fp8_state"]),
        input_output_aliases={7: len(saved_types) + 2} if spec.takes_state else None)
    attrs = spec.attributes()

    # Flat results: (y, *saved, state), the saved ones one by one.
    @jax.custom_batching.custom_vmap
    def forward(x, gamma, beta, w1, b1, w2, b2, state):
        y, *saved, _, state = call(x, gamma, beta, w1, b1, w2, b2, state, **attrs)
        return (y, *saved, state)

    @forward.def_vmap
    def forward_batched(axis_size, in_batched, x, gamma, beta, w1, b1, w2, b2, state):
        args = (x, gamma, beta, w1, b1, w2, b2, state)
        if in_batched[0] and not any(in_batched[1:]):
            # Only x is batched: one call with the batch folded into the tokens. saved is that
            # call's, so it stays unbatched (backward's rule below reads it whole).
            big = spec.with_(tokens=axis_size * spec.tokens)
            y, *rest = forward_call(big).flat(x.reshape(big.tokens, spec.hidden), *args[1:])
            return (y.reshape(axis_size, spec.tokens, spec.hidden), *rest), (True,) + (False,) * len(rest)
        return _sequential(forward, axis_size, in_batched, args)

    def grouped(x, gamma, beta, w1, b1, w2, b2, state):
        y, *saved, state = forward(x, gamma, beta, w1, b1, w2, b2, state)
        return y, (tuple(saved) if spec.saved_apart else saved[0]), state

    grouped.flat = forward
    return grouped


@functools.lru_cache(maxsize=512)
def backward_call(spec: Spec):
    """(dy, x, gamma, beta, w1, b1, w2, saved, state, rng=None) -> (dx, dgamma, dbeta, dw1, db1, dw2,
    db2, state); saved is the tuple of sections with spec.saved_apart. A plan that rounds
    stochastically (spec.draws_random) takes rng, random_operand's; without it, state is the
    quantizer set's random state itself, the call's tensors whole."""
    out = _output_types(spec)
    n_saved = len(_saved_outputs(spec, out))
    # The state (the last operand) is updated in place: XLA aliases it to output 8.
    call = jax.ffi.ffi_call(
        _ffi.BACKWARD, tuple(out[n] for n in _BACKWARD_OUTPUTS + ("workspace", "fp8_state")),
        input_output_aliases={7 + n_saved: 8} if spec.takes_state else None)
    attrs = spec.attributes()

    # Flat operands: (dy, x, gamma, beta, w1, b1, w2, *saved, state[, rng]), the saved ones one by one.
    @jax.custom_batching.custom_vmap
    def backward(*args):
        *grads, _, state = call(*args, **attrs)
        return (*grads, state)

    @backward.def_vmap
    def backward_batched(axis_size, in_batched, *args):
        if in_batched[0] and in_batched[1] and not any(in_batched[2:]):
            # dy and x batched, saved whole: the backward of forward_batched's one call.
            big = spec.with_(tokens=axis_size * spec.tokens)
            rows = (big.tokens, spec.hidden)
            dx, *rest = backward_call(big).flat(args[0].reshape(rows), args[1].reshape(rows), *args[2:])
            dx = dx.reshape(axis_size, spec.tokens, spec.hidden)
            return (dx, *rest), (True,) + (False,) * len(rest)
        return _sequential(backward, axis_size, in_batched, args)

    def grouped(dy, x, gamma, beta, w1, b1, w2, saved, state, rng=None):
        if spec.draws_random and rng is None:
            state, rng = no_state(), random_operand(state)
        random = (rng,) if spec.draws_random else ()
        return backward(dy, x, gamma, beta, w1, b1, w2, *(saved if spec.saved_apart else (saved,)), state, *random)

    grouped.flat = backward
    return grouped
