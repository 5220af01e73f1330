"""Host time per launching op or per aten call: which predicts a profile's host time better.

    python results/calibration/host_per_call.py [--out FILE]      (from the repository root; ~1 s)

Reads `results/kernels/host-dispatch.json` (`results/kernels/build_host_dispatch.py`): for each
of the eight shared H100 profiles and class (forward, backward, optimizer), the host intervals
between its launching ops that its capture matched, their sum, and the aten calls the capture
dispatched in them (`prismbench.host_timing.call_intervals`). Each profile's host time per class
is predicted LEAVE-ONE-OUT from the other seven, two ways: its intervals x the median over the
others of their mean interval (one figure per launching op, the rule before per-call figures),
and its calls x the median over the others of their host time per call (the rule
`emulator.costs.host_dispatch` applies to plain tensors). The profiler's inflation scales both
alike, so it is left in. Error: ln(predicted / profiled).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "results"))
from shared_gpu import command_line, report  # noqa: E402

DISPATCH = ROOT / "results" / "kernels" / "host-dispatch.json"
CLASSES = ("forward", "backward", "optimizer")


def loo_rows(per_call: dict[str, dict]) -> list[dict]:
    """Per profile and class: profiled host time (ms), the two leave-one-out predictions (ms)
    and their ln errors; `per_call`: profile -> class -> call_intervals' figures."""
    rows = []
    for cls in CLASSES:
        measured = {p: f[cls] for p, f in per_call.items() if f[cls]["intervals"]}
        for profile, own in measured.items():
            others = [f for p, f in measured.items() if p != profile]
            per_launch = statistics.median(f["sum_us"] / f["intervals"] for f in others)
            per_call_us = statistics.median(f["sum_us"] / f["calls"] for f in others)
            by_launch, by_call = own["intervals"] * per_launch, own["calls"] * per_call_us
            rows.append({
                "profile": profile, "class": cls, "profiled_ms": own["sum_us"] / 1e3,
                "launches": own["intervals"], "calls": own["calls"],
                "per_launch_ms": by_launch / 1e3, "per_call_ms": by_call / 1e3,
                "per_launch_ln": math.log(by_launch / own["sum_us"]),
                "per_call_ln": math.log(by_call / own["sum_us"]),
            })  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the markdown report here")
    args = parser.parse_args(argv)
    data = json.loads(DISPATCH.read_text())
    per_call = {p: f["per_call"] for p, f in data["profiles"].items() if f["framework"] == "aten"}
    rows = loo_rows(per_call)
    lines = [
        "| profile | class | launching ops | calls | profiled (ms) | per launch, LOO (ms) "
        "| ln error | per call, LOO (ms) | ln error |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['profile']} | {r['class']} | {r['launches']} | {r['calls']} "
            f"| {r['profiled_ms']:.1f} | {r['per_launch_ms']:.1f} | {r['per_launch_ln']:+.3f} "
            f"| {r['per_call_ms']:.1f} | {r['per_call_ln']:+.3f} |"
        )
    lines += ["", "| class | per launch: median / max abs ln error | per call |", "|---|--:|--:|"]
    for cls in CLASSES:
        mine = [r for r in rows if r["class"] == cls]
        cells = []
        for key in ("per_launch_ln", "per_call_ln"):
            errors = [abs(r[key]) for r in mine]
            cells.append(f"{statistics.median(errors):.3f} / {max(errors):.3f}")
        lines.append(f"| {cls} | " + " | ".join(cells) + " |")
    report(command_line("results/calibration/host_per_call.py", argv), lines, args.out)


if __name__ == "__main__":
    main()
