"""replay_memory: a RankTrace's alloc/free sequence through the caching-allocator model.

The trace is replayed as a training process runs it (emulator.memory.iterations): a first
iteration from an empty allocator, then steady iterations with the allocator's state carried
over until its blocks stop changing; the steady iteration's peaks are the headline figures,
the first iteration's are reported beside them, and an OOM in either is reported.

Metrics (defined once here): `allocated` = sum of the sizes of blocks handed out (what
torch.cuda.max_memory_allocated reports: rounded, including unsplit remainders); `reserved` =
bytes of segments held from CUDA (max_memory_reserved); `requested` = the unrounded sizes asked
for (memory_stats "requested_bytes"); fragmentation at the peak = reserved - allocated at the
event where allocated peaks. "What was live" is counted in block bytes, so the categories sum to
the allocated figure.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from emulator.capture.trace import COMM, COMPUTE, PHASES, RankTrace
from emulator.hardware import GpuPreset, gpu_preset
from emulator.memory.allocator import CachingAllocator
from emulator.memory.blocks import allocation_size, round_size
from emulator.memory.config import AllocatorConfig, parse_alloc_conf
from emulator.memory.events import replay_events
from emulator.memory.iterations import iteration_events
from emulator.memory.outside import (
    CUBLAS_WORKSPACE_BYTES,
    CUBLASLT_WORKSPACE_BYTES,
    OutsideMemory,
    outside_memory,
)

MAX_STEADY_ITERATIONS = 8
_ZERO_FILL = "aten.fill_"  # emulator.capture.opmap.ZERO_FILL, which imports torch


@dataclass(frozen=True, kw_only=True)
class MemoryEvent:
    """Where in the program an event happened."""

    event_index: int  # index among the replayed alloc/free events
    seq: int
    stage: int | None
    phase: str
    micro_batch: int
    module: str
    op: str  # the aten op (or collective) the event belongs to; "" before the first op


@dataclass(frozen=True, kw_only=True)
class OomReport:
    """The first allocation that did not fit, after torch's cache-release retries, with the
    figures of torch's OutOfMemoryError message (CUDACachingAllocator.cpp, malloc), taken as
    torch takes them: after the retries have freed the cache."""

    iteration: str  # "first" or "steady"
    at: MemoryEvent
    request_bytes: int  # what the op asked for (unrounded)
    # torch's "Tried to allocate": get_allocation_size(round_size(request)), the segment the
    # failed cudaMalloc asked for (20 MiB for a 3 MiB request; the rounded request above 10 MiB)
    allocation_bytes: int
    allocated_bytes: int  # "... is allocated by PyTorch"
    reserved_bytes: int  # allocated + "... is reserved by PyTorch but unallocated"
    allocator_capacity_bytes: int  # GPU capacity - outside: what the allocator may reserve
    gpu_capacity_bytes: int  # "GPU 0 has a total capacity of ..." (cudaMemGetInfo's total)
    outside_bytes: int  # CUDA context and NCCL (emulator.memory.outside)
    free_bytes: int  # "... of which ... is free": GPU capacity - outside - reserved
    process_in_use_bytes: int  # "this process has ... memory in use": reserved + outside
    live_by_category: dict[str, int]


@dataclass(frozen=True, kw_only=True)
class MemoryTimeline:
    """Per replayed event: the trace row and the totals after it; per allocation: its event
    (0 for one live before the replayed iteration), its trace row, the event that freed it
    (n if never), its block size and category."""

    rows: np.ndarray
    allocated: np.ndarray
    reserved: np.ndarray
    requested: np.ndarray
    alloc_event: np.ndarray
    alloc_row: np.ndarray
    carried_allocations: int  # the first this many were live before the replayed iteration
    free_event: np.ndarray
    block_bytes: np.ndarray
    category: np.ndarray
    categories: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class MemoryResult:
    """Peaks of the steady iteration (the headline) and of the first; `peak`, the live
    breakdowns and `timeline` are the steady iteration's, `first_timeline` the first's."""

    peak_allocated_bytes: int
    peak_reserved_bytes: int
    peak_requested_bytes: int
    first_iteration_peak_allocated_bytes: int
    first_iteration_peak_reserved_bytes: int
    first_iteration_peak_requested_bytes: int
    steady_iterations: int  # steady iterations replayed until the allocator's blocks repeat
    steady_converged: bool  # False: they still changed after MAX_STEADY_ITERATIONS
    fragmentation_at_peak_bytes: int
    peak: MemoryEvent | None
    live_at_peak_by_category: dict[str, int]
    live_at_peak_by_module: dict[str, int]
    outside: OutsideMemory
    device_total_estimate_bytes: int
    gpu: str | None
    gpu_capacity_bytes: int | None
    oom: OomReport | None
    alloc_conf: str
    events: int
    # torch's num_alloc_retries: requests served (or refused) only after freeing the whole
    # cache (a device synchronize, cudaFree of every unused segment, cudaMalloc again): over
    # every replayed iteration, in the first, and in the last steady one (which every later
    # step repeats)
    alloc_retries: int
    first_iteration_alloc_retries: int
    steady_alloc_retries: int
    unmatched_frees: int
    timeline: MemoryTimeline = field(repr=False, compare=False)
    first_timeline: MemoryTimeline = field(repr=False, compare=False)

    @property
    def allocator_limit_bytes(self) -> int | None:
        """What the allocator may reserve: the usable capacity less the memory outside it
        (`_allocator`); None without a GPU."""
        if self.gpu_capacity_bytes is None:
            return None
        return max(self.gpu_capacity_bytes - self.outside.total_bytes, 0)

    def __post_init__(self) -> None:
        if self.peak_reserved_bytes < self.peak_allocated_bytes:
            raise ValueError(
                f"peak_reserved_bytes({self.peak_reserved_bytes}) < "
                f"peak_allocated_bytes({self.peak_allocated_bytes})"
            )

    def to_dict(self) -> dict:
        timelines = ("timeline", "first_timeline")
        d = {k: v for k, v in asdict(self).items() if k not in (*timelines, "outside")}
        return d | {"outside": self.outside.to_dict(), "is_oom": self.oom is not None}


def replay_memory(
    trace: RankTrace,
    *,
    gpu: GpuPreset | str | None = None,
    alloc_conf: str | AllocatorConfig = "",
    memory_fraction: float | None = None,
    stage: int | None = None,
    top_modules: int = 10,
    workspaces: bool = True,
    outside: OutsideMemory | None = None,
) -> MemoryResult:
    """Replay `trace` (see the package docstring for the API)."""
    return _replay(
        trace, gpu, alloc_conf, memory_fraction, stage, top_modules, workspaces, outside
    )[0]


def _replay(
    trace,
    gpu,
    alloc_conf,
    memory_fraction,
    stage,
    top_modules,
    workspaces,
    outside,
    history=False,
):
    preset = gpu_preset(gpu) if isinstance(gpu, str) else gpu
    conf_text = alloc_conf if isinstance(alloc_conf, str) else repr(alloc_conf)
    allocator, first_ev, steady_ev, outside = prepared_replay(
        trace, preset, alloc_conf, memory_fraction, workspaces, outside, history
    )
    runs = _iterations(allocator, first_ev, steady_ev)
    result = _result(trace, runs, allocator, outside, preset, conf_text, stage, top_modules)
    return result, allocator


def prepared_replay(
    trace: RankTrace,
    preset: GpuPreset | None,
    alloc_conf: str | AllocatorConfig = "",
    memory_fraction: float | None = None,
    workspaces: bool = True,
    outside: OutsideMemory | None = None,
    history: bool = False,
) -> tuple[CachingAllocator, dict, dict, OutsideMemory]:
    """What a replay starts from: the device's empty allocator, the first and the steady
    iteration's events (emulator.memory.iterations) and the memory outside the allocator."""
    config = alloc_conf if isinstance(alloc_conf, AllocatorConfig) else parse_alloc_conf(alloc_conf)
    arch = preset.arch if preset else None
    outside = outside or outside_memory(trace, arch)
    allocator = _allocator(config, preset, outside, memory_fraction, history)
    ev = replay_events(
        trace,
        CUBLAS_WORKSPACE_BYTES.get(arch, CUBLAS_WORKSPACE_BYTES["ampere"]),
        workspaces,
        CUBLASLT_WORKSPACE_BYTES,
    )
    return allocator, *iteration_events(trace, ev), outside


