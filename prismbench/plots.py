"""Figures drawn from emulation results (matplotlib, imported only when a figure is drawn).

`plot_memory_timeline(result, path)`: a memory replay's allocated bytes stacked by category
and its reserved bytes, over the replayed alloc/free events (PNG).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from emulator.memory.replay import MemoryResult

_MAX_POINTS = 4000  # timeline points plotted (events are binned beyond this)


def plot_memory_timeline(result: MemoryResult, path: str | Path, title: str = "") -> Path:
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
