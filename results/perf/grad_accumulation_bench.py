"""`prismbench capture` time as gradient-accumulation micro-batches grow; writes grad_accumulation.md.

    python results/perf/grad_accumulation_bench.py [--micro-batches 16 64 256 1024] [--out FILE]

A data-parallel job without a pipeline runs its micro-batches one after another, and capture
collects reference cycles before each one (emulator.capture.rank's
`garbage_collected_at_micro_batches`, which keeps the trace deterministic), so whatever the
collector scans grows with every micro-batch captured. Each point is gpt-debug (seq 128,
micro-batch 1, dp 1) with that many micro-batches, captured by the CLI as a user runs it
(`prismbench capture JOB --out DIR`, a fresh process and an empty cache); the figures are the
capture's own wall time (`wall_s` of the summary.json it writes) and its events. Wall-clock
seconds on this machine. `grad_accumulation_aab4cfd.md` is the same at aab4cfd (this script
copied into a worktree of that commit), before 095e54e kept the recorder's events untracked by
the collector and b52c9ae its ledger of injected copies (1 024 micro-batches: 99.5 s at
aab4cfd, 16.4 s at 095e54e, 13.4-13.8 s since). Measured through the command, not `capture_rank` alone: in a bare interpreter
the same 256-micro-batch capture took 3.1 s before 095e54e and 3.0 s after, the command's
7.7-9.1 s and 4.1 s; the collector's cost depends on the heap around what it scans.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from shared_gpu import ROOT, command_line, commit_label  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # results/perf/: machine
from machine import machine_line  # noqa: E402

OUT = Path(__file__).resolve().parent / "grad_accumulation.md"


def measure(micro_batches: int) -> tuple[int, float]:
    """(trace events, capture seconds) of `prismbench capture` at `micro_batches`."""
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "job.toml"
        job.write_text(
            '[model]\nname = "gpt-debug"\n'
            f"[batch]\nseq_len = 128\nmicro_batch = 1\nglobal_batch = {micro_batches}\n"
        )
        out = Path(tmp) / "out"
        subprocess.run(
            [sys.executable, "-m", "prismbench", "capture", str(job), "--out", str(out)],
            cwd=ROOT, env=os.environ | {"PRISMBENCH_CACHE": str(Path(tmp) / "cache")},
            check=True, capture_output=True,
        )  # fmt: skip
        summary = json.loads((out / "summary.json").read_text())
    return summary["classes"]["0"]["events"], summary["wall_s"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro-batches", type=int, nargs="+", default=[16, 64, 256, 1024])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if any(n < 1 for n in args.micro_batches):
        parser.error("--micro-batches: every count must be at least 1")
    lines = [
        "# Capture time vs gradient-accumulation micro-batches",
        "",
        f"Measured by `{command_line('results/perf/grad_accumulation_bench.py', argv)}` "
        f"at commit {commit_label()}, {time.strftime('%Y-%m-%d')}. The method is in the "
        f"script's docstring. {machine_line()}",
        "",
        "| micro-batches | trace events | capture | per micro-batch |",
        "|--:|--:|--:|--:|",
    ]
    for n in args.micro_batches:
        events, seconds = measure(n)
        lines.append(f"| {n} | {events:,} | {seconds:.1f} s | {seconds / n * 1e3:.1f} ms |")
        print(lines[-1], flush=True)
    args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
