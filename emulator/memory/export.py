"""Export of a memory replay: a torch.cuda.memory._snapshot()-style pickle.

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

from emulator.capture.trace import RankTrace
from emulator.memory.replay import _replay


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
