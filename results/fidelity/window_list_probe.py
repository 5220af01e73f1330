"""What keeping every busy window of comm would change in the replay (a diagnosis).

    PRISMBENCH_CACHE=DIR python results/fidelity/window_list_probe.py r046 r045 r043 ...

The replay (emulator/graph/replay.py) keeps one busy window of comm per rank, the latest: a
comm call replayed after the window opened that had ended before it is left out, and a
segment of compute that started before the window loses its overlap with earlier ones. This
script replays each named published baseline (a substring of its file name) twice: as
`emulate` does, and with a replay that keeps every window (a sorted list of disjoint
[start, end, bytes] intervals, overlapping calls merged) and walks a segment through all of
them, at full speed in the gaps and slowed by each window's own traffic inside it. It prints
both iteration times. Uniform replays only (no per-rank speed factors): that is what
`emulate` runs, and one list per rank is then one list. Nothing here changes a prediction.
Captures come from the capture cache (run `validate` or `emulate` first).
"""

from __future__ import annotations

import argparse
from contextlib import contextmanager
from pathlib import Path

import emulator.graph.replay as replay_module
from emulator.graph.build import build_graph
from prismbench.baselines import load_baselines
from prismbench.emulate import price_job

BASELINES = Path(__file__).resolve().parents[2] / "results" / "baselines"


def _extend_all(self, start, end, nbytes) -> None:
    merged, kept = [start, end, nbytes], []
    for window in getattr(self, "windows", []):
        if window[1] < merged[0] or window[0] > merged[1]:
            kept.append(window)
        else:
            merged = [min(window[0], merged[0]), max(window[1], merged[1]),
                      window[2] + merged[2]]  # fmt: skip
    self.windows = sorted([*kept, merged])
    self.busy = max(self.busy, end)


def _beside_all(self, d, start, slowdown, slope):
    t, left = start, d
    for window_start, window_end, nbytes in self.windows:
        if window_end <= t:
            continue
        if window_start > t:  # a gap: full speed
            if left <= window_start - t:
                return t + left - start
            left -= window_start - t
            t = window_start
        span = window_end - window_start
        s = slowdown + (slope * nbytes / span if span > 0 else 0.0)
        if left * s <= window_end - t:
            return t + left * s - start
        left -= (window_end - t) / s
        t = window_end
    return t + left - start


@contextmanager
def every_window():
    """The replay's window rules swapped for the list of windows while inside."""
    cls = replay_module._Class
    saved = cls._extend_window, cls._beside_comm
    cls._extend_window, cls._beside_comm = _extend_all, _beside_all
    try:
        yield
    finally:
        cls._extend_window, cls._beside_comm = saved


def main(names: list[str]) -> None:
    baselines = load_baselines(BASELINES)
    print("| baseline | latest window (s) | every window (s) | change |")
    print("|---|--:|--:|--:|")
    for name in names:
        (baseline,) = [b for b in baselines if name in b.name]
        priced = price_job(baseline.job)
        graph = build_graph(priced.capture.traces, priced.capture.world, priced.cost,
                            durations_s=priced.durations_s)  # fmt: skip
        latest = replay_module.replay(graph)
        if not latest.uniform:
            raise SystemExit(f"{baseline.name}: not a uniform replay")
        with every_window():
            every = replay_module.replay(graph)
        a, b = latest.iteration_time_s, every.iteration_time_s
        print(f"| {baseline.name} | {a:.6f} | {b:.6f} | {100 * (b - a) / a:+.4f} % |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="+", metavar="BASELINE",
                        help="a substring of a published baseline's file name, e.g. r046")  # fmt: skip
    main(parser.parse_args().names)
