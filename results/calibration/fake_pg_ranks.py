"""Predicted vs measured iteration time of one rank of the shared fake-process-group jobs.

    python results/calibration/fake_pg_ranks.py [--out FILE]

Measured: ../shared/data/gpu/h100-sxm-80g/fake-pg-ranks/results.json `iteration_s_median`: rank 0
of each job on one H100 with torch's `fake` process-group backend (no communication happens),
eight timed iterations, workloads at 86a4f47. Predicted: the job's capture priced with the
committed H100 kernel table, every collective and p2p call free (`comm_durations=False`: the
fake backend moves nothing), with the host dispatch model (`emulator.costs.host_dispatch`,
framework `dtensor` for tp > 1, `aten` otherwise) and without it ("no host"). "LOO": the host
figures without the job's own host profile (per-op intervals and profiler inflation), where
one exists. Error = (predicted - measured) / measured. Progress on stderr, the table on stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # this checkout's packages, not an installed copy
sys.path.insert(0, str(ROOT / "results"))
from shared_gpu import SHARED, command_line, report  # noqa: E402

FAKE = SHARED / "fake-pg-ranks"


def rank_time_s(priced, host) -> float:
    """One iteration of the priced job's rank with free communication and `host` dispatch."""
    from emulator.graph.build import build_graph
    from emulator.graph.replay import replay

    cost = dataclasses.replace(priced.cost, host=host)
    capture = priced.capture
    graph = build_graph(
        capture.traces, capture.world, cost, durations_s=priced.durations_s, comm_durations=False
    )
    return replay(graph).iteration_time_s


def main() -> None:
    from prismbench.emulate import host_dispatch_for, price_job
    from prismbench.spec import load_job_spec

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the markdown table here")
    out = parser.parse_args().out
    measured = json.loads((FAKE / "results.json").read_text())
    cases = [c for c, e in measured.items() if isinstance(e, dict)]
    lines = [
        "| case | measured (s) | no host (s) | error | host (s) | error | host, LOO (s) | error |",
        "|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for i, case in enumerate(cases, 1):
        print(f"[{i}/{len(cases)}] {case}", file=sys.stderr, flush=True)
        job = load_job_spec(FAKE / f"{case}.toml")
        priced = price_job(job, host_dispatch=None)
        real = measured[case]["iteration_s_median"]
        times = [
            rank_time_s(priced, None),
            rank_time_s(priced, host_dispatch_for(job)),
            rank_time_s(priced, host_dispatch_for(job, skip_profiles=(case,))),
        ]
        cells = " | ".join(f"{t:.4f} | {100 * (t - real) / real:+.1f} %" for t in times)
        lines.append(f"| {case} | {real:.4f} | {cells} |")
    report(command_line("results/calibration/fake_pg_ranks.py", None), lines, out)


if __name__ == "__main__":
    main()
