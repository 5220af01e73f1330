"""Chunk reuse: record a pipeline stage's forward and backward once, reuse them for the rest.

Every micro-batch of a pipeline stage runs the same forward and the same backward (same
layers, same shapes); capture time is linear in their number, and a rank runs 2 x 32 of
them in the Llama 3 405B job. While `reused_chunks` is active, a stage's first forward
and first backward run for real and their events are kept as templates: torch's
`forward_maybe_with_nosync` and `backward_maybe_with_nosync`, or the `forward_step` and
`backward_step` of a pipeline executor of the program's own (`RankProgram.pipeline_steps`,
the workloads' Megatron 1F1B), whose receive buffers, sends and loss stay outside the chunk
and run for real. Later ones, except the last micro-batch (whose backward completes the
gradient buckets and so differs), run a stub instead of the stage module, with the op
recorder paused, and the template's events are recorded in their place:
- the stub (`_StubChunk`) returns outputs of the template's shapes, dtypes and strides,
  connected by autograd to the stage's inputs and parameters; its backward returns zero
  gradients, so everything around the chunk runs for real: the schedule's sends and
  receives, the stage's caches, gradient accumulation hooks (paused: their kernels are
  in the template) and whatever state they keep;
- storages allocated by the template get fresh ids per micro-batch (a forward's saved
  activations are freed by the same micro-batch's backward); the storages a chunk hands
  out (the forward's outputs, the backward's input gradients) are adopted by the
  recorder under those ids, so their frees are recorded where the program drops them;
- collectives and waits inside a chunk (tensor and context parallelism) are copied, a
  wait pointing at its copied collective.
Only full-backward schedules are reused (1F1B, GPipe, interleaved 1F1B, looped BFS);
zero-bubble schedules split the backward and run unchanged. What a template may not
contain is checked; `ChunkReuseError` says what failed, and the caller captures again
without reuse. Tests compare a reused capture with a full one event for event.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch.distributed.pipelining import schedules as pipeline_schedules
from torch.distributed.tensor import DTensor

from emulator import torch_compat
from emulator.capture.injection import ReuseSink
from emulator.capture.trace import ALLOC, FREE, RECORD, STREAM_WAIT, OpEvent

_STAGE = torch_compat.PIPELINE_STAGE
_SCHEDULES = torch_compat.PIPELINE_SCHEDULES
_FULL_BACKWARD_SCHEDULES = (
    pipeline_schedules.Schedule1F1B,
    pipeline_schedules.ScheduleGPipe,
    pipeline_schedules.ScheduleInterleaved1F1B,
    pipeline_schedules.ScheduleLoopedBFS,
)


class ChunkReuseError(RuntimeError):
    """A chunk's template cannot stand for later micro-batches (the message says why)."""


@dataclass
class _Template:
    op_events: list[OpEvent]
    comm_events: list
    first_dispatch: int | None = None  # index of the first phase-setting op in op_events
    out_uids: list[int] = field(default_factory=list)  # storages the chunk hands out
    # backward: (uid, bytes) of storages allocated outside the chunk that it frees, in order
    # (the last stage's loss graph, built by the schedule around the stage)
    outside_frees: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class _StageTemplates:
    forward: _Template | None = None
    output_metas: tuple = ()  # (shape, stride, dtype, device) per output
    single_output: bool = True  # the stage returns a tensor, not a tuple
    backward: _Template | None = None
    # per micro-batch: template storage id -> this micro-batch's, template seq -> copy's
    uids: dict[int, dict[int, int]] = field(default_factory=dict)
    seqs: dict[int, dict[int, int]] = field(default_factory=dict)
    zero_grads: dict[int, torch.Tensor] = field(default_factory=dict)  # id(param) -> zeros
    anchor: torch.Tensor | None = None  # see _StubChunk


