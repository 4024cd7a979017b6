"""The functional API of TransformerEngine's ``layernorm_mlp`` (transformer_engine/jax/layernorm_mlp.py),
on NumPy arrays, backed by cached :class:`lnmlp.Plan` objects.

Arguments that only matter for JAX sharding or checkpointing on several devices
(``norm_input_axes``, ``dot_1_input_axes``, ``dot_2_input_axes``, ``kernel_1_axes``,
``kernel_2_axes``, ``ffn1_ckpt_name``, ``ffn2_ckpt_name``) are accepted and ignored: on one
device they do not change the result. ``transpose_batch_sequence`` is accepted too and changes
nothing, since every leading dimension of x is flattened into tokens anyway.
"""

from __future__ import annotations

import re
import threading
import weakref
from collections import OrderedDict

import numpy as np

from ._lib import InvalidArgumentError
from ._plan import Plan, _normalize_act_params, normalize_activations
from .recipe import QuantizerSet

__all__ = ["layernorm_mlp", "layernorm_mlp_vjp", "noop_quantizer_set", "clear_plan_cache",
           "plan_cache_info", "set_plan_cache_size"]

#: Stands for TransformerEngine's ``noop_quantizer_set`` (no FP8 quantization).
noop_quantizer_set = None

_cache_lock = threading.Lock()
_cache: "OrderedDict[tuple, Plan]" = OrderedDict()
_cache_max = 16
_stats = {"hits": 0, "misses": 0, "evictions": 0}
# Live vjp closures per plan: an evicted plan still needed by a pending vjp is not closed then,
# but freed by garbage collection once the last such vjp is gone.
_vjp_users: "weakref.WeakKeyDictionary[Plan, weakref.WeakSet]" = weakref.WeakKeyDictionary()


def set_plan_cache_size(n: int) -> None:
    """Sets how many plans the functional API keeps (least recently used are closed first)."""
    global _cache_max
    if int(n) < 1:
        raise InvalidArgumentError(f"the plan cache size must be >= 1, got {n}")
    with _cache_lock:
        _cache_max = int(n)
        _evict_locked()


def plan_cache_info() -> dict:
    """{"size", "max_size", "hits", "misses", "evictions"} of the functional API's plan cache."""
    with _cache_lock:
        return dict(_stats, size=len(_cache), max_size=_cache_max)


def clear_plan_cache() -> None:
    """Closes every cached plan (those still needed by a pending vjp are freed when it goes)."""
    with _cache_lock:
        while _cache:
            _close_unless_used(_cache.popitem(last=False)[1])
        for k in _stats:
            _stats[k] = 0


def _close_unless_used(plan: Plan) -> None:
    users = _vjp_users.get(plan)
    if not users:
        plan.close()


def _evict_locked():
    while len(_cache) > _cache_max:
        _close_unless_used(_cache.popitem(last=False)[1])
        _stats["evictions"] += 1


def _get_plan(key, kwargs) -> Plan:
    with _cache_lock:
        plan = _cache.get(key)
        if plan is not None and not plan.closed:
            _cache.move_to_end(key)
            _stats["hits"] += 1
            return plan
    plan = Plan(**kwargs)  # outside the lock: creation may take a while
    with _cache_lock:
        _stats["misses"] += 1
        _cache[key] = plan
        _cache.move_to_end(key)
        _evict_locked()
    return plan


def _as_array(name, a):
    if a is None or isinstance(a, np.ndarray):
        return a
    if hasattr(a, "__cuda_array_interface__"):
        raise InvalidArgumentError(f"{name} is a CUDA device array; the functional API takes "
                                   f"host arrays (use lnmlp.Plan with backend='cuda')")
    return np.asarray(a)


def unpack_kernels_and_biases(kernels, biases):
    """(kernel_1, kernel_2, bias_1, bias_2) from the seed's ``kernels`` and ``biases`` (None: no
    biases), or InvalidArgumentError naming the expected form. Every front end's call starts here."""
    try:
        kernel_1, kernel_2 = kernels
    except (TypeError, ValueError):
        raise InvalidArgumentError("kernels must be [kernel_1 (H, A, F), kernel_2 (F, H)]") from None
    try:
        bias_1, bias_2 = (None, None) if biases is None else biases
    except (TypeError, ValueError):
        raise InvalidArgumentError("biases must be [bias_1 (A, F) or None, bias_2 (H,) or None]") from None
    return kernel_1, kernel_2, bias_1, bias_2


