"""Exports of a memory replay: a timeline PNG and a torch.cuda.memory._snapshot()-style pickle.

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
from emulator.memory.replay import MemoryResult, _replay

_MAX_POINTS = 4000  # timeline points plotted (events are binned beyond this)


def plot_timeline(result: MemoryResult, path: str | Path, title: str = "") -> Path:
    """Allocated bytes stacked by category, and reserved, over the replayed events (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = result.timeline
    n = len(t.rows)
    picks = np.unique(np.linspace(0, max(n - 1, 0), min(n, _MAX_POINTS)).astype(np.int64))
    stacks, labels = [], []
    for code in np.unique(t.category):
        mine = t.category == code
        delta = np.zeros(n + 1, np.int64)
        np.add.at(delta, t.alloc_event[mine], t.block_bytes[mine])
        np.add.at(delta, t.free_event[mine], -t.block_bytes[mine])
        stacks.append(np.cumsum(delta[:n])[picks] / 2**30)
        labels.append(t.categories[code] or "other")
    fig, ax = plt.subplots(figsize=(10, 4.5))
    if stacks:
        ax.stackplot(picks, *stacks, labels=labels, alpha=0.8)
    ax.plot(picks, t.reserved[picks] / 2**30, color="black", lw=1.2, label="reserved")
    if result.peak is not None:
        ax.axvline(result.peak.event_index, color="red", ls=":", lw=1, label="allocated peak")
    if result.gpu_capacity_bytes:
        ax.axhline(result.gpu_capacity_bytes / 2**30, color="gray", ls="--", lw=1, label=result.gpu)
    ax.set_xlabel("alloc/free event")
    ax.set_ylabel("GiB")
    ax.set_title(title or "memory timeline (allocated by category, reserved)")
    ax.legend(loc="upper left", fontsize=7, ncol=2)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def snapshot(trace: RankTrace, **replay_kwargs) -> dict:
    """Replay `trace` (same keywords as replay_memory) and return the allocator's final state
    and event history in torch.cuda.memory._snapshot()'s format."""
    kw = {
        "gpu": None,
        "alloc_conf": "",
        "memory_fraction": None,
        "cublas_workspace": True,
        "outside": None,
    }
    unknown = set(replay_kwargs) - set(kw)
    if unknown:
        raise TypeError(f"snapshot() got unknown keywords {sorted(unknown)}; known: {sorted(kw)}")
    kw |= replay_kwargs
    _, allocator = _replay(
        trace, kw["gpu"], kw["alloc_conf"], kw["memory_fraction"], None, 10,
        kw["cublas_workspace"], kw["outside"], history=True,
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
