"""replay_memory: a RankTrace's alloc/free sequence through the caching-allocator model.

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

from emulator.capture.trace import ALLOC, COMPUTE, FREE, PHASES, RankTrace
from emulator.hardware import GpuPreset, gpu_preset
from emulator.memory.allocator import CachingAllocator
from emulator.memory.config import AllocatorConfig, parse_alloc_conf
from emulator.memory.outside import CUBLAS_WORKSPACE_BYTES, OutsideMemory, outside_memory

WORKSPACE_CATEGORY = "cublas_workspace"
_MATMULS = ("mm", "addmm", "bmm", "linear", "scaled_mm")
_BACKWARD_PHASES = (PHASES.index("backward"), PHASES.index("recompute"))


@dataclass(frozen=True, kw_only=True)
class MemoryEvent:
    """Where in the program an event happened."""

    event_index: int  # index among the replayed alloc/free events
    seq: int
    stage: int | None
    phase: str
    micro_batch: int
    module: str


@dataclass(frozen=True, kw_only=True)
class OomReport:
    """The first allocation that did not fit, after torch's cache-release retries."""

    at: MemoryEvent
    request_bytes: int
    allocated_bytes: int
    reserved_bytes: int
    allocator_capacity_bytes: int
    gpu_capacity_bytes: int
    live_by_category: dict[str, int]


@dataclass(frozen=True, kw_only=True)
class MemoryTimeline:
    """Per replayed event: the trace row and the totals after it; per allocation: its event,
    the event that freed it (n if never), its block size and category."""

    rows: np.ndarray
    allocated: np.ndarray
    reserved: np.ndarray
    requested: np.ndarray
    alloc_event: np.ndarray
    free_event: np.ndarray
    block_bytes: np.ndarray
    category: np.ndarray
    categories: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class MemoryResult:
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    peak_requested_bytes: int
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
    alloc_retries: int
    unmatched_frees: int
    timeline: MemoryTimeline = field(repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.peak_reserved_bytes < self.peak_allocated_bytes:
            raise ValueError(
                f"peak_reserved_bytes({self.peak_reserved_bytes}) < "
                f"peak_allocated_bytes({self.peak_allocated_bytes})"
            )

    def to_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k not in ("timeline", "outside")}
        return d | {"outside": self.outside.to_dict(), "is_oom": self.oom is not None}


def replay_memory(
    trace: RankTrace,
    *,
    gpu: GpuPreset | str | None = None,
    alloc_conf: str | AllocatorConfig = "",
    memory_fraction: float | None = None,
    stage: int | None = None,
    top_modules: int = 10,
    cublas_workspace: bool = True,
    outside: OutsideMemory | None = None,
) -> MemoryResult:
    """Replay `trace` (see the package docstring for the API)."""
    return _replay(
        trace, gpu, alloc_conf, memory_fraction, stage, top_modules, cublas_workspace, outside
    )[0]


def _replay(
    trace,
    gpu,
    alloc_conf,
    memory_fraction,
    stage,
    top_modules,
    cublas_workspace,
    outside,
    history=False,
):
    preset = gpu_preset(gpu) if isinstance(gpu, str) else gpu
    config = alloc_conf if isinstance(alloc_conf, AllocatorConfig) else parse_alloc_conf(alloc_conf)
    conf_text = alloc_conf if isinstance(alloc_conf, str) else repr(alloc_conf)
    arch = preset.arch if preset else None
    outside = outside or outside_memory(trace, arch)
    allocator = _allocator(config, preset, outside, memory_fraction, history)
    ev = _events(
        trace,
        CUBLAS_WORKSPACE_BYTES.get(arch, CUBLAS_WORKSPACE_BYTES["ampere"])
        if cublas_workspace
        else 0,
    )
    timeline, oom, unmatched = _run(allocator, ev)
    result = _result(
        trace, timeline, allocator, outside, preset, conf_text, stage, top_modules, oom, unmatched
    )
    return result, allocator


def _allocator(config, preset, outside, memory_fraction, history) -> CachingAllocator:
    """The allocator of one device: what the GPU has, less what lives outside the allocator."""
    total = preset.hbm_capacity_bytes if preset else None
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


def _run(allocator: CachingAllocator, ev: dict) -> tuple[MemoryTimeline, tuple | None, int]:
    """Replay the alloc/free events: the timeline, the first OOM (or None) and the number of
    frees of storages never allocated."""
    n = len(ev["rows"])
    alloc_t, res_t, req_t = [0] * n, [0] * n, [0] * n
    free_event = np.full(n, n, np.int64)
    block_bytes = np.zeros(n, np.int64)
    live: dict[int, tuple] = {}
    unmatched, oom = 0, None
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
                oom = oom or (
                    j,
                    size,
                    allocator.allocated,
                    allocator.reserved,
                    allocator.capacity_bytes,
                )
                allocator.capacity_bytes = None  # the figures go on as on an unlimited device
                block = malloc(size, stream)
            live[uid] = (block, j)
            block_bytes[j] = block.size
        alloc_t[j], res_t[j], req_t[j] = (
            allocator.allocated,
            allocator.reserved,
            allocator.requested,
        )
    allocs = ~ev["is_free"]
    timeline = MemoryTimeline(
        rows=ev["rows"],
        allocated=np.asarray(alloc_t, np.int64),
        reserved=np.asarray(res_t, np.int64),
        requested=np.asarray(req_t, np.int64),
        alloc_event=np.flatnonzero(allocs),
        free_event=free_event[allocs],
        block_bytes=block_bytes[allocs],
        category=ev["category"][allocs],
        categories=ev["categories"],
    )
    return timeline, oom, unmatched


