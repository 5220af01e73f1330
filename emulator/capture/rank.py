"""Capture: run one rank of a virtual world under FakeTensorMode and record its RankTrace.

The caller hands a program in three parts (the emulator never imports a workload):
- `setup()` runs outside fake mode once the virtual world exists: meshes and groups
  (DeviceMesh creation and flattening fail inside FakeTensorMode, NOTES.md);
- `build(context)` runs inside fake mode: the model, parallelised, and the optimizer; it
  returns the state. With `record_build`, its allocations and frees are recorded (rows
  before the first op, phase -1: what the process holds and caches before its first
  iteration); its compute is not;
- `declare(state)` runs inside fake mode, unrecorded: whatever makes the state that of a
  steady iteration (e.g. optimizer states); it returns the tensors to declare, by category;
- `step(state, phase)` runs one training iteration, recorded; `phase(name)` is the
  recorder's context manager, for the program to mark e.g. its "optimizer" part.

Everything `step` does is recorded: compute ops and allocations by the op recorder,
collectives, p2p and waits by the virtual backend, on one shared sequence. Tensors
alive before the step (parameters, optimizer state, ...) are declared first, so the
trace's live bytes start from the steady-state baseline.

These adaptations make torch's real program run under fake tensors; all are generic
torch-level patches active only during capture:
- the pipelining warm-up "vote" calls `.item()` on a received tensor, which fake mode
  refuses; with explicit stage input/output shapes the vote always decides STATIC
  inference, so capture sets that mode directly (what the vote would decide);
- a DeviceMesh made during build (FSDP2 concatenates its dp mesh with a TP parameter's
  mesh) finds this rank's coordinates in the rank map with `nonzero`, which fake mode
  refuses; the rank map is a real tensor, so meshes are built outside fake mode;
- ops a CUDA build runs fused where the CPU path decomposes (`torch.rms_norm`) are routed
  to the fused op pair (`emulator.capture.fused_ops`);
- DTensor learns an op's output shape by running it on fake tensors (once per sharding, in
  an lru_cache) in the active fake mode, i.e. ours; those runs are paused in the recorder,
  else the first micro-batch (and the first capture in a worker) would carry phantom kernels,
  and a recorded build a phantom full-size storage per sharded parameter shape;
- micro-batch markers: `PipelineStage.forward_one_chunk` / `backward_one_chunk` /
  `backward_weight_one_chunk` set the recorder's micro-batch, as do the steps of a pipeline
  executor of the program's own (`RankProgram.pipeline_steps`); without pipelining, each
  forward of a root module starts the next micro-batch. Optimizer steps (torch's global
  optimizer hooks) run in the "optimizer" phase.

A compiled program (`RankProgram.compiled_region`) has its recorded kernels fused as Inductor
fuses them, once the step is recorded (emulator.capture.compile_fusion), and keeps for backward
only the activations its backward reads (emulator.capture.compile_saved).

Repeated micro-batches are recorded once and copied: a pipeline stage's chunks
(emulator.capture.chunk_reuse) and, without pipelining, the program's gradient-accumulation
micro-batches (`RankProgram.micro_batch_steps`, emulator.capture.micro_batch_reuse).
"""

from __future__ import annotations

import contextlib
import functools
import gc
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from emulator import torch_compat
from emulator.capture import streams
from emulator.capture.chunk_reuse import PipelineSteps, reused_chunks, wrapped_attribute
from emulator.capture.compile_fusion import fuse_compiled_regions
from emulator.capture.compile_saved import free_unread_saved
from emulator.capture.fused_ops import gpu_fused_ops
from emulator.capture.micro_batch_reuse import reused_micro_batches
from emulator.capture.op_recorder import OpRecorder
from emulator.capture.trace import EventSequence, RankTrace
from emulator.world.comm_events import Recorder, recording
from emulator.world.virtual_world import destroy_virtual_world, init_virtual_world


@dataclass(frozen=True, kw_only=True)
class RankProgram:
    """The parts of the program one rank runs (see the module docstring)."""

    setup: Callable[[], Any]
    build: Callable[[Any], Any]
    declare: Callable[[Any], Mapping[str, Any]]
    step: Callable[[Any, Callable], None]
    roots: Callable[[Any], list[torch.nn.Module]]  # modules whose forward starts a micro-batch
    record_build: bool = False
    # the object whose `forward(model, loss_fn, tokens, labels) -> loss` and `backward(loss,
    # micro_batches)` run each gradient-accumulation micro-batch without pipelining, if the
    # program has one: capture replaces the two while the step runs (micro-batch reuse)
    micro_batch_steps: Callable[[Any], Any] = lambda state: None
    # the pipeline executor of the program's own, if it runs one (the workloads' Megatron
    # 1F1B; emulator.capture.chunk_reuse.PipelineSteps): capture replaces its two steps while
    # the step runs (micro-batch markers and chunk reuse)
    pipeline_steps: Callable[[Any], PipelineSteps | None] = lambda state: None
    # entered around the recorded step with the recorder: how the program's kernels are
    # recorded where eager torch runs others (emulator.capture.fp8_casts)
    recording_rules: Callable[[OpRecorder], contextlib.AbstractContextManager] = lambda recorder: (
        contextlib.nullcontext()
    )
    # the program runs compiled modules (torch.compile): module path -> the compiled module it
    # runs in, "" outside them; the recorded step's kernels are then fused as Inductor fuses
    # them (emulator.capture.compile_fusion). None: an eager program
    compiled_region: Callable[[str], str] | None = None
    # a backward collective reads a forward activation that no backward kernel reads (Megatron's
    # sequence-parallel regather); the capture cannot see collectives' reads, so a compiled
    # program then keeps its activations as recorded (emulator.capture.compile_saved)
    collectives_read_activations: bool = False


