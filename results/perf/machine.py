"""What a speed figure under results/perf/ was measured on: the CPU, the cores this process may
use, the Python, numpy and torch versions, and a yardstick timed on the spot.

The machines these figures come from are shared and unlike each other. On 2026-12-02 the
commit the committed replay table was made at (d92d8e1) rebuilt its 405B-like traces in 17.3 s,
built the graph in 7.7 s and replayed it in 0.53 s, where that table, made on 2026-11-29, says
5.4, 1.87 and 0.138 s: the machine, not the code, was 3-4 x slower. The same machine ran the
yardstick in 1.72 s once and in 0.57-0.62 s an hour later. So a table says what its machine
was and how fast it ran then; compare two tables' seconds only with their yardsticks beside them.
"""

from __future__ import annotations

import os
import platform
import sys
import time

from prismbench.record import cpu_model

YARDSTICK_ADDITIONS = 10**7


def usable_cores() -> int:
    """Cores this process may run on (its affinity, which a container may narrow)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def yardstick_s(repeats: int = 3) -> float:
    """Seconds a pure-Python loop of YARDSTICK_ADDITIONS additions takes, best of `repeats`."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        total = 0
        for i in range(YARDSTICK_ADDITIONS):
            total += i
        best = min(best, time.perf_counter() - start)
    return best


def machine_line() -> str:
    """One sentence for a table's header: CPU, cores, versions and the yardstick's time."""
    versions = [f"Python {platform.python_version()}"]
    for name in ("numpy", "torch"):
        module = sys.modules.get(name)
        if module is not None:
            versions.append(f"{name} {module.__version__}")
    return (
        f"Machine: {cpu_model()} ({platform.machine()}), {usable_cores()} cores, "
        f"{', '.join(versions)}; yardstick: {YARDSTICK_ADDITIONS:.0e} pure-Python additions in "
        f"{yardstick_s():.2f} s (best of 3, `results/perf/machine.py`)."
    )
