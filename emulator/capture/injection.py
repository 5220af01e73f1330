"""What chunk and micro-batch reuse may do to a recording: a narrow sink over the op recorder.

Chunk reuse (emulator.capture.chunk_reuse) records one pipeline chunk and injects copies of
it for the other micro-batches; micro-batch reuse (emulator.capture.micro_batch_reuse) does
the same for a gradient-accumulation micro-batch. `ReuseSink(recorder)` is all of the
recorder they touch: how many events there are and the ones since a point, the micro-batch,
pausing, where the first phase-setting op of a stretch starts, which storage a tensor is,
adopting a storage made while paused, holding the frees a stubbed backward causes, a
parameter's post-accumulate-grad hooks but the recorder's own, and injecting copies of
recorded events as if they ran now.
"""

from __future__ import annotations

import contextlib
import dataclasses
import weakref
from collections.abc import Iterator

import torch

from emulator import torch_compat
from emulator.capture.op_recorder import OpRecorder
from emulator.capture.storages import StorageRecord
from emulator.capture.trace import (
    ALLOC,
    FREE,
    MARKER,
    RECORD,
    STREAM_WAIT,
    OpEvent,
    renamed_storages,
)


class ReuseSink:
    def __init__(self, recorder: OpRecorder) -> None:
        self._recorder = recorder
        self._born_as: dict[int, str] = {}  # injected copy's uid -> its original's first category

    @property
    def event_count(self) -> int:
        return len(self._recorder.events)

    def events_since(self, start: int) -> list[OpEvent]:
        return self._recorder.events[start:]

    @property
    def current_micro_batch(self) -> int:
        return self._recorder.current_micro_batch

    def paused(self):
        return self._recorder.paused()

    @contextlib.contextmanager
    def holding_frees(self) -> Iterator[list[tuple[int, int]]]:
        """While paused inside the block, storages that die are not recorded as freed but
        listed (uid, bytes), for the caller to record their frees itself (`inject`)."""
        self._recorder.storages.held_frees = held = []
        try:
            yield held
        finally:
            self._recorder.storages.held_frees = None

    def program_grad_hooks(self, param: torch.Tensor) -> list:
        """The post-accumulate-grad hooks of `param` but the recorder's own (declared.py)."""
        own = self._recorder.declarations.is_own_hook
        return [h for h in torch_compat.post_accumulate_grad_hooks(param) if not own(h)]

    def watch_first_dispatch(self) -> None:
        """Remember where the next op that sets the phase starts (`first_dispatch`)."""
        self._recorder.state.watch_first_dispatch()

    def first_dispatch(self) -> int | None:
        """Index in `events` of the first phase-setting op since `watch_first_dispatch`."""
        return self._recorder.state.take_first_dispatch()

    def storage_uid(self, tensor: torch.Tensor) -> int | None:
        """The id this recorder gave the storage of `tensor`, None if it has not seen it."""
        known = self._recorder.storages.live.get(id(tensor.untyped_storage()))
        return None if known is None else known.uid

    def adopt(self, tensor: torch.Tensor, uid: int) -> None:
        """Track the storage of `tensor` (made while paused) as the already recorded
        allocation `uid`: its free is recorded when it dies, like any other, and its category
        starts as its original's did (a storage freed in the phase epoch it was born in
        becomes a temporary then, whenever its original died)."""
        storages = self._recorder.storages
        storages.categories[uid] = self._born_as.pop(uid, storages.categories[uid])
        storages.adopted.add(uid)
        storage = tensor.untyped_storage()
        key = id(storage)
        ref = weakref.ref(storage, lambda r, key=key: self._recorder.storages.on_free(key, r))
        self._recorder.storages.live[key] = StorageRecord(
            uid, storage.nbytes(), self._recorder.state.epoch, False, ref
        )

    def inject(
        self,
        op_events,
        comm_events,
        comm_sink,
        micro_batch: int,
        uids: dict,
        seqs: dict,
        first_dispatch: int | None,
        event_ids: dict | None = None,
    ) -> None:
        """Record copies of earlier events as if they ran now (emulator.capture.chunk_reuse).

        `op_events` (OpEvent) and `comm_events` (CommEvent / WaitEvent, appended to
        `comm_sink`) are merged by seq and get new seqs (old -> new added to `seqs`); their
        micro-batch becomes `micro_batch`; storages allocated get new uids (old -> new added
        to `uids`, frees are mapped through it). Phases follow the recorder's own rules:
        events before `first_dispatch` (index into `op_events` of the first op that set the
        phase) inherit the current phase; from there on, phase markers are emitted where the
        phase changes from the current one. Raises KeyError for a free or wait of something
        not allocated or issued in `uids` / `seqs`. Stream records get new event ids (old ->
        new added to `event_ids`), stream waits are mapped through it (KeyError likewise).
        """
        event_ids = {} if event_ids is None else event_ids
        merged = sorted([*op_events, *comm_events], key=lambda e: e.seq)
        op_index, dispatched = -1, False
        for e in merged:
            if not isinstance(e, OpEvent):
                new_seq = self._recorder.sequence.next_seq()
                seqs[e.seq] = new_seq
                if hasattr(e, "comm_seq"):
                    comm_sink.append(dataclasses.replace(e, seq=new_seq, comm_seq=seqs[e.comm_seq]))
                else:
                    comm_sink.append(dataclasses.replace(e, seq=new_seq))
                continue
            op_index += 1
            is_phase_marker = e.kind == MARKER and e.name.startswith("phase:")
            if op_index == first_dispatch:
                dispatched = True
                if not is_phase_marker and e.phase != self._recorder.state.last_phase:
                    self._recorder.transition(e.phase, e.stream, e.module, micro_batch)
            if is_phase_marker:
                if e.phase != self._recorder.state.last_phase:
                    self._recorder.transition(e.phase, e.stream, e.module, micro_batch)
                continue
            storage = e.storage
            if e.kind == ALLOC:
                storage = uids[e.storage] = next(self._recorder.storages.uids)
                self._recorder.storages.categories[storage] = (
                    self._recorder.storages.categories.get(e.storage, e.category)
                )
                self._recorder.storages.original_of[storage] = e.storage
                self._born_as[storage] = e.category
            elif e.kind == FREE:
                storage = uids[e.storage]
            tag = e.tag
            if e.kind == RECORD:
                tag = event_ids[e.tag] = self._recorder.streams.next_event_id()
            elif e.kind == STREAM_WAIT:
                tag = event_ids[e.tag]
            self._recorder.events.append(
                renamed_storages(e, uids)._replace(
                    seq=self._recorder.sequence.next_seq(),
                    micro_batch=micro_batch,
                    storage=storage,
                    phase=e.phase if dispatched else self._recorder.state.last_phase,
                    tag=tag,
                )
            )