class _StubChunk(torch.autograd.Function):
    """Outputs of given metadata, differentiable w.r.t. the inputs; zero gradients.

    The stage's parameters are not inputs: the backward accumulates into them itself
    (`accumulate_zero`), with one zero gradient per parameter made once, where autograd
    would make, detach and hand over a new one per parameter and micro-batch (for DTensor
    parameters ~0.5 ms each, most of a stubbed backward's time). Returning None for them
    as inputs would not do: autograd runs their hooks with no gradient. `anchor` is an
    empty tensor that requires grad, so the backward runs where no other input does (the
    first stage's token ids)."""

    @staticmethod
    def forward(ctx, metas, params, zero_grads, anchor, *inputs):
        ctx.inputs, ctx.params, ctx.zero_grads = inputs, params, zero_grads
        return tuple(
            torch.empty_strided(shape, stride, dtype=dtype, device=device)
            for shape, stride, dtype, device in metas
        )

    @staticmethod
    def backward(ctx, *grads):
        for param in ctx.params:
            zero = ctx.zero_grads.get(id(param))
            if zero is None:
                zero = ctx.zero_grads[id(param)] = torch.zeros_like(param)
            accumulate_zero(param, zero)
        needs = ctx.needs_input_grad[4:]
        return (
            None,
            None,
            None,
            None,
            *(
                torch.zeros_like(t) if need else None
                for t, need in zip(ctx.inputs, needs, strict=True)
            ),
        )


def accumulate_zero(param: torch.Tensor, zero: torch.Tensor) -> None:
    """What autograd's AccumulateGrad does with a zero gradient: set `.grad` where there is
    none (adding zero to one there changes nothing), then run the post-accumulate hooks
    (torch keeps them in `_post_accumulate_grad_hooks`, in registration order)."""
    if param.grad is None:
        param.grad = zero
    for hook in torch_compat.post_accumulate_grad_hooks(param):
        hook(param)


def _meta(t: torch.Tensor):
    return (tuple(t.shape), t.stride(), t.dtype, t.device)


