"""A ``torch.distributed`` process group as the communicator of lnmlp's sharded plans.

A tensor-parallel ``LayerNormMLP`` runs the library's sharded plan (docs/sharding.md): one rank of
the group per process, the collectives between its GEMMs run by the library through a
communicator. This file makes that communicator from the module's ``tp_group``:

* CPU tensors (the CPU backend): a callback communicator (``lnmlp_comm_create_callbacks``) whose
  four collectives call ``torch.distributed`` on the group (gloo, or whatever backend the group
  has for CPU tensors), on the buffers the library gives, in place, with no copy.
* CUDA tensors (the CUDA backend, which takes only an NCCL communicator): an NCCL communicator of
  the group's ranks made for lnmlp (``ncclCommInitRank`` from the NCCL library torch loaded, its
  unique id broadcast over the group), so that lnmlp's collectives, enqueued on the caller's
  stream, never share a communicator with torch's own on its streams.

Why the library's sharded plan and not framework collectives around unsharded calls (as lnmlp.jax
does, where XLA needs them in its graph): the plan is one schedule already tested on every backend,
dtype and FP8 recipe; it sums GEMM2's and dn's partials in fp32 before their one rounding; it
reduces the FP8 amaxes over the group inside the call (so delayed scaling's state stays identical
on every rank and current scaling sees the group's amax before it quantizes); and under
``torch.compile`` the block stays one opaque op, so the graph has no break.

Groups are known to the ops by number (``group_number``), as recipes are: the ops' configuration
is a list of ints.
"""

from __future__ import annotations

import ctypes
import threading

import torch

from .. import _capi, _lib
from .._lib import InvalidArgumentError, NotSupportedError
from . import _numbering

__all__ = ["group_number", "group_count", "group_of", "check_group", "communicator", "layout_communicator",
           "amax_over_group", "agreed_state", "forget_groups"]

_groups = _numbering.Numbering()  # the process groups the ops' configurations name
_lock = threading.Lock()
_communicators: dict = {}       # (number, device str) -> _Communicator


def group_number(group) -> int:
    """The number of a process group in the ops' configuration (0 for None)."""
    return _groups.number(group)


def group_count() -> int:
    return len(_groups)


def group_of(number: int):
    """(group, size, rank) of a group number (number 0: (None, 1, 0))."""
    group = _groups[number]
    if group is None:
        return None, 1, 0
    return group, torch.distributed.get_world_size(group), torch.distributed.get_rank(group)


# LNMLP_DTYPE_* -> the torch dtype of a collective's buffer.
_TORCH_DTYPES = {_capi.DTYPE_F32: torch.float32, _capi.DTYPE_BF16: torch.bfloat16, _capi.DTYPE_F16: torch.float16,
                 _capi.DTYPE_U8: torch.uint8}


def _as_tensor(address: int, count: int, dtype: torch.dtype) -> torch.Tensor:
    """`count` elements of `dtype` at a CPU address, as a tensor sharing that memory."""
    nbytes = count * torch.empty((), dtype=dtype).element_size()
    raw = (ctypes.c_char * nbytes).from_address(address)
    return torch.frombuffer(raw, dtype=torch.uint8).view(dtype)


class _Communicator:
    """An lnmlp communicator (``lnmlp_comm_handle``, what lnmlp.Plan's ``comm`` takes) over a
    process group. Plans keep it (and so its callbacks) alive; it is never destroyed before the
    process ends, since every module of the group may make plans with it."""

    def __init__(self, size: int, rank: int):
        self.size, self.rank = size, rank
        self.lnmlp_comm_handle = ctypes.c_void_p()
        self.error = None  # the last collective's failure, which the op's error then names

    def failure(self) -> str:
        return f" ({self.error})" if self.error else ""

    def _make_callback_communicator(self, functions) -> None:
        """lnmlp_comm_create_callbacks over four Python functions (all_gather, reduce_scatter,
        all_reduce_sum, all_reduce_max), kept here: their ctypes objects must outlive it."""
        self._fns = [_capi.LNMLP_COMM_FN(f) for f in functions]
        table = _capi.lnmlp_comm_callbacks(ctypes.sizeof(_capi.lnmlp_comm_callbacks), self.size, self.rank,
                                           *self._fns, None)
        _lib.check(_lib.get_lib().lnmlp_comm_create_callbacks(ctypes.byref(table),
                                                               ctypes.byref(self.lnmlp_comm_handle)))