def _prepare(x, gamma, beta, kernels, biases, norm_type, zero_centered_gamma, epsilon,
             activation_type, quantizer_set, act_params, remat):
    if quantizer_set is not None and not isinstance(quantizer_set, QuantizerSet):
        raise InvalidArgumentError(
            f"quantizer_set must be None (noop_quantizer_set) or a set made by "
            f"lnmlp.make_quantizer_set(recipe), got {type(quantizer_set).__name__}")
    recipe = None if quantizer_set is None else quantizer_set.recipe
    if not isinstance(norm_type, str):
        raise InvalidArgumentError(f"norm_type must be 'layernorm' or 'rmsnorm', got {norm_type!r}")
    kernel_1, kernel_2, bias_1, bias_2 = unpack_kernels_and_biases(kernels, biases)
    x, gamma, beta = _as_array("x", x), _as_array("gamma", gamma), _as_array("beta", beta)
    kernel_1, kernel_2 = _as_array("kernel_1", kernel_1), _as_array("kernel_2", kernel_2)
    bias_1, bias_2 = _as_array("bias_1", bias_1), _as_array("bias_2", bias_2)
    if x is None or x.ndim < 1:
        raise InvalidArgumentError("x must be an array of shape [..., H]")
    if kernel_1 is None or kernel_1.ndim != 3:
        raise InvalidArgumentError(
            f"kernel_1 must have shape (H, A, F), got {None if kernel_1 is None else kernel_1.shape}")
    if kernel_2 is None or kernel_2.ndim != 2:
        raise InvalidArgumentError(
            f"kernel_2 must have shape (F, H), got {None if kernel_2 is None else kernel_2.shape}")
    acts = normalize_activations(activation_type)
    hidden, ffn = int(x.shape[-1]), int(kernel_1.shape[-1])
    tokens = int(np.prod(x.shape[:-1], dtype=np.int64))
    ap = _normalize_act_params(act_params)
    key = (tokens, hidden, ffn, norm_type.lower(), bool(zero_centered_gamma), float(epsilon), acts,
           ap, bias_1 is not None, bias_2 is not None, x.dtype.str, x.dtype.name, remat, recipe)
    kwargs = dict(tokens=tokens, hidden=hidden, ffn=ffn, norm_type=norm_type,
                  zero_centered_gamma=zero_centered_gamma, epsilon=epsilon, activation_type=acts,
                  act_params=ap, use_bias1=bias_1 is not None, use_bias2=bias_2 is not None,
                  dtype=x.dtype, remat=remat, recipe=recipe)
    plan = _get_plan(key, kwargs)
    return plan, (x, gamma, beta, kernel_1, bias_1, kernel_2, bias_2)


def _with_state(qs, fn, plan=None):
    """Runs fn(fp8_state) with the quantizer set's state array (delayed scaling; None otherwise),
    which the plan call uses and updates in place (plans may be shared by several quantizer sets).
    A backward call (`plan` given) of a set that rounds stochastically draws from the set's random
    state: the shared plan takes it for the call, and the set keeps where the call left it."""
    if qs is None or not (qs.recipe.stateful or (plan is not None and qs.recipe.draws_random)):
        return fn(None)
    with qs._lock:
        if plan is None or not qs.recipe.draws_random:
            return fn(qs._state)
        with plan._lock:
            plan.set_rng_state(*qs._rng)
            out = fn(qs._state)
            qs._rng = plan.rng_state()
            return out


def _run_forward(plan, args, qs=None):
    x, gamma, beta, k1, b1, k2, b2 = args
    try:
        return _with_state(qs, lambda st: plan.forward(x, gamma, beta, k1, b1, k2, b2, fp8_state=st))
    except InvalidArgumentError as e:
        raise _rename(e) from None


_RENAMES = ((re.compile(r"\bw1\b"), "kernel_1"), (re.compile(r"\bw2\b"), "kernel_2"),
            (re.compile(r"\bb1\b"), "bias_1"), (re.compile(r"\bb2\b"), "bias_2"))