class ChunkReuse:
    """State of one capture's reuse (see the module docstring)."""

    def __init__(self, recorder, comm, enabled: bool = True):
        self.recorder, self.comm, self.enabled = ReuseSink(recorder), comm, enabled
        self.stages: dict[int, _StageTemplates] = {}
        self.reused = 0  # chunks stubbed

    def disable(self, reason: str) -> None:
        """Run every chunk from now on; too late (ChunkReuseError) once one was stubbed."""
        if self.reused:
            raise ChunkReuseError(reason)
        self.enabled = False

    # ---- the two patched stage methods -----------------------------------------------------

    def forward(self, key, params, inputs, last: bool, run):
        """A stage's forward of the current micro-batch: `run()` for real (the stage's first
        becomes its template; `last`, the stage's last micro-batch, always runs) or a stub
        standing in for it. `key` names the stage, `params` are its parameters and `inputs`
        the forward's arguments (those that require grad connect the stub's outputs)."""
        templates = self.stages.setdefault(key, _StageTemplates())
        micro_batch = self.recorder.current_micro_batch
        if not self.enabled or templates.forward is None or last:
            start_op, start_comm = self.recorder.event_count, len(self.comm.events)
            self.recorder.watch_first_dispatch()  # read only when this becomes the template
            output = run()
            if self.enabled and templates.forward is None:
                self._keep_forward(templates, output, start_op, start_comm)
            return output
        outputs = self._stub(templates, params, inputs)
        self._inject(templates, templates.forward, micro_batch)
        self._adopt(outputs, templates.forward.out_uids, templates.uids[micro_batch])
        self.reused += 1
        return outputs[0] if templates.single_output else outputs

    def backward(self, key, last: bool, run, input_grads):
        """A stage's backward of the current micro-batch: `run()` for real (the stage's first
        becomes its template; `last` always runs: it completes the gradient buckets), or, for a
        micro-batch whose forward a stub stood in for, `run()` through the stub, paused, and the
        template recorded in its place. `input_grads(result)`: the gradients it hands out."""
        templates = self.stages.get(key)
        micro_batch = self.recorder.current_micro_batch
        reusable = self.enabled and templates is not None and templates.backward is not None
        if not reusable or last or micro_batch not in templates.uids:
            start_op, start_comm = self.recorder.event_count, len(self.comm.events)
            self.recorder.watch_first_dispatch()  # read only when this becomes the template
            result = run()
            if self.enabled and templates and templates.forward and templates.backward is None:
                self._keep_backward(templates, input_grads(result), start_op, start_comm)
            return result
        with (
            paused_and_silent(self.recorder, self.comm, "a stubbed backward"),
            self.recorder.holding_frees() as frees,
        ):
            result = run()
        self._match_outside_frees(templates, frees, micro_batch)
        self._inject(templates, templates.backward, micro_batch)
        self._adopt(input_grads(result), templates.backward.out_uids, templates.uids[micro_batch])
        self.reused += 1
        return result

    # ---- templates -------------------------------------------------------------------------------

    def _segment(self, start_op: int, start_comm: int) -> _Template:
        ops = self.recorder.events_since(start_op)
        comms = self.comm.events[start_comm:]
        first = self.recorder.first_dispatch()
        if any(e.kind in (RECORD, STREAM_WAIT) for e in ops):
            raise _Unsupported("it records stream events (e.g. FSDP2's), which are not copied")
        return _Template(
            op_events=list(ops),
            comm_events=list(comms),
            first_dispatch=None if first is None else first - start_op,
        )

    def _keep_forward(self, templates, output, start_op, start_comm) -> None:
        outputs = output if isinstance(output, tuple) else (output,)
        try:
            if not all(type(t) is not DTensor and isinstance(t, torch.Tensor) for t in outputs):
                raise _Unsupported("the stage returns something other than plain tensors")
            template = self._segment(start_op, start_comm)
            template.out_uids = self._handed_out(template, outputs, "forward outputs")
        except _Unsupported as why:
            self.disable(f"forward: {why}")
            return
        templates.forward = template
        templates.output_metas = tuple(_meta(t) for t in outputs)
        templates.single_output = not isinstance(output, tuple)

    def _keep_backward(self, templates, input_grads, start_op, start_comm) -> None:
        grads = [g for g in input_grads if isinstance(g, torch.Tensor)]
        try:
            if any(type(g) is DTensor for g in grads):
                raise _Unsupported("input gradients are DTensors")
            template = self._segment(start_op, start_comm)
            template.out_uids = self._handed_out(template, grads, "input gradients")
            self._check_pair(templates.forward, template)
        except _Unsupported as why:
            self.disable(f"backward: {why}")
            return
        inside = {
            e.storage
            for e in (*templates.forward.op_events, *template.op_events)
            if e.kind == ALLOC
        }
        template.outside_frees = [
            (e.storage, e.size_bytes)
            for e in template.op_events
            if e.kind == FREE and e.storage not in inside
        ]
        templates.backward = template

    def _handed_out(self, template: _Template, tensors, what: str) -> list[int]:
        allocated = {e.storage for e in template.op_events if e.kind == ALLOC}
        freed = {e.storage for e in template.op_events if e.kind == FREE}
        uids = [self.recorder.storage_uid(t) for t in tensors]
        if any(u is None or u not in allocated or u in freed for u in uids):
            raise _Unsupported(f"its {what} are not storages it allocates and keeps")
        return uids

    @staticmethod
    def _check_pair(forward: _Template, backward: _Template) -> None:
        """Everything the forward keeps is freed by the backward or handed out, the backward
        keeps only what it hands out, and waits only on what the two issue."""
        f_alloc = {e.storage for e in forward.op_events if e.kind == ALLOC}
        f_freed = {e.storage for e in forward.op_events if e.kind == FREE}
        b_alloc = {e.storage for e in backward.op_events if e.kind == ALLOC}
        b_freed = {e.storage for e in backward.op_events if e.kind == FREE}
        kept = f_alloc - f_freed - set(forward.out_uids)
        if kept - b_freed:
            raise _Unsupported("the forward keeps storages its backward does not free")
        if set(forward.out_uids) & b_freed:
            raise _Unsupported("the backward frees the forward's outputs")
        if b_alloc - b_freed - set(backward.out_uids):
            raise _Unsupported("the backward keeps storages it does not hand out")
        issued = {
            e.seq
            for e in (*forward.comm_events, *backward.comm_events)
            if not hasattr(e, "comm_seq")
        }
        waited = {
            e.comm_seq
            for e in (*forward.comm_events, *backward.comm_events)
            if hasattr(e, "comm_seq")
        }
        if waited - issued:
            raise _Unsupported("it waits on collectives issued outside the chunk")

    # ---- reuse -----------------------------------------------------------------------------------

    def _stub(self, templates, params, args) -> tuple[torch.Tensor, ...]:
        inputs = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
        params = tuple(p for p in params if p.requires_grad)
        with paused_and_silent(self.recorder, self.comm, "a stubbed forward"):
            if templates.anchor is None:
                templates.anchor = torch.empty(0, requires_grad=True)
            return _StubChunk.apply(
                templates.output_metas, params, templates.zero_grads, templates.anchor, *inputs
            )

    @staticmethod
    def _match_outside_frees(templates, frees, micro_batch: int) -> None:
        """The storages the stubbed backward freed are, in order, this micro-batch's copies
        of those the template freed from outside the chunk (same program, same order)."""
        expected = templates.backward.outside_frees
        if [size for _, size in frees] != [size for _, size in expected]:
            raise ChunkReuseError(
                f"a stubbed backward freed {len(frees)} storages from outside the chunk, "
                f"its template {len(expected)} (or of other sizes)"
            )
        uids = templates.uids.setdefault(micro_batch, {})
        for (uid, _), (template_uid, _) in zip(frees, expected, strict=True):
            uids[template_uid] = uid

    def _inject(self, templates, template: _Template, micro_batch: int) -> None:
        uids = templates.uids.setdefault(micro_batch, {})
        seqs = templates.seqs.setdefault(micro_batch, {})
        self.recorder.inject(
            template.op_events,
            template.comm_events,
            self.comm.events,
            micro_batch,
            uids,
            seqs,
            template.first_dispatch,
        )

    def _adopt(self, tensors, template_uids, uids) -> None:
        tensors = [t for t in tensors if isinstance(t, torch.Tensor)]
        for tensor, uid in zip(tensors, template_uids, strict=True):
            self.recorder.adopt(tensor, uids[uid])


