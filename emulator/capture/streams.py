"""The streams a program uses, as it would use them on a GPU, recorded while it runs on CPU.

Device-agnostic torch code (FSDP2, pipelining, DDP-style hooks) calls the same stream API
on CPU as on CUDA: `torch.cpu.Stream()`, `with torch.cpu.stream(s)`, `s.wait_stream(t)`,
`s.record_event()`, `s.wait_event(e)`, `torch.cpu.Event().record()`. On CPU those are
no-ops; while a `StreamTracker` is active they are recorded instead:
- every stream object gets a small id (the default stream is 0), which the op recorder
  puts on compute ops and allocations and the virtual backend on collectives it issues;
- `record` events (a stream's position at that point, with an event id) and
  `stream_wait` events (a stream waits for a recorded event) go to the trace, so the
  execution graph can make e.g. FSDP2's compute stream wait for its all-gather stream
  exactly where the program does, as a CUDA stream wait would.
The patches are on torch.cpu's classes and last only while the tracker is active.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator

import torch

from emulator import torch_compat
from emulator.world import comm_events

RECORD, STREAM_WAIT = "record", "stream_wait"

_active: StreamTracker | None = None


def current_stream_id() -> int:
    """Id of the stream the program is on now (0 outside a tracker or on the default stream)."""
    return _active.stream_id(torch.cpu.current_stream()) if _active is not None else 0


class StreamTracker:
    """Assigns stream ids and reports records and waits to `emit(kind, stream_id, event_id)`."""

    def __init__(self, emit: Callable[[str, int, int], None]):
        self.emit = emit
        self._ids: dict[int, int] = {id(torch.cpu.current_stream()): 0}
        self._streams: list = [torch.cpu.current_stream()]  # keeps ids from being reused
        self._event_ids = itertools.count(1)

    def stream_id(self, stream) -> int:
        key = id(stream)
        if key not in self._ids:
            self._ids[key] = len(self._streams)
            self._streams.append(stream)
        return self._ids[key]

    def next_event_id(self) -> int:
        """A new event id, as a record takes (micro-batch reuse's copies of records take them)."""
        return next(self._event_ids)

    def record(self, event, stream) -> None:
        event.prism_event_id = self.next_event_id()
        self.emit(
            RECORD, self.stream_id(stream or torch.cpu.current_stream()), event.prism_event_id
        )

    def wait(self, stream, event) -> None:
        event_id = getattr(event, "prism_event_id", None)
        if event_id is not None:
            self.emit(STREAM_WAIT, self.stream_id(stream), event_id)


@contextlib.contextmanager
def tracking(tracker: StreamTracker) -> Iterator[StreamTracker]:
    """Record stream use inside the block (see the module docstring)."""
    global _active
    event_cls = torch.cpu.Event

    def record_event(original):
        def record_event(self, event=None):
            event = event if event is not None else event_cls()
            tracker.record(event, self)
            return event  # as torch.cuda.Stream.record_event does

        return record_event

    def wait_event(original):
        def wait_event(self, event) -> None:
            if event is not None:
                tracker.wait(self, event)

        return wait_event

    def wait_stream(original):
        def wait_stream(self, stream) -> None:
            self.wait_event(stream.record_event())

        return wait_stream

    def record(original):
        def record(self, stream=None) -> None:
            tracker.record(self, stream)

        return record

    previous, _active = _active, tracker
    try:
        with (
            comm_events.stream_source(current_stream_id),
            torch_compat.patched("torch.cpu.Stream.record_event", record_event),
            torch_compat.patched("torch.cpu.Stream.wait_event", wait_event),
            torch_compat.patched("torch.cpu.Stream.wait_stream", wait_stream),
            torch_compat.patched("torch.cpu.Event.record", record),
        ):
            yield tracker
    finally:
        _active = previous
