"""lnmlp's forward and backward as PyTorch custom ops (``torch.library.custom_op``).

Three ops, each with a fake (meta) implementation for ``torch.compile`` and ``opcheck``:

* ``lnmlp::forward(x, gamma, beta, w1, b1, w2, b2, state, main_dw1, main_dw2, ints, floats)
  -> (y, saved, state, norm_output)`` (y a fresh tensor of x's shape, never a view; norm_output
  the norm's output of x's shape when the configuration asks for it, else empty; main_dw1 /
  main_dw2: the fp32 accumulators its backward adds the weight gradients into, or None; forward
  only keeps them for backward)
* ``lnmlp::backward(dy, x, gamma, beta, w1, b1, w2, saved, state, ints, floats)
  -> (dx, dgamma, dbeta, dw1, db1, dw2, db2, state)``
* ``lnmlp::backward_accumulate(dy, ..., state, main_dw1, main_dw2, ints, floats)
  -> (dx, dgamma, dbeta, db1, db2, state)``, which adds dW1 and dW2 into fp32 ``main_dw1`` /
  ``main_dw2`` in place inside the GEMMs (TransformerEngine's ``fuse_wgrad_accumulation``), or
  writes them there when the configuration's ``main_grad`` bits say overwrite (both weights).
  Eager backward uses it; under ``torch.compile`` (whose backward graphs do not take a mutating
  custom op), and when one weight overwrites and the other adds, backward computes fp32 dW with
  ``lnmlp::backward`` and adds or copies it.

``forward`` is differentiable (``register_autograd``): its backward runs ``lnmlp::backward``
(or ``backward_accumulate``), or, for a configuration with ``delay_wgrad`` (the module's
``delay_wgrad_compute``), eagerly the library's backward data call, leaving the weights call
pending per slot for ``finish_weight_grads`` (the module's ``backward_dw()``). Every op is
functional but the last one's two accumulators: the delayed-scaling state comes in and goes out
as a fresh tensor, and the caller copies it back (``_functional.py``), which both eager PyTorch
and ``torch.compile`` handle; the backward formula copies the backward quantizers' update into the
caller's state tensor the same way.

Tensors are passed to the C library by pointer, with no copies: x is ``[..., H]`` (every leading
index a token), w1 ``[H, A, F]`` and w2 ``[F, H]`` (JAX's kernels, the configuration's
``weight_layout`` 0) or ``[A, F, H]`` and ``[H, F]`` (``nn.Linear``'s weights, 1), all contiguous;
dW1 and dW2 come back in the weights' layout. The ops are public, so each checks every tensor it
reads or writes, and its configuration, before the library sees a pointer: the block's shapes, then
each tensor's dtype and shape against what the plan reports (``_checked_plan``). CPU tensors run on
the CPU backend, CUDA tensors on the CUDA backend on ``torch.cuda.current_stream()``.

The configuration travels as two lists (``ints``, ``floats``; ``_Config`` packs and unpacks them),
and the plan behind a call comes from a cache keyed by the configuration, device and dtypes; on the
CPU by thread too (a plan's lock keeps its calls one at a time, and a CPU call holds it for the
whole computation; a thread's plans are closed when the thread ends), on a GPU by stream instead (a
call only enqueues, and calls on one stream are ordered: forward and autograd's backward, which
runs on its own thread, then share the plan and its workspace); and by a *slot*: 0 for the
functional API's shared plans, a module's own number for a module's plans (their kept weight copies
are then that module's, which ``is_first_microbatch=False`` relies on; a deep copy or an unpickled
module gets a new slot). On the CPU a plan serves every token count up to the largest seen so far
(ABI 2's tokens per call); a larger call replaces it.
"""

from __future__ import annotations

import atexit
import collections
import ctypes
import dataclasses
import functools
import itertools
import threading
import weakref
from typing import List, Optional

import numpy as np
import torch
from torch import Tensor

from .. import _lib
from .. import _plan
from .._lib import InvalidArgumentError, NotSupportedError
from . import _comm, _numbering

# torch dtype -> (NumPy dtype for lnmlp.Plan, LNMLP_DTYPE_*)
_DTYPES = {torch.float32: (np.dtype(np.float32), _lib.DTYPE_F32),
           torch.float16: (np.dtype(np.float16), _lib.DTYPE_F16)}
if _plan._BF16 is not None:
    _DTYPES[torch.bfloat16] = (_plan._BF16, _lib.DTYPE_BF16)
_CODE_TO_TORCH = {code: t for t, (_, code) in _DTYPES.items()}
_ACT_NAMES = {v: k for k, v in _plan.ACTIVATIONS.items()}
_REMAT_NAMES = {v: k for k, v in _plan._REMATS.items()}

# Recipes by number: the ops take ints, lnmlp.Plan takes the recipe object.
_recipes = _numbering.Numbering()


@torch.compiler.assume_constant_result  # torch.compile: a constant for the recipe it traces with
def recipe_number(recipe) -> int:
    """A recipe's number in the ops' configuration (0: none). Equal recipes share a number."""
    return _recipes.number(recipe)