def _events(trace: RankTrace, workspace_bytes: int) -> dict:
    """The alloc/free rows, plus one cuBLAS workspace allocation (never freed) at the first
    matmul of each (thread, stream): autograd runs backward on its own thread, whose cuBLAS
    handle gets its own workspace (CublasHandlePool.cpp keys workspaces by handle and stream)."""
    c = trace.columns
    kind = c["kind"]
    rows = np.flatnonzero((kind == ALLOC) | (kind == FREE))
    categories = (*trace.strings, WORKSPACE_CATEGORY)
    ws_rows = _first_matmuls(trace) if workspace_bytes else np.zeros(0, np.int64)
    all_rows = np.concatenate([rows, ws_rows])
    order = np.argsort(all_rows, kind="stable")
    n_ws = len(ws_rows)
    return {
        "rows": all_rows[order],
        "is_free": np.concatenate([kind[rows] == FREE, np.zeros(n_ws, bool)])[order],
        "size": np.concatenate([c["size_bytes"][rows], np.full(n_ws, workspace_bytes, np.int64)])[
            order
        ],
        "uid": np.concatenate([c["storage"][rows], -2 - np.arange(n_ws, dtype=np.int64)])[order],
        "stream": np.concatenate([c["stream"][rows], c["stream"][ws_rows]]).astype(np.int64)[order],
        "category": np.concatenate(
            [c["category"][rows], np.full(n_ws, len(trace.strings), np.int32)]
        )[order],
        "categories": categories,
    }


def _first_matmuls(trace: RankTrace) -> np.ndarray:
    c = trace.columns
    names = [trace.strings.index(m) for m in _MATMULS if m in trace.strings]
    rows = np.flatnonzero((c["kind"] == COMPUTE) & np.isin(c["name"], names))
    if not len(rows):
        return np.zeros(0, np.int64)
    thread = np.isin(c["phase"][rows], _BACKWARD_PHASES).astype(np.int64)
    key = thread * (1 << 20) + c["stream"][rows].astype(np.int64)
    _, first = np.unique(key, return_index=True)
    return np.sort(rows[first])


def _live_at(t: MemoryTimeline, j: int) -> np.ndarray:
    return (t.alloc_event <= j) & (t.free_event > j)


def _by_category(t: MemoryTimeline, j: int) -> dict[str, int]:
    live = _live_at(t, j)
    sums = np.bincount(t.category[live], weights=t.block_bytes[live], minlength=len(t.categories))
    return {t.categories[i] or "other": int(s) for i, s in enumerate(sums) if s}


def _by_module(trace: RankTrace, t: MemoryTimeline, j: int, top: int) -> dict[str, int]:
    live = _live_at(t, j)
    modules = trace.columns["module"][t.rows[t.alloc_event]]
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
    )


def _result(
    trace, t, allocator, outside, preset, conf_text, stage, top, oom, unmatched
) -> MemoryResult:
    n = len(t.rows)
    j = int(np.argmax(t.allocated)) if n else -1
    report = None
    if oom is not None:
        at, size, allocated, reserved, capacity = oom
        report = OomReport(
            at=_where(trace, t, at, stage),
            request_bytes=size,
            allocated_bytes=allocated,
            reserved_bytes=reserved,
            allocator_capacity_bytes=capacity,
            gpu_capacity_bytes=preset.hbm_capacity_bytes,
            live_by_category=_by_category(t, at - 1) if at else {},
        )
    return MemoryResult(
        peak_allocated_bytes=allocator.peak_allocated,
        peak_reserved_bytes=allocator.peak_reserved,
        peak_requested_bytes=allocator.peak_requested,
        fragmentation_at_peak_bytes=int(t.reserved[j] - t.allocated[j]) if n else 0,
        peak=_where(trace, t, j, stage) if n else None,
        live_at_peak_by_category=_by_category(t, j) if n else {},
        live_at_peak_by_module=_by_module(trace, t, j, top) if n else {},
        outside=outside,
        device_total_estimate_bytes=allocator.peak_reserved + outside.total_bytes,
        gpu=preset.name if preset else None,
        gpu_capacity_bytes=preset.hbm_capacity_bytes if preset else None,
        oom=report,
        alloc_conf=conf_text,
        events=n,
        alloc_retries=allocator.num_alloc_retries,
        unmatched_frees=unmatched,
        timeline=t,
    )
