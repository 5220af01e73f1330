"""fp8 casts as production runs them: each fp8 GEMM operand's amax/scale/cast work recorded as
the kernels torch.compile or Transformer Engine run, instead of torchao's eager op chain.

Eager torchao (`hp_tensor_to_float8_dynamic`) casts an operand with ~10 separate kernels
(abs, max, scale arithmetic, an fp32 upcast, multiply, clamp, the fp8 copy), each reading
and writing the whole tensor, some in float32. Production fp8 does not run that chain.

Rule `fp8_casts = "fused"` (torch.compile: torchtitan's float8 needs `--training.compile` "to
fuse the float8 scaling/casting kernels", torchtitan docs/float8.md; Inductor turns each cast
into a reduction kernel and one pointwise kernel), per operand cast, i.e. per call of
`hp_tensor_to_float8_dynamic`:
1. an amax reduction (`aten.amax`): reads the high-precision tensor, writes its scale(s);
   none when the eager chain ran no reduction: under op-level SAC a recomputed cast takes
   `max` from the checkpoint's store (torchtitan's policy saves it), as the compiled
   backward takes the forward's saved amax;
2. a cast kernel (`aten._to_copy`): reads the high-precision tensor and the scale(s), writes
   the fp8 tensor in the layout its GEMM reads. The scale arithmetic on the scalar (per-row)
   amax folds into it, and so do the transposing copies eager torchao makes of the fp8 data
   for `_scaled_mm` (a row-major A, a column-major B: `preprocess_addmm`; on an H100 794 us
   for a [14 336, 8 192] fp8 operand of Llama 3 8B) and of a transposed weight before its
   amax (ATen's `max()` reduces a contiguous copy: emulator.capture.opmap.CONTIGUOUS_INPUT).
   Both rules drop those copies' kernels (Transformer Engine's cast-transpose writes both
   layouts); their storages stay as recorded, and a cast whose GEMM reads it through such a
   copy records its output transposed, the layout it writes.
The eager chain's compute rows are replaced by these two (the first keeps the chain's first
sequence number, the second its last, so a TP amax all-reduce in between stays in between:
dynamic scaling needs this step's amax before it can cast); its allocations stay as recorded,
so transient float32 copies are still counted in peak memory (an overestimate of at most one
fp32 copy of one operand); under torch.compile (`compiled`) the storages the eager chain
allocated and freed are dropped too, since Inductor never materialises them. Left out, making
it conservative: Inductor may share one amax between an operand's two casts (torchao casts
input, weight and output gradient twice each per linear, once per GEMM that reads them).

Rule `fp8_casts = "transformer-engine"` (Megatron, NeMo and llm-foundry run Transformer Engine
with its default recipe, `DelayedScaling`: transformer_engine/common/recipe/__init__.py), per
operand:
1. one cast kernel that also records the operand's amax (TE's `cast_transpose` /
   `quantize` kernels update the amax history as they cast, with the scale taken from the
   history of earlier steps): reads the high-precision tensor once, writes the fp8 tensor;
2. no kernel for the operand's second cast: TE's cast-transpose writes both layouts the two
   GEMMs read from one read (torchao casts the same tensor again, transposed, for the second
   GEMM): the first kernel writes the second layout's bytes too, once; further casts of the
   same operand add nothing (torchao casts attention's input for each of wq, wk and wv, where
   Megatron's and TE's fused QKV linear casts it once; a weight's casts in later micro-batches
   read TE's cache, below);
3. no collective per cast: delayed scaling reduces the amax history once per fp8_autocast
   region (`FP8GlobalStateManager.reduce_and_update_fp8_tensors`: one coalesced all-reduce of
   a few bytes per micro-batch, not recorded), so the amax all-reduces torchao issues for a
   sharded operand under tensor parallelism are dropped with their waits;
4. no scale reciprocals before the GEMM (torchao's `addmm_float8_unwrapped` inverts both
   scales, two scalar kernels per GEMM; TE's cast writes `scale_inv` with the fp8 data).
The eager chain's transient storages are dropped as under `compiled` (TE's kernels keep them in
registers); the fp8 copies torchao allocates stay as recorded. A weight is cast once for the
micro-batches that follow while its storage lives (TE caches the fp8 weight and its transpose
when Megatron passes `is_first_microbatch`; under FSDP every gather is a new storage, cast
again).
5. under sequence parallelism, where the program all-gathers an operand in high precision and
   casts the gathered tensor (`sp_collectives = "first-dim"`, Megatron's path): TE writes a
   LayerNormLinear's input in fp8 on the sequence shard, all-gathers the fp8 bytes, keeps the
   fp8 shard and gathers it again in backward, where it transposes it for the weight
   gradient; a row-parallel linear's output gradient is cast on its shard, gathered in fp8 and
   transposed (TE v1.9 and v2.18, `module/layernorm_linear.py`, `module/base.py`
   `grad_output_preprocess`, `distributed.py` `gather_along_first_dim`). So such a gather
   (the virtual world tells which gather wrote the cast operand's storage:
   `comm_events.gathered_by`) is recorded moving the fp8 bytes, and the operand's kernel is
   the cast on the shard (forward input), the fp8 transpose of the gathered tensor (input in
   backward), or both (output gradient); its later casts add nothing. Left out: the forward
   shard cast is a kernel of its own (TE folds it into the norm kernel), the gathered buffer
   keeps the program's high-precision size in memory, and a forward recomputed in backward
   is priced with the transpose, not the shard cast.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from unittest import mock

import torch

from emulator import torch_compat
from emulator.capture import opmap
from emulator.capture.trace import ALLOC, COMPUTE, FREE, OpEvent
from emulator.world import comm_events
from emulator.world.comm_events import CommEvent, WaitEvent, current_recorder

# torchao modules that call the dynamic cast (each imported it by name)
_CALLERS = (
    "torchao.float8.float8_linear",
    "torchao.float8.float8_tensor_parallel",
    "torchao.float8.fsdp_utils",
)
_AMAX = torch.ops.aten.amax.default
_CAST = torch.ops.aten._to_copy.default
_GEMM_CALLERS = ("torchao.float8.float8_ops",)  # they call addmm_float8_unwrapped by name
_RECIPROCAL_ATEN = opmap.op_info(torch.ops.aten.reciprocal.default).aten
_CAST_ATEN = opmap.op_info(_CAST).aten
# the eager chain's reduction: `max` (tensorwise), `amax` (rowwise)
_AMAX_ATENS = {opmap.op_info(op).aten for op in (torch.ops.aten.max.default, _AMAX)}


def _local(t: torch.Tensor) -> torch.Tensor:
    """The rank's own tensor: a DTensor's local shard, a Float8TrainingTensor's fp8 data."""
    t = getattr(t, "_local_tensor", t)
    return getattr(t, "_data", t)


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def fused_kernels(
    first: OpEvent, last: OpEvent, hp: torch.Tensor, fp8, uid=None
) -> tuple[OpEvent, ...]:
    """The two kernels of the rule for casting `hp` to `fp8` (a Float8TrainingTensor, maybe
    inside a DTensor); `first`/`last` are the eager chain's first and last compute rows.
    `uid(tensor)`: its storage id, to give the rows their `flows` (None: no flows)."""
    hp, data = _local(hp), _local(fp8)
    scale = getattr(fp8, "_local_tensor", fp8)._scale
    ids = {} if uid is None else {"hp": uid(hp), "scale": uid(scale), "data": uid(data)}
    hp_t = (tuple(hp.shape), _dtype_name(hp), False)
    scale_in = (tuple(scale.shape), _dtype_name(scale), False)
    amax = first._replace(
        name=opmap.op_info(_AMAX).name,
        aten=opmap.op_info(_AMAX).aten,
        flops=0,
        read_bytes=hp.nbytes,
        write_bytes=scale.nbytes,
        tensors=(hp_t, (*scale_in[:2], True)),
        workspace_bytes=0,
        flows=(ids["hp"], ids["scale"]) if ids else (),
    )
    cast = last._replace(
        name=opmap.op_info(_CAST).name,
        aten=opmap.op_info(_CAST).aten,
        flops=0,
        read_bytes=hp.nbytes + scale.nbytes,
        write_bytes=data.nbytes,
        tensors=(hp_t, scale_in, (tuple(data.shape), _dtype_name(data), True)),
        workspace_bytes=0,
        flows=(ids["hp"], ids["scale"], ids["data"]) if ids else (),
    )
    return amax, cast