@dataclasses.dataclass(frozen=True)
class _Config:
    """What a call computes besides its tensors (their shapes and dtypes say the rest)."""

    slot: int = 0           # 0: the shared plans; a module's number: its own plans
    norm: int = 0           # LNMLP_NORM_*
    zero_centered_gamma: int = 0
    act0: int = _plan.ACTIVATIONS["relu"]
    act1: int = -1          # -1: one activation
    remat: int = _plan._REMATS["save_all"]
    recipe: int = 0         # recipe_number()
    flags: int = 0          # LNMLP_CALL_* of this call
    grad_dtype: int = -1    # dW1, db1, dW2, db2: -1 the I/O dtype, or LNMLP_DTYPE_F32
    weight_layout: int = 0  # LNMLP_WEIGHT_LAYOUT_*: 0 w1 [H, A, F], w2 [F, H]; 1 w1 [A, F, H], w2 [H, F]
    main_grad: int = 0      # MAIN_GRAD_* bits: how backward treats main_dw1 / main_dw2, what it returns as dW
    norm_output: int = 0    # 1: forward also gives the norm output (lnmlp_desc_set_norm_output)
    delay_wgrad: int = 0    # 1: backward leaves dW1 and dW2 to finish_weight_grads (delay_wgrad_compute)
    tp_group: int = 0       # _comm.group_number of the tensor-parallel group (0: none): the plan is its rank's
    sequence_parallel: int = 0  # 1: x, y, dy, dx are this rank's rows of the group's tokens
    fp8_group: int = 0      # _comm.group_number of the group delayed scaling's state agrees over (TE's fp8_group)
    epsilon: float = 1e-6
    clamp_limit: float = 7.0
    clamp_alpha: float = 1.702
    clamp_offset: float = 1.0

    _INTS = ("slot", "norm", "zero_centered_gamma", "act0", "act1", "remat", "recipe", "flags", "grad_dtype",
             "weight_layout", "main_grad", "norm_output", "delay_wgrad", "tp_group", "sequence_parallel",
             "fp8_group")
    _FLOATS = ("epsilon", "clamp_limit", "clamp_alpha", "clamp_offset")

    def ints(self) -> List[int]:
        return [int(getattr(self, n)) for n in self._INTS]

    def floats(self) -> List[float]:
        return [float(getattr(self, n)) for n in self._FLOATS]

    @classmethod
    def unpack(cls, ints, floats) -> "_Config":
        return _unpack(tuple(ints), tuple(floats))

    def with_(self, **changes) -> "_Config":
        return dataclasses.replace(self, **changes)

    @property
    def out_in(self) -> bool:
        return self.weight_layout == _lib.WEIGHT_LAYOUT_OUT_IN

    def ffn_of(self, w1: Tensor) -> tuple:
        """(A, F) of w1, whichever its layout."""
        return (w1.shape[0], w1.shape[1]) if self.out_in else (w1.shape[1], w1.shape[2])

    def weight_shapes(self, hidden, A, ffn) -> tuple:
        """The shapes of w1 (and dW1) and w2 (and dW2) in this configuration's layout."""
        return ((A, ffn, hidden), (hidden, ffn)) if self.out_in else ((hidden, A, ffn), (ffn, hidden))

    @property
    def activations(self):
        return (_ACT_NAMES[self.act0],) if self.act1 < 0 else (_ACT_NAMES[self.act0], _ACT_NAMES[self.act1])


# _Config.main_grad, per weight (shifted by MAIN_GRAD_SHIFT for w2), as TransformerEngine's
# fuse_wgrad_accumulation treats a weight's main_grad (module/layernorm_mlp.py's backward):
MAIN_GRAD_OVERWRITE = 1  # backward writes dW into main_dw instead of adding (is_first_microbatch=True, or the
#                          weight's overwrite_main_grad)
MAIN_GRAD_DUMMY = 2      # backward returns an uninitialised dW of the weight's shape and dtype (Megatron's DDP,
#                          whose grad_added_to_main_grad attribute asks for one, runs its hooks on it) ...
MAIN_GRAD_ZEROS = 4      # ... zero-filled (the weight's zero_out_wgrad)
MAIN_GRAD_SHIFT = 3


@functools.lru_cache(maxsize=1024)  # a call unpacks its configuration several times: once per tuple
def _unpack(ints: tuple, floats: tuple) -> _Config:
    if len(ints) != len(_Config._INTS) or len(floats) != len(_Config._FLOATS):
        raise InvalidArgumentError(f"lnmlp ops: expected {len(_Config._INTS)} ints and {len(_Config._FLOATS)} "
                                   f"floats of configuration, got {len(ints)} and {len(floats)}")
    cfg = _Config(**dict(zip(_Config._INTS, map(int, ints))), **dict(zip(_Config._FLOATS, map(float, floats))))
    bad = _config_error(cfg)
    if bad:
        raise InvalidArgumentError(f"lnmlp ops: the configuration's {bad}")
    return cfg


def _config_error(cfg: _Config) -> str:
    """What is wrong with a configuration the ops were given ('' when nothing is): the ops are
    public (torch.ops.lnmlp.*), so their ints are checked before any is used as an index."""
    recipes = len(_recipes)
    valid = (("slot", cfg.slot >= 0), ("norm", cfg.norm in _plan._NORMS.values()),
             ("zero_centered_gamma", cfg.zero_centered_gamma in (0, 1)), ("act0", cfg.act0 in _ACT_NAMES),
             ("act1", cfg.act1 == -1 or cfg.act1 in _ACT_NAMES), ("remat", cfg.remat in _REMAT_NAMES),
             ("recipe", 0 <= cfg.recipe < recipes),
             ("flags", cfg.flags in (_lib.CALL_DEFAULT, _lib.CALL_WEIGHTS_UNCHANGED)),
             ("grad_dtype", cfg.grad_dtype in (-1, _lib.DTYPE_F32)),
             ("weight_layout", cfg.weight_layout in (_lib.WEIGHT_LAYOUT_IN_OUT, _lib.WEIGHT_LAYOUT_OUT_IN)),
             ("main_grad", 0 <= cfg.main_grad < 1 << (2 * MAIN_GRAD_SHIFT)),
             ("norm_output", cfg.norm_output in (0, 1)), ("delay_wgrad", cfg.delay_wgrad in (0, 1)),
             ("tp_group", 0 <= cfg.tp_group < _comm.group_count()),
             ("sequence_parallel", cfg.sequence_parallel in ((0, 1) if cfg.tp_group else (0,))),
             ("fp8_group", 0 <= cfg.fp8_group < _comm.group_count()))
    return ", ".join(f"{name} {getattr(cfg, name)} is not valid" for name, ok in valid if not ok)


# ---- checks -----------------------------------------------------------------------------------------

#: The ops' own argument names; the functional API and the module pass theirs.
OP_NAMES = {n: n for n in ("x", "gamma", "beta", "w1", "b1", "w2", "b2")}


def check_tensor(name, t, x=None, dtypes=tuple(_DTYPES)) -> None:
    """t is a torch tensor of one of `dtypes`, on CPU or CUDA (x's device where x is given), and
    contiguous: the library reads and writes it in place as a row-major array."""
    if not isinstance(t, Tensor):
        raise InvalidArgumentError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        want = " or ".join(str(d).replace("torch.", "") for d in dtypes)
        raise InvalidArgumentError(f"{name} must be {want}, got {t.dtype}")
    if t.device.type not in ("cpu", "cuda"):
        raise InvalidArgumentError(f"{name} is on {t.device}; lnmlp runs on CPU and CUDA tensors")
    if x is not None and t.device != x.device:
        raise InvalidArgumentError(f"{name} is on {t.device}, but x is on {x.device}")
    if not t.is_contiguous():
        raise InvalidArgumentError(f"{name} is not contiguous; lnmlp reads tensors in place: pass {name}.contiguous()")


