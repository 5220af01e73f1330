"""The host dispatch model alone: measured kernels + modelled host vs the measured iteration.

    python results/calibration/host_dispatch_check.py [--out FILE]      (a few seconds)

For every shared profile (the eight H100 jobs, `aten`; the two fake-pg tensor-parallel ranks,
`dtensor`), its launching ops in host order with their *measured* kernel times run through the
launch-queue rule of `emulator.costs.host_dispatch` (one stream: a kernel starts once issued and
once the previous one ended), issued at the model's host figures for their class
(`host_dispatch.from_figures`, LEAVE-ONE-OUT: the profile's own intervals and inflation left
out). Nothing here is priced by the kernel table, so the error is the host model's (and the
profiled iteration's kernels standing for the timed ones). Measured: summary.json /
fake-pg-ranks/results.json `iteration_s_median` (unprofiled). "kernels only": the sum of the
measured kernel times (the GPU never waits). "+ gap": each op's kernels also pay the stream's
idle time before each of them (`host_dispatch.kernel_gap_from_figures`, leave-one-out too), as
the emulator prices them since eb7471b. Error = (predicted - measured) / measured.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "results"))
from shared_gpu import SHARED, command_line, report  # noqa: E402

DISPATCH = ROOT / "results" / "kernels" / "host-dispatch.json"


def launch_queue_s(classes: list[str], kernel_us: np.ndarray, host) -> float:
    """End of one stream fed by one host thread at `host`'s figures (seconds)."""
    per_op = np.array([host.per_op_s[c] for c in classes])
    entry = np.array([host.entry_s[c] for c in classes])
    starts = np.r_[False, np.array(classes[1:]) != np.array(classes[:-1])]
    issued = np.cumsum(np.where(starts, entry, per_op))
    gpu = 0.0
    for t, k in zip(issued.tolist(), (kernel_us * 1e-6).tolist(), strict=True):
        gpu = max(gpu, t) + k
    return gpu


def main() -> None:
    from emulator.costs.host_dispatch import from_figures, kernel_gap_from_figures
    from prismbench.host_timing import read_launch_gaps

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the markdown table here")
    out = parser.parse_args().out
    data = json.loads(DISPATCH.read_text())
    measured = json.loads((SHARED / "summary.json").read_text())
    fake = json.loads((SHARED / "fake-pg-ranks" / "results.json").read_text())
    measured |= {c: e for c, e in fake.items() if isinstance(e, dict)}
    lines = [
        "| profile | framework | ops | measured (s) | kernels only (s) | error "
        "| kernels + host, LOO (s) | error | kernels + gap + host, LOO (s) | error |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    errors, before, with_gap = [], [], []
    for case, profile in data["profiles"].items():
        gaps = read_launch_gaps(SHARED.parents[2] / profile["file"])
        host = from_figures(data, profile["framework"], skip_profiles=(case,))
        real = measured[case]["iteration_s_median"]
        kernels = float(gaps.kernel_us.sum()) * 1e-6
        predicted = launch_queue_s(gaps.classes, gaps.kernel_us, host)
        gap_us = kernel_gap_from_figures(data, skip_profiles=(case,)) * 1e6
        gapped = launch_queue_s(gaps.classes, gaps.kernel_us + gaps.kernel_count * gap_us, host)
        before.append(100 * (kernels - real) / real)
        errors.append(100 * (predicted - real) / real)
        with_gap.append(100 * (gapped - real) / real)
        lines.append(
            f"| {case} | {profile['framework']} | {len(gaps.ops)} | {real:.4f} | {kernels:.4f} "
            f"| {before[-1]:+.1f} % | {predicted:.4f} | {errors[-1]:+.1f} % | {gapped:.4f} "
            f"| {with_gap[-1]:+.1f} % |"
        )
    lines.append("")
    lines.append(
        f"median |error| kernels only {statistics.median(abs(e) for e in before):.1f} % "
        f"(max {max(abs(e) for e in before):.1f} %), kernels + host "
        f"{statistics.median(abs(e) for e in errors):.1f} % (max {max(abs(e) for e in errors):.1f} %), "
        f"kernels + gap + host {statistics.median(abs(e) for e in with_gap):.1f} % "
        f"(max {max(abs(e) for e in with_gap):.1f} %)"
    )
    report(command_line("results/calibration/host_dispatch_check.py", None), lines, out)


if __name__ == "__main__":
    main()