def _storage_uid(recorder):
    def uid(t: torch.Tensor) -> int:
        known = recorder.storages.live.get(id(t.untyped_storage()))
        return -1 if known is None else known.uid

    return uid


def _transient_rows(events: list, start: int) -> set[int]:
    """Rows from `start` on that allocate or free a storage allocated and freed there."""
    allocs = {e.storage: i for i, e in enumerate(events[start:], start) if e.kind == ALLOC}
    frees = {e.storage: i for i, e in enumerate(events[start:], start) if e.kind == FREE}
    transient = allocs.keys() & frees.keys()
    return {allocs[u] for u in transient} | {frees[u] for u in transient}


def _fuse_since(recorder, start: int, hp: torch.Tensor, fp8, compiled: bool) -> None:
    events = recorder.events
    chain = [i for i in range(start, len(events)) if events[i].kind == COMPUTE]
    if len(chain) < 2:
        return  # nothing recorded (paused, another fake mode): nothing to replace
    uid = _storage_uid(recorder) if recorder.record_flows else None
    amax, cast = fused_kernels(events[chain[0]], events[chain[-1]], hp, fp8, uid)
    if any(events[i].aten in _AMAX_ATENS for i in chain):
        events[chain[0]], events[chain[-1]] = amax, cast
        drop = set(chain[1:-1])
    else:  # the reduction did not run: a recomputation took it from the checkpoint's store
        events[chain[-1]] = cast
        drop = set(chain[:-1])
    drop |= _transient_rows(events, start) if compiled else set()
    for i in sorted(drop, reverse=True):
        del events[i]


