"""Work handles of the virtual backend: complete at once, and record a wait when waited.

A `VirtualWork` is what a virtual collective returns: already done (the values were filled
when the call was made), so `wait()` only records where the program waits for it (a
`WaitEvent` on the stream it waits from). Its future's `wait()` is the work's wait too.
"""

from __future__ import annotations

import datetime

import torch.distributed as dist
from torch.futures import Future

from emulator.world import comm_events
from emulator.world.comm_events import WaitEvent


class VirtualWork(dist.Work):
    """Already-completed work; records its first wait."""

    def __init__(self, recorder: comm_events.Recorder | None, comm_seq: int | None, result):
        super().__init__()
        self._recorder = recorder
        self._comm_seq = comm_seq
        self._result = result
        self._waited = False

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        if not self._waited and self._recorder is not None and self._comm_seq is not None:
            self._recorder.emit(
                WaitEvent, comm_seq=self._comm_seq, stream=comm_events.current_stream()
            )
        self._waited = True
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def result(self):
        return self._result

    def get_future(self) -> Future:
        fut = _WaitRecordingFuture(self)
        fut.set_result(self._result)
        return fut


class _WaitRecordingFuture(Future):
    """A completed future whose `wait()` is the work's wait: on CUDA, waiting a collective's
    future makes the current stream wait for the NCCL stream, as `Work.wait()` does (DDP comm
    hooks do). A future chained with `then` is torch's own and records nothing."""

    def __init__(self, work: VirtualWork):
        super().__init__()
        self._work = work

    def wait(self):
        self._work.wait()
        return super().wait()