def _shape_error(name, want, got):
    return InvalidArgumentError(f"{name} must have shape {want}, got {tuple(got)}")


def check_operands(names: dict, cfg: _Config, x, gamma, beta, w1, b1, w2, b2) -> None:
    """The block's inputs fit cfg and each other: x [..., H]; w1 [H, A, F] and w2 [F, H] (or, in
    cfg's out x in layout, [A, F, H] and [H, F]); gamma [H]; beta [H] for layernorm, None for
    rmsnorm; b1 [A, F] and b2 [H] or None; all torch tensors on x's device, contiguous, of an I/O
    dtype. Messages use `names` (the caller's names for x, gamma, beta, w1, b1, w2, b2)."""
    check_tensor(names["x"], x)
    if x.dim() < 1 or x.shape[-1] < 1:
        raise InvalidArgumentError(f"{names['x']} must have shape [..., H] with H >= 1, got {tuple(x.shape)}")
    H, A = x.shape[-1], len(cfg.activations)
    check_tensor(names["w1"], w1, x)
    check_tensor(names["w2"], w2, x)
    if cfg.out_in:
        if w1.dim() != 3 or w1.shape[0] != A or w1.shape[2] != H:
            raise _shape_error(names["w1"], f"(A, F, H) = ({A}, F, {H})", w1.shape)
    elif w1.dim() != 3 or w1.shape[0] != H or w1.shape[1] != A:
        raise _shape_error(names["w1"], f"(H, A, F) = ({H}, {A}, F)", w1.shape)
    F = cfg.ffn_of(w1)[1]
    w2_shape = cfg.weight_shapes(H, A, F)[1]
    if tuple(w2.shape) != w2_shape:
        raise _shape_error(names["w2"], w2_shape, w2.shape)
    check_tensor(names["gamma"], gamma, x)
    if tuple(gamma.shape) != (H,):
        raise _shape_error(names["gamma"], (H,), gamma.shape)
    if cfg.norm == _plan._NORMS["layernorm"]:
        if beta is None:
            raise InvalidArgumentError(f"{names['beta']} is None, but layernorm needs it (shape (H,))")
        check_tensor(names["beta"], beta, x)
        if tuple(beta.shape) != (H,):
            raise _shape_error(names["beta"], (H,), beta.shape)
    elif beta is not None:
        raise InvalidArgumentError(f"{names['beta']} must be None for rmsnorm, which has no beta")
    for name, b, shape in (("b1", b1, (A, F)), ("b2", b2, (H,))):
        if b is not None:
            check_tensor(names[name], b, x)
            if tuple(b.shape) != shape:
                raise _shape_error(names[name], shape, b.shape)


_NUMPY_TO_TORCH = {np_dtype: t for t, (np_dtype, _) in _DTYPES.items()}
_NUMPY_TO_TORCH[np.dtype(np.uint8)] = torch.uint8


# The ops' arguments that are not named as the library's tensors.
_TENSOR_OF = {"state": "fp8_state", "main_dw1": "dw1", "main_dw2": "dw2"}


def _check_against_plan(op: str, plan, tokens: int, x: Tensor, **tensors) -> None:
    """Each given tensor (None: not given) has the dtype and shape the plan reports for a call
    with `tokens` tokens (lnmlp_plan_get_tensor_shape), is on x's device and contiguous; one the
    plan does not take must be None or empty. x-shaped tensors (dy) must match x; saved must hold
    at least the call's saved bytes. Nothing outside the tensors given is then read or written."""
    for name, t in tensors.items():
        k = _lib.TENSORS[_TENSOR_OF.get(name, name)]
        if k in plan._shapes:  # the sizes that do not depend on tokens, which the plan keeps
            shape, np_dtype = plan._shapes[k], plan._dtypes[k]
        else:  # dy, saved: one query for this call's tokens
            shape, np_dtype = plan._tensor_shape(k, tokens, with_dtype=True)
        label = f"lnmlp::{op}: {name}"
        if shape is None:
            if t is not None and t.numel():
                raise InvalidArgumentError(f"{label} must be None or empty: this configuration takes none")
            continue
        if t is None:
            raise InvalidArgumentError(f"{label} is None, but this configuration needs it: shape {shape}")
        check_tensor(label, t, x, dtypes=(_NUMPY_TO_TORCH[np_dtype],))
        if name == "dy":
            if tuple(t.shape) != tuple(x.shape):
                raise _shape_error(label, tuple(x.shape), t.shape)
        elif name == "saved":
            if t.dim() != 1 or t.numel() < shape[0]:
                raise InvalidArgumentError(f"{label} must be the 1-D uint8 tensor forward returned, of at least "
                                           f"{shape[0]} bytes for {tokens} tokens, got shape {tuple(t.shape)}")
        elif tuple(t.shape) != shape:
            raise _shape_error(label, shape, t.shape)


def _checked_plan(op: str, cfg: _Config, x, gamma, beta, w1, b1, w2, b2, has_b2, accumulate=False, **more):
    """The plan for an op's call, after checking every tensor the call reads or writes in place:
    first the block's shapes (the plan is made from x's and w1's), then every tensor against the
    plan's reported dtypes and shapes (`more`: dy, saved, state, main_dw1, main_dw2)."""
    check_operands({n: f"lnmlp::{op}: {n}" for n in OP_NAMES}, cfg, x, gamma, beta, w1, b1, w2, b2)
    plan = _plan_for(cfg, x, w1, b1 is not None, has_b2, accumulate)
    params = dict(gamma=gamma, beta=beta, w1=w1, b1=b1, w2=w2)
    if b2 is not None or not has_b2:  # backward takes no b2, only whether there is one
        params["b2"] = b2
    _check_against_plan(op, plan, _dims(cfg, x, w1)[0], x, **params, **more)
    return plan


def _check_one_device(op: str, x: Tensor, **tensors) -> None:
    """The fake implementations' check: a meta tensor among CPU or CUDA ones sends a call here
    rather than to the real one, which would refuse it; so does this."""
    for name, t in tensors.items():
        if t is not None and t.device != x.device:
            raise InvalidArgumentError(f"lnmlp::{op}: {name} is on {t.device}, but x is on {x.device}")