@contextlib.contextmanager
def paused_and_silent(recorder, comm, what: str) -> Iterator[None]:
    """Run a stand-in with the recorder paused; it must record nothing (no op, no collective)."""
    n_op, n_comm = recorder.event_count, len(comm.events)
    with recorder.paused():
        yield
    if recorder.event_count != n_op or len(comm.events) != n_comm:
        raise ChunkReuseError(f"{what} recorded events of its own")


class _Unsupported(Exception):
    pass


@contextlib.contextmanager
def reused_chunks(recorder, comm, own_steps=None, enabled: bool = True) -> Iterator[ChunkReuse]:
    """Reuse pipeline chunks (module docstring) while the block runs: torch's pipeline stages',
    and those of `own_steps`, the program's own pipeline executor if it runs one (see
    `RankProgram.pipeline_steps`; its two steps are replaced inside the block)."""
    reuse = ChunkReuse(recorder, comm, enabled)

    def checked_step(original):
        @functools.wraps(original)
        def step(self, *args, **kwargs):
            if reuse.enabled and not isinstance(self, _FULL_BACKWARD_SCHEDULES):
                reuse.disable(f"{type(self).__name__} is not a full-backward schedule")
            return original(self, *args, **kwargs)

        return step

    def forwarding(forward):
        @functools.wraps(forward)
        def stage_forward(stage, *args, **kwargs):
            micro_batch = reuse.recorder.current_micro_batch
            last = stage.chunks is not None and micro_batch == stage.chunks - 1
            run = functools.partial(forward, stage, *args, **kwargs)
            return reuse.forward(id(stage), stage.submod.parameters(), args, last, run)

        return stage_forward

    def backwarding(backward):
        @functools.wraps(backward)
        def stage_backward(stage, backward_type, bwd_kwargs, last_backward=False):
            if backward_type != "full" and reuse.enabled:
                reuse.disable(f"the schedule runs a split ({backward_type!r}) backward")
            run = functools.partial(
                backward, stage, backward_type, bwd_kwargs, last_backward=last_backward
            )
            return reuse.backward(id(stage), last_backward, run, lambda result: result[0])

        return stage_backward

    with (
        torch_compat.patched(f"{_STAGE}.forward_maybe_with_nosync", forwarding),
        torch_compat.patched(f"{_STAGE}.backward_maybe_with_nosync", backwarding),
        torch_compat.patched(f"{_SCHEDULES}.PipelineScheduleSingle.step", checked_step),
        torch_compat.patched(f"{_SCHEDULES}.PipelineScheduleMulti.step", checked_step),
        _reused_own_steps(reuse, own_steps),
    ):
        yield reuse