def _iterations(allocator: CachingAllocator, first_ev: dict, steady_ev: dict) -> dict:
    """Replay the first iteration, then steady ones until the allocator's blocks repeat."""
    live: dict[int, tuple] = {}
    first, oom, unmatched = _run(allocator, first_ev, live)
    runs = {
        "first_peaks": (
            allocator.peak_allocated,
            allocator.peak_reserved,
            allocator.peak_requested,
        ),
        "first_retries": allocator.num_alloc_retries,
        "first": first,
        "oom": None if oom is None else ("first", first, oom),
        "unmatched": unmatched,
        "converged": False,
    }
    state = _blocks_state(allocator)
    for count in range(1, MAX_STEADY_ITERATIONS + 1):
        allocator.reset_peak_stats()
        if allocator.history is not None:  # a snapshot records the last iteration only
            allocator.history.clear()
        retries = allocator.num_alloc_retries
        steady, oom, unmatched = _run(allocator, steady_ev, live)
        runs["steady_retries"] = allocator.num_alloc_retries - retries
        runs["oom"] = runs["oom"] or (None if oom is None else ("steady", steady, oom))
        runs["unmatched"] = max(runs["unmatched"], unmatched)
        state, previous = _blocks_state(allocator), state
        runs |= {"steady": steady, "count": count}
        if state == previous:
            runs["converged"] = True
            break
    return runs


