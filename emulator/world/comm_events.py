"""Communication events recorded by the virtual-world backend, and the sink they go to.

A `Recorder` owns three things that every producer of events shares:
- `events`: a plain list-like sink (anything with `append`), in program order;
- one sequence counter (`next_seq`): the capture stage stamps its compute events from
  the same counter, so `seq` orders the whole sink;
- `groups`: group id -> global ranks (numpy int64 array), stored once per group, so an
  event over a 131 072-rank group costs one string, not a tuple of 131 072 ints.

Size convention (as nccl-tests reports "size"): `numel`/`nbytes` are the FULL buffer of
the collective: the gathered output of all_gather/gather, the unreduced input of
reduce_scatter, the tensor of all_reduce/broadcast/reduce/send/recv, the input of
all_to_all and scatter. The per-rank shard of all_gather/reduce_scatter/scatter/gather is
`numel // group_size`. `*_coalesced` calls are one event with `sizes` = per-tensor numels.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
from torch.utils.weak import WeakIdKeyDictionary

from emulator.world.collectives import RECORDED_KINDS

_backend_fill_depth = 0


@contextlib.contextmanager
def backend_fills() -> Iterator[None]:
    """Ops inside the block are the backend writing a collective's outputs: on a GPU the
    collective kernel does that, so they are not the rank's compute (the op recorder skips them)."""
    global _backend_fill_depth
    _backend_fill_depth += 1
    try:
        yield
    finally:
        _backend_fill_depth -= 1


def in_backend_fills() -> bool:
    return _backend_fill_depth > 0


@dataclass(frozen=True, kw_only=True, slots=True)
class CommEvent:
    """One collective or p2p call as this rank issued it."""

    seq: int
    kind: str
    group_id: str
    group_size: int
    op: str | None  # reduce op name ("SUM", "AVG", ...) or None
    dtype: str  # torch dtype name without the "torch." prefix; NO_TENSOR_DTYPE for a barrier
    numel: int
    nbytes: int
    async_op: bool
    peer: int | None = None  # global rank of the other side of a send/recv
    root: int | None = None  # global rank of the root of broadcast/reduce/scatter/gather
    tag: int = 0
    sizes: tuple[int, ...] | None = None  # per-tensor numels of a coalesced call
    stream: int = 0  # the stream it was issued from (emulator/capture/streams.py ids)

    def __post_init__(self) -> None:
        if self.kind not in RECORDED_KINDS:
            raise ValueError(f"kind({self.kind!r}) is not one of {sorted(RECORDED_KINDS)}")
        if self.numel < 0 or self.nbytes < 0:
            raise ValueError(f"numel({self.numel}) and nbytes({self.nbytes}) must be >= 0")


@dataclass(frozen=True, kw_only=True, slots=True)
class WaitEvent:
    """The program waited on the work of event `comm_seq` (first wait only)."""

    seq: int
    comm_seq: int
    stream: int = 0  # the stream that waits

    def __post_init__(self) -> None:
        if self.comm_seq >= self.seq:
            raise ValueError(f"comm_seq({self.comm_seq}) must precede seq({self.seq})")


# storage of a waited functional-collective output nothing has read yet -> its work
# (emulator/world/fake_collectives.py: the wait is recorded at the first read)
_unread: WeakIdKeyDictionary = WeakIdKeyDictionary()


def mark_unread(tensor, work) -> None:
    """`work` (it produced `tensor`) is waited at the first read of `tensor`'s storage."""
    _unread[tensor.untyped_storage()] = work


def wait_for_reads(tensors) -> None:
    """Record the wait of every collective whose unread output one of `tensors` reads."""
    if not _unread:
        return
    for tensor in tensors:
        work = _unread.pop(tensor.untyped_storage(), None)
        if work is not None:
            work.wait()


# storage of an all-gather's output -> that collective's seq: the transformer-engine fp8 rule
# (emulator/capture/fp8_casts.py) finds the gather whose output the program casts to fp8
_gathered_by: WeakIdKeyDictionary = WeakIdKeyDictionary()


def note_gathered(tensor, seq: int) -> None:
    """`tensor` is the output of the all-gather the current recorder recorded as event `seq`."""
    _gathered_by[tensor.untyped_storage()] = (_current, seq)


def gathered_by(tensor) -> int | None:
    """The seq of the all-gather of the current recording whose output `tensor` is (a view
    of), or None."""
    recorder, seq = _gathered_by.get(tensor.untyped_storage(), (None, None))
    return seq if recorder is not None and recorder is _current else None


@dataclass(eq=False)
class Recorder:
    """Event sink + shared sequence counter + group table (see module docstring)."""

    events: list = field(default_factory=list)
    groups: dict[str, np.ndarray] = field(default_factory=dict)
    _counter: Iterator[int] = field(default_factory=itertools.count, repr=False)

    def next_seq(self) -> int:
        return next(self._counter)

    def emit(self, event_type: type, **fields) -> object:
        """Stamp `event_type(**fields)` with the next seq, append it, return it."""
        event = event_type(seq=self.next_seq(), **fields)
        self.events.append(event)
        return event

    def add_group(self, group_id: str, ranks: np.ndarray) -> None:
        known = self.groups.get(group_id)
        if known is None:
            self.groups[group_id] = ranks
        elif known is not ranks and not np.array_equal(known, ranks):
            raise ValueError(f"group {group_id!r} already recorded with other ranks")


_current: Recorder | None = None
_stream_source: Callable[[], int] | None = None


@contextlib.contextmanager
def stream_source(source: Callable[[], int]) -> Iterator[None]:
    """While the block runs, `current_stream()` asks `source` which stream the program is on
    (capture's stream tracking supplies it; the world does not track streams itself)."""
    global _stream_source
    previous, _stream_source = _stream_source, source
    try:
        yield
    finally:
        _stream_source = previous


def current_stream() -> int:
    """Id of the stream a collective is issued or waited from (0: the default stream)."""
    return _stream_source() if _stream_source is not None else 0


def current_recorder() -> Recorder | None:
    return _current


@contextlib.contextmanager
def recording(recorder: Recorder) -> Iterator[Recorder]:
    """Route every virtual-world call made inside the block to `recorder`."""
    global _current
    previous, _current = _current, recorder
    try:
        yield recorder
    finally:
        _current = previous
