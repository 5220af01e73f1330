"""The "prism" torch.distributed backend: one process plays rank r of a world of W.

`VirtualProcessGroup` subclasses `dist.ProcessGroup` (the C++ `Backend` has no Python
constructor) and implements the Python methods torch 2.13 calls. Each call is recorded
into the active `comm_events.Recorder` (if any) and completes at once; the `VirtualWork`
it returns records a `WaitEvent` when it is first waited on, through `wait()` or its
future's `wait()` (`async_op=False` calls are waited on by torch itself, right after the
call); a functional collective's wait is recorded at the first read of its output
(emulator/world/fake_collectives.py).

Outputs are filled as if every rank held the same data as this one, so value-reading
control flow (grad clipping, NaN checks, loss scaling) runs and never sees garbage:
- all_reduce / reduce, every op including SUM: the local value is kept. Scaling SUM by the
  group size would be the literal "same data everywhere" answer, but it overflows fp16 and
  bf16 reductions over big groups (65504 / 1024 is a small gradient) and would turn loss
  scalers and NaN checks into false alarms; timing never depends on the values.
- all_gather / gather copy the local input into every slot; reduce_scatter takes this
  rank's chunk; all_to_all copies chunk i to chunk i (prefix copy, zero tail, when uneven);
- broadcast / scatter on a non-root rank and recv fill with zeros.
Fills run under no_grad, as a real backend writes behind autograd's back, and inside
`comm_events.backend_fills()`, so the op recorder does not take them for compute kernels
(on a GPU the collective's own kernel writes the output). Works on real CPU tensors and
on FakeTensorMode tensors; fake tensors hold no values, so their fills are skipped (each
would cost a fake dispatch and change nothing).
"""

from __future__ import annotations

import functools

import numpy as np
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (
    AllgatherOptions,
    AllreduceCoalescedOptions,
    AllreduceOptions,
    AllToAllOptions,
    BarrierOptions,
    BroadcastOptions,
    GatherOptions,
    ReduceOptions,
    ReduceScatterOptions,
    ScatterOptions,
)
from torch._subclasses.fake_tensor import FakeTensor

from emulator.world import comm_events
from emulator.world.collectives import NO_TENSOR_DTYPE, all_to_all_kind
from emulator.world.comm_events import CommEvent
from emulator.world.work import VirtualWork

BACKEND_NAME = "prism"
# read-only defaults for callers that pass no options (torch always passes them)
_ALL_TO_ALL_OPTIONS = AllToAllOptions()
_ALLGATHER_OPTIONS = AllgatherOptions()
_ALLREDUCE_COALESCED_OPTIONS = AllreduceCoalescedOptions()
_ALLREDUCE_OPTIONS = AllreduceOptions()
_BARRIER_OPTIONS = BarrierOptions()
_BROADCAST_OPTIONS = BroadcastOptions()
_GATHER_OPTIONS = GatherOptions()
_REDUCE_OPTIONS = ReduceOptions()
_REDUCE_SCATTER_OPTIONS = ReduceScatterOptions()
_SCATTER_OPTIONS = ScatterOptions()


def _op_name(opts) -> str:
    return opts.reduceOp.op.name


def _async(opts) -> bool:
    return bool(getattr(opts, "asyncOp", True))


def _fills_outputs(method):
    """A collective method that fills outputs (module docstring): no_grad, not rank compute."""

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        with torch.no_grad(), comm_events.backend_fills():
            return method(*args, **kwargs)

    return wrapper


def _holds_values(tensor: torch.Tensor) -> bool:
    """Whether `tensor` has values to fill (a fake tensor has none: the fill is skipped)."""
    return not isinstance(tensor, FakeTensor)


def _fill_gathered(out: torch.Tensor, inp: torch.Tensor, n: int) -> None:
    """Every one of the n slots of `out` gets a copy of `inp` (one broadcasting copy)."""
    if out.is_contiguous():
        out.view(n, -1).copy_(inp.reshape(1, -1))
    else:
        out.copy_(inp.reshape(1, -1).expand(n, -1).reshape(out.shape))


def _copy_prefix(out: torch.Tensor, inp: torch.Tensor) -> None:
    """out <- inp where both have elements, zeros beyond (uneven all_to_all splits)."""
    if out.numel() == inp.numel():
        out.copy_(inp.reshape(out.shape))
        return
    out.zero_()
    k = min(out.numel(), inp.numel())
    out.view(-1)[:k].copy_(inp.reshape(-1)[:k])


def _numel(tensors) -> tuple[int, ...]:
    return tuple(int(t.numel()) for t in tensors)