def _blocks_state(allocator: CachingAllocator) -> tuple:
    """What decides how the next iteration's requests are served: every block's place and
    whether it is in use (same state, same iteration)."""
    return tuple(sorted((b.addr, b.size, b.allocated, b.stream) for b in allocator.blocks()))


def _allocator(config, preset, outside, memory_fraction, history) -> CachingAllocator:
    """The allocator of one device: what the GPU has, less what lives outside the allocator
    (MemoryResult.allocator_limit_bytes says the same)."""
    total = preset.usable_capacity_bytes if preset else None
    if memory_fraction is not None and not 0 < memory_fraction <= 1:
        raise ValueError(f"memory_fraction={memory_fraction} must be in (0, 1]")
    return CachingAllocator(
        config,
        capacity_bytes=None if total is None else max(total - outside.total_bytes, 0),
        allowed_bytes=None
        if memory_fraction is None or total is None
        else int(memory_fraction * total),
        device_total_bytes=total or 1 << 40,
        record_history=history,
    )


def _run(
    allocator: CachingAllocator, ev: dict, live: dict
) -> tuple[MemoryTimeline, tuple | None, int]:
    """Replay the alloc/free events: the timeline, the first OOM (or None) and the number of
    frees of storages never allocated. `live` (uid -> [block, allocation index, row,
    category]) carries the live storages from one call to the next; the timeline lists those
    carried in as allocations at event 0."""
    n = len(ev["rows"])
    totals = np.zeros((3, n), np.int64)  # allocated, reserved, requested after each event
    carried = list(live.values())
    alloc_rows, categories, sizes = _allocation_columns(ev, carried)
    free_event = np.full(len(alloc_rows), n, np.int64)
    for k, entry in enumerate(carried):
        entry[1] = k
    unmatched, oom, next_allocation = 0, None, len(carried)
    malloc, free = allocator.malloc, allocator.free
    columns = (ev["is_free"], ev["size"], ev["uid"], ev["stream"])
    for j, (is_free, size, uid, stream) in enumerate(
        zip(*(c.tolist() for c in columns), strict=True)
    ):
        if is_free:
            entry = live.pop(uid, None)
            if entry is None:
                unmatched += 1
            else:
                free(entry[0])
                free_event[entry[1]] = j
        else:
            block = malloc(size, stream)
            if block is None:
                oom = oom or _failure(allocator, j, size)
                allocator.capacity_bytes = None  # the figures go on as on an unlimited device
                block = malloc(size, stream)
            row, category = int(ev["rows"][j]), int(ev["category"][j])
            live[uid] = [block, next_allocation, row, category]
            sizes[next_allocation] = block.size
            next_allocation += 1
        totals[:, j] = allocator.allocated, allocator.reserved, allocator.requested
    allocs = np.flatnonzero(~ev["is_free"])
    timeline = MemoryTimeline(
        rows=ev["rows"],
        allocated=totals[0],
        reserved=totals[1],
        requested=totals[2],
        alloc_event=np.concatenate([np.zeros(len(carried), np.int64), allocs]),
        alloc_row=alloc_rows,
        carried_allocations=len(carried),
        free_event=free_event,
        block_bytes=sizes,
        category=categories,
        categories=ev["categories"],
    )
    return timeline, oom, unmatched