class _CallbackCommunicator(_Communicator):
    """The CPU backend's communicator: the library calls these four functions, each a blocking
    collective of torch.distributed on the group over the library's buffers."""

    def __init__(self, group, size: int, rank: int):
        super().__init__(size, rank)
        self.group = group
        self._make_callback_communicator([self._guarded(f) for f in (self._all_gather, self._reduce_scatter,
                                                                     self._all_reduce_sum, self._all_reduce_max)])

    def _guarded(self, collective):
        """The C callback: no exception may cross into the library; a failure is its status 1."""
        def call(send, recv, count, dtype, _user, _stream):
            try:
                if count:
                    collective(send, recv, count, _TORCH_DTYPES[dtype])
                self.error = None
                return 0
            except BaseException as e:  # noqa: BLE001 -- reported through the op's error instead
                self.error = f"torch.distributed failed in lnmlp's {collective.__name__.strip('_')}: {e!r}"
                return 1
        return call

    def _all_gather(self, send, recv, count, dtype):
        out = _as_tensor(recv, count * self.size, dtype)
        torch.distributed.all_gather_into_tensor(out, _as_tensor(send, count, dtype), group=self.group)

    def _reduce_scatter(self, send, recv, count, dtype):
        torch.distributed.reduce_scatter_tensor(_as_tensor(recv, count, dtype),
                                                _as_tensor(send, count * self.size, dtype), group=self.group)

    def _all_reduce_sum(self, send, recv, count, dtype):
        out = _as_tensor(recv, count, dtype)
        if send != recv:
            out.copy_(_as_tensor(send, count, dtype))
        torch.distributed.all_reduce(out, group=self.group)

    def _all_reduce_max(self, send, recv, count, dtype):
        _as_tensor(recv, count, torch.float32).copy_(amax_over_group(_as_tensor(send, count, torch.float32),
                                                                     self.group))


def amax_over_group(amax: torch.Tensor, group) -> torch.Tensor:
    """The element-wise maximum of float32 amaxes over the group's ranks, as lnmlp's own
    communicators take it: of the bit patterns read as unsigned ints (amaxes are >= 0, and every
    NaN is above +inf, so a NaN on any rank wins on every rank)."""
    bits = amax.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    torch.distributed.all_reduce(bits, op=torch.distributed.ReduceOp.MAX, group=group)
    return bits.to(torch.int32).view(torch.float32)


def agreed_state(state: torch.Tensor, group, most_recent: bool) -> torch.Tensor:
    """Delayed scaling's state [quantizers, 1 + history] after a call, made identical on every rank
    of `group` (TransformerEngine's amax reduction over its fp8_group): the histories max-reduced
    (the newest entry becomes the group's amax; the older ones are equal already), and each
    quantizer's scale taken from the lowest rank whose reduced amax (the newest, or the history's
    maximum) equals the group's: the scale is a function of that amax and of the previous scale,
    equal on every rank, so it is the scale the library computes from the group's history."""
    history = state[:, 1:]
    group_history = amax_over_group(history, group).view(history.shape)

    def reduced(h):
        return h[:, 0] if most_recent else h.max(dim=1).values

    mine, theirs = reduced(history), reduced(group_history)
    holds = (mine == theirs) | (mine.isnan() & theirs.isnan())
    rank, size = torch.distributed.get_rank(group), torch.distributed.get_world_size(group)
    owner = torch.where(holds, rank, size).to(torch.int64)
    torch.distributed.all_reduce(owner, op=torch.distributed.ReduceOp.MIN, group=group)
    scale = torch.where(owner == rank, state[:, 0], torch.zeros_like(state[:, 0]))
    torch.distributed.all_reduce(scale, group=group)  # the owner's scale plus zeros: that scale, exactly
    return torch.cat([scale[:, None], group_history], dim=1)