def _dims(cfg: _Config, x: Tensor, w1: Tensor) -> tuple:
    """(T, H, A, F) of a call: x is [..., H], every leading index a token (T may be symbolic)."""
    H = x.shape[-1]
    return (x.numel() // H, H, *cfg.ffn_of(w1))


# ---- plans ------------------------------------------------------------------------------------------

_plans_lock = threading.Lock()
_plans: dict = {}       # key -> lnmlp.Plan
_size_plans: dict = {}  # the saved-buffer bound's terms per configuration (a CPU plan answers)


def _plan_kwargs(cfg: _Config, hidden, ffn, dtype, has_b1, has_b2, weight_dtype, accumulate):
    np_dtype = _DTYPES[dtype][0]
    clamped = cfg.activations == _plan.GATED_PAIRS["clamped_swiglu"]
    return dict(hidden=hidden, ffn=ffn, norm_type="layernorm" if cfg.norm == 0 else "rmsnorm",
                zero_centered_gamma=bool(cfg.zero_centered_gamma), epsilon=cfg.epsilon,
                activation_type=cfg.activations,
                act_params=_plan.ActParams(cfg.clamp_limit, cfg.clamp_alpha, cfg.clamp_offset) if clamped else None,
                use_bias1=has_b1, use_bias2=has_b2, dtype=np_dtype, remat=_REMAT_NAMES[cfg.remat],
                recipe=_recipes[cfg.recipe], grad_dtype=np.float32 if cfg.grad_dtype == _lib.DTYPE_F32 else None,
                weight_dtype=_DTYPES[weight_dtype][0] if weight_dtype != dtype else None, accumulate_grads=accumulate,
                weight_layout="out_in" if cfg.out_in else "in_out", norm_output=bool(cfg.norm_output))


def _plan_for(cfg: _Config, x: Tensor, w1: Tensor, has_b1, has_b2, accumulate=False):
    """The plan for this call (made, or replaced by a larger one, as needed)."""
    return _plan_of(cfg, _dims(cfg, x, w1), x.dtype, w1.dtype, x.device, has_b1, has_b2, accumulate)


def _sharding_kwargs(cfg: _Config, tokens: int, ffn: int, comm) -> tuple:
    """(the plan's tokens, ffn, and its sharding keywords) for a call of `tokens` rows with F shard
    `ffn`: without a tensor-parallel group these; with one the group's (under sequence
    parallelism every rank's rows; F of every shard), the rank's sharding and the communicator."""
    if not cfg.tp_group:
        return tokens, ffn, {}
    _, size, rank = _comm.group_of(cfg.tp_group)
    sp = bool(cfg.sequence_parallel)
    return (tokens * size if sp else tokens), ffn * size, dict(sharding=(size, rank, sp), comm=comm)


def _plan_of(cfg: _Config, dims: tuple, dtype, weight_dtype, device, has_b1, has_b2, accumulate):
    """_plan_for, given a call's (T, H, A, F), I/O and weight dtypes and device."""
    tokens, hidden, A, ffn = dims
    owner = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else _thread_number()
    key = (cfg.with_(flags=0, main_grad=0, fp8_group=0), hidden, A, ffn, dtype, weight_dtype, has_b1, has_b2,
           accumulate, str(device), owner)
    with _plans_lock:
        plan = _plans.get(key)
    if plan is not None and plan.local_tokens >= tokens:
        return plan
    most = max(tokens, 1 if plan is None else plan.local_tokens)
    comm = _comm.communicator(cfg.tp_group, device) if cfg.tp_group else None
    rows, group_ffn, sharding = _sharding_kwargs(cfg, most, ffn, comm)
    kw = _plan_kwargs(cfg, hidden, group_ffn, dtype, has_b1, has_b2, weight_dtype, accumulate)
    if device.type == "cuda":
        new = _plan.Plan(rows, backend="cuda", device=device.index, **sharding, **kw)
    else:
        new = _plan.Plan(rows, **sharding, **kw)
    with _plans_lock:
        old = _plans.get(key)
        _plans[key] = new
    if old is not None:
        old.close()
    return new


def _drop_plans(which) -> None:
    """Closes the plans whose cache key `which` accepts."""
    with _plans_lock:
        gone = [_plans.pop(k) for k in [k for k in _plans if which(k)]]
    for p in gone:
        p.close()


def drop_slot(slot: int) -> None:
    """Closes the plans of a module's slot (called when the module is garbage-collected), and drops
    the weight gradients it left pending."""
    _drop_plans(lambda key: key[0].slot == slot)
    with _plans_lock:
        _pending.pop(slot, None)


def _release_at_exit() -> None:
    """Closes every plan and drops the process groups they used, before the interpreter tears torch
    down, so that no group (nor its communicator's callbacks) is left to that last teardown. (One
    rank of the Llama example once aborted at exit -- "terminate called without an active
    exception" -- after printing its results; not reproduced since, and this was the suspect.)"""
    _drop_plans(lambda key: True)
    with _plans_lock:
        _pending.clear()
    _comm.forget_groups()


atexit.register(_release_at_exit)  # runs before torch's own exit handlers (registered earlier)


class _ThreadPlans:
    """Held in a thread's local storage by the first CPU call on that thread: when the thread
    ends, Python drops its local storage, and the finalizer closes the plans the thread made."""

    def __init__(self, number: int):
        self.number = number
        weakref.finalize(self, _drop_plans, lambda key: key[-1] == ("thread", number))


_thread_local = threading.local()
_thread_numbers = itertools.count(1)  # never reused, unlike thread idents


def _thread_number() -> tuple:
    """This thread's part of a CPU plan's cache key."""
    mine = getattr(_thread_local, "plans", None)
    if mine is None:
        mine = _thread_local.plans = _ThreadPlans(next(_thread_numbers))
    return ("thread", mine.number)


def plan_count() -> int:
    """How many plans the ops keep (every slot, thread, device and configuration)."""
    with _plans_lock:
        return len(_plans)


# A call with t tokens needs at most per_token * t + _SAVED_SLACK bytes of saved buffer, the bound
# the ops allocate (a shape the fake implementations can state for a symbolic t). The saved layout
# (docs/design.md, src/plan/layout.cpp) has at most 10 regions, each padded to 256 bytes, and the
# blocked recipes' scale rows for ceil(t / block) blocks of ln_out [H] and act_out [F] columns add
# at most one block row (<= 4 bytes a column) beyond the per-token share per_token counts. A test
# (test_torch.py) checks the bound against the library's exact size for many t.
_SAVED_REGION_SLACK = 10 * 256


def _saved_terms(cfg: _Config, hidden, A, ffn, dtype, has_b1, has_b2):
    """(per_token, slack) of the saved-size bound for this configuration."""
    key = (cfg.with_(slot=0, flags=0, main_grad=0, fp8_group=0), hidden, A, ffn, dtype, has_b1, has_b2)
    with _plans_lock:
        terms = _size_plans.get(key)
    if terms is None:
        layout = None if not cfg.tp_group else _comm.layout_communicator(*_comm.group_of(cfg.tp_group)[1:])
        rows, group_ffn, sharding = _sharding_kwargs(cfg, 1, ffn, layout)
        kw = _plan_kwargs(cfg, hidden, group_ffn, dtype, has_b1, has_b2, dtype, False)
        kw["grad_dtype"] = None
        with _plan.Plan(rows, external_workspace=True, **sharding, **kw) as p:  # the layout is every backend's
            per_token = p.saved_bytes_per_token
        if cfg.sequence_parallel:  # a rank's call saves what it computes for the group's rows, P per local row
            per_token *= rows
        slack = 0 if per_token == 0 else _SAVED_REGION_SLACK + 4 * (hidden + ffn)
        terms = (per_token, slack)
        with _plans_lock:
            _size_plans[key] = terms
    return terms


def saved_bytes_bound(cfg: _Config, tokens, hidden, A, ffn, dtype, has_b1, has_b2):
    """The bound for `tokens` tokens (which may be symbolic; the model's dimensions are fixed)."""
    per_token, slack = _saved_terms(cfg, int(hidden), int(A), int(ffn), dtype, has_b1, has_b2)
    return per_token * tokens + slack if per_token else 0


# ---- the C calls ------------------------------------------------------------------------------------

def _check_call(cfg: _Config, device, status: int, outputs: Optional[str] = None) -> None:
    """_lib.check of a call's status; a tensor-parallel call that failed in a collective also
    says what torch.distributed raised."""
    if status != _lib.SUCCESS and cfg.tp_group:
        failure = _comm.communicator(cfg.tp_group, device).failure()
        if failure:
            raise _lib.error_for(status, _lib.get_lib().lnmlp_last_error().decode("utf-8", "replace") + failure)
    _lib.check(status, outputs)


def _ptr(t: Optional[Tensor]):
    return None if t is None or t.numel() == 0 else ctypes.c_void_p(t.data_ptr())


def _stream(device):
    return ctypes.c_void_p(torch.cuda.current_stream(device).cuda_stream) if device.type == "cuda" else None


def _state_copy(state: Optional[Tensor], device):
    """A fresh copy of the delayed state for the call to update (empty without one)."""
    if state is None or state.numel() == 0:
        return torch.empty(0, dtype=torch.float32, device=device)
    return state.clone()


def _agreed(cfg: _Config, new_state: Tensor) -> Tensor:
    """A call's updated delayed-scaling state, made identical over cfg's fp8_group (unchanged
    without one; a sharded plan has agreed over its tensor-parallel group already)."""
    if not cfg.fp8_group or new_state.numel() == 0:
        return new_state
    most_recent = _recipes[cfg.recipe].amax_compute_algo == "most_recent"
    return _comm.agreed_state(new_state, _comm.group_of(cfg.fp8_group)[0], most_recent)


def _seed_stochastic_rounding(plan, cfg: _Config) -> None:
    """A recipe that rounds stochastically (NVFP4's gradients) draws from torch's default generator,
    as TransformerEngine's quantizers draw from torch's: 63 random bits per backward call seed the
    plan's random stream (lnmlp_plan_set_rng_state), so torch.manual_seed reproduces a run (and
    tensor-parallel ranks seeded alike draw one stream). Called holding the plan's lock."""
    recipe = _recipes[cfg.recipe] if cfg.recipe else None
    if recipe is not None and recipe.draws_random:
        plan.set_rng_state(int(torch.randint(0, 2 ** 63 - 1, (), dtype=torch.int64).item()), 0)


def _empty_like_param(present: bool, shape, dtype, device):
    return torch.empty(shape if present else (0,), dtype=dtype, device=device)


@torch.library.custom_op("lnmlp::forward", mutates_args=(), device_types=("cpu", "cuda"))
def forward_op(x: Tensor, gamma: Tensor, beta: Optional[Tensor], w1: Tensor, b1: Optional[Tensor], w2: Tensor,
               b2: Optional[Tensor], state: Optional[Tensor], main_dw1: Optional[Tensor],
               main_dw2: Optional[Tensor], ints: List[int],
               floats: List[float]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    cfg = _Config.unpack(ints, floats)
    plan = _checked_plan("forward", cfg, x, gamma, beta, w1, b1, w2, b2, b2 is not None, state=state)
    if (main_dw1 is None) != (main_dw2 is None):
        raise InvalidArgumentError("lnmlp::forward: main_dw1 and main_dw2 are both given or both None")
    for name, main, w in (("main_dw1", main_dw1, w1), ("main_dw2", main_dw2, w2)):
        if main is not None:  # kept for backward_accumulate, which adds into them
            check_tensor(f"lnmlp::forward: {name}", main, x, dtypes=(torch.float32,))
            if main.shape != w.shape:
                raise _shape_error(f"lnmlp::forward: {name}", tuple(w.shape), main.shape)
    T, H, A, F = _dims(cfg, x, w1)
    y = torch.empty_like(x)
    saved = torch.empty(saved_bytes_bound(cfg, T, H, A, F, x.dtype, b1 is not None, b2 is not None),
                        dtype=torch.uint8, device=x.device)
    new_state = _state_copy(state, x.device)
    lib = _lib.get_lib()
    with plan._lock:
        status = lib.lnmlp_plan_forward(plan._live(), T, _ptr(x), _ptr(gamma), _ptr(beta), _ptr(w1), _ptr(b1),
                                        _ptr(w2), _ptr(b2), _ptr(y), _ptr(saved), _ptr(new_state), cfg.flags,
                                        _stream(x.device))
    _check_call(cfg, x.device, status)
    new_state = _agreed(cfg, new_state)
    # The library writes every byte of the call's saved bytes; the bound's slack beyond them is
    # zeroed too, so the output is a function of the inputs (opcheck compares it).
    exact = 0 if saved.numel() == 0 else plan._tensor_shape(_lib.TENSOR_SAVED, T)[0]
    if saved.numel() > exact:
        saved[exact:].zero_()
    return y, saved, new_state, _norm_output_of(cfg, plan, saved, x)


def _norm_output_of(cfg: _Config, plan, saved: Tensor, x: Tensor) -> Tensor:
    """A copy of the norm output [..., H] in x's dtype, out of the saved buffer's section where the
    plan says it is (empty without cfg.norm_output)."""
    if not cfg.norm_output:
        return x.new_empty((0,))
    offset = plan.saved_section("norm_output", x.numel() // x.shape[-1])[0]
    if cfg.sequence_parallel:  # the section holds the group's rows, gathered: this rank's are its own
        offset += _comm.group_of(cfg.tp_group)[2] * x.numel() * x.element_size()
    return saved[offset:offset + x.numel() * x.element_size()].view(x.dtype).view(x.shape).clone()


@forward_op.register_fake
def _forward_fake(x, gamma, beta, w1, b1, w2, b2, state, main_dw1, main_dw2, ints, floats):
    _check_one_device("forward", x, gamma=gamma, beta=beta, w1=w1, b1=b1, w2=w2, b2=b2, state=state,
                      main_dw1=main_dw1, main_dw2=main_dw2)
    cfg = _Config.unpack(ints, floats)
    T, H, A, F = _dims(cfg, x, w1)
    saved = x.new_empty(saved_bytes_bound(cfg, T, H, A, F, x.dtype, b1 is not None, b2 is not None),
                        dtype=torch.uint8)
    new_state = x.new_empty(state.shape if state is not None else (0,), dtype=torch.float32)
    return torch.empty_like(x), saved, new_state, torch.empty_like(x) if cfg.norm_output else x.new_empty((0,))


def _grad_type(cfg: _Config, io: torch.dtype) -> torch.dtype:
    return io if cfg.grad_dtype < 0 else _CODE_TO_TORCH[cfg.grad_dtype]


@torch.library.custom_op("lnmlp::backward", mutates_args=(), device_types=("cpu", "cuda"))
def backward_op(dy: Tensor, x: Tensor, gamma: Tensor, beta: Optional[Tensor], w1: Tensor, b1: Optional[Tensor],
                w2: Tensor, has_b2: bool, saved: Tensor, state: Optional[Tensor], ints: List[int],
                floats: List[float]) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    cfg = _Config.unpack(ints, floats)
    plan = _checked_plan("backward", cfg, x, gamma, beta, w1, b1, w2, None, has_b2, dy=dy, saved=saved, state=state)
    T, H, A, F = _dims(cfg, x, w1)
    g = _grad_type(cfg, x.dtype)
    dx, dgamma = torch.empty_like(x), torch.empty_like(gamma)
    dbeta = _empty_like_param(beta is not None, (H,), x.dtype, x.device)
    w1_shape, w2_shape = cfg.weight_shapes(H, A, F)
    dw1 = torch.empty(w1_shape, dtype=g, device=x.device)
    db1 = _empty_like_param(b1 is not None, (A, F), g, x.device)
    dw2 = torch.empty(w2_shape, dtype=g, device=x.device)
    db2 = _empty_like_param(has_b2, (H,), g, x.device)
    new_state = _state_copy(state, x.device)
    lib = _lib.get_lib()
    with plan._lock:
        _seed_stochastic_rounding(plan, cfg)
        status = lib.lnmlp_plan_backward(plan._live(), T, _ptr(dy), _ptr(x), _ptr(gamma), _ptr(beta), _ptr(w1),
                                         _ptr(b1), _ptr(w2), _ptr(saved), _ptr(dx), _ptr(dgamma), _ptr(dbeta),
                                         _ptr(dw1), _ptr(db1), _ptr(dw2), _ptr(db2), _ptr(new_state), cfg.flags,
                                         _stream(x.device))
    _check_call(cfg, x.device, status)
    return dx, dgamma, dbeta, dw1, db1, dw2, db2, _agreed(cfg, new_state)


@backward_op.register_fake
def _backward_fake(dy, x, gamma, beta, w1, b1, w2, has_b2, saved, state, ints, floats):
    _check_one_device("backward", x, dy=dy, gamma=gamma, beta=beta, w1=w1, b1=b1, w2=w2, saved=saved, state=state)
    cfg = _Config.unpack(ints, floats)
    _, H, A, F = _dims(cfg, x, w1)
    g = _grad_type(cfg, x.dtype)
    w1_shape, w2_shape = cfg.weight_shapes(H, A, F)
    return (torch.empty_like(x), torch.empty_like(gamma), x.new_empty((H,) if beta is not None else (0,)),
            x.new_empty(w1_shape, dtype=g), x.new_empty((A, F) if b1 is not None else (0,), dtype=g),
            x.new_empty(w2_shape, dtype=g), x.new_empty((H,) if has_b2 else (0,), dtype=g),
            x.new_empty(state.shape if state is not None else (0,), dtype=torch.float32))


@torch.library.custom_op("lnmlp::backward_accumulate", mutates_args=("main_dw1", "main_dw2"),
                         device_types=("cpu", "cuda"))
def backward_accumulate_op(dy: Tensor, x: Tensor, gamma: Tensor, beta: Optional[Tensor], w1: Tensor,
                           b1: Optional[Tensor], w2: Tensor, has_b2: bool, saved: Tensor, state: Optional[Tensor],
                           main_dw1: Tensor, main_dw2: Tensor, ints: List[int],
                           floats: List[float]) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    cfg = _Config.unpack(ints, floats).with_(grad_dtype=_lib.DTYPE_F32)
    overwrite = {bool(main_grad_bits(cfg, i) & MAIN_GRAD_OVERWRITE) for i in (0, 1)}
    if len(overwrite) != 1:
        raise InvalidArgumentError("lnmlp::backward_accumulate: the configuration's main_grad must overwrite both "
                                   "main_dw1 and main_dw2 or neither")
    plan = _checked_plan("backward_accumulate", cfg, x, gamma, beta, w1, b1, w2, None, has_b2,
                         accumulate=not overwrite.pop(), dy=dy, saved=saved, state=state, main_dw1=main_dw1,
                         main_dw2=main_dw2)
    T, H, A, F = _dims(cfg, x, w1)
    dx, dgamma = torch.empty_like(x), torch.empty_like(gamma)
    dbeta = _empty_like_param(beta is not None, (H,), x.dtype, x.device)
    # The bias gradients accumulate too (the plan's option covers all four): into zeros, i.e. this
    # call's gradient in fp32 (or are written, when main_grad says overwrite).
    db1 = torch.zeros((A, F) if b1 is not None else (0,), dtype=torch.float32, device=x.device)
    db2 = torch.zeros((H,) if has_b2 else (0,), dtype=torch.float32, device=x.device)
    new_state = _state_copy(state, x.device)
    lib = _lib.get_lib()
    with plan._lock:
        _seed_stochastic_rounding(plan, cfg)
        status = lib.lnmlp_plan_backward(plan._live(), T, _ptr(dy), _ptr(x), _ptr(gamma), _ptr(beta), _ptr(w1),
                                         _ptr(b1), _ptr(w2), _ptr(saved), _ptr(dx), _ptr(dgamma), _ptr(dbeta),
                                         ctypes.c_void_p(main_dw1.data_ptr()), _ptr(db1),
                                         ctypes.c_void_p(main_dw2.data_ptr()), _ptr(db2), _ptr(new_state),
                                         cfg.flags, _stream(x.device))
    _check_call(cfg, x.device, status, outputs="fc1/fc2 main_grad")
    return dx, dgamma, dbeta, db1, db2, _agreed(cfg, new_state)


@backward_accumulate_op.register_fake
def _backward_accumulate_fake(dy, x, gamma, beta, w1, b1, w2, has_b2, saved, state, main_dw1, main_dw2, ints,
                              floats):
    _check_one_device("backward_accumulate", x, dy=dy, gamma=gamma, beta=beta, w1=w1, b1=b1, w2=w2, saved=saved,
                      state=state, main_dw1=main_dw1, main_dw2=main_dw2)
    _, H, A, F = _dims(_Config.unpack(ints, floats), x, w1)
    return (torch.empty_like(x), torch.empty_like(gamma), x.new_empty((H,) if beta is not None else (0,)),
            x.new_empty((A, F) if b1 is not None else (0,), dtype=torch.float32),
            x.new_empty((H,) if has_b2 else (0,), dtype=torch.float32),
            x.new_empty(state.shape if state is not None else (0,), dtype=torch.float32))


# ---- autograd ---------------------------------------------------------------------------------------

def main_grad_bits(cfg: _Config, weight: int) -> int:
    """The MAIN_GRAD_* bits of w1 (0) or w2 (1)."""
    return (cfg.main_grad >> (weight * MAIN_GRAD_SHIFT)) & ((1 << MAIN_GRAD_SHIFT) - 1)


def _main_grad_dummy(cfg: _Config, weight: int, w: Tensor) -> Optional[Tensor]:
    """What backward returns as a weight's gradient when it went into main_grad: None, or
    TransformerEngine's placeholder (empty, or zeros) for Megatron's DDP hooks."""
    bits = main_grad_bits(cfg, weight)
    if not bits & MAIN_GRAD_DUMMY:
        return None
    return torch.zeros_like(w) if bits & MAIN_GRAD_ZEROS else torch.empty_like(w)


def _setup_context(ctx, inputs, output):
    x, gamma, beta, w1, b1, w2, b2, state, main_dw1, main_dw2, ints, floats = inputs
    _, saved, new_state, norm_output = output
    # The norm output's gradient reaches x, gamma and beta through the caller's framework norm
    # (_functional.run), not through this op.
    ctx.mark_non_differentiable(saved, new_state, norm_output)
    ctx.save_for_backward(x, gamma, beta, w1, b1, w2, saved)
    ctx.cfg = _Config.unpack(ints, floats)
    ctx.has_b2 = b2 is not None
    ctx.dtypes = (gamma.dtype, None if beta is None else beta.dtype, w1.dtype, None if b1 is None else b1.dtype,
                  w2.dtype, None if b2 is None else b2.dtype)
    # Backward reads the caller's state as it is then (forward's update already copied into it)
    # and writes its own update (the dy and dh quantizers) back into it.
    ctx.state = state
    # The fp32 accumulators the weight gradients go to instead of being returned (or None).
    ctx.main_grads = None if main_dw1 is None else (main_dw1, main_dw2)


def _backward(ctx, dy, _dsaved, _dstate, _dnorm_output):
    x, gamma, beta, w1, b1, w2, saved = ctx.saved_tensors
    cfg = ctx.cfg
    state = ctx.state
    dy = dy.contiguous()
    if cfg.delay_wgrad:
        dx, dgamma, dbeta, db1, db2, new_state = _backward_data(cfg, dy, x, gamma, beta, w1, b1, w2, ctx.has_b2, saved,
                                                                state, ctx.main_grads)
        dw1 = dw2 = None
        if ctx.main_grads is not None:
            dw1, dw2 = _main_grad_dummy(cfg, 0, w1), _main_grad_dummy(cfg, 1, w2)
    elif ctx.main_grads is not None:
        mains = ctx.main_grads
        overwrite = [bool(main_grad_bits(cfg, i) & MAIN_GRAD_OVERWRITE) for i in (0, 1)]
        if overwrite[0] == overwrite[1] and not torch.compiler.is_compiling():
            dx, dgamma, dbeta, db1, db2, new_state = backward_accumulate_op(
                dy, x, gamma, beta, w1, b1, w2, ctx.has_b2, saved, state, *mains, cfg.ints(), cfg.floats())
        else:  # one weight overwrites, the other adds; or compiled (its backward graph takes no mutating op)
            dx, dgamma, dbeta, dw1, db1, dw2, db2, new_state = backward_op(
                dy, x, gamma, beta, w1, b1, w2, ctx.has_b2, saved, state,
                cfg.with_(grad_dtype=_lib.DTYPE_F32).ints(), cfg.floats())
            for main, dw, write in zip(mains, (dw1, dw2), overwrite):
                if write:
                    main.copy_(dw)
                else:
                    main.add_(dw)
        dw1, dw2 = _main_grad_dummy(cfg, 0, w1), _main_grad_dummy(cfg, 1, w2)
    else:
        dx, dgamma, dbeta, dw1, db1, dw2, db2, new_state = backward_op(
            dy, x, gamma, beta, w1, b1, w2, ctx.has_b2, saved, state, cfg.ints(), cfg.floats())
    if state is not None and state.numel():
        state.copy_(new_state)
    g_dt, beta_dt, w1_dt, b1_dt, w2_dt, b2_dt = ctx.dtypes
    cast = lambda t, dt: None if dt is None or t is None else t.to(dt)  # noqa: E731
    return (dx, cast(dgamma, g_dt), cast(dbeta, beta_dt), cast(dw1, w1_dt), cast(db1, b1_dt), cast(dw2, w2_dt),
            cast(db2, b2_dt), None, None, None, None, None)


forward_op.register_autograd(_backward, setup_context=_setup_context)


# ---- backward in two calls (TransformerEngine's delay_wgrad_compute) ----------------------------------

@dataclasses.dataclass
class _PendingWeightGrads:
    """What backward's data call (lnmlp_plan_backward_data) leaves for its weights call: the
    call's dy, saved and deferred buffers, what finds its plan again, and where dW goes."""
    cfg: _Config
    dims: tuple  # (T, H, A, F)
    dtype: torch.dtype
    weight_dtype: torch.dtype
    has_b1: bool
    has_b2: bool
    dy: Tensor
    saved: Tensor
    deferred: Tensor
    main_grads: Optional[tuple]  # fuse_wgrad_accumulation's fp32 accumulators, or None


_pending: dict = {}  # slot -> deque of _PendingWeightGrads, first in first out (TE's WeightGradStore)


def _backward_data(cfg: _Config, dy, x, gamma, beta, w1, b1, w2, has_b2, saved, state, main_grads):
    """Backward without dW1 and dW2 (dx, dgamma, dbeta, db1, db2, the delayed state), leaving them
    pending for finish_weight_grads(cfg.slot). Eager only: torch.compile's backward graph cannot
    leave work for later."""
    if torch.compiler.is_compiling():
        raise NotSupportedError("delay_wgrad_compute=True does not run under torch.compile: backward_dw() finishes "
                                "the weight gradients eagerly, outside the compiled backward")
    if main_grads is not None:  # the bias gradients in fp32, as fuse_wgrad_accumulation gives them
        cfg = cfg.with_(grad_dtype=_lib.DTYPE_F32)
    plan = _checked_plan("backward_data", cfg, x, gamma, beta, w1, b1, w2, None, has_b2, dy=dy, saved=saved,
                         state=state)
    dims = _dims(cfg, x, w1)
    T, H, A, F = dims
    g = _grad_type(cfg, x.dtype)
    dx, dgamma = torch.empty_like(x), torch.empty_like(gamma)
    dbeta = _empty_like_param(beta is not None, (H,), x.dtype, x.device)
    db1 = _empty_like_param(b1 is not None, (A, F), g, x.device)
    db2 = _empty_like_param(has_b2, (H,), g, x.device)
    deferred = torch.empty(plan.deferred_bytes(T), dtype=torch.uint8, device=x.device)
    new_state = _state_copy(state, x.device)
    lib = _lib.get_lib()
    with plan._lock:
        _seed_stochastic_rounding(plan, cfg)
        status = lib.lnmlp_plan_backward_data(plan._live(), T, _ptr(dy), _ptr(x), _ptr(gamma), _ptr(beta),
                                              _ptr(w1), _ptr(b1), _ptr(w2), _ptr(saved), _ptr(dx), _ptr(dgamma),
                                              _ptr(dbeta), _ptr(db1), _ptr(db2), _ptr(deferred), _ptr(new_state),
                                              cfg.flags, _stream(x.device))
    _check_call(cfg, x.device, status)
    new_state = _agreed(cfg, new_state)
    pending = _PendingWeightGrads(cfg, dims, x.dtype, w1.dtype, b1 is not None, has_b2, dy, saved, deferred,
                                  main_grads)
    with _plans_lock:
        _pending.setdefault(cfg.slot, collections.deque()).append(pending)
    return dx, dgamma, dbeta, db1, db2, new_state


def pending_weight_grads(slot: int) -> int:
    """How many backwards of a module's slot wait for finish_weight_grads."""
    with _plans_lock:
        return len(_pending.get(slot, ()))


def finish_weight_grads(slot: int):
    """The weights call of the oldest pending backward of a module's slot: (dW1, dW2) in the
    weights' layout and the I/O dtype; or, under fuse_wgrad_accumulation, added into (or written
    to, as its main_grad bits say) the fp32 main_grad tensors, returning (None, None)."""
    with _plans_lock:
        queue = _pending.get(slot)
        p = queue.popleft() if queue else None
    if p is None:
        raise InvalidArgumentError("backward_dw(): no backward is waiting for its weight gradients (call it once "
                                   "after each backward of a module made with delay_wgrad_compute=True)")
    T, H, A, F = p.dims
    device = p.dy.device
    w1_shape, w2_shape = p.cfg.weight_shapes(H, A, F)
    cfg, mains = p.cfg, p.main_grads
    if mains is None:  # dW in the I/O dtype
        accumulate, outs, writes = False, None, None
    else:
        writes = [bool(main_grad_bits(cfg, i) & MAIN_GRAD_OVERWRITE) for i in (0, 1)]
        same = writes[0] == writes[1]
        accumulate, outs = (not writes[0], mains) if same else (False, None)
    plan = _plan_of(cfg, p.dims, p.dtype, p.weight_dtype, device, p.has_b1, p.has_b2, accumulate)
    if outs is None:
        g = torch.float32 if mains is not None else p.dtype
        outs = (torch.empty(w1_shape, dtype=g, device=device), torch.empty(w2_shape, dtype=g, device=device))
    lib = _lib.get_lib()
    with plan._lock:
        status = lib.lnmlp_plan_backward_weights(plan._live(), T, _ptr(p.dy), _ptr(p.saved), _ptr(p.deferred),
                                                 _ptr(outs[0]), _ptr(outs[1]), 0, _stream(device))
    _check_call(cfg, device, status, outputs="fc1/fc2 main_grad" if mains is not None else None)
    if mains is None:
        return outs
    if outs is not mains:  # one weight overwrites, the other adds
        for main, dw, write in zip(mains, outs, writes):
            if write:
                main.copy_(dw)
            else:
                main.add_(dw)
    return None, None
