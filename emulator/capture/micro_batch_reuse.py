"""Micro-batch reuse: record one gradient-accumulation micro-batch, reuse it for the rest.

Without pipeline parallelism a step runs its micro-batches one after the other, each a
forward with its loss and a backward (the program's `forward` and `backward` steps, see
`RankProgram.micro_batch_steps`); capture time is linear in their number (21 per rank in
llm-foundry's MPT-30B rows). While `reused_micro_batches` is active:
- the first micro-batch runs for real: it allocates what later ones accumulate into (FSDP2's
  sharded gradients) and initialises lazily (FSDP2's streams);
- the second runs for real and its events are kept as templates, one for the forward (from
  the micro-batch marker the root's forward sets) and one for the backward;
- later ones are not run: `micro_batch_markers`' stand-in for the root forward marks the
  micro-batch (and collects garbage) as the forward would, the template's events are
  recorded in its place (storages get fresh ids, collectives and waits are copied, a wait
  pointing at its copy, stream records get fresh event ids and stream waits follow them),
  the loss is a tensor of the template's metadata adopted as the copy of the template's
  loss storage (its free is recorded where the program drops it), and the post-accumulate-
  grad hooks the template's backward fired run again in its order with zero gradients (as
  chunk reuse's stub runs them), unrecorded, so state they keep (workloads.zero's bucket
  counts) advances as a real backward advances it;
- the last micro-batch runs for real if the template's backward fired such hooks (they may
  act on the last micro-batch only, as workloads.zero's buckets launch their reductions
  there); FSDP2 reduce-scatters in every backward alike and ends each in the same state (its
  final callback waits for and drops what it kept), so there it is reused too. Any micro-
  batch whose FSDP2 per-backward flags (`torch_compat.fsdp_backward_flags`: is_last_backward,
  requires_gradient_sync, ...) differ, when its forward step begins, from those the
  template's backward ran with runs for real (ChunkReuseError if they change after a
  stood-in forward, before its backward).
A template must leave nothing behind but its loss: every storage it allocates is freed in
it, it frees nothing it did not allocate, and waits only on collectives and stream events it
issued; where that fails nothing is reused (and the capture is the full one). Nothing after
the template may wait on what it issued (checked at the end; ChunkReuseError, and the caller
captures again without reuse). Tests compare a reused capture with a full one event for event.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from emulator import torch_compat
from emulator.capture.chunk_reuse import ChunkReuseError, accumulate_zero, paused_and_silent
from emulator.capture.injection import ReuseSink
from emulator.capture.trace import ALLOC, FREE, MARKER, RECORD, STREAM_WAIT, OpEvent

TEMPLATE = 1  # the micro-batch recorded as the template (the first allocates, see docstring)


@dataclass
class _Template:
    op_events: list[OpEvent]
    comm_events: list
    first_dispatch: int | None = None  # index of the first phase-setting op in op_events


@dataclass
class _Templates:
    model: torch.nn.Module
    forward: _Template
    loss_meta: tuple  # (shape, stride, dtype, device)
    loss_uid: int
    marker_module: str  # the module the root forward's micro-batch marker is recorded in
    inputs: tuple  # what the forward step was called with, but the batch: (loss_fn, metas)
    flags: tuple = ()  # torch_compat.fsdp_backward_flags at the template's backward
    backward: _Template | None = None
    micro_batches: int = 0  # as the template's backward was told
    hooked: list[torch.Tensor] = field(default_factory=list)  # params whose hooks it fired


class MicroBatchReuse:
    """State of one capture's micro-batch reuse (see the module docstring)."""

    def __init__(self, recorder, comm, skipped_forward: Callable, enabled: bool = True):
        self.recorder, self.comm, self.enabled = ReuseSink(recorder), comm, enabled
        self.skipped_forward = skipped_forward
        self.templates: _Templates | None = None
        self.forwards = 0  # forward steps so far: the next one's micro-batch
        self.standing_in: int | None = None  # micro-batch whose forward was stood in for
        self.reused = 0  # micro-batches stood in for
        self.zero_grads: dict[int, torch.Tensor] = {}  # id(param) -> zeros
        # per stood-in micro-batch: template storage id / seq / stream event id -> the copy's
        self.uids: dict[int, dict[int, int]] = {}
        self.seqs: dict[int, dict[int, int]] = {}
        self.event_ids: dict[int, dict[int, int]] = {}

    def disable(self, reason: str) -> None:
        """Run every micro-batch from now on; too late (ChunkReuseError) once one was reused."""
        if self.reused:
            raise ChunkReuseError(reason)
        self.enabled = False

    # ---- the two wrapped steps ---------------------------------------------------------------

    def forward(self, original, model, loss_fn, tokens, labels):
        micro_batch = self.forwards
        self.forwards += 1
        inputs = _inputs(loss_fn, tokens, labels)
        if self._reusable(micro_batch, model, inputs):
            return self._stand_in_forward(micro_batch)
        if not self.enabled or micro_batch != TEMPLATE:
            return original(model, loss_fn, tokens, labels)
        if isinstance(model, DistributedDataParallel):
            self.disable("torch DDP's reducer keeps per-backward state of its own")
            return original(model, loss_fn, tokens, labels)
        start_op, start_comm = self.recorder.event_count, len(self.comm.events)
        self.recorder.watch_first_dispatch()
        loss = original(model, loss_fn, tokens, labels)
        try:
            self._keep_forward(model, inputs, loss, micro_batch, start_op, start_comm)
        except _Unsupported as why:
            self.disable(f"forward: {why}")
        return loss

    def backward(self, original, loss, micro_batches):
        if self.standing_in is not None:
            self._stand_in_backward(micro_batches)
            return None
        templates = self.templates
        ours = self.forwards == TEMPLATE + 1  # the template's forward was the last one
        if not self.enabled or templates is None or templates.backward is not None or not ours:
            return original(loss, micro_batches)
        templates.flags = torch_compat.fsdp_backward_flags(templates.model)
        start_op, start_comm = self.recorder.event_count, len(self.comm.events)
        self.recorder.watch_first_dispatch()
        fired: list[torch.Tensor] = []
        params = [p for p in templates.model.parameters() if p.requires_grad]
        handles = [p.register_post_accumulate_grad_hook(fired.append) for p in params]
        try:
            result = original(loss, micro_batches)
        finally:
            for handle in handles:
                handle.remove()
        try:
            self._keep_backward(templates, micro_batches, fired, start_op, start_comm)
        except _Unsupported as why:
            self.disable(f"backward: {why}")
        return result

    # ---- templates -------------------------------------------------------------------------

    def _keep_forward(self, model, inputs, loss, micro_batch, start_op, start_comm) -> None:
        events = self.recorder.events_since(start_op)
        first = self.recorder.first_dispatch()
        marker = next(
            (
                i
                for i, e in enumerate(events)
                if e.kind == MARKER and e.name == f"micro_batch:{micro_batch}"
            ),
            None,
        )
        if marker is None or any(e.kind != FREE for e in events[:marker]):
            raise _Unsupported("the root forward does not start it with its micro-batch marker")
        comms = self.comm.events[start_comm:]
        if any(e.seq < events[marker].seq for e in comms):
            raise _Unsupported("it communicates before the root forward starts")
        if type(loss) is DTensor or not isinstance(loss, torch.Tensor):
            raise _Unsupported("the loss is not a plain tensor")
        storage = loss.untyped_storage()
        if loss.storage_offset() or storage.nbytes() != loss.numel() * loss.element_size():
            raise _Unsupported("the loss is a view")
        ops = events[marker + 1 :]
        uid = self.recorder.storage_uid(loss)
        if uid is None or uid not in {e.storage for e in ops if e.kind == ALLOC}:
            raise _Unsupported("the loss is not a storage it allocates")
        offset = start_op + marker + 1
        self.templates = _Templates(
            model=model,
            forward=_Template(
                op_events=list(ops),
                comm_events=list(comms),
                first_dispatch=None if first is None or first < offset else first - offset,
            ),
            loss_meta=(tuple(loss.shape), loss.stride(), loss.dtype, loss.device),
            loss_uid=uid,
            marker_module=events[marker].module,
            inputs=inputs,
        )

    def _keep_backward(self, templates, micro_batches, fired, start_op, start_comm) -> None:
        first = self.recorder.first_dispatch()
        backward = _Template(
            op_events=list(self.recorder.events_since(start_op)),
            comm_events=list(self.comm.events[start_comm:]),
            first_dispatch=None if first is None else first - start_op,
        )
        _check_pair(templates.forward, backward, templates.loss_uid)
        templates.backward = backward
        templates.micro_batches = micro_batches
        # with hooks of the program's (the watcher is gone): what a stand-in runs again
        templates.hooked = [p for p in fired if self.recorder.program_grad_hooks(p)]

    # ---- reuse -----------------------------------------------------------------------------

    def _reusable(self, micro_batch: int, model, inputs: tuple) -> bool:
        templates = self.templates
        if not self.enabled or templates is None or templates.backward is None:
            return False
        last = micro_batch == templates.micro_batches - 1
        return (
            micro_batch > TEMPLATE
            and model is templates.model
            and inputs == templates.inputs
            and micro_batch < templates.micro_batches
            and not (last and templates.hooked)
            and torch_compat.fsdp_backward_flags(model) == templates.flags
        )

    def _stand_in_forward(self, micro_batch: int) -> torch.Tensor:
        templates = self.templates
        self.skipped_forward(templates.model, templates.marker_module)
        if self.recorder.current_micro_batch != micro_batch:
            raise ChunkReuseError(
                f"micro-batch {micro_batch} was marked {self.recorder.current_micro_batch}"
            )
        shape, stride, dtype, device = templates.loss_meta
        with paused_and_silent(self.recorder, self.comm, "a stand-in loss"):
            loss = torch.empty_strided(shape, stride, dtype=dtype, device=device)
        uids = self._inject(templates.forward, micro_batch)
        self.recorder.adopt(loss, uids[templates.loss_uid])
        self.standing_in = micro_batch
        self.reused += 1
        return loss

    def _stand_in_backward(self, micro_batches: int) -> None:
        templates, micro_batch = self.templates, self.standing_in
        self.standing_in = None
        if micro_batches != templates.micro_batches:
            raise ChunkReuseError(
                f"a backward of {micro_batches} micro-batches, the template's of "
                f"{templates.micro_batches}"
            )
        if torch_compat.fsdp_backward_flags(templates.model) != templates.flags:
            raise ChunkReuseError("FSDP2's flags changed after a stood-in forward")
        self._inject(templates.backward, micro_batch)
        with paused_and_silent(
            self.recorder, self.comm, "the post-accumulate-grad hooks of a stand-in backward"
        ):
            for param in templates.hooked:
                zero = self.zero_grads.get(id(param))
                if zero is None:
                    zero = self.zero_grads[id(param)] = torch.zeros_like(param)
                accumulate_zero(param, zero)

    def _inject(self, template: _Template, micro_batch: int) -> dict[int, int]:
        uids = self.uids.setdefault(micro_batch, {})
        try:
            self.recorder.inject(
                template.op_events,
                template.comm_events,
                self.comm.events,
                micro_batch,
                uids,
                self.seqs.setdefault(micro_batch, {}),
                template.first_dispatch,
                self.event_ids.setdefault(micro_batch, {}),
            )
        except KeyError as missing:
            raise ChunkReuseError(f"a copied event refers to {missing}, not in the copy") from None
        return uids

    def check_nothing_waits_on_the_template(self) -> None:
        """After the step: no event outside the templates waits on a collective or stream
        event they issued (a stood-in micro-batch issued none for it to wait on)."""
        if not self.reused:
            return
        templates = self.templates
        issued = {
            e.seq
            for t in (templates.forward, templates.backward)
            for e in t.comm_events
            if not hasattr(e, "comm_seq")
        }
        recorded = {
            e.tag
            for t in (templates.forward, templates.backward)
            for e in t.op_events
            if e.kind == RECORD
        }
        ranges = [_seq_range(t) for t in (templates.forward, templates.backward)]

        def outside(seq: int) -> bool:
            return not any(lo <= seq <= hi for lo, hi in ranges)

        for e in self.comm.events:
            if hasattr(e, "comm_seq") and e.comm_seq in issued and outside(e.seq):
                raise ChunkReuseError("a collective of the template is waited on after it")
        for e in self.recorder.events_since(0):
            if e.kind == STREAM_WAIT and e.tag in recorded and outside(e.seq):
                raise ChunkReuseError("a stream event of the template is waited on after it")