class VirtualProcessGroup(dist.ProcessGroup):
    """A process group of the virtual world; `global_ranks[i]` is group rank i."""

    def __init__(self, rank: int, size: int, global_ranks: np.ndarray, group_name: str):
        super().__init__(rank, size)
        if len(global_ranks) != size:
            raise ValueError(f"global_ranks has {len(global_ranks)} entries, size is {size}")
        self.global_ranks = global_ranks
        self._group_name = group_name

    # -- identity -----------------------------------------------------------------
    def _set_group_name(self, name: str) -> None:
        self._group_name = name

    @property
    def group_name(self) -> str:
        return self._group_name

    def name(self) -> str:
        return BACKEND_NAME

    def getBackendName(self) -> str:
        return BACKEND_NAME

    def __repr__(self) -> str:
        return (
            f"VirtualProcessGroup(name={self._group_name}, rank={self.rank()}, size={self.size()})"
        )

    # -- recording ------------------------------------------------------------------
    def record(
        self,
        kind: str,
        tensors,
        *,
        op=None,
        async_op=True,
        peer=None,
        root=None,
        tag=0,
        coalesced=False,
        numel=None,
        result=None,
    ) -> VirtualWork:
        recorder = comm_events.current_recorder()
        if recorder is None:
            return VirtualWork(None, None, result)
        recorder.add_group(self._group_name, self.global_ranks)
        comm_events.wait_for_reads(tensors)  # sending or reducing it reads it
        if coalesced and len(tensors) == 1:  # torch routes single tensors through *_coalesced
            kind, coalesced = kind.removesuffix("_coalesced"), False
        sizes = _numel(tensors)
        total = sum(sizes) if numel is None else numel
        itemsize = tensors[0].element_size() if tensors else 0
        dtype = str(tensors[0].dtype).removeprefix("torch.") if tensors else NO_TENSOR_DTYPE
        event = recorder.emit(
            CommEvent,
            kind=kind,
            group_id=self._group_name,
            group_size=self.size(),
            op=op,
            dtype=dtype,
            numel=int(total),
            nbytes=int(total) * itemsize,
            async_op=async_op,
            peer=peer,
            root=root,
            tag=tag,
            sizes=sizes if coalesced else None,
            stream=comm_events.current_stream(),
        )
        if kind == "all_gather" and len(tensors) == 1:
            comm_events.note_gathered(tensors[0], event.seq)
        return VirtualWork(recorder, event.seq, result)

    def global_rank(self, group_rank: int) -> int:
        return int(self.global_ranks[group_rank])

    # -- all_reduce / reduce ----------------------------------------------------------
    def allreduce(self, tensors, opts=_ALLREDUCE_OPTIONS):
        return self.record(
            "all_reduce", tensors, op=_op_name(opts), async_op=_async(opts), result=tensors
        )

    def allreduce_coalesced(self, tensors, opts=_ALLREDUCE_COALESCED_OPTIONS):
        return self.record(
            "all_reduce_coalesced",
            tensors,
            op=_op_name(opts),
            async_op=_async(opts),
            coalesced=True,
            result=tensors,
        )

    def reduce(self, tensors, opts=_REDUCE_OPTIONS):
        return self.record(
            "reduce",
            tensors,
            op=_op_name(opts),
            async_op=_async(opts),
            root=self.global_rank(opts.rootRank),
            result=tensors,
        )

    # -- all_gather ---------------------------------------------------------------------
    @_fills_outputs
    def all_gather_single(self, output, input, opts=_ALLGATHER_OPTIONS):
        if _holds_values(output):
            _fill_gathered(output, input, self.size())
        return self.record("all_gather", [output], async_op=_async(opts), result=[output])

    _allgather_base = all_gather_single

    @_fills_outputs
    def allgather(self, output_tensors, input_tensors, opts=_ALLGATHER_OPTIONS):
        for outs, inp in zip(output_tensors, input_tensors, strict=True):
            for out in filter(_holds_values, outs):
                out.copy_(inp)
        flat = [o for outs in output_tensors for o in outs]
        return self.record("all_gather", flat, async_op=_async(opts), result=output_tensors)

    @_fills_outputs
    def _allgather_many(self, outputs, inputs, opts):
        for out, inp in zip(outputs, inputs, strict=True):
            if _holds_values(out):
                _fill_gathered(out, inp, self.size())
        return self.record(
            "all_gather_coalesced", outputs, async_op=_async(opts), coalesced=True, result=outputs
        )

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=_ALLGATHER_OPTIONS):
        return self._allgather_many(outputs, inputs, opts)

    def all_gather_single_coalesced(self, outputs, inputs, opts=_ALLGATHER_OPTIONS):
        return self._allgather_many(outputs, inputs, opts)

    @_fills_outputs
    def allgather_coalesced(self, output_lists, input_list, opts=_ALLGATHER_OPTIONS):
        for outs, inp in zip(output_lists, input_list, strict=True):
            for out in filter(_holds_values, outs):
                out.copy_(inp)
        flat = [torch.cat([o.reshape(-1) for o in outs]) for outs in output_lists]
        return self.record(
            "all_gather_coalesced", flat, async_op=_async(opts), coalesced=True, result=output_lists
        )

    # -- reduce_scatter -------------------------------------------------------------------
    @_fills_outputs
    def reduce_scatter_single(self, output, input, opts=_REDUCE_SCATTER_OPTIONS):
        if _holds_values(output):
            output.copy_(input.reshape(self.size(), -1)[self.rank()].reshape(output.shape))
        return self.record(
            "reduce_scatter", [input], op=_op_name(opts), async_op=_async(opts), result=[output]
        )

    _reduce_scatter_base = reduce_scatter_single

    @_fills_outputs
    def reduce_scatter(self, output_tensors, input_tensors, opts=_REDUCE_SCATTER_OPTIONS):
        for out, chunks in zip(output_tensors, input_tensors, strict=True):
            if _holds_values(out):
                out.copy_(chunks[self.rank()])
        flat = [c for chunks in input_tensors for c in chunks]
        return self.record(
            "reduce_scatter", flat, op=_op_name(opts), async_op=_async(opts), result=output_tensors
        )

    @_fills_outputs
    def _reduce_scatter_many(self, outputs, inputs, opts):
        for out, inp in zip(outputs, inputs, strict=True):
            if _holds_values(out):
                out.copy_(inp.reshape(self.size(), -1)[self.rank()].reshape(out.shape))
        return self.record(
            "reduce_scatter_coalesced",
            inputs,
            op=_op_name(opts),
            async_op=_async(opts),
            coalesced=True,
            result=outputs,
        )

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=_REDUCE_SCATTER_OPTIONS):
        return self._reduce_scatter_many(outputs, inputs, opts)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=_REDUCE_SCATTER_OPTIONS):
        return self._reduce_scatter_many(outputs, inputs, opts)

    # -- all_to_all -------------------------------------------------------------------------
    @_fills_outputs
    def all_to_all_single(
        self, output, input, output_split_sizes, input_split_sizes, opts=_ALL_TO_ALL_OPTIONS
    ):
        if _holds_values(output):
            _copy_prefix(output, input)
        kind = all_to_all_kind(input_split_sizes, self.rank())
        return self.record(kind, [input], async_op=_async(opts), result=[output])

    alltoall_base = all_to_all_single

    @_fills_outputs
    def alltoall(self, output_tensors, input_tensors, opts=_ALL_TO_ALL_OPTIONS):
        for out, inp in zip(output_tensors, input_tensors, strict=True):
            if _holds_values(out):
                _copy_prefix(out, inp)
        return self.record(
            "all_to_all", input_tensors, async_op=_async(opts), result=output_tensors
        )

    # -- rooted collectives ---------------------------------------------------------------------
    @_fills_outputs
    def broadcast(self, tensors, opts=_BROADCAST_OPTIONS):
        if opts.rootRank != self.rank():
            for t in filter(_holds_values, tensors):
                t.zero_()
        return self.record(
            "broadcast",
            tensors,
            async_op=_async(opts),
            root=self.global_rank(opts.rootRank),
            result=tensors,
        )

    @_fills_outputs
    def scatter(self, output_tensors, input_tensors, opts=_SCATTER_OPTIONS):
        for i, out in enumerate(output_tensors):
            if not _holds_values(out):
                continue
            if input_tensors:
                out.copy_(input_tensors[i][self.rank()])
            else:
                out.zero_()
        n = self.size() * sum(_numel(output_tensors))
        return self.record(
            "scatter",
            output_tensors,
            async_op=_async(opts),
            numel=n,
            root=self.global_rank(opts.rootRank),
            result=output_tensors,
        )

    @_fills_outputs
    def gather(self, output_tensors, input_tensors, opts=_GATHER_OPTIONS):
        for outs, inp in zip(output_tensors, input_tensors, strict=False):  # [] off root
            for out in filter(_holds_values, outs):
                out.copy_(inp)
        n = self.size() * sum(_numel(input_tensors))
        return self.record(
            "gather",
            input_tensors,
            async_op=_async(opts),
            numel=n,
            root=self.global_rank(opts.rootRank),
            result=output_tensors,
        )

    # -- p2p and barrier --------------------------------------------------------------------------
    def send(self, tensors, dstRank, tag=0):
        # The work keeps no reference to what it sends. On NCCL, batch_isend_irecv (torch's
        # pipelining sends through it) returns one coalesced work that lets go of the sent
        # tensors once the send completes; pipelining waits its sends at the end of the step,
        # so a work holding them would keep every sent activation until then.
        return self.record("send", tensors, peer=self.global_rank(dstRank), tag=tag, result=[])

    @_fills_outputs
    def recv(self, tensors, srcRank, tag=0):
        for t in filter(_holds_values, tensors):
            t.zero_()
        return self.record("recv", tensors, peer=self.global_rank(srcRank), tag=tag, result=tensors)

    def barrier(self, opts=_BARRIER_OPTIONS):
        return self.record("barrier", [], async_op=_async(opts), result=[])

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        self.record("barrier", [], async_op=False).wait()
