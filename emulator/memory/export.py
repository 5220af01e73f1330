"""Export of a memory replay: a torch.cuda.memory._snapshot()-style pickle, and the allocator's
events of each iteration a training process goes through (`history_by_iteration`).

The timeline plot lives with the harness (prismbench.plots): the core does not draw.

The snapshot follows the keys torch/cuda/_memory_viz.py and pytorch.org/memory_viz read
(torch/csrc/cuda/memory_snapshot.cpp writes them): "segments" (device, address, total_size,
allocated_size, active_size, requested_size, stream, segment_type, segment_pool_id,
is_expandable, frames, blocks[address, size, requested_size, state, frames]) and
"device_traces" (one list per device of {action, addr, size, stream, time_us, frames}).
A CPU trace has no Python stacks: every frame list holds one placeholder frame.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

from emulator.capture.trace import RankTrace
from emulator.hardware import gpu_preset
from emulator.memory.iterations import take_events
from emulator.memory.replay import _replay, _run, prepared_replay


def snapshot(trace: RankTrace, **replay_kwargs) -> dict:
    """Replay `trace` (same keywords as replay_memory) and return the allocator's final state
    and event history in torch.cuda.memory._snapshot()'s format."""
    kw = {
        "gpu": None,
        "alloc_conf": "",
        "memory_fraction": None,
        "workspaces": True,
        "outside": None,
    }
    unknown = set(replay_kwargs) - set(kw)
    if unknown:
        raise TypeError(f"snapshot() got unknown keywords {sorted(unknown)}; known: {sorted(kw)}")
    kw |= replay_kwargs
    _, allocator = _replay(
        trace, kw["gpu"], kw["alloc_conf"], kw["memory_fraction"], None, 10,
        kw["workspaces"], kw["outside"], history=True,
    )  # fmt: skip
    frames = [{"filename": "prismbench", "line": 0, "name": "replay"}]
    traces = [dict(e, time_us=i, frames=frames) for i, e in enumerate(allocator.history)]
    return {
        "segments": _segments(allocator.blocks(), frames),
        "device_traces": [traces],
        "allocator_settings": {"PYTORCH_ALLOC_CONF": str(kw["alloc_conf"])},
    }


def write_snapshot(trace: RankTrace, path: str | Path, **replay_kwargs) -> Path:
    path = Path(path)
    with path.open("wb") as f:
        pickle.dump(snapshot(trace, **replay_kwargs), f)
    return path


def history_by_iteration(
    trace: RankTrace, *, gpu: str | None = None, alloc_conf: str = "", steady_iterations: int = 1
) -> dict:
    """The allocator's events ({action, addr, size, stream}, as in a snapshot's device trace)
    in the order a process makes them: "setup" (the storages the capture recorded while the
    program was built, if it did, and the declared state), "first" (the first iteration) and
    "steady" (one list per steady iteration, `steady_iterations` of them), so that a real run's
    memory history can be compared part by part; and "peaks", the same parts' allocator peaks
    ({"allocated", "reserved", "requested"} under "setup", "first" and "steady") with the
    peaks reset at each part's start, as a process that calls
    `torch.cuda.reset_peak_memory_stats()` before each iteration reads them (so "first" leaves
    the build out, where `replay_memory`'s `first_iteration_peak_*` count it: from an empty
    allocator)."""
    if steady_iterations < 0:
        raise ValueError(f"steady_iterations={steady_iterations} must be >= 0")
    preset = gpu_preset(gpu) if gpu else None
    allocator, first, steady, _ = prepared_replay(trace, preset, alloc_conf, history=True)
    in_iteration = trace.columns["phase"][first["rows"]] >= 0  # the setup events come first
    setup_count = int(np.argmax(in_iteration)) if in_iteration.any() else len(in_iteration)
    live: dict = {}
    peaks: list[dict] = []

    def replayed(part: dict) -> list:
        allocator.reset_peak_stats()
        _run(allocator, part, live)
        peaks.append({"allocated": allocator.peak_allocated, "reserved": allocator.peak_reserved,
                      "requested": allocator.peak_requested})  # fmt: skip
        history = allocator.history[:]
        allocator.history.clear()
        return history

    n = len(first["rows"])
    history = {
        "setup": replayed(take_events(first, np.arange(setup_count))),
        "first": replayed(take_events(first, np.arange(setup_count, n))),
        "steady": [replayed(steady) for _ in range(steady_iterations)],
    }
    return history | {"peaks": {"setup": peaks[0], "first": peaks[1], "steady": peaks[2:]}}


def _segments(blocks, frames) -> list[dict]:
    """One segment per cudaMalloc, or per contiguous mapped run of an expandable segment."""
    segments = []
    for head in blocks:
        if not head.mapped or (head.prev is not None and head.prev.mapped):
            continue
        seg = {
            "device": 0, "address": head.addr, "total_size": 0, "allocated_size": 0,
            "active_size": 0, "requested_size": 0, "stream": head.stream,
            "segment_type": "small" if head.small else "large", "segment_pool_id": (0, 0),
            "is_expandable": head.segment is not None, "frames": frames, "blocks": [],
        }  # fmt: skip
        b = head
        while b is not None and b.mapped:
            active = b.allocated or b.events > 0
            state = (
                "active_allocated"
                if b.allocated
                else "active_pending_free"
                if active
                else "inactive"
            )
            seg["blocks"].append(
                {"address": b.addr, "size": b.size, "requested_size": b.requested if active else 0,
                 "state": state, "frames": frames if active else []}
            )  # fmt: skip
            seg["total_size"] += b.size
            seg["allocated_size"] += b.size if b.allocated else 0
            seg["active_size"] += b.size if active else 0
            seg["requested_size"] += b.requested if active else 0
            b = b.next
        segments.append(seg)
    return sorted(segments, key=lambda s: s["address"])
