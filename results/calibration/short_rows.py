"""How much of the eight shared jobs' compute the kernel table prices from short rows' rates.

    python results/calibration/short_rows.py [--gpu h100-sxm-80g|h200-141g] [--only CASE] [--out FILE]

Lookup step 2 (`emulator.costs.kernel_table`) prices a memory-bound op at the rate (bytes/s) of
the rows near it, scaled linearly with bytes. A row of a few microseconds is latency, not
bandwidth: its rate lent to an op half its size prices it at half the time, and to one twice
its size at twice. Per case, leave-one-out as `gpu_compare.py` (the table without the case's
own profile): the memory-bound ops whose every lending row ran under SHORT_ROW_S, their share
of the predicted compute, and their predicted against their measured kernel time (ops matched
to the profile op by op, `prismbench.profile_ingest.align_profile`).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "results"))
from shared_gpu import cases_from_cli, command_line, leave_one_out_table, report, shared_dir  # noqa: E402

# Rows shorter than this are taken as latency-bound (the shortest kernels of the tables run
# 1-4 us; 10 us is a round figure between them and the bandwidth-bound rows, not fitted).
SHORT_ROW_S = 10e-6


def lending_times(table, op) -> np.ndarray | None:
    """Times of the rows lookup step 2 prices a memory-bound `op` from; None where another
    step prices it (as `KernelTable.lookup` picks them: the first group with a row within a
    factor 2, its `NEIGHBOURS` nearest)."""
    from emulator.costs.kernel_table import NEIGHBOURS, lookup_keys, row_key

    target = np.array(row_key(op)[1])
    for i, key in enumerate(lookup_keys(op)):
        if key not in table.groups:
            continue
        features, _, _, _, times = table.groups[key]
        distance = np.max(np.abs(features - target), axis=1)
        if i == 0 and (distance == 0).any():
            return None
        near = np.flatnonzero(distance <= 1.0)
        if len(near):
            return times[near[np.argsort(distance[near], kind="stable")[:NEIGHBOURS]]]
    return None


def case_row(case: str, gpu: str) -> str:
    from emulator.costs.ops import ATTENTION_OPS, GEMM_OPS
    from emulator.costs.pricing import compute_prices, op_record
    from prismbench.capture import capture_job
    from prismbench.emulate import cost_context
    from prismbench.profile_ingest import align_profile
    from prismbench.profile_readers import read_profile
    from prismbench.spec import load_job_spec

    shared = shared_dir(gpu)
    job = load_job_spec(shared / "specs" / f"{case}.toml")
    table = leave_one_out_table(case, gpu)
    traces = capture_job(job).traces
    trace = traces[min(traces)]
    aligned = align_profile(read_profile(shared / "profiles" / f"{case}.ops.jsonl.gz"), trace)
    durations, _ = compute_prices(trace, cost_context(job, table, kernel_gap_s=0.0))
    measured: dict[int, float] = {}
    for i, j in aligned.pairs:
        measured[j] = measured.get(j, 0.0) + aligned.ops[i].kernel_us * 1e-6
    predicted, truth = [], []
    for j, row in enumerate(aligned.compute_rows):
        op = op_record(trace, row)
        if op.name in GEMM_OPS or op.name in ATTENTION_OPS or j not in measured:
            continue
        lending = lending_times(table, op)
        if lending is not None and lending.max() < SHORT_ROW_S:
            predicted.append(durations[row])
            truth.append(measured[j])
    p, m = np.array(predicted), np.array(truth)
    compute = durations[aligned.compute_rows].sum()
    median = f"{np.median(p / m):.2f}" if len(p) else "-"
    error = f"{100 * (p.sum() - m.sum()) / m.sum():+.1f} %" if len(p) else "-"
    return (f"| {case} | {compute * 1e3:.2f} | {len(p)} | {p.sum() * 1e3:.3f} "
            f"({100 * p.sum() / compute:.2f} %) | {m.sum() * 1e3:.3f} | {error} | {median} |")  # fmt: skip


def main() -> None:
    args, cases, _ = cases_from_cli(__doc__.splitlines()[0])
    lines = [
        f"Memory-bound ops priced from rows all under {SHORT_ROW_S * 1e6:.0f} us "
        f"({args.gpu}, leave-one-out):",
        "",
        "| case | compute ms | ops | their predicted ms (share) | measured ms | error | median per-op predicted / measured |",
        "|---|--:|--:|--:|--:|--:|--:|",
    ]
    for i, case in enumerate(cases, 1):
        print(f"[{i}/{len(cases)}] {case}", file=sys.stderr, flush=True)
        lines.append(case_row(case, args.gpu))
    report(command_line("results/calibration/short_rows.py", None), lines, args.out)


if __name__ == "__main__":
    main()