@contextlib.contextmanager
def _rewriting_casts(recorder, on_cast) -> Iterator[None]:
    """Call `on_cast(start, world_start, hp, fp8)` after each of torchao's dynamic casts, with
    the recorder's and the virtual world's event counts before it: the casts of
    `hp_tensor_to_float8_dynamic` (where `_CALLERS` call it) and the output-gradient casts of
    torchao's float8 tensor-parallel styles (`NoopFwToFloat8BwDynamic.backward`)."""
    import torchao.float8.float8_scaling_utils as scaling

    eager = scaling.hp_tensor_to_float8_dynamic
    eager_backward = scaling.NoopFwToFloat8BwDynamic.backward

    def counts() -> tuple[int, int]:
        world = current_recorder()
        return len(recorder.events), len(world.events) if world is not None else 0

    def cast(hp_tensor, *args, **kwargs):
        before = counts()
        out = eager(hp_tensor, *args, **kwargs)
        on_cast(*before, hp_tensor, out)
        return out

    def cast_gradient(ctx, grad):
        before = counts()
        out = eager_backward(ctx, grad)
        if out[0] is not grad:  # not already fp8
            on_cast(*before, grad, out[0])
        return out

    with contextlib.ExitStack() as stack:
        for module in _CALLERS:
            stack.enter_context(mock.patch(f"{module}.hp_tensor_to_float8_dynamic", cast))
        stack.enter_context(mock.patch.object(
            scaling.NoopFwToFloat8BwDynamic, "backward", staticmethod(cast_gradient)
        ))  # fmt: skip
        yield


def _drop_compute_since(events: list, start: int, aten: str | None = None) -> None:
    """Delete the compute rows from `start` on (only those of `aten`, when given)."""
    for i in range(len(events) - 1, start - 1, -1):
        if events[i].kind == COMPUTE and (aten is None or events[i].aten == aten):
            del events[i]


def _cast_writes_transposed(
    events: list, before: int, storage: int, reads_transposed: bool = False
) -> None:
    """Record the latest cast kernel before row `before` that wrote `storage` as writing its
    output transposed: the kernel writes the layout `_scaled_mm` reads, the transposing copy
    folded in. Two casts of one tensor, one read through a layout copy and one read directly,
    write two layouts, so the compile rule's common-subexpression elimination must not take
    one for the other (both rows otherwise show the same op over the same tensors). The search
    stops at the storage's allocation: data no cast wrote (an fp8 all-gather's) is left as is,
    without a scan of the whole trace for every GEMM. `reads_transposed`: the kernel's loop
    runs over its output, reading the cast's input through its transpose
    (`OpEvent.transposed_reads`)."""
    for i in range(before - 1, -1, -1):
        e = events[i]
        if e.kind == ALLOC and e.storage == storage:
            return
        if e.kind != COMPUTE or e.aten != _CAST_ATEN or storage not in e.flows[-1:]:
            continue
        *rest, (shape, dtype, is_out) = e.tensors
        transposed = (e.flows[0],) if reads_transposed and e.flows[0] >= 0 else ()
        events[i] = e._replace(
            tensors=(*rest, (shape[::-1], dtype, is_out)), transposed_reads=transposed
        )
        return