def _failure(allocator: CachingAllocator, j: int, size: int) -> dict:
    """What torch's OOM message reports of the allocator when event `j` (`size` bytes) fails."""
    config = allocator.config
    return {
        "at": j,
        "request_bytes": size,
        "allocation_bytes": allocation_size(round_size(size, config), config),
        "allocated_bytes": allocator.allocated,
        "reserved_bytes": allocator.reserved,
        "allocator_capacity_bytes": allocator.capacity_bytes,
    }


def _allocation_columns(ev: dict, carried: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(trace row, category, block bytes) per allocation: the carried ones, then this run's
    (whose block sizes are filled in as they are served)."""
    allocs = ~ev["is_free"]
    rows = np.array([e[2] for e in carried], np.int64)
    categories = np.array([e[3] for e in carried], ev["category"].dtype)
    sizes = np.array([e[0].size for e in carried], np.int64)
    return (
        np.concatenate([rows, ev["rows"][allocs]]),
        np.concatenate([categories, ev["category"][allocs]]),
        np.concatenate([sizes, np.zeros(int(allocs.sum()), np.int64)]),
    )


def _live_at(t: MemoryTimeline, j: int) -> np.ndarray:
    return (t.alloc_event <= j) & (t.free_event > j)


def _by_category(t: MemoryTimeline, j: int) -> dict[str, int]:
    live = _live_at(t, j)
    sums = np.bincount(t.category[live], weights=t.block_bytes[live], minlength=len(t.categories))
    totals: dict[str, int] = {}
    for i, s in enumerate(sums):
        if s:  # an uncategorised storage ("") counts as "other", added, not overwritten
            name = t.categories[i] or "other"
            totals[name] = totals.get(name, 0) + int(s)
    return totals


def _by_module(trace: RankTrace, t: MemoryTimeline, j: int, top: int) -> dict[str, int]:
    live = _live_at(t, j)
    modules = trace.columns["module"][t.alloc_row]
    sums = np.bincount(modules[live], weights=t.block_bytes[live], minlength=len(trace.strings))
    order = np.argsort(-sums, kind="stable")[:top]
    return {trace.strings[i] or "<top>": int(sums[i]) for i in order if sums[i]}


def _where(trace: RankTrace, t: MemoryTimeline, j: int, stage: int | None) -> MemoryEvent:
    c, row = trace.columns, int(t.rows[j])
    phase = int(c["phase"][row])
    return MemoryEvent(
        event_index=j,
        seq=int(c["seq"][row]),
        stage=stage,
        # rows before the first op are the declared model state (parameters, optimizer state)
        phase=PHASES[phase] if 0 <= phase < len(PHASES) else "setup",
        micro_batch=int(c["micro_batch"][row]),
        module=trace.strings[c["module"][row]],
        op=_op_at(trace, row) if phase >= 0 else "",
    )


def _op_at(trace: RankTrace, row: int) -> str:
    """The op of an allocation at `row`: the first compute or collective row from there on (the
    op recorder writes an op's output allocations right before its row; a kernel's own
    workspace is at its row). A zero fill that a kernel runs on its output
    (opmap.ZERO_FILLED_OUTPUT) is recorded between the two: the op is the kernel after it."""
    c, strings = trace.columns, trace.strings
    ops = np.flatnonzero(np.isin(c["kind"][row:], (COMPUTE, COMM))) + row
    if not len(ops):
        return ""
    names = [strings[c["aten"][r]] or strings[c["name"][r]] for r in ops[:2].tolist()]
    if names[0] == _ZERO_FILL and len(names) > 1:
        from emulator.capture.opmap import ZERO_FILLED_OUTPUT  # imports torch: only here

        if names[1] in ZERO_FILLED_OUTPUT:
            return names[1]
    return names[0]


def _result(trace, runs, allocator, outside, preset, conf_text, stage, top) -> MemoryResult:
    t = runs["steady"]
    n = len(t.rows)
    j = int(np.argmax(t.allocated)) if n else -1
    first_allocated, first_reserved, first_requested = runs["first_peaks"]
    return MemoryResult(
        peak_allocated_bytes=allocator.peak_allocated,
        peak_reserved_bytes=allocator.peak_reserved,
        peak_requested_bytes=allocator.peak_requested,
        first_iteration_peak_allocated_bytes=first_allocated,
        first_iteration_peak_reserved_bytes=first_reserved,
        first_iteration_peak_requested_bytes=first_requested,
        steady_iterations=runs["count"],
        steady_converged=runs["converged"],
        fragmentation_at_peak_bytes=int(t.reserved[j] - t.allocated[j]) if n else 0,
        peak=_where(trace, t, j, stage) if n else None,
        live_at_peak_by_category=_by_category(t, j) if n else {},
        live_at_peak_by_module=_by_module(trace, t, j, top) if n else {},
        outside=outside,
        device_total_estimate_bytes=max(allocator.peak_reserved, first_reserved)
        + outside.total_bytes,
        gpu=preset.name if preset else None,
        gpu_capacity_bytes=preset.usable_capacity_bytes if preset else None,
        oom=_oom_report(trace, runs["oom"], preset, outside, stage),
        alloc_conf=conf_text,
        events=n,
        alloc_retries=allocator.num_alloc_retries,
        first_iteration_alloc_retries=runs["first_retries"],
        steady_alloc_retries=runs["steady_retries"],
        unmatched_frees=runs["unmatched"],
        timeline=t,
        first_timeline=runs["first"],
    )


def _oom_report(trace, oom, preset, outside, stage) -> OomReport | None:
    if oom is None:
        return None
    iteration, t, failure = oom
    at, reserved = failure["at"], failure["reserved_bytes"]
    total, outside_bytes = preset.usable_capacity_bytes, outside.total_bytes
    return OomReport(
        iteration=iteration,
        at=_where(trace, t, at, stage),
        **{k: v for k, v in failure.items() if k != "at"},
        gpu_capacity_bytes=total,
        outside_bytes=outside_bytes,
        free_bytes=max(total - outside_bytes - reserved, 0),
        process_in_use_bytes=reserved + outside_bytes,
        live_by_category=_by_category(t, at - 1) if at else {},
    )