def _rename(e):
    """The plan's argument names (w1, b1, ...) in this API's words (kernel_1, bias_1, ...)."""
    msg = e.message
    for pat, new in _RENAMES:
        msg = pat.sub(new, msg)
    return type(e)(msg)


def layernorm_mlp(x, gamma, beta, kernels, biases, norm_type, zero_centered_gamma=False,
                  epsilon=1e-6, transpose_batch_sequence=False, norm_input_axes=None,
                  dot_1_input_axes=None, dot_2_input_axes=None, kernel_1_axes=None,
                  kernel_2_axes=None, ffn1_ckpt_name="ffn1", ffn2_ckpt_name="ffn2",
                  activation_type=("relu",), quantizer_set=noop_quantizer_set, act_params=None):
    """``act(norm(x) @ kernel_1 + bias_1) @ kernel_2 + bias_2``, TransformerEngine's signature.

    x: [..., H]; gamma, beta: [H] (beta None for rmsnorm); kernels = [kernel_1 (H, A, F),
    kernel_2 (F, H)]; biases = [bias_1 (A, F) or None, bias_2 (H,) or None]; every array has
    x's dtype (float32, float16 or ml_dtypes.bfloat16). Returns the output, shaped like x.
    The axes, checkpoint names and transpose_batch_sequence are accepted and ignored (one device).

    quantizer_set: None (no FP8) or ``lnmlp.make_quantizer_set(recipe)``: the GEMMs run in FP8 as
    docs/fp8.md defines; under delayed scaling this call updates the set's forward quantizers
    (ln_out, w1, act_out, w2).
    """
    plan, args = _prepare(x, gamma, beta, kernels, biases, norm_type, zero_centered_gamma,
                          epsilon, activation_type, quantizer_set, act_params, "forward_only")
    return _run_forward(plan, args, quantizer_set)[0]


class _VJP:
    """The pullback of one layernorm_mlp call; may be called several times."""

    def __init__(self, plan, args, saved, qs=None):
        self._plan, self._args, self._saved, self._qs = plan, args, saved, qs
        with _cache_lock:
            _vjp_users.setdefault(plan, weakref.WeakSet()).add(self)

    def __call__(self, dy):
        """dy -> (dx, dgamma, dbeta, [dkernel_1, dkernel_2], [dbias_1, dbias_2])."""
        x, gamma, beta, k1, b1, k2, b2 = self._args
        dy = _as_array("dy", dy)
        try:
            g = _with_state(self._qs, lambda st: self._plan.backward(dy, x, gamma, beta, k1, b1, k2,
                                                                     self._saved, fp8_state=st), self._plan)
        except InvalidArgumentError as e:
            raise _rename(e) from None
        return g.dx, g.dgamma, g.dbeta, [g.dw1, g.dw2], [g.db1, g.db2]


def layernorm_mlp_vjp(x, gamma, beta, kernels, biases, norm_type, zero_centered_gamma=False,
                      epsilon=1e-6, transpose_batch_sequence=False, norm_input_axes=None,
                      dot_1_input_axes=None, dot_2_input_axes=None, kernel_1_axes=None,
                      kernel_2_axes=None, ffn1_ckpt_name="ffn1", ffn2_ckpt_name="ffn2",
                      activation_type=("relu",), quantizer_set=noop_quantizer_set, act_params=None):
    """Like :func:`layernorm_mlp`, and also returns the pullback: ``(output, vjp)`` where
    ``vjp(dy)`` returns ``(dx, dgamma, dbeta, [dkernel_1, dkernel_2], [dbias_1, dbias_2])``
    (None where the input was None; each gradient shaped like its input).

    The vjp reads x and the weights again: do not modify them in place before calling it.

    With a delayed-scaling quantizer set, this call updates the set's forward quantizers and each
    ``vjp(dy)`` call its backward ones (dy, dh); backward re-quantizes the weights with the
    scales this forward used (kept in the saved buffer).
    """
    plan, args = _prepare(x, gamma, beta, kernels, biases, norm_type, zero_centered_gamma,
                          epsilon, activation_type, quantizer_set, act_params, "save_all")
    y, saved = _run_forward(plan, args, quantizer_set)
    return y, _VJP(plan, args, saved, quantizer_set)