@contextlib.contextmanager
def _layout_copies_dropped(recorder) -> Iterator[None]:
    """Drop the kernels torchao's fp8 GEMMs run to put their operands in the layouts
    `_scaled_mm` takes (`preprocess_addmm`: a row-major A, a column-major B; each a transposing
    copy of the fp8 data on a GPU): both rules' cast kernels write the layout the GEMM reads.
    Their storages stay as recorded (at most one fp8 copy of an operand too many); a row that
    reads a copy reports the cast's storage in its flows (`OpRecorder.read_as`), so the cast's
    reader is not lost with the copy, and the cast's row records its output transposed
    (`_cast_writes_transposed`). Inductor folds the cast into the copy as one loop: over the
    copy's output for A (`a.contiguous()` of the transposed cast of an output gradient, for
    the weight gradient), so that kernel reads the high-precision tensor transposed; over the
    source's order for B (`b.t().contiguous().t()`), reading it in order. Read from the
    scheduler nodes' `MemoryDep`s of a compiled Llama 3 8B block's backward (torch 2.13;
    results/fidelity/HISTORY.md, "Which fp8 casts Inductor fuses")."""
    import torchao.float8.float8_ops as float8_ops

    eager = float8_ops.preprocess_addmm
    uid = _storage_uid(recorder)

    def preprocess(a, b, *args, **kwargs):
        start = len(recorder.events)
        out = eager(a, b, *args, **kwargs)
        _drop_compute_since(recorder.events, start)
        if not recorder.record_flows:
            return out
        for data, laid_out, is_a in ((a._data, out[0], True), (b._data, out[2], False)):
            source, copy = uid(data), uid(laid_out)
            if source >= 0 and copy >= 0 and copy != source:
                recorder.read_as[copy] = source
                _cast_writes_transposed(recorder.events, start, source, reads_transposed=is_a)
        return out

    with mock.patch.object(float8_ops, "preprocess_addmm", preprocess):
        yield


@contextlib.contextmanager
def fused_fp8_casts(recorder, compiled: bool = False) -> Iterator[None]:
    """Record torchao's dynamic fp8 casts as the `fused` rule's kernels (module docstring);
    `compiled` (the job runs torch.compile): the eager chain's transient storages are not
    allocated either (Inductor keeps them in registers)."""

    def on_cast(start, _world_start, hp, fp8):
        _fuse_since(recorder, start, hp, fp8, compiled)

    with _rewriting_casts(recorder, on_cast), _layout_copies_dropped(recorder):
        yield


def _drop_collectives_since(start: int) -> None:
    """Drop the collectives (and their waits) the virtual world recorded from event `start` on."""
    world = current_recorder()
    if world is None or len(world.events) <= start:
        return
    new = world.events[start:]
    dropped = {e.seq for e in new if isinstance(e, CommEvent)}
    kept = [e for e in new if not isinstance(e, CommEvent)
            and not (isinstance(e, WaitEvent) and e.comm_seq in dropped)]  # fmt: skip
    del world.events[start:]
    world.events.extend(kept)


def _fp8_gather(gather_seq: int, fp8) -> int | None:
    """Make the recorded all-gather `gather_seq` move `fp8`'s bytes (Transformer Engine gathers
    the fp8 data where the program gathers the high-precision tensor and casts it); its group
    size, or None when the virtual world holds no such gather."""
    world = current_recorder()
    if world is None:
        return None
    data = _local(fp8)
    for i in range(len(world.events) - 1, -1, -1):
        event = world.events[i]
        if event.seq == gather_seq:
            if not isinstance(event, CommEvent) or event.kind != "all_gather":
                return None
            world.events[i] = dataclasses.replace(
                event, dtype=_dtype_name(data), nbytes=event.numel * data.element_size()
            )
            return event.group_size
    return None