class _NcclCommunicator(_Communicator):
    """The CUDA backend's communicator: an NCCL communicator of the group's ranks, made for lnmlp
    (a collective: every rank of the group makes it at the same time, its first CUDA plan)."""

    class _UniqueId(ctypes.Structure):
        _fields_ = [("internal", ctypes.c_ubyte * 128)]  # NCCL_UNIQUE_ID_BYTES (bytes, NULs among them)

    def __init__(self, group, size: int, rank: int, device: torch.device):
        super().__init__(size, rank)
        try:
            nccl = ctypes.CDLL("libnccl.so.2")  # torch's CUDA build has loaded it already
        except OSError as e:
            raise NotSupportedError(f"tensor parallelism on CUDA needs NCCL (libnccl.so.2), which this process "
                                    f"cannot load: {e}") from None
        uid = self._UniqueId()
        if rank == 0:
            _nccl_check(nccl, nccl.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
        box = [bytes(uid.internal) if rank == 0 else None]
        torch.distributed.broadcast_object_list(box, src=torch.distributed.get_global_rank(group, 0), group=group,
                                                device=device if torch.distributed.get_backend(group) == "nccl"
                                                else None)
        ctypes.memmove(ctypes.addressof(uid), box[0], ctypes.sizeof(uid))
        self._nccl, self._comm = nccl, ctypes.c_void_p()
        with torch.cuda.device(device):
            _nccl_check(nccl, nccl.ncclCommInitRank(ctypes.byref(self._comm), ctypes.c_int(size), uid,
                                                    ctypes.c_int(rank)), "ncclCommInitRank")
        _lib.check(_lib.get_lib().lnmlp_comm_create_nccl(ctypes.byref(self._comm),
                                                          ctypes.byref(self.lnmlp_comm_handle)))


def _nccl_check(nccl, status: int, what: str) -> None:
    if status != 0:
        nccl.ncclGetErrorString.restype = ctypes.c_char_p
        raise NotSupportedError(f"{what} failed: {nccl.ncclGetErrorString(status).decode()}")


def communicator(number: int, device: torch.device) -> _Communicator:
    """The communicator of group `number` for plans on `device` (made on first use)."""
    key = (number, str(device))
    with _lock:
        comm = _communicators.get(key)
    if comm is None:
        group, size, rank = group_of(number)
        if device.type == "cuda":
            comm = _NcclCommunicator(group, size, rank, device)
        else:
            comm = _CallbackCommunicator(group, size, rank)
        with _lock:
            comm = _communicators.setdefault(key, comm)
    return comm


class _LayoutCommunicator(_Communicator):
    """A communicator of a group's size and rank that runs nothing: for plans made only to read
    sizes (the saved buffer's layout), never called."""

    def __init__(self, size: int, rank: int):
        super().__init__(size, rank)

        def refuse(*_):
            return 1

        self._make_callback_communicator([refuse] * 4)


def layout_communicator(size: int, rank: int) -> _Communicator:
    key = ("layout", size, rank)
    with _lock:
        comm = _communicators.get(key)
        if comm is None:
            comm = _communicators[key] = _LayoutCommunicator(size, rank)
        return comm


def forget_groups() -> None:
    """Drops this file's references to process groups and their communicators (at interpreter exit,
    after the plans that use them are closed), so that a group torch.distributed destroyed goes
    while torch is still whole, not in the interpreter's last teardown."""
    with _lock:
        _communicators.clear()
    _groups.forget()


def check_group(group, what: str) -> int:
    """A process group's size, checked: torch.distributed initialised and `group` a group of it."""
    if not torch.distributed.is_available() or not torch.distributed.is_initialized():
        raise InvalidArgumentError(f"{what}: torch.distributed is not initialised "
                                   "(torch.distributed.init_process_group first)")
    if not isinstance(group, torch.distributed.ProcessGroup):
        raise InvalidArgumentError(f"{what} must be a torch.distributed ProcessGroup, got {type(group).__name__}")
    size = torch.distributed.get_world_size(group)
    if size < 1 or torch.distributed.get_rank(group) < 0:
        raise InvalidArgumentError(f"{what}: this process is not a rank of the group")
    return size