@contextlib.contextmanager
def static_pipeline_warmup() -> Iterator[None]:
    """Replace the pipelining warm-up vote by its outcome for static shapes (STATIC mode)."""
    vote = f"{_SCHEDULES}._PipelineSchedule._warmup_p2p"
    if not torch_compat.present(torch_compat.seam(vote)):
        yield  # an older torch: no vote to replace
        return
    static = torch_compat.resolve("torch.distributed.pipelining.stage.InferenceMode.STATIC")

    def decided(original):
        def warmup(self, stages, has_backward, p2p_done):
            for stage in stages:
                stage._inference_mode = static

        return warmup

    with torch_compat.patched(vote, decided):
        yield


@contextlib.contextmanager
def real_mesh_tensors() -> Iterator[None]:
    """Build DeviceMeshes and compute `DeviceMesh.mesh` outside fake mode (real rank maps)."""

    def unfaked(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with torch_compat.unset_fake_temporarily():
                return fn(*args, **kwargs)

        return wrapper

    mesh = "torch.distributed.device_mesh.DeviceMesh"
    with (
        torch_compat.patched(f"{mesh}.__init__", unfaked),
        torch_compat.patched(f"{mesh}.mesh", lambda prop: property(unfaked(prop.fget))),
    ):
        yield


@contextlib.contextmanager
def dtensor_shape_propagation_unrecorded(recorder: OpRecorder) -> Iterator[None]:
    """Run DTensor's fake shape propagation with the recorder paused (module docstring)."""

    def paused(original):
        @functools.wraps(original)
        def propagate(self, op_schema):
            with recorder.paused():
                return original(self, op_schema)

        return propagate

    with torch_compat.patched(_SHAPE_PROPAGATION, paused):
        yield


_SCHEDULES = torch_compat.PIPELINE_SCHEDULES
_STAGE = torch_compat.PIPELINE_STAGE
_SHAPE_PROPAGATION = (
    "torch.distributed.tensor._sharding_prop.ShardingPropagator._propagate_tensor_meta_non_cached"
)
_CHUNK_METHODS = ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk")


@contextlib.contextmanager
def micro_batch_markers(
    recorder: OpRecorder, roots: list[torch.nn.Module], own_steps=None
) -> Iterator[Callable[[torch.nn.Module, str], None]]:
    """Set the recorder's micro-batch from pipeline chunks, else from root forwards.

    `own_steps`: the program's own pipeline executor (`RankProgram.pipeline_steps`) or None;
    its forward and backward steps mark their micro-batch as torch's chunk methods do.

    Yields what a root's forward does to the marking, for a caller that skips the forward
    (micro-batch reuse): `skipped(root, module)`, the marker put in `module` (the name the
    root's forward would have been recorded in)."""
    in_pipeline = [False]

    def marked(method):
        # forward actions leave little cyclic garbage; a full backward drops the saved state
        # (young: a collection or two old); zero-bubble's split backward keeps temporaries in
        # a cycle until the weight step, by then in the oldest generation
        def generation(kwargs) -> int:
            if method.__name__ == "forward_one_chunk":
                return 0
            split = method.__name__ == "backward_weight_one_chunk" or not kwargs.get(
                "full_backward", True
            )
            return 2 if split else 1

        @functools.wraps(method)
        def wrapper(self, chunk_id, *args, **kwargs):
            in_pipeline[0] = True
            with recorder.micro_batch(chunk_id):
                result = method(self, chunk_id, *args, **kwargs)
                gc.collect(generation(kwargs))
                return result

        return wrapper

    def marked_step(generation: int):
        def wrap(step):
            def wrapper(chunk, micro_batch, *args):
                in_pipeline[0] = True
                with recorder.micro_batch(micro_batch):
                    result = step(chunk, micro_batch, *args)
                    gc.collect(generation)
                    return result

            return wrapper

        return wrap

    counts = {id(root): 0 for root in roots}

    def next_micro_batch(module, args, marker_module=None):
        if not in_pipeline[0]:
            gc.collect()
            recorder.set_micro_batch(counts[id(module)], marker_module)
            counts[id(module)] += 1

    # prepend: before FSDP2's own pre-forward hook, so the root's parameter all-gather
    # already belongs to the micro-batch whose forward it serves
    handles = [root.register_forward_pre_hook(next_micro_batch, prepend=True) for root in roots]
    try:
        with contextlib.ExitStack() as patches:
            for name in _CHUNK_METHODS:
                patches.enter_context(torch_compat.patched(f"{_STAGE}.{name}", marked))
            if own_steps is not None:
                for name, generation in (("forward_step", 0), ("backward_step", 1)):
                    patches.enter_context(
                        wrapped_attribute(own_steps, name, marked_step(generation))
                    )
            yield lambda root, module: next_micro_batch(root, (), module)
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def garbage_collected_at_micro_batches() -> Iterator[None]:
    """Collect reference cycles only where `micro_batch_markers` calls gc.collect().

    Some programs free tensors through reference cycles (torch's zero-bubble pipelining
    keeps backward temporaries in one until its weight step): left to Python's collector,
    whether and where those frees land in the trace varied from run to run. Collecting at
    fixed points (after each backward pipeline action, a young-generation pass after each
    forward one, before each root forward) makes the trace deterministic, and stands for a
    collector that runs at least that often, as it does in training. What exists before
    the iteration is frozen out of the collections, which keeps them cheap; `capture_rank`
    freezes what existed before the capture too (a test session's objects, a worker's earlier
    captures), so even the first full collection here scans only what the capture built.
    """
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    gc.freeze()  # what exists now outlives the capture: keep it out of every collection
    try:
        yield
    finally:
        gc.unfreeze()
        if was_enabled:
            gc.enable()


@contextlib.contextmanager
def optimizer_phase(recorder: OpRecorder) -> Iterator[None]:
    """Record every torch optimizer step in the "optimizer" phase."""
    pre = register_optimizer_step_pre_hook(lambda *_: recorder.push_phase("optimizer"))
    post = register_optimizer_step_post_hook(lambda *_: recorder.pop_phase())
    try:
        yield
    finally:
        pre.remove()
        post.remove()


def capture_rank(
    rank: int, world_size: int, program: RankProgram, *, reuse_chunks: bool = True
) -> RankTrace:
    """The RankTrace of one iteration of `program` as rank `rank` of `world_size`.

    `reuse_chunks`: record a pipeline stage's first forward and backward and reuse them for
    its other micro-batches (emulator.capture.chunk_reuse), and likewise a gradient-accumulation
    micro-batch (emulator.capture.micro_batch_reuse); raises ChunkReuseError when that turns
    out not to hold for this program (capture again with False)."""
    init_virtual_world(rank, world_size)
    gc.freeze()  # see garbage_collected_at_micro_batches: the caller's heap is not ours to scan
    try:
        context = program.setup()
        sequence = EventSequence()
        comm = Recorder(_counter=sequence)
        with (
            static_pipeline_warmup(),
            real_mesh_tensors(),
            recording(comm),
            gpu_fused_ops(),
            FakeTensorMode(allow_non_fake_inputs=True),
        ):
            recorder = OpRecorder(sequence=sequence)
            if program.record_build:
                with (
                    recorder,
                    recorder.recording_build(),
                    dtensor_shape_propagation_unrecorded(recorder),
                ):
                    state = program.build(context)
            else:
                state = program.build(context)
            declared = program.declare(state)
            own_steps = program.pipeline_steps(state)
            comm.events.clear()  # only the recorded iteration's communication counts
            for category, tensors in declared.items():
                recorder.tag(tensors, category)
            recorder.record_flows = program.compiled_region is not None
            with (
                recorder,
                dtensor_shape_propagation_unrecorded(recorder),
                streams.tracking(recorder.stream_tracker()),
                garbage_collected_at_micro_batches(),
                # before the markers: they wrap the program's own steps around its reuse, so a
                # chunk's template starts after its micro-batch's marker
                reused_chunks(recorder, comm, own_steps, enabled=reuse_chunks),
                micro_batch_markers(recorder, program.roots(state), own_steps) as skipped_forward,
                reused_micro_batches(
                    recorder,
                    comm,
                    program.micro_batch_steps(state),
                    skipped_forward,
                    enabled=reuse_chunks,
                ),
                optimizer_phase(recorder),
                program.recording_rules(recorder),
            ):
                program.step(state, recorder.phase)
            comm_events = comm.events
            if program.compiled_region is not None:
                gradients = [
                    uid
                    for uid, category in recorder.storages.final_categories().items()
                    if category == "gradient"
                ]
                recorder.events[:] = fuse_compiled_regions(
                    recorder.events,
                    (e.seq for e in comm.events),
                    program.compiled_region,
                    eager_storages=gradients,
                )
                if not program.collectives_read_activations:
                    recorder.events[:], comm_events = free_unread_saved(
                        recorder.events, comm.events, program.compiled_region
                    )
        return recorder.trace(comm_events, comm.groups)
    finally:
        gc.unfreeze()
        destroy_virtual_world()
