"""One rank's capture time as gradient-accumulation micro-batches grow; writes grad_accumulation.md.

    python results/perf/grad_accumulation_bench.py [--micro-batches 16 64 256 1024] [--out FILE]

A data-parallel job without a pipeline runs its micro-batches one after another, and capture
collects reference cycles before each one (emulator.capture.rank's
`garbage_collected_at_micro_batches`, which keeps the trace deterministic). Each point is
gpt-debug (seq 128, micro-batch 1, dp 1) with that many micro-batches, captured once in this
process with micro-batches reused (the default); the time Python's cycle collector took inside
it is summed from `gc.callbacks`. Wall-clock seconds on this machine; the first point is run
twice and its first run dropped (imports, torch's caches).
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import sys
import time
from pathlib import Path

from emulator.capture.rank import capture_rank
from prismbench.program import rank_program
from prismbench.spec import job_spec_from_dict

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from shared_gpu import command_line, commit_label  # noqa: E402

OUT = Path(__file__).resolve().parent / "grad_accumulation.md"


class CollectorClock:
    """Seconds spent in Python's cycle collector while installed (a gc.callbacks entry)."""

    def __init__(self) -> None:
        self.seconds, self._started = 0.0, 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started


def measure(micro_batches: int) -> tuple[int, float, float]:
    """(trace events, capture seconds, of which cycle collection seconds)."""
    job = job_spec_from_dict({
        "model": {"name": "gpt-debug"},
        "batch": {"seq_len": 128, "micro_batch": 1, "global_batch": micro_batches},
    })  # fmt: skip
    clock = CollectorClock()
    gc.callbacks.append(clock)
    try:
        started = time.perf_counter()
        trace = capture_rank(0, job.world_size, rank_program(job))
        seconds = time.perf_counter() - started
    finally:
        gc.callbacks.remove(clock)
    return len(trace.columns["seq"]), seconds, clock.seconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro-batches", type=int, nargs="+", default=[16, 64, 256, 1024])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if any(n < 1 for n in args.micro_batches):
        parser.error("--micro-batches: every count must be at least 1")
    measure(args.micro_batches[0])
    lines = [
        "# Capture time vs gradient-accumulation micro-batches",
        "",
        f"Measured by `{command_line('results/perf/grad_accumulation_bench.py', argv)}` on "
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"at commit {commit_label()}, {time.strftime('%Y-%m-%d')}. The method is in the "
        "script's docstring.",
        "",
        "| micro-batches | trace events | capture | of which cycle collection | share |",
        "|--:|--:|--:|--:|--:|",
    ]
    for n in args.micro_batches:
        events, seconds, collecting = measure(n)
        lines.append(
            f"| {n} | {events:,} | {seconds:.1f} s | {collecting:.2f} s "
            f"| {collecting / seconds:.0%} |"
        )
        print(lines[-1], flush=True)
    args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
