"""OpRecorder: a TorchDispatchMode that records what one rank computes and allocates.

Enter it inside a FakeTensorMode (or with real CPU tensors). For every aten op it records,
in program order and with seq numbers from a shared `trace.EventSequence`:
- a compute event (normalized name, tensor shapes and dtypes, FLOPs, bytes read and written,
  stream, module path, phase, micro-batch) unless the op launches no kernel (views, metadata,
  pure allocations, collectives: see `opmap`);
- an alloc event for every storage it has not seen (size, stream, category), and a free
  event the moment a storage dies (a weakref callback on the untyped storage, so a `del`
  is recorded before the next op runs).

Phase, micro-batch and stream of each op: emulator.capture.phase_state (the caller forces
"optimizer" with `recorder.phase(...)`).
Categories: declared with `tag()`; `.grad` of tagged parameters becomes "gradient" as it is
accumulated; otherwise inferred: "communication" for collective outputs and off-stream-0
allocations, "optimizer_state" in the optimizer phase, "temporary" in backward,
"activation" in forward/recompute; an inferred activation or optimizer state freed before
the phase changes is reclassified "temporary".
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass_type

from emulator import torch_compat
from emulator.capture import opmap
from emulator.capture.declared import Declarations
from emulator.capture.phase_state import PhaseState
from emulator.capture.storages import INFERRED_PHASE_CATEGORY, OPTIMIZER, StorageLedger
from emulator.capture.streams import RECORD, StreamTracker, current_stream_id
from emulator.capture.trace import (
    COMPUTE,
    MARKER,
    PHASES,
    EventLog,
    EventSequence,
    OpEvent,
    build_trace,
)
from emulator.capture.trace import (
    RECORD as RECORD_ROW,
)
from emulator.capture.trace import (
    STREAM_WAIT as STREAM_WAIT_ROW,
)
from emulator.world import fake_collectives
from emulator.world.comm_events import in_backend_fills, wait_for_reads

_WAIT_TENSOR = torch.ops._c10d_functional.wait_tensor.default
_PRIM_DEVICE = torch.ops.prim.device.default
_META = torch.device("meta")
_ADD_ = torch.ops.aten.add_.Tensor


def _contiguous_copy(t: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten.clone.default(t, memory_format=torch.contiguous_format)


def _clone_then_in_place(func, target, other, *args, **kwargs):
    """An opmap.CLONES_SELF op as ATen runs it: a contiguous clone of `target` broadcast
    against its second argument (masked_fill's mask), then `func`'s in-place overload on it."""
    result = _contiguous_copy(target.expand(torch.broadcast_shapes(target.shape, other.shape)))
    in_place = getattr(getattr(torch.ops.aten, f"{func._opname}_"), func._overloadname)
    return in_place(result, other, *args, **kwargs)


_OP_INFOS: dict = {}  # OpOverload -> opmap.OpInfo, shared by all recorders (pure function)
_WRAPPER_SUBCLASS: dict[type, bool] = {}  # tensor type -> is a traceable wrapper subclass


def _has_wrapper_subclass(types) -> bool:
    for cls in types:
        wraps = _WRAPPER_SUBCLASS.get(cls)
        if wraps is None:
            wraps = _WRAPPER_SUBCLASS[cls] = is_traceable_wrapper_subclass_type(cls)
        if wraps:
            return True
    return False


def _tensors(values) -> list[torch.Tensor]:
    found = []
    for v in values:
        if isinstance(v, torch.Tensor):
            found.append(v)
        elif isinstance(v, (list, tuple)):
            found.extend(x for x in v if isinstance(x, torch.Tensor))
    return found


class OpRecorder(TorchDispatchMode):
    """Records compute ops, allocations, frees and markers (see module docstring)."""

    def __init__(self, sequence=None):
        super().__init__()
        self.sequence = sequence if sequence is not None else EventSequence()
        self.events = EventLog()
        self.storages = StorageLedger(self)
        self._dtype_names: dict[torch.dtype, str] = {}
        self.state = PhaseState()
        self.declarations = Declarations(self.storages, lambda: self.state.is_paused)
        self._mod_tracker = torch_compat.LeafSafeModTracker()
        self._fake_mode = None
        self._resize_patch = None
        self.streams: StreamTracker | None = None  # the tracker `stream_tracker` made
        # give every compute row the storage ids of its tensors (OpEvent.flows): off by
        # default, the hot path pays for it only where a capture rule needs it
        self.record_flows = False
        # storage id -> the id a row reading it reports instead: a copy a capture rule dropped
        # from the trace stands for its source (emulator.capture.fp8_casts' layout copies)
        self.read_as: dict[int, int] = {}

    # ---- caller-facing context ------------------------------------------------------------

    def on_stream(self, stream: int):
        """Ops and allocations inside the block belong to stream `stream` (0 = compute),
        whatever stream the program is on (emulator.capture.streams tracks that otherwise)."""
        return self.state.on_stream(stream)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Force the phase (e.g. "optimizer") for everything inside the block."""
        self.push_phase(name)
        try:
            yield
        finally:
            self.pop_phase()

    def push_phase(self, name: str) -> None:
        """Force the phase until the matching `pop_phase` (for hooks that cannot use `with`)."""
        if self.state.push_phase(name) == OPTIMIZER:
            self.declarations.tag_gradients()

    def pop_phase(self) -> None:
        self.state.pop_phase()

    @contextlib.contextmanager
    def micro_batch(self, index: int) -> Iterator[None]:
        previous = self.state.micro_batch
        self.set_micro_batch(index)
        try:
            yield
        finally:
            self.state.micro_batch = previous

    @contextlib.contextmanager
    def recording_build(self) -> Iterator[None]:
        """Inside the block (with the recorder entered) only storages are recorded, as rows
        before the iteration: building the model and optimizer is not the iteration's work,
        but what it leaves cached is the allocator's state when the first iteration starts."""
        self.state.building = True
        try:
            yield
        finally:
            self.state.building = False

    def paused(self):
        """Ops inside the block run unrecorded (work the program does not do on a GPU, such as
        DTensor running an op on fake tensors to learn its output's shape)."""
        return self.state.paused()

    def set_micro_batch(self, index: int, module: str | None = None) -> None:
        """Ops from now on belong to micro-batch `index` (marked in the trace, as if in module
        `module` if given, else in the current one)."""
        self.state.micro_batch = index
        self._emit(MARKER, f"micro_batch:{index}", module=module)

    @property
    def current_micro_batch(self) -> int:
        return self.state.micro_batch

    @property
    def categories(self) -> dict[int, str]:
        """Storage uid -> its current memory category."""
        return self.storages.categories

    # what the storage ledger asks of its owner (emulator.capture.storages)
    @property
    def is_paused(self) -> bool:
        return self.state.is_paused

    @property
    def epoch(self) -> int:
        """Advances at every phase change: a storage that dies in the epoch it was born in and
        was never declared is a temporary."""
        return self.state.epoch

    @property
    def last_phase(self) -> int:
        return self.state.last_phase

    def current_stream(self) -> int:
        return self.state.stream or current_stream_id()

    def emit_storage_event(self, kind: int, size: int, uid: int, category: str) -> None:
        self._emit(kind, "", size_bytes=size, storage=uid, category=category)

    def transition(self, phase: int, stream: int, module: str, micro_batch: int) -> None:
        """Enter `phase` and record its marker as if an op of (stream, module) set it."""
        self.state.enter(phase)
        self._emit(
            MARKER,
            f"phase:{PHASES[phase]}",
            phase=phase,
            stream=stream,
            module=module,
            micro_batch=micro_batch,
        )

    def stream_tracker(self) -> StreamTracker:
        """A tracker (emulator.capture.streams) whose records and waits become trace rows."""

        def emit(kind: str, stream: int, event_id: int) -> None:
            self._emit(
                RECORD_ROW if kind == RECORD else STREAM_WAIT_ROW, kind, stream=stream, tag=event_id
            )

        self.streams = StreamTracker(emit)
        return self.streams

    def mark(self, name: str) -> None:
        self._emit(MARKER, name)

    def tag(self, obj, category: str) -> None:
        """Declare the memory category of tensors (emulator.capture.declared)."""
        self.declarations.tag(obj, category)

    def trace(self, comm_events=(), groups=None):
        """The RankTrace of everything recorded so far, merged with the backend's events."""
        return build_trace(self.events, comm_events, groups, self.storages.final_categories())

    # ---- mode plumbing ---------------------------------------------------------------------

    def __enter__(self):
        self._fake_mode = torch_compat.active_fake_mode()
        self._mod_tracker.register_user_hooks(pre_fw_hook=self._pre_fw, post_fw_hook=self._post_fw)
        self._mod_tracker.__enter__()
        self.declarations.watch_gradients()
        recorder = self

        def seeing_resizes(original):
            def resize_(storage, size):
                result = original(storage, size)
                if not recorder.state.pause_depth:
                    recorder.storages.see(storage, None)
                return result

            return resize_

        self._resize_patch = torch_compat.patched("torch.UntypedStorage.resize_", seeing_resizes)
        self._resize_patch.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        self._resize_patch.__exit__(None, None, None)
        self._resize_patch = None
        self.declarations.unwatch_gradients()
        self._mod_tracker.__exit__(*exc)
        self._mod_tracker.clear_user_hooks()
        return super().__exit__(*exc)

    def _pre_fw(self, module, args) -> None:
        self.state.forward_depth += 1

    def _post_fw(self, module, args, output) -> None:
        self.state.forward_depth -= 1

    # ---- the hot path ----------------------------------------------------------------------

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is _PRIM_DEVICE and type(args[0]) is FakeTensor:
            # half of all dispatches (C++ code asking a fake tensor for its device): answered
            # here exactly as FakeTensor.__torch_dispatch__ does, saving ~45 us of mode stack
            tensor = args[0]
            return _META if tensor.fake_mode.in_kernel_invocation else tensor.fake_device
        kwargs = kwargs or {}
        if self.state.pause_depth or in_backend_fills():
            if func is _ADD_ and not kwargs and _same_fake_floats(*args):
                return args[0]  # the fake kernel's answer, minus its cache hashing (grad hooks)
            return func(*args, **kwargs)
        if _has_wrapper_subclass(types):
            # let DTensor (torchao's Float8TrainingTensor, ...) unwrap: its ops on the tensors
            # it wraps come back here, and those are the kernels (fp8 `aten.mm` -> `_scaled_mm`)
            return NotImplemented
        info = _OP_INFOS.get(func)
        if info is None:
            info = _OP_INFOS[func] = opmap.op_info(func)
        if info.decomposes:
            with torch_compat.mode_reentered(self):
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out  # its parts were recorded as they came back
        if info.clones_self:
            with torch_compat.mode_reentered(self):  # the clone and the fill come back here
                return _clone_then_in_place(func, *args, **kwargs)
        if info.contiguous_input >= 0 and not args[info.contiguous_input].is_contiguous():
            args = list(args)
            with torch_compat.mode_reentered(self):  # the copy is recorded as it comes back
                args[info.contiguous_input] = _contiguous_copy(args[info.contiguous_input])
        if func is _WAIT_TENSOR and self._fake_mode is not None:
            # answered here (the fake impl never sees it), and this recorder sees the reads
            fake_collectives.take_wait(args[0], at_first_read=True)
            out = args[0]  # the fake kernel returns a fresh tensor; on a GPU it is in place
        else:
            out = func(*args, **kwargs)
        if info.ignored or torch_compat.active_fake_mode() is not self._fake_mode:
            return out  # ops of another fake mode nested in ours are not this rank's work
        if isinstance(out, torch.Tensor):
            outs = [out]
        else:
            outs = _tensors(out) if isinstance(out, (list, tuple)) else []
        if self.state.building:
            for t in outs:
                self.storages.see(t.untyped_storage(), "other")
            return out
        phase = self._current_phase()
        if info.is_comm or self.current_stream():
            category = "communication"
        else:
            category = INFERRED_PHASE_CATEGORY[phase]
        for t in outs:  # views too: lift_fresh of a constant is a view with a fresh fake storage
            self.storages.see(t.untyped_storage(), category)
        if info.name:
            self._record_compute(func, info, args, kwargs, out, outs, phase)
        return out

    def _record_compute(self, func, info, args, kwargs, out, outs, phase) -> None:
        ins = _tensors(args) + (_tensors(kwargs.values()) if kwargs else [])
        wait_for_reads(ins)  # a collective's output is waited at its first read
        if info.mutated_args:
            written = _tensors(
                args[i] if i < len(args) else kwargs.get(name) for i, name in info.mutated_args
            )
        else:
            written = outs
        names = self._dtype_names
        shapes = []
        for ts, is_out in ((ins, False), (outs, True)):
            for t in ts:
                dtype = names.get(t.dtype)
                if dtype is None:
                    dtype = names[t.dtype] = str(t.dtype).removeprefix("torch.")
                shapes.append((tuple(t.shape), dtype, is_out))
        if info.zero_filled_output >= 0:
            k = info.zero_filled_output
            self._record_zero_fill(outs[k], shapes[len(ins) + k], phase)
        causal = info.causal_arg == opmap.ALWAYS_CAUSAL
        if info.causal_arg >= 0:
            pos = info.causal_arg
            causal = bool(args[pos] if len(args) > pos else kwargs.get("is_causal", False))
        self.events.append(
            OpEvent(
                self.sequence.next_seq(),
                COMPUTE,
                info.name,
                info.aten,
                self.current_stream(),
                self._module(),
                phase,
                self.state.micro_batch,
                flops=int(info.flop_fn(args, kwargs, out)) if info.flop_fn else 0,
                read_bytes=sum(t.nbytes for t in ins) if info.reads_inputs else 0,
                write_bytes=sum(t.nbytes for t in written),
                tensors=tuple(shapes),
                workspace_bytes=info.workspace_fn(args, kwargs) if info.workspace_fn else 0,
                causal=causal,
                flows=self._flows(ins, outs) if self.record_flows else (),
            )
        )

    def _record_zero_fill(self, out: torch.Tensor, described: tuple, phase) -> None:
        """The fill a CUDA kernel runs on its output `out` before writing it
        (opmap.ZERO_FILLED_OUTPUT); `described`: its (shape, dtype name, True) entry."""
        self.events.append(
            OpEvent(
                self.sequence.next_seq(),
                COMPUTE,
                opmap.normalized_name(opmap.ZERO_FILL),
                opmap.ZERO_FILL,
                self.current_stream(),
                self._module(),
                phase,
                self.state.micro_batch,
                write_bytes=out.nbytes,
                tensors=(described,),
                flows=self._flows((), (out,)) if self.record_flows else (),
            )
        )

    def _flows(self, ins, outs) -> tuple[int, ...]:
        """Storage id of each input, then each output (as `tensors` lists them); -1 unknown."""
        live = self.storages.live
        flows = []
        for t in ins:
            known = live.get(id(t.untyped_storage()))
            flows.append(-1 if known is None else self.read_as.get(known.uid, known.uid))
        for t in outs:
            known = live.get(id(t.untyped_storage()))
            flows.append(-1 if known is None else known.uid)
        return tuple(flows)

    def _current_phase(self) -> int:
        phase, changed = self.state.resolve(torch_compat.in_backward(), len(self.events))
        if changed:
            self._emit(MARKER, f"phase:{PHASES[phase]}", phase=phase)
        return phase

    def _module(self) -> str:
        # the deepest active module; ModTracker's parents is a set, and in backward sibling
        # modules can be active together (wk and wv share an input), so ties are broken by
        # name: set order follows string hashes, which change with every process
        return max(self._mod_tracker.parents, key=lambda name: (len(name), name))

    def _emit(
        self,
        kind: int,
        name: str,
        *,
        phase=None,
        stream=None,
        module=None,
        micro_batch=None,
        **fields,
    ) -> None:
        """A non-compute row; where it happened defaults to the current state."""
        self.events.append(
            OpEvent(
                self.sequence.next_seq(),
                kind,
                name,
                "",
                self.current_stream() if stream is None else stream,
                self._module() if module is None else module,
                self.state.last_phase if phase is None else phase,
                self.state.micro_batch if micro_batch is None else micro_batch,
                **fields,
            )
        )


def _same_fake_floats(a, b) -> bool:
    """Two fake floating-point tensors of one shape on one device: `a.add_(b)` checks nothing."""
    return (
        type(a) is FakeTensor
        and type(b) is FakeTensor
        and a.shape == b.shape
        and a.fake_device == b.fake_device
        and a.dtype.is_floating_point
        and b.dtype.is_floating_point
    )