class PipelineSteps(Protocol):
    """A pipeline executor of the program's own (the workloads' Megatron 1F1B), as chunk reuse
    sees it: the rank's model chunks, the micro-batches per iteration, and the two steps it
    calls through itself, which capture replaces while the step runs."""

    modules: Sequence[Any]
    num_microbatches: int

    def forward_step(self, chunk: int, micro_batch: int, inputs: Any) -> Any: ...

    def backward_step(
        self, chunk: int, micro_batch: int, output: Any, output_grad: Any, inputs: Any
    ) -> Any: ...


@contextlib.contextmanager
def _reused_own_steps(reuse: ChunkReuse, steps: PipelineSteps | None) -> Iterator[None]:
    """Chunk reuse for the steps of a pipeline executor of the program's own: a model chunk's
    forward and backward of one micro-batch (`RankProgram.pipeline_steps`); each chunk (a
    virtual stage) has templates of its own."""
    if steps is None:
        yield
        return

    def forwarding(forward):
        def forward_step(chunk, micro_batch, inputs):
            last = micro_batch == steps.num_microbatches - 1
            module = steps.modules[chunk]
            run = functools.partial(forward, chunk, micro_batch, inputs)
            return reuse.forward(id(module), module.parameters(), (inputs,), last, run)

        return forward_step

    def backwarding(backward):
        def backward_step(chunk, micro_batch, output, output_grad, inputs):
            last = micro_batch == steps.num_microbatches - 1
            run = functools.partial(backward, chunk, micro_batch, output, output_grad, inputs)
            key = id(steps.modules[chunk])
            return reuse.backward(key, last, run, lambda input_grad: (input_grad,))

        return backward_step

    with (
        wrapped_attribute(steps, "forward_step", forwarding),
        wrapped_attribute(steps, "backward_step", backwarding),
    ):
        yield


@contextlib.contextmanager
def wrapped_attribute(obj, name: str, wrap) -> Iterator[None]:
    """`obj.name` replaced by `wrap(obj.name)` inside the block (an instance attribute)."""
    original, own = getattr(obj, name), name in vars(obj)
    setattr(obj, name, wrap(original))
    try:
        yield
    finally:
        if own:
            setattr(obj, name, original)
        else:
            delattr(obj, name)  # the class's method again
