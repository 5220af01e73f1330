"""The event table a memory replay walks: a trace's alloc/free rows plus cuBLAS workspaces.

Per event: its trace row, whether it frees, size, storage uid (workspaces get uids -2, -3,
...), stream and category code (into `categories`: the trace's strings plus
WORKSPACE_CATEGORY). emulator.memory.iterations cuts it into a first and a steady iteration.
"""

from __future__ import annotations

import numpy as np

from emulator.capture.trace import ALLOC, COMPUTE, FREE, PHASES, RankTrace

WORKSPACE_CATEGORY = "cublas_workspace"
_MATMULS = ("mm", "addmm", "bmm", "linear", "scaled_mm")
_BACKWARD_PHASES = (PHASES.index("backward"), PHASES.index("recompute"))


def replay_events(trace: RankTrace, workspace_bytes: int) -> dict:
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
