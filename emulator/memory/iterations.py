"""The iterations a real run goes through before the one it reports: the first, then steady.

A capture records one steady-state iteration: the model state is declared first (ALLOC rows
before the first op: parameters, buffers, gradient buffers, master weights, optimizer state),
then come the iteration's own allocations and frees. A training process differs twice:
- **first iteration**, from an empty allocator: the optimizer's state is created lazily, by
  its first `step()` (torch.optim.AdamW `_init_group` makes `exp_avg`, `exp_avg_sq` and
  `step` when a parameter has no state yet), so the storages of category LAZY_CATEGORIES
  are allocated at the iteration's first optimizer-phase row, not before the iteration;
- **steady iterations**: the same events again with the allocator's state carried over. An
  allocation the iteration never frees (a buffer made once on first use, the cuBLAS
  workspace of a handle) is made by the first iteration only and stays.

The allocator's segment set after the first iteration (shaped by where the optimizer state
landed) is what the steady iterations reuse; they repeat until it stops changing
(`replay.py`). This is what `summary.json` of the shared H100 measurements calls
`peak_first_iteration` (from an empty allocator) and `peak_steady` (after
`torch.cuda.reset_peak_memory_stats()` following warm-up iterations).
"""

from __future__ import annotations

import numpy as np

from emulator.capture.trace import PHASES, RankTrace

# Declared categories created by the optimizer's first step (prismbench.program declares
# the tensors a step creates under this name and those it finds, e.g. fp32 master copies,
# as "master_weights").
LAZY_CATEGORIES = ("optimizer_state",)
_OPTIMIZER = PHASES.index("optimizer")


def iteration_events(trace: RankTrace, events: dict) -> tuple[dict, dict]:
    """(the first iteration's events, one steady iteration's events) from the captured ones.

    `events` is the replay's event table (events.replay_events): per event its trace row,
    whether it frees, size, storage uid, stream and category code."""
    phase = trace.columns["phase"][events["rows"]]
    setup = phase < 0
    lazy_codes = [i for i, c in enumerate(events["categories"]) if c in LAZY_CATEGORIES]
    lazy = setup & np.isin(events["category"], lazy_codes)
    in_iteration = np.flatnonzero(~setup)
    optimizer = in_iteration[phase[in_iteration] == _OPTIMIZER]
    at = optimizer[0] if len(optimizer) else len(phase)
    before, after = in_iteration[in_iteration < at], in_iteration[in_iteration >= at]
    first = np.concatenate([np.flatnonzero(setup & ~lazy), before, np.flatnonzero(lazy), after])
    steady = in_iteration[~_kept(events, in_iteration)]
    return take_events(events, first), take_events(events, steady)


def _kept(events: dict, index: np.ndarray) -> np.ndarray:
    """Which of the events `index` allocate a storage that the same events never free."""
    is_free, uid = events["is_free"][index], events["uid"][index]
    freed = np.isin(uid, uid[is_free])
    return ~is_free & ~freed


def take_events(events: dict, index: np.ndarray) -> dict:
    """The events at `index` (every column cut alike; the category names kept)."""
    return {k: (v[index] if isinstance(v, np.ndarray) else v) for k, v in events.items()}
