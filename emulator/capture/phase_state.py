"""Where a recording is: the phase, micro-batch and stream the next recorded op belongs to.

The op recorder (emulator.capture.op_recorder) owns one `PhaseState` and asks it, for every
op it records, which phase the op is in (`resolve`): the innermost forced phase (the caller's
`phase("optimizer")`), else "backward" inside an autograd graph task, "recompute" when a
module forward runs inside one (activation checkpointing), else "forward". A phase change
advances the *epoch*, which the storage ledger uses to tell temporaries. Chunk reuse asks
where the first phase-setting op of a stretch of recording starts (`watch_first_dispatch`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from emulator.capture.storages import BACKWARD, FORWARD, RECOMPUTE
from emulator.capture.trace import PHASES

_NOT_WATCHED = -1


class PhaseState:
    def __init__(self) -> None:
        self.stream = 0  # forced stream; 0: the program's current stream (capture.streams)
        self.micro_batch = -1
        self.forced: list[int] = []  # stack of forced phases
        self.last_phase = -1
        self.epoch = 0
        self.forward_depth = 0  # module forwards running (maintained by module hooks)
        self.pause_depth = 0
        self.building = False  # recording the program's build: storages only (op_recorder)
        self._first_dispatch: int | None = _NOT_WATCHED  # None: watched, not seen yet

    @property
    def is_paused(self) -> bool:
        return bool(self.pause_depth)

    def resolve(self, in_backward: bool, event_index: int) -> tuple[int, bool]:
        """(the phase of the op being recorded as event `event_index`, whether it differs
        from the last op's, in which case the state has entered it)."""
        if self._first_dispatch is None:
            self._first_dispatch = event_index
        if self.forced:
            phase = self.forced[-1]
        elif in_backward:
            phase = RECOMPUTE if self.forward_depth > 0 else BACKWARD
        else:
            phase = FORWARD
        changed = phase != self.last_phase
        if changed:
            self.enter(phase)
        return phase, changed

    def enter(self, phase: int) -> None:
        self.last_phase = phase
        self.epoch += 1

    def watch_first_dispatch(self) -> None:
        """Remember the event index of the next op that resolves a phase."""
        self._first_dispatch = None

    def take_first_dispatch(self) -> int | None:
        """The index remembered since `watch_first_dispatch` (None if no op came); unwatches."""
        index, self._first_dispatch = self._first_dispatch, _NOT_WATCHED
        return index

    # ---- the caller's blocks ---------------------------------------------------------------

    @contextlib.contextmanager
    def on_stream(self, stream: int) -> Iterator[None]:
        previous, self.stream = self.stream, stream
        try:
            yield
        finally:
            self.stream = previous

    def push_phase(self, name: str) -> int:
        if name not in PHASES:
            raise ValueError(f"phase({name!r}) is not one of {PHASES}")
        self.forced.append(PHASES.index(name))
        return self.forced[-1]

    def pop_phase(self) -> None:
        self.forced.pop()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        self.pause_depth += 1
        try:
            yield
        finally:
            self.pause_depth -= 1
