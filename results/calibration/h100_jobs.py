"""Predicted vs measured iteration time of the eight shared H100 jobs (world size 1).

    python results/calibration/h100_jobs.py [--only CASE] [--out FILE]

Measured: ../shared/data/gpu/h100-sxm-80g/summary.json `iteration_s_median` (eight timed
iterations after three warm-up ones, H100 80GB HBM3, torch 2.11 / CUDA 13, workloads at
86a4f47). Predicted: `prismbench.emulate.emulate` of specs/<case>.toml (capture cached), priced
with results/kernels/h100-sxm-80g.csv LEAVE-ONE-OUT: the rows ingested from the case's own
profile (source `profile:<case>`) are left out of the table that predicts it, and the host
dispatch figures (results/kernels/host-dispatch.json, `emulator.costs.host_dispatch`) are taken
without the case's own profile (per-op intervals and profiler inflation). Error =
(predicted - measured) / measured. "no host" is the same prediction with the host binding
nothing (kernels back to back), the model before host dispatch. "priced by" counts the compute
ops of one iteration by how the table priced them (exact shape, interpolated, roofline curves).
Progress goes to stderr, the table to stdout.
"""

from __future__ import annotations

import dataclasses
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # this checkout's packages, not an installed copy
sys.path.insert(0, str(ROOT / "results"))
from shared_h100 import SHARED, cases_from_cli, leave_one_out_table  # noqa: E402


def without_host_s(priced) -> float:
    """The iteration time of the same priced job with the host binding nothing."""
    from emulator.graph.build import build_graph
    from emulator.graph.replay import replay

    cost = dataclasses.replace(priced.cost, host=None)
    capture = priced.capture
    graph = build_graph(capture.traces, capture.world, cost, durations_s=priced.durations_s)
    return replay(graph).iteration_time_s


def main() -> None:
    from prismbench.emulate import emulate, host_dispatch_for, price_job
    from prismbench.spec import load_job_spec

    cases, measured, out = cases_from_cli(__doc__.splitlines()[0])
    lines = [
        "| case | predicted (s) | measured (s) | error | no host (s) | no-host error "
        "| priced by: exact / interpolated / roofline |",
        "|---|--:|--:|--:|--:|--:|--:|",
    ]
    errors, before = [], []
    for i, case in enumerate(cases, 1):
        print(f"[{i}/{len(cases)}] {case}", file=sys.stderr, flush=True)
        table = leave_one_out_table(case)
        job = load_job_spec(SHARED / "specs" / f"{case}.toml")
        host = host_dispatch_for(job, skip_profiles=(case,))
        priced = price_job(job, kernel_table=table, host_dispatch=host)
        result = emulate(job, name=case, priced=priced)
        by = result.compute_priced_by
        real = measured[case]["iteration_s_median"]
        errors.append(100 * (result.iteration_time_s - real) / real)
        no_host = without_host_s(priced)
        before.append(100 * (no_host - real) / real)
        lines.append(
            f"| {case} | {result.iteration_time_s:.4f} | {real:.4f} | {errors[-1]:+.1f} % "
            f"| {no_host:.4f} | {before[-1]:+.1f} % | "
            + " / ".join(f"{int(by[s]['ops'])}" for s in ("exact", "interpolated", "roofline"))
            + " |"
        )
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()  # fmt: skip
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()  # fmt: skip
    commit += "-dirty" if dirty else ""
    absolute = [abs(e) for e in errors]
    lines.append("")
    lines.append(f"median |error| {statistics.median(absolute):.1f} %, max {max(absolute):.1f} %; "
                 f"no host: median {statistics.median(abs(e) for e in before):.1f} %, "
                 f"max {max(abs(e) for e in before):.1f} % (commit {commit})")  # fmt: skip
    text = "\n".join(lines)
    print(text)
    if out:
        out.write_text(text + "\n")


if __name__ == "__main__":
    main()
