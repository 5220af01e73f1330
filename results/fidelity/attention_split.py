"""Which part of a source's predicted iteration is off: attention (or all tensor-core work) or the rest (a diagnosis).

    python results/fidelity/attention_split.py DB [--source llmfoundry] [--split attention|tensor-core]
                                               [--run RUN_ID] [--out FILE]

For every row of `--source` in the DB's latest complete `validate` run (or run RUN_ID): the job's compute priced
as `emulate` prices it (class 0's trace), split into the part's kernels (`--split attention`:
flash_attn_fwd/bwd; `tensor-core`: those and every GEMM) and everything else, the predicted
iteration time the run stored, and the measured one. Then, per GPU and precision, the two
factors (rest, part) that scale the prediction's parts to the measurements best, in the
least-squares sense on relative error:

    measured ~ f_rest * (predicted - part) + f_part * part

with each fit's residuals. This is a diagnosis, not a calibration: nothing here is applied to a
prediction, and a factor far from 1 says where a model is wrong, not by how much it should be
corrected. Captures come from the capture cache (run `validate` first; PRISMBENCH_CACHE as it
used).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tomllib
from collections import defaultdict
from pathlib import Path

import duckdb
import numpy as np

from emulator.costs.ops import ATTENTION_OPS, GEMM_OPS

ROOT = Path(__file__).resolve().parents[2]
BASELINES = ROOT / "results" / "baselines"
PARTS = {"attention": ATTENTION_OPS, "tensor-core": (*ATTENTION_OPS, *GEMM_OPS)}


def run_rows(db: str, source: str, run_id: str | None) -> tuple[str, dict[str, float]]:
    con = duckdb.connect(db, read_only=True)
    if run_id is None:
        (run_id,) = con.execute(
            "SELECT run_id FROM runs WHERE status = 'complete' ORDER BY ended_at DESC LIMIT 1"
        ).fetchone()
    rows = con.execute(
        "SELECT baseline, predicted FROM metric_results WHERE run_id = ? "
        "AND metric = 'iteration_time_s' AND baseline LIKE ?",
        [run_id, f"{source}__%"],
    ).fetchall()
    return run_id, dict(rows)


def part_seconds(job, kernels=ATTENTION_OPS) -> float:
    """Predicted time of class 0's iteration in the `kernels` named (op names of the trace)."""
    from emulator.costs.pricing import compute_prices
    from prismbench.capture import capture_job
    from prismbench.emulate import cost_context

    traces = capture_job(job).traces
    trace = traces[min(traces)]
    times, _ = compute_prices(trace, cost_context(job, "preset"))
    names = np.array(trace.strings)[trace.columns["name"]]
    return float(times[np.isin(names, kernels)].sum())


def fit(rows: list[dict]) -> tuple[float, float, list[float]]:
    parts = np.array([[r["predicted_s"] - r["part_s"], r["part_s"]] for r in rows])
    measured = np.array([r["measured_s"] for r in rows])
    (rest, part), *_ = np.linalg.lstsq(parts / measured[:, None], np.ones(len(rows)), rcond=None)
    residuals = (parts @ [rest, part] - measured) / measured
    return float(rest), float(part), [float(x) for x in residuals]


def held_out(rows: list[dict], precision: str) -> list[str]:
    """Report lines: the factors fitted on `precision`'s rows, applied to every other row
    without context or pipeline parallelism."""
    fitted = [r for r in rows if r["group"][1] == precision]
    rest, part, _ = fit(fitted)
    lines = [
        "",
        f"Fitted on the {len(fitted)} {precision} rows alone (f_rest {rest:.3f}, f_part "
        f"{part:.3f}), applied to the other rows without context or pipeline parallelism:",
        "",
        "| row | precision | error now | with those factors |",
        "|---|---|--:|--:|",
    ]
    for r in rows:
        if r["group"][1] == precision or not r["plain"]:
            continue
        scaled = rest * (r["predicted_s"] - r["part_s"]) + part * r["part_s"]
        lines.append(
            f"| {r['name']} | {r['group'][1]} | {100 * (r['predicted_s'] / r['measured_s'] - 1):+.1f} % "
            f"| {100 * (scaled / r['measured_s'] - 1):+.1f} % |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("db")
    parser.add_argument("--source", default="llmfoundry")
    parser.add_argument("--split", choices=sorted(PARTS), default="attention")
    parser.add_argument("--run", help="a run id (default: the latest complete run)")
    parser.add_argument(
        "--held-out-from",
        metavar="PRECISION",
        help="also score the other rows (those without context or pipeline parallelism) with "
        "the factors fitted on this precision's rows alone: a check of the split out of sample",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from prismbench.spec import job_spec_from_dict

    run_id, predicted = run_rows(args.db, args.source, args.run)
    rows = []
    for i, (name, predicted_s) in enumerate(sorted(predicted.items()), 1):
        print(f"[{i}/{len(predicted)}] {name}", file=sys.stderr, flush=True)
        spec = tomllib.loads((BASELINES / f"{name}.toml").read_text())
        job = job_spec_from_dict(spec["job"])
        rows.append(
            {
                "name": name,
                "group": (job.cluster.gpu, job.train.precision),
                "seq_len": job.batch.seq_len,
                "predicted_s": predicted_s,
                "measured_s": spec["measured"]["iteration_time_s"],
                "part_s": part_seconds(job, PARTS[args.split]),
                "plain": job.parallel.cp == 1 and job.parallel.pp == 1,
            }
        )
    groups = defaultdict(list)
    for row in rows:
        groups[row["group"]].append(row)
    lines = [
        f"Run {run_id}, source {args.source}: measured ~ f_rest * (predicted - {args.split}) "
        f"+ f_{args.split} * {args.split} (a diagnosis; nothing applied).",
        "",
        f"| GPU | precision | rows | f_rest | f_{args.split} | error now: median / max abs "
        "| residual of the fit: median / max abs |",
        "|---|---|--:|--:|--:|--:|--:|",
    ]
    for (gpu, precision), members in sorted(groups.items()):
        errors = [abs(r["predicted_s"] / r["measured_s"] - 1) for r in members]
        if len(members) < 3:
            lines.append(
                f"| {gpu} | {precision} | {len(members)} | - | - | "
                f"{100 * statistics.median(errors):.1f} / {100 * max(errors):.1f} % | - |"
            )
            continue
        rest, part, residuals = fit(members)
        absolute = [abs(x) for x in residuals]
        lines.append(
            f"| {gpu} | {precision} | {len(members)} | {rest:.3f} | {part:.3f} | "
            f"{100 * statistics.median(errors):.1f} / {100 * max(errors):.1f} % | "
            f"{100 * statistics.median(absolute):.1f} / {100 * max(absolute):.1f} % |"
        )
    lines += [
        "",
        f"| row | GPU | precision | seq | {args.split} share | error |",
        "|---|---|---|--:|--:|--:|",
    ]
    for row in sorted(rows, key=lambda r: r["predicted_s"] / r["measured_s"]):
        share = row["part_s"] / row["predicted_s"]
        error = row["predicted_s"] / row["measured_s"] - 1
        gpu, precision = row["group"]
        lines.append(
            f"| {row['name']} | {gpu} | {precision} | {row['seq_len']} | "
            f"{100 * share:.0f} % | {100 * error:+.1f} % |"
        )
    if args.held_out_from:
        lines += held_out(rows, args.held_out_from)
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