def _gathered_cast_bytes(hp: torch.Tensor, fp8, group_size: int) -> tuple[int, int]:
    """(read, write) bytes of what Transformer Engine runs for an operand the program
    all-gathered in high precision (module docstring, sequence parallelism): a forward input
    is cast on its shard (the gather then moves fp8); in backward an input was gathered again
    from its saved fp8 shard and is transposed in fp8 for the weight gradient; an output
    gradient is cast on its shard, gathered in fp8 and transposed."""
    hp_bytes, data_bytes = _local(hp).nbytes, _local(fp8).nbytes
    shard = (hp_bytes // group_size, data_bytes // group_size)
    transpose = (data_bytes, data_bytes)
    role = getattr(getattr(fp8, "_local_tensor", fp8), "_gemm_input_role", None)
    if role is not None and role.value == "grad_output":
        return shard[0] + transpose[0], shard[1] + transpose[1]
    return transpose if torch_compat.in_backward() else shard


class _TransformerEngineCasts:
    """The `transformer-engine` rule's state for one recording (module docstring)."""

    def __init__(self, recorder):
        self.recorder = recorder
        self.uid = _storage_uid(recorder)
        # (storage uid, offset, numel) of a cast operand -> (event index, seq) of its kernel
        self.cast_of: dict[tuple[int, int, int], tuple[int, int]] = {}
        # operands whose kernel writes all it will: both layouts written (a weight's casts in
        # later micro-batches read TE's cache), or gathered in fp8 (one fp8 tensor and one
        # transpose serve all their GEMMs); their later casts add nothing
        self.complete: set[tuple[int, int, int]] = set()

    def _operand_key(self, hp: torch.Tensor) -> tuple[int, int, int] | None:
        hp = _local(hp)
        uid = self.uid(hp)
        return None if uid < 0 else (uid, hp.storage_offset(), hp.numel())

    def _event_index(self, index: int, seq: int) -> int:
        events = self.recorder.events
        if index < len(events) and events[index].seq == seq:
            return index
        return next(i for i in range(len(events) - 1, -1, -1) if events[i].seq == seq)

    def record(self, start: int, hp: torch.Tensor, fp8) -> None:
        events = self.recorder.events
        chain = [i for i in range(start, len(events)) if events[i].kind == COMPUTE]
        if not chain:
            return  # nothing recorded (paused, another fake mode): nothing to replace
        key = self._operand_key(hp)
        earlier = self.cast_of.get(key) if key is not None else None
        drop = set(chain) | _transient_rows(events, start)
        if earlier is not None:
            if key not in self.complete:  # the second layout, written by the first cast-transpose
                i = self._event_index(*earlier)
                written = events[i].write_bytes + _local(fp8).nbytes
                events[i] = events[i]._replace(write_bytes=written)
                self.complete.add(key)
        else:
            uid = self.uid if self.recorder.record_flows else None
            _, cast = fused_kernels(events[chain[0]], events[chain[-1]], hp, fp8, uid)
            gather_seq = comm_events.gathered_by(_local(hp))
            group_size = None if gather_seq is None else _fp8_gather(gather_seq, fp8)
            if group_size is not None:
                read, write = _gathered_cast_bytes(hp, fp8, group_size)
                cast = cast._replace(read_bytes=read, write_bytes=write)
                if key is not None:
                    self.complete.add(key)
            events[chain[-1]] = cast
            drop.discard(chain[-1])
        for i in sorted(drop, reverse=True):
            del events[i]
        if earlier is None and key is not None:
            index = chain[-1] - sum(1 for i in drop if i < chain[-1])
            self.cast_of[key] = (index, cast.seq)

    def drop_reciprocals_since(self, start: int) -> None:
        """Drop the scale reciprocals recorded from `start` on (rule item 4)."""
        _drop_compute_since(self.recorder.events, start, aten=_RECIPROCAL_ATEN)


@contextlib.contextmanager
def transformer_engine_fp8_casts(recorder) -> Iterator[None]:
    """Record torchao's dynamic fp8 casts as Transformer Engine's delayed-scaling kernels
    (the `transformer-engine` rule of the module docstring)."""
    import torchao.float8.float8_ops as float8_ops

    eager_gemm = float8_ops.addmm_float8_unwrapped
    state = _TransformerEngineCasts(recorder)

    def on_cast(start, world_start, hp, fp8):
        _drop_collectives_since(world_start)
        state.record(start, hp, fp8)

    def gemm(*args, **kwargs):
        start = len(recorder.events)
        out = eager_gemm(*args, **kwargs)
        state.drop_reciprocals_since(start)
        return out

    with contextlib.ExitStack() as stack:
        stack.enter_context(_rewriting_casts(recorder, on_cast))
        stack.enter_context(_layout_copies_dropped(recorder))
        for module in _GEMM_CALLERS:
            stack.enter_context(mock.patch(f"{module}.addmm_float8_unwrapped", gemm))
        yield
