"""Does the host figure need to know the op? Profiled host time per class, measured against the
leave-one-out figures a prediction would use.

    python results/calibration/host_per_op.py [--out FILE]      (from the repository root; ~5 s)

For each shared H100 profile (../shared/data/gpu/h100-sxm-80g/profiles, one profiled iteration
each) and class (forward, backward, optimizer; `prismbench.host_timing`): the launching ops,
their kernel time, and their host time as profiled (the intervals from one launching op to the
next, phase entries left out, not divided by the profiler's inflation, which scales every
column alike), against the same ops priced two ways from the OTHER seven profiles:
- class mean: each op at the median over profiles of their mean interval in that class (the
  rule `emulator.costs.host_dispatch` uses);
- per op: each op at the median over profiles of their mean interval for that op name in that
  class, the class mean where no other profile launches it (coverage: the ops that had one).
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "results"))
from shared_gpu import SHARED, command_line, report  # noqa: E402

from emulator.costs.host_dispatch import CLASSES  # noqa: E402


def intervals(gaps) -> dict[tuple[str, str], list[float]]:
    """(class, op) -> the host intervals (us) of its launches, phase entries left out."""
    found = collections.defaultdict(list)
    for i, gap in enumerate(np.diff(gaps.start_us)):
        if gaps.classes[i] == gaps.classes[i + 1]:
            found[(gaps.classes[i], gaps.ops[i])].append(float(gap))
    return found


def kernels_ms(gaps) -> dict[str, float]:
    """Class -> the kernel time (ms) its launches ran."""
    return {c: 1e-3 * sum(k for k, cl in zip(gaps.kernel_us, gaps.classes, strict=True) if cl == c)
            for c in CLASSES}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the markdown report here")
    args = parser.parse_args(argv)
    from prismbench.host_timing import read_launch_gaps

    profiled = {p.name.split(".ops.")[0]: read_launch_gaps(p)
                for p in sorted((SHARED / "profiles").glob("*.ops.jsonl.gz"))}  # fmt: skip
    found = {case: intervals(gaps) for case, gaps in profiled.items()}
    lines = [
        "| job | class | launching ops | kernels (ms) | host, profiled (ms) | class mean (ms) "
        "| per op (ms) | per op coverage |",
        "|---|---|--:|--:|--:|--:|--:|--:|",
    ]
    for case, own in found.items():
        others = [found[c] for c in found if c != case]
        kernels = kernels_ms(profiled[case])
        for cls in CLASSES:
            mine = {op: v for (c, op), v in own.items() if c == cls}
            if not mine:
                continue
            class_mean = statistics.median(
                float(np.mean([g for (c, _), v in o.items() if c == cls for g in v]))
                for o in others if any(c == cls for c, _ in o)
            )  # fmt: skip
            per_op = {op: statistics.median(float(np.mean(o[(cls, op)])) for o in others if (cls, op) in o)
                      for op in mine if any((cls, op) in o for o in others)}  # fmt: skip
            launches = sum(len(v) for v in mine.values())
            covered = sum(len(v) for op, v in mine.items() if op in per_op)
            lines.append(
                f"| {case} | {cls} | {launches} | {kernels[cls]:.1f} "
                f"| {1e-3 * sum(sum(v) for v in mine.values()):.1f} "
                f"| {1e-3 * launches * class_mean:.1f} "
                f"| {1e-3 * sum(len(v) * per_op.get(op, class_mean) for op, v in mine.items()):.1f} "
                f"| {covered / launches:.0%} |"
            )
    report(command_line("results/calibration/host_per_op.py", argv), lines, args.out)


if __name__ == "__main__":
    main()