def _inputs(loss_fn, tokens, labels) -> tuple:
    """The loss function and the batch's metadata: two forward steps alike in these (and in the
    program state the module docstring names) run the same."""
    return (loss_fn, *((tuple(t.shape), t.stride(), t.dtype, t.device) for t in (tokens, labels)))


def _seq_range(template: _Template) -> tuple[int, int]:
    seqs = [e.seq for e in (*template.op_events, *template.comm_events)]
    return (min(seqs), max(seqs)) if seqs else (0, -1)


def _check_pair(forward: _Template, backward: _Template, loss_uid: int) -> None:
    """The two templates leave only the loss behind, free only what they allocate, and wait
    only on what they issue."""
    ops = (*forward.op_events, *backward.op_events)
    allocated = {e.storage for e in ops if e.kind == ALLOC}
    freed = {e.storage for e in ops if e.kind == FREE}
    if freed - allocated:
        raise _Unsupported("it frees storages allocated before it")
    if allocated - freed != {loss_uid}:
        raise _Unsupported("it keeps storages other than its loss")
    comms = (*forward.comm_events, *backward.comm_events)
    issued = {e.seq for e in comms if not hasattr(e, "comm_seq")}
    if {e.comm_seq for e in comms if hasattr(e, "comm_seq")} - issued:
        raise _Unsupported("it waits on collectives issued before it")
    recorded = {e.tag for e in ops if e.kind == RECORD}
    if {e.tag for e in ops if e.kind == STREAM_WAIT} - recorded:
        raise _Unsupported("it waits on stream events recorded before it")


class _Unsupported(Exception):
    pass


@contextlib.contextmanager
def reused_micro_batches(
    recorder, comm, steps, skipped_forward: Callable, enabled: bool = True
) -> Iterator[MicroBatchReuse]:
    """Reuse gradient-accumulation micro-batches (module docstring) while the block runs.

    `steps`: the program's object with `forward(model, loss_fn, tokens, labels) -> loss` and
    `backward(loss, micro_batches)` attributes, replaced inside the block (None: none);
    `skipped_forward(root)`: what the root's forward does to the micro-batch marking."""
    reuse = MicroBatchReuse(recorder, comm, skipped_forward, enabled=enabled and steps is not None)
    if steps is None:
        yield reuse
        return
    forward, backward = steps.forward, steps.backward
    steps.forward = functools.partial(reuse.forward, forward)
    steps.backward = functools.partial(reuse.backward, backward)
    try:
        yield reuse
        reuse.check_nothing_waits_on_the_template()
    finally:
        steps.forward, steps.backward = forward, backward
