"""``lnmlp.torch.LayerNormMLP``: TransformerEngine PyTorch's ``LayerNormMLP`` module on lnmlp, and
``fp8_autocast``.

Parameters carry TransformerEngine's names, shapes and layout: ``fc1_weight`` [A*F, H] and
``fc2_weight`` [H, F] are contiguous tensors in ``nn.Linear``'s out x in layout, which the module's
plans read in place (``weight_layout="out_in"``) and write their gradients (and fp32 ``main_grad``
accumulations) in. So a TransformerEngine checkpoint loads with ``load_state_dict``, and FSDP2,
DDP's bucket views, ``torch.distributed.checkpoint``, safetensors and Megatron-style ``main_grad``
views into one flat buffer take the parameters as they are.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import weakref

import torch

from .. import _lib, _plan
from .._lib import InvalidArgumentError, NotSupportedError
from ..recipe import QUANTIZERS, DelayedScaling, Recipe, check_recipe
from . import _comm, _extra_state, _functional, _ops

__all__ = ["LayerNormMLP", "autocast", "fp8_autocast"]

# TransformerEngine PyTorch's activation names -> lnmlp's activations.
ACTIVATIONS = {"gelu": ("gelu",), "geglu": ("gelu", "linear"), "qgelu": ("quick_gelu",),
               "qgeglu": ("quick_gelu", "linear"), "relu": ("relu",), "reglu": ("relu", "linear"),
               "srelu": ("squared_relu",), "sreglu": ("squared_relu", "linear"), "silu": ("silu",),
               "swiglu": ("silu", "linear"), "glu": ("sigmoid", "linear"),
               "clamped_swiglu": ("clamped_silu", "clamped_linear")}
_NORMALIZATIONS = {"LayerNorm": "layernorm", "RMSNorm": "rmsnorm"}
# The module's names for the block's tensors, in its error messages (TransformerEngine's).
_NAMES = dict(x="inp", gamma="layer_norm_weight", beta="layer_norm_bias", w1="fc1_weight", b1="fc1_bias",
              w2="fc2_weight", b2="fc2_bias")


class _Fp8Autocast(threading.local):
    enabled = False
    recipe = None
    group = 0  # the amax reduction group (fp8_group) as the ops number it (_comm.group_number), or 0


_autocast = _Fp8Autocast()


@contextlib.contextmanager
def autocast(enabled: bool = True, calibrating: bool = False, recipe: Recipe | None = None,
             amax_reduction_group=None, _graph: bool = False):
    """Runs the :class:`LayerNormMLP` modules called inside under FP8 (TransformerEngine's
    ``autocast``, its arguments in its order): ``recipe`` is an lnmlp recipe or
    TransformerEngine's recipe object of the same name (read as the lnmlp recipe it equals),
    ``DelayedScaling()`` by default. A module made with ``fp8_recipe=`` uses its own recipe
    whatever the context says. ``amax_reduction_group`` (TE's, a torch.distributed group, such as
    the data- and tensor-parallel ranks of a model): delayed scaling's state is made identical over
    it after every forward and backward call (each amax history max-reduced, the scales the
    group's), where TE reduces once at the end of the region; a tensor-parallel module agrees over
    its tp_group anyway. ``calibrating=True`` is refused (NotSupportedError: lnmlp has no
    calibration mode); ``_graph`` (TE's CUDA-graph capture hint) changes nothing."""
    if calibrating:
        raise NotSupportedError("calibrating=True is not supported: lnmlp has no calibration mode (amaxes "
                                "recorded without FP8 compute)")
    recipe = check_recipe(recipe)
    if amax_reduction_group is not None:
        _comm.check_group(amax_reduction_group, "amax_reduction_group")
    before = (_autocast.enabled, _autocast.recipe, _autocast.group)
    _autocast.enabled = bool(enabled)
    _autocast.recipe = (recipe or DelayedScaling()) if enabled else None
    # A number, so that a forward torch.compile traces reads an int (the registry is not traced).
    _autocast.group = _comm.group_number(amax_reduction_group) if enabled else 0
    try:
        yield
    finally:
        _autocast.enabled, _autocast.recipe, _autocast.group = before


def fp8_autocast(enabled: bool = True, calibrating: bool = False, fp8_recipe: Recipe | None = None,
                 fp8_group=None, _graph: bool = False):
    """TransformerEngine's ``fp8_autocast`` (its arguments in its order): :func:`autocast` with
    ``recipe=fp8_recipe`` and ``amax_reduction_group=fp8_group``."""
    return autocast(enabled, calibrating, fp8_recipe, fp8_group, _graph)


_slots = itertools.count(1)

# TE's arguments that ask for what the module does not do (Userbuffers' communication overlap, a
# symmetric all-reduce, the gathered norm output), and the value of each that asks for nothing
# (TE's default).
_UNSUPPORTED_DEFAULTS = dict(return_layernorm_output_gathered=False, ub_overlap_ag=False, ub_overlap_rs=False,
                             ub_overlap_rs_dgrad=False, ub_bulk_dgrad=False, ub_bulk_wgrad=False,
                             symmetric_ar_type=None)


def _refuse_what_is_not_supported(**given):
    asked = [f"{k}={v!r}" for k, v in given.items() if v != _UNSUPPORTED_DEFAULTS[k]]
    if asked:
        one = len(asked) == 1
        raise NotSupportedError(f"{', '.join(asked)} {'is' if one else 'are'} not supported: lnmlp.torch's module "
                                "has no Userbuffers communication overlap, symmetric all-reduce or gathered norm "
                                f"output; leave {'it' if one else 'them'} at TE's default")


def _init_normal(tensor):
    """TransformerEngine's default init method: N(0, 0.023)."""
    return torch.nn.init.normal_(tensor, mean=0.0, std=0.023)


class LayerNormMLP(torch.nn.Module):
    """``fc2(act(fc1(norm(x))))`` as one fused lnmlp op, with TransformerEngine's ``LayerNormMLP``
    constructor names where they apply.

    hidden_size, ffn_hidden_size: H and F. eps: the norm's epsilon (TE's default 1e-5).
    bias: fc1 and fc2 biases. normalization: "LayerNorm" or "RMSNorm". activation: "gelu",
    "geglu", "qgelu", "qgeglu", "relu", "reglu", "srelu", "sreglu", "silu", "swiglu", "glu"
    (sigmoid, TE's) or "clamped_swiglu" (``activation_params={"limit", "alpha", "glu_linear_offset"}``); gated ones
    make fc1 2F wide, its first F rows feeding the activation, the next F the linear half.
    init_method / output_layer_init_method: fc1's / fc2's weight init (TE's default N(0, 0.023));
    biases start at 0, layer_norm_weight at 1 (0 with zero_centered_gamma).
    params_dtype: the parameters' dtype (default torch.get_default_dtype()); inputs may have
    another (parameters are cast to the input's dtype, except fp32 weights under FP8, quantized
    from fp32). device: where the parameters live ("cpu", a CUDA device, or "meta" for deferred
    initialisation: ``to_empty(device=...)`` then :meth:`reset_parameters`); by default "cuda"
    as in TE where a GPU is present, else "cpu".
    Tensor parallelism, as TE's: ``tp_group`` (a torch.distributed group; or ``tp_size`` now and
    :meth:`set_tensor_parallel_group` before forward) with ``set_parallel_mode=True`` makes fc1
    column-parallel and fc2 row-parallel over F: each rank holds ``fc1_weight [A*F/tp, H]`` (its
    F/tp rows of each of the A halves), ``fc1_bias [A*F/tp]``, ``fc2_weight [H, F/tp]``, and the
    norm's parameters and ``fc2_bias`` whole, so a TE/Megatron tensor-parallel checkpoint loads per
    rank. Forward and backward run the library's sharded plan, its collectives through
    torch.distributed on the group (CPU tensors: the group's backend, such as gloo; CUDA tensors: an
    NCCL communicator of the group's ranks) and its sums in fp32. ``sequence_parallel=True``
    splits the tokens too: ``inp`` and the output are this rank's rows along the first dimension.
    The norm's and fc2_bias's gradients come back summed over the group, identical on every rank
    (so their ``sequence_parallel`` attribute is False: Megatron must not sum them again).
    ``get_rng_state_tracker``: as TE's, each rank draws its weight shards under the tracker's fork.
    Userbuffers' arguments, ``symmetric_ar_type`` and ``return_layernorm_output_gathered`` are
    accepted at TE's defaults and refused (NotSupportedError, naming them) otherwise;
    seq_length, micro_batch_size and name are accepted and change nothing (TE uses them for
    Userbuffers and debug tools).
    fuse_wgrad_accumulation: backward adds dW into each weight's fp32 ``main_grad`` instead of
    returning ``.grad``: a contiguous float32 tensor of the weight's shape (any contiguous view, such
    as Megatron's slices of one flat buffer; made here when absent). As in TE, it writes instead on
    ``is_first_microbatch=True`` or for a weight with ``overwrite_main_grad``, and honours Megatron's
    ``grad_added_to_main_grad`` / ``zero_out_wgrad`` (:meth:`_main_grad_bits`).
    return_bias: forward returns (output without fc2's bias, fc2_bias), as TE does.
    return_layernorm_output: forward also returns the norm's output [..., H] in the compute dtype,
    last, as TE does ((out, ln_out), or (out, fc2_bias, ln_out)); it is differentiable: its
    gradient reaches inp, layer_norm_weight and layer_norm_bias (through torch's own norm).
    delay_wgrad_compute: as TE's: backward gives the gradients of inp, the norm's parameters and
    the biases, and leaves the weights' to :meth:`backward_dw` (a pipeline schedule calls it
    later, once per backward, in order): the library's backward in two calls, the data call in
    backward keeping what the weight-gradient GEMMs need in a deferred buffer (their operands the
    saved buffer lacks), the weights call in ``backward_dw`` -- together the bits of one backward.
    As in TE, ``backward_dw`` sets each weight's ``.grad`` (replacing it), or accumulates into
    ``main_grad`` under ``fuse_wgrad_accumulation``, then runs the hooks of
    :meth:`register_wgrad_accumulation_and_reduce_hooks`; the weights and biases get TE's
    ``skip_backward_post_hook``. Eager only (torch.compile is refused at backward).
    checkpoint: TE's selective activation recompute: forward keeps only the norm's statistics
    (the library's ``remat="save_stats"``), and backward recomputes the norm, fc1 and the
    activation from the input (never fc2), for the same result with less memory.
    Under ``torch.autocast`` (CPU or CUDA) forward computes in autocast's dtype, as TE's module
    does: the input and the parameters are cast to it, the output has it, and the parameters'
    gradients come back in their own dtype.
    fp8_recipe: an lnmlp recipe this module always uses (else the surrounding :func:`fp8_autocast`
    decides); with delayed scaling its state is the buffer ``fp8_state``, which ``state_dict()`` holds
    as ``_extra_state`` in TransformerEngine's format (so lnmlp's and TE's state_dicts have the same
    keys, and each loads the other's; an lnmlp checkpoint with an ``fp8_state`` key loads too).

    ``forward(inp, is_first_microbatch=None)``: ``is_first_microbatch=False`` promises the weights
    are unchanged since the previous micro-batch, so their FP8 (or widened) copies are reused.
    """

    # TransformerEngine's constructor, argument for argument in its order (module/layernorm_mlp.py);
    # fp8_recipe is lnmlp's own, keyword only. docs/torch.md tabulates what each does here.
    def __init__(self, hidden_size: int, ffn_hidden_size: int, eps: float = 1e-5, sequence_parallel: bool = False,
                 return_bias: bool = False, get_rng_state_tracker=None, tp_group=None, tp_size: int = 1,
                 init_method=None, bias: bool = True, normalization: str = "LayerNorm", activation: str = "gelu",
                 activation_params: dict | None = None, output_layer_init_method=None,
                 fuse_wgrad_accumulation: bool = False, params_dtype=None, return_layernorm_output: bool = False,
                 return_layernorm_output_gathered: bool = False, seq_length: int | None = None,
                 micro_batch_size: int | None = None, set_parallel_mode: bool = False,
                 zero_centered_gamma: bool = False, device=None, ub_overlap_ag: bool = False, name: str | None = None,
                 ub_overlap_rs: bool = False, ub_overlap_rs_dgrad: bool = False, ub_bulk_dgrad: bool = False,
                 ub_bulk_wgrad: bool = False, delay_wgrad_compute: bool = False, symmetric_ar_type: str | None = None,
                 checkpoint: bool = False, *, fp8_recipe: Recipe | None = None):
        super().__init__()
        if normalization not in _NORMALIZATIONS:
            raise InvalidArgumentError(f"normalization must be 'LayerNorm' or 'RMSNorm', got {normalization!r}")
        if activation not in ACTIVATIONS:
            raise InvalidArgumentError(f"activation must be one of {', '.join(ACTIVATIONS)}, got {activation!r}")
        _refuse_what_is_not_supported(
            return_layernorm_output_gathered=return_layernorm_output_gathered, ub_overlap_ag=ub_overlap_ag,
            ub_overlap_rs=ub_overlap_rs, ub_overlap_rs_dgrad=ub_overlap_rs_dgrad, ub_bulk_dgrad=ub_bulk_dgrad,
            ub_bulk_wgrad=ub_bulk_wgrad, symmetric_ar_type=symmetric_ar_type)
        # No effect here: TE uses these for Userbuffers' buffers (seq_length, micro_batch_size) and
        # for debug tools (name).
        self.name, self.seq_length, self.micro_batch_size = name, seq_length, micro_batch_size
        self.get_rng_state_tracker = get_rng_state_tracker
        if device is None:  # TE's default is "cuda"; here the CPU where there is no GPU
            device = "cuda" if torch.cuda.is_available() else "cpu"
        fp8_recipe = check_recipe(fp8_recipe)
        for name, v in (("hidden_size", hidden_size), ("ffn_hidden_size", ffn_hidden_size)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidArgumentError(f"{name} must be an int >= 1, got {v!r}")
        self.hidden_size, self.ffn_hidden_size = hidden_size, ffn_hidden_size
        self._tensor_parallelism(tp_group, tp_size, sequence_parallel, set_parallel_mode)
        self.eps, self.use_bias, self.normalization, self.activation = eps, bool(bias), normalization, activation
        self.zero_centered_gamma = bool(zero_centered_gamma)
        self.fuse_wgrad_accumulation = bool(fuse_wgrad_accumulation)
        self.return_bias = bool(return_bias)
        self.fp8_recipe = fp8_recipe
        self.activation_params = activation_params
        # Checks the settings once, here (forward only swaps the recipe and flags).
        self.checkpoint = bool(checkpoint)
        self._cfg = _functional.config(_NORMALIZATIONS[normalization], zero_centered_gamma, eps,
                                       ACTIVATIONS[activation], activation_params, None, slot=next(_slots)
                                       ).with_(weight_layout=_lib.WEIGHT_LAYOUT_OUT_IN)
        self.return_layernorm_output = bool(return_layernorm_output)
        if self.return_layernorm_output:  # the library writes it into the saved buffer, the op copies it out
            self._cfg = self._cfg.with_(norm_output=1)
        if self.checkpoint:  # TE's selective recompute: backward recomputes norm, fc1 and activation
            self._cfg = self._cfg.with_(remat=_plan._REMATS["save_stats"])
        self.delay_wgrad_compute = bool(delay_wgrad_compute)
        if self.delay_wgrad_compute:
            self._cfg = self._cfg.with_(delay_wgrad=1)
        self.wgrad_accumulation_and_reduce_hooks = []
        weakref.finalize(self, _ops.drop_slot, self._cfg.slot)
        A = len(ACTIVATIONS[activation])
        H, F = hidden_size, self.size_per_partition
        dtype = params_dtype if params_dtype is not None else torch.get_default_dtype()
        if dtype not in _ops._DTYPES:
            raise InvalidArgumentError(f"params_dtype must be torch.float32, torch.bfloat16 or torch.float16, got "
                                       f"{dtype}{'' if params_dtype is not None else ' (the default dtype)'}")
        kw = dict(dtype=dtype, device=device)
        param = lambda present, t: torch.nn.Parameter(t) if present else None  # noqa: E731
        self.register_parameter("layer_norm_weight", param(True, torch.empty(H, **kw)))
        self.register_parameter("layer_norm_bias", param(normalization == "LayerNorm", torch.empty(H, **kw)))
        # nn.Linear's layout, as TE stores them: the plans read them so (weight_layout "out_in").
        # Under tensor parallelism this rank's shards, as TE's: fc1 column-parallel (its F / tp rows
        # of each of the A halves), fc2 row-parallel (its F / tp columns), fc2_bias whole.
        self.register_parameter("fc1_weight", param(True, torch.empty(A * F, H, **kw)))
        self.register_parameter("fc1_bias", param(bias, torch.empty(A * F, **kw)))
        self.register_parameter("fc2_weight", param(True, torch.empty(H, F, **kw)))
        self.register_parameter("fc2_bias", param(bias, torch.empty(H, **kw)))
        self._init_method = init_method or _init_normal
        self._output_layer_init_method = output_layer_init_method or _init_normal
        # Not persistent: get_extra_state puts it in the state_dict, in TE's format.
        self.register_buffer("fp8_state", None, persistent=False)
        self._state_recipe = None  # the delayed-scaling recipe fp8_state was made or loaded for
        if fp8_recipe is not None and fp8_recipe.stateful:
            self.fp8_state = _functional.fresh_state(fp8_recipe, device)
            self._state_recipe = fp8_recipe
        self.reset_parameters()
        if self.delay_wgrad_compute:  # as TE marks them: their gradients come from backward_dw()
            for p in (self.fc1_weight, self.fc1_bias, self.fc2_weight, self.fc2_bias):
                if p is not None:
                    p.skip_backward_post_hook = True

    def __setstate__(self, state):
        # copy.deepcopy and pickle come here: the copy gets its own slot (its own plans, so its own
        # FP8 and widened weight copies, which is_first_microbatch=False reuses) and frees it when
        # collected; the original's slot number in the state names the original's plans.
        super().__setstate__(state)
        self.__dict__.setdefault("_state_recipe", None)  # a module pickled before it existed
        self.__dict__.setdefault("delay_wgrad_compute", False)
        self.__dict__.setdefault("wgrad_accumulation_and_reduce_hooks", [])
        for name, default in (("_tp_group_number", 0), ("tp_size", 1), ("sequence_parallel", False),
                              ("set_parallel_mode", False), ("size_per_partition", self.ffn_hidden_size)):
            self.__dict__.setdefault(name, default)  # a module pickled before tensor parallelism
        self._cfg = self._cfg.with_(slot=next(_slots))
        weakref.finalize(self, _ops.drop_slot, self._cfg.slot)

    def _tensor_parallelism(self, tp_group, tp_size, sequence_parallel, set_parallel_mode):
        """TE's tensor-parallel arguments, checked: tp_size (the group's size when tp_group is
        given), sequence_parallel (only with more than one rank, as TE), and this rank's F."""
        self.set_parallel_mode = bool(set_parallel_mode)
        self._tp_group_number = 0
        if tp_group is None:
            if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 1:
                raise InvalidArgumentError(f"tp_size must be an int >= 1, got {tp_size!r}")
            self.tp_size = tp_size
        else:
            self.tp_size = _comm.check_group(tp_group, "tp_group")
        if self.tp_size > 1 and not self.set_parallel_mode:
            # TE's LayerNormMLP then leaves fc2's output unreduced on every rank (a partial sum).
            raise NotSupportedError("tensor parallelism (tp_size > 1) needs set_parallel_mode=True (fc1 column- and "
                                    "fc2 row-parallel, the output reduced over tp_group, as TE's TransformerLayer "
                                    "makes it); lnmlp does not return per-rank partial outputs")
        if self.ffn_hidden_size % self.tp_size:
            raise InvalidArgumentError(f"ffn_hidden_size {self.ffn_hidden_size} must be divisible by the "
                                       f"tensor-parallel size {self.tp_size}")
        self.size_per_partition = self.ffn_hidden_size // self.tp_size
        self.sequence_parallel = self.tp_size > 1 and bool(sequence_parallel)
        if tp_group is not None:
            self.set_tensor_parallel_group(tp_group)

    @property
    def tp_group(self):
        """The tensor-parallel process group (None: none)."""
        return _comm.group_of(self._tp_group_number)[0]

    def set_tensor_parallel_group(self, tp_group) -> None:
        """TE's: the tensor-parallel group for the forwards to come, of ``tp_size`` ranks (this
        rank's shards of fc1 and fc2 are the module's parameters). None: no group (tp_size 1)."""
        if tp_group is None:
            self._tp_group_number = 0
            return
        size = _comm.check_group(tp_group, "tp_group")
        if size != self.tp_size:
            raise InvalidArgumentError(f"tp_group has {size} ranks, but the module was made for tp_size "
                                       f"{self.tp_size} (its parameters are shards of that many)")
        self._tp_group_number = _comm.group_number(tp_group) if size > 1 else 0

    def _parallel_config(self, cfg):
        """cfg for this rank of the tensor-parallel group (unchanged without one)."""
        if self.tp_size == 1:
            return cfg
        if not self._tp_group_number:
            raise InvalidArgumentError(f"the module was made for tp_size {self.tp_size} without a tp_group: call "
                                       "set_tensor_parallel_group(group) before forward")
        return cfg.with_(tp_group=self._tp_group_number, sequence_parallel=int(self.sequence_parallel))

    def need_backward_dw(self) -> bool:
        """Whether :meth:`backward_dw` has work: the module was made with delay_wgrad_compute=True."""
        return self.delay_wgrad_compute

    def register_wgrad_accumulation_and_reduce_hooks(self, hook) -> None:
        """A function (no arguments) :meth:`backward_dw` calls after it has set the weights'
        gradients, as TE's modules do (for a data-parallel reduction of them)."""
        self.wgrad_accumulation_and_reduce_hooks.append(hook)

    def backward_dw(self) -> None:
        """The weight gradients of the oldest backward still waiting for them (delay_wgrad_compute):
        fc1_weight's and fc2_weight's ``.grad`` set to them in the weights' dtype, as TE sets them
        (or, under fuse_wgrad_accumulation, added into or written to their ``main_grad``); then the
        registered hooks. Does nothing for a module without delay_wgrad_compute; raises when no
        backward is waiting."""
        if not self.need_backward_dw():
            return
        dw1, dw2 = _ops.finish_weight_grads(self._cfg.slot)
        if dw1 is not None:  # [A, F, H] is fc1_weight's [A*F, H]
            self.fc1_weight.grad = dw1.view(self.fc1_weight.shape).to(self.fc1_weight.dtype)
            self.fc2_weight.grad = dw2.to(self.fc2_weight.dtype)
        for hook in self.wgrad_accumulation_and_reduce_hooks:
            hook()

    def reset_parameters(self):
        """Initialises the parameters (and a delayed-scaling state: scales 1, zero histories). With
        ``device="meta"`` the module is made without memory, as TE defers initialisation;
        ``module.to_empty(device=...)`` then ``reset_parameters()`` gives it its values."""
        with torch.no_grad():
            if self.fp8_state is not None:  # fresh_state's values: scales 1, zero histories
                self.fp8_state[:, 0] = 1.0
                self.fp8_state[:, 1:] = 0.0
            self.layer_norm_weight.fill_(0.0 if self.zero_centered_gamma else 1.0)
            if self.layer_norm_bias is not None:
                self.layer_norm_bias.zero_()
            for init, w in ((self._init_method, self.fc1_weight), (self._output_layer_init_method, self.fc2_weight)):
                if self.get_rng_state_tracker is None:
                    init(w)
                else:  # as TE: each rank draws its shard under the tracker's model-parallel generator
                    with self.get_rng_state_tracker().fork():
                        init(w)
            for b in (self.fc1_bias, self.fc2_bias):
                if b is not None:
                    b.zero_()
        # TE's (and Megatron's) tensor-parallel attributes: fc1's weight and bias split along their
        # rows, fc2's weight along its columns. The norm's parameters and fc2_bias are marked not
        # sequence-parallel even under sequence parallelism: their gradients come back summed over
        # the group already (TE's are each rank's part, which Megatron sums for parameters marked so).
        for p, dim in ((self.fc1_weight, 0), (self.fc1_bias, 0), (self.fc2_weight, 1)):
            if p is not None:
                p.tensor_model_parallel, p.partition_dim, p.partition_stride = True, dim, 1
        for p in (self.layer_norm_weight, self.layer_norm_bias, self.fc2_bias):
            if p is not None:
                p.sequence_parallel = False

    def extra_repr(self):
        return (f"hidden_size={self.hidden_size}, ffn_hidden_size={self.ffn_hidden_size}, "
                f"normalization={self.normalization}, activation={self.activation}, bias={self.use_bias}, "
                f"eps={self.eps}, fp8_recipe={self.fp8_recipe!r}")

    def get_extra_state(self) -> torch.Tensor:
        """TransformerEngine's ``_extra_state``: empty without delayed-scaling state, else TE's
        pickled FP8 metadata (``_extra_state.py``)."""
        return _extra_state.encode(self._state_recipe, self.fp8_state)

    def set_extra_state(self, state) -> None:
        """Loads a TE-format ``_extra_state`` (TE's or lnmlp's): an empty one changes nothing."""
        pending = self.__dict__.pop("_pending_extra", None)
        if pending is not None and pending[0] is state:
            decoded = pending[1]  # decoded and checked by _load_from_state_dict
        else:
            decoded = self._loadable(*_extra_state.decode(state))
        self._apply_fp8_state(*decoded)

    def _loadable(self, recipe, state):
        """(recipe, state) checked against this module's own recipe; a clear error names what differs."""
        if state is None:
            return recipe, None
        if not isinstance(state, torch.Tensor) or state.dtype != torch.float32 or state.dim() != 2 or \
                tuple(state.shape[:1]) != (len(QUANTIZERS),) or state.shape[1] < 2:
            raise InvalidArgumentError(f"a checkpoint's fp8_state must be a float32 tensor [{len(QUANTIZERS)}, "
                                       "1 + amax_history_len]")
        mine = self.fp8_recipe
        if mine is not None and not isinstance(mine, DelayedScaling):
            raise InvalidArgumentError(f"the checkpoint holds delayed-scaling state, but this module's fp8_recipe is "
                                       f"{type(mine).__name__}")
        if mine is not None:
            theirs = recipe or DelayedScaling(margin=mine.margin, fp8_format=mine.fp8_format,
                                              amax_history_len=state.shape[1] - 1,
                                              amax_compute_algo=mine.amax_compute_algo)
            differ = [f"{f} (checkpoint {getattr(theirs, f)!r}, module {getattr(mine, f)!r})"
                      for f in DelayedScaling._fields if getattr(theirs, f) != getattr(mine, f)]
            if differ:
                raise InvalidArgumentError("the checkpoint's DelayedScaling differs from this module's fp8_recipe in "
                                           + ", ".join(differ))
        return recipe, state

    def _apply_fp8_state(self, recipe, state):
        if state is None:
            return
        with torch.no_grad():
            if self.fp8_state is None or self.fp8_state.shape != state.shape:
                self.fp8_state = state.to(self.layer_norm_weight.device, copy=True).contiguous()
            else:
                self.fp8_state.copy_(state)
        self._state_recipe = recipe or self._state_recipe

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # The FP8 state is decoded and checked first, so a bad one raises before anything changes.
        extra_key, legacy_key = prefix + "_extra_state", prefix + "fp8_state"
        extra = state_dict.get(extra_key)
        decoded = self._loadable(*_extra_state.decode(extra))
        if decoded[1] is None and legacy_key in state_dict:  # an lnmlp checkpoint from before _extra_state
            legacy = state_dict[legacy_key]
            decoded = self._loadable(None, legacy.detach().cpu() if isinstance(legacy, torch.Tensor) else legacy)
        self._pending_extra = (extra, decoded)
        try:
            super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                          error_msgs)
        finally:
            self.__dict__.pop("_pending_extra", None)
        if extra is None:  # no _extra_state (older lnmlp checkpoints, plain weights): no FP8 state, or the legacy one
            self._apply_fp8_state(*decoded)
            if extra_key in missing_keys:
                missing_keys.remove(extra_key)
        if legacy_key in unexpected_keys:
            unexpected_keys.remove(legacy_key)

    def _recipe(self):
        if self.fp8_recipe is not None:
            return self.fp8_recipe
        return _autocast.recipe if _autocast.enabled else None

    def _state_for(self, recipe):
        if recipe is None or not recipe.stateful:
            return None
        want = (len(QUANTIZERS), 1 + recipe.amax_history_len)
        if self.fp8_state is None:
            # First FP8 step under fp8_autocast. The buffer must exist before torch.compile traces.
            if torch.compiler.is_compiling():
                raise InvalidArgumentError(
                    "this module has no delayed-scaling state yet, and torch.compile cannot create a buffer while "
                    "tracing: make it with LayerNormMLP(..., fp8_recipe=recipe), or run one step eagerly first")
            self.fp8_state = _functional.fresh_state(recipe, self.layer_norm_weight.device)
            self._state_recipe = recipe
        elif tuple(self.fp8_state.shape) != want:
            raise InvalidArgumentError(f"this module's fp8_state was made for amax_history_len "
                                       f"{self.fp8_state.shape[1] - 1}, but the recipe has {recipe.amax_history_len}")
        elif self._state_recipe is not recipe and not torch.compiler.is_compiling():
            self._state_recipe = recipe  # the recipe now updating it, which get_extra_state names
        return self.fp8_state

    def _main_grads(self, A, F):
        """fc1's and fc2's fp32 main_grad as the plans take them: [A, F, H] and [H, F] (made when absent)."""
        out = []
        for name, w, shape in (("fc1_weight", self.fc1_weight, (A, F, self.hidden_size)),
                               ("fc2_weight", self.fc2_weight, None)):
            mg = getattr(w, "main_grad", None)
            if mg is None:
                mg = w.main_grad = torch.zeros(w.shape, dtype=torch.float32, device=w.device)
            if (not isinstance(mg, torch.Tensor) or mg.dtype != torch.float32 or tuple(mg.shape) != tuple(w.shape)
                    or mg.device != w.device or not mg.is_contiguous()):
                raise InvalidArgumentError(
                    f"{name}.main_grad must be a contiguous float32 tensor of {name}'s shape {tuple(w.shape)} on its "
                    f"device (torch.zeros_like({name}, dtype=torch.float32), or a view of a flat buffer), to be "
                    "accumulated into in place")
            out.append(mg if shape is None else mg.view(shape))
        return out

    def _main_grad_bits(self, is_first_microbatch):
        """fuse_wgrad_accumulation as TransformerEngine's LayerNormMLP does it, per weight: backward
        writes dW into main_grad on the first micro-batch (is_first_microbatch=True) or when the
        weight's ``overwrite_main_grad`` is set, and adds it otherwise; it returns no ``.grad``,
        except for a weight with Megatron-core DDP's ``grad_added_to_main_grad`` attribute, which is
        set True and gets TE's placeholder gradient (zeros with ``zero_out_wgrad``, else
        uninitialised) so that DDP's hooks run. TE sets the attribute in backward, here forward
        sets it for the backward to come: DDP reads it after backward and resets it per step."""
        bits = 0
        for i, w in enumerate((self.fc1_weight, self.fc2_weight)):
            b = 0
            if is_first_microbatch is True or getattr(w, "overwrite_main_grad", False):
                b |= _ops.MAIN_GRAD_OVERWRITE
            if hasattr(w, "grad_added_to_main_grad"):
                w.grad_added_to_main_grad = True
                b |= _ops.MAIN_GRAD_DUMMY | (_ops.MAIN_GRAD_ZEROS if getattr(w, "zero_out_wgrad", False) else 0)
            bits |= b << (i * _ops.MAIN_GRAD_SHIFT)
        return bits

    def forward(self, inp: torch.Tensor, is_first_microbatch: bool | None = None):
        recipe = self._recipe()
        A = len(self._cfg.activations)
        H, F = self.hidden_size, self.size_per_partition
        if not isinstance(inp, torch.Tensor) or inp.dim() < 1 or inp.shape[-1] != H:
            got = tuple(inp.shape) if isinstance(inp, torch.Tensor) else type(inp).__name__
            raise InvalidArgumentError(f"inp must be a tensor [..., hidden_size] = [..., {H}], got {got}")
        if inp.device.type in ("cpu", "cuda") and torch.is_autocast_enabled(inp.device.type):
            # As TE's module under torch.autocast: it computes in autocast's dtype, the input and
            # the parameters cast to it (the casts differentiable: gradients in the parameters' dtype).
            inp = inp.to(torch.get_autocast_dtype(inp.device.type))
        flags = 0
        if is_first_microbatch is False:
            flags = _ops._lib.CALL_WEIGHTS_UNCHANGED
        cfg = self._parallel_config(self._cfg.with_(recipe=_ops.recipe_number(recipe), flags=flags))
        if recipe is not None and recipe.stateful and _autocast.group:
            cfg = cfg.with_(fp8_group=_autocast.group)
        for name, want in (("fc1_weight", (A * F, H)), ("fc1_bias", (A * F,))):
            p = getattr(self, name)
            if p is not None and tuple(p.shape) != want:  # one replaced since construction
                raise InvalidArgumentError(f"{name} must have shape {want}, got {tuple(p.shape)}")
        # The weights in place ([A*F, H] read as [A, F, H]); a copy only if someone replaced one by a
        # non-contiguous tensor.
        w1, w2 = self.fc1_weight.contiguous().view(A, F, H), self.fc2_weight.contiguous()
        b1 = None if self.fc1_bias is None else self.fc1_bias.view(A, F)
        b2 = None if self.fc2_bias is None or self.return_bias else self.fc2_bias
        main = None
        if self.fuse_wgrad_accumulation and torch.is_grad_enabled():
            main = self._main_grads(A, F)
            cfg = cfg.with_(main_grad=self._main_grad_bits(is_first_microbatch))
        y = _functional.run(cfg, recipe, inp, self.layer_norm_weight, self.layer_norm_bias, w1, b1, w2, b2,
                            self._state_for(recipe), main_grads=main, names=_NAMES)
        ln_out = None
        if self.return_layernorm_output:
            y, ln_out = y
        out = (y,)
        if self.return_bias:  # TE casts it to the compute dtype
            out += (self.fc2_bias.to(y.dtype),)
        if ln_out is not None:
            out += (ln_out,)
        return out if len(out) > 1 else y
