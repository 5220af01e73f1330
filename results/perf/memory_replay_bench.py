"""Replay speed of emulator.memory on a synthetic trace of N alloc/free events.

Run: python results/perf/memory_replay_bench.py [N]   (default 100000)
The trace mimics a training step: a stack of activations (sizes from 4 KiB to 64 MiB, large
ones dominating bytes) freed in reverse order, with short-lived temporaries in between.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from emulator.capture.trace import ALLOC, COLUMNS, FREE, RAGGED, RankTrace
from emulator.memory import replay_memory
from emulator.units import GiB


def synthetic_trace(n_events: int, seed: int = 0) -> RankTrace:
    rng = np.random.default_rng(seed)
    kinds, sizes, uids, live, next_uid = [], [], [], [], 0
    while len(kinds) < n_events:
        if live and (rng.random() < 0.45 or len(live) > 2000):
            uid, size = live.pop() if rng.random() < 0.7 else live.pop(rng.integers(len(live)))
            kinds.append(FREE)
        else:
            size = int(2 ** rng.uniform(12, 26))
            uid, next_uid = next_uid, next_uid + 1
            live.append((uid, size))
            kinds.append(ALLOC)
        sizes.append(size)
        uids.append(uid)
    n = len(kinds)
    cols = {k: np.zeros(n, dt) for k, dt in COLUMNS.items()}
    cols["seq"] = np.arange(n, dtype=np.int64)
    cols["kind"] = np.asarray(kinds, np.int8)
    cols["size_bytes"] = np.asarray(sizes, np.int64)
    cols["storage"] = np.asarray(uids, np.int64)
    cols["category"][:] = 1
    ragged = {k: np.zeros(1 if k.endswith("offsets") else 0, dt) for k, dt in RAGGED.items()}
    ragged["tensor_offsets"] = np.zeros(n + 1, np.int64)
    ragged["sizes_offsets"] = np.zeros(n + 1, np.int64)
    return RankTrace(columns=cols, ragged=ragged, strings=("", "activation"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("n", nargs="?", type=int, default=100_000, metavar="N",
                        help="alloc/free events (default: %(default)s)")  # fmt: skip
    n = parser.parse_args().n
    trace = synthetic_trace(n)
    for conf in ("", "expandable_segments:True"):
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            result = replay_memory(trace, gpu="h100-sxm-80g", alloc_conf=conf)
            best = min(best, time.perf_counter() - t0)
        print(
            f"{n} events, alloc_conf={conf!r}: best of 3 {best:.3f} s "
            f"({best / n * 1e6:.2f} us/event); peak allocated {result.peak_allocated_bytes / GiB:.2f} GiB, "
            f"reserved {result.peak_reserved_bytes / GiB:.2f} GiB"
        )


if __name__ == "__main__":
    main()
