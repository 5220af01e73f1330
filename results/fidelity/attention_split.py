"""Which part of a source's predicted iteration is off: attention, GEMMs, both, or the rest (a diagnosis).

    python results/fidelity/attention_split.py DB [--source llmfoundry]
        [--split attention|tensor-core|gemm-attention] [--held-out-from PRECISION]
        [--run RUN_ID] [--out FILE]

For every row of `--source` in the DB's latest complete `validate` run (or run RUN_ID): the job's compute priced
as `emulate` prices it (class 0's trace), split into parts (`--split attention`:
flash_attn_fwd/bwd; `tensor-core`: those and every GEMM as one part; `gemm-attention`: GEMMs
and attention as two parts) and everything else, the predicted iteration time the run stored,
and the measured one. Then, per GPU and precision, the factors (rest, each part) that scale
the prediction's parts to the measurements best, in the least-squares sense on relative error:

    measured ~ f_rest * (predicted - sum of parts) + sum of f_part * part

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
# split -> (part name, the trace's op names in it), ...
PARTS = {
    "attention": (("attention", ATTENTION_OPS),),
    "tensor-core": (("tensor-core", (*ATTENTION_OPS, *GEMM_OPS)),),
    "gemm-attention": (("gemm", GEMM_OPS), ("attention", ATTENTION_OPS)),
}


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


def part_seconds(job, parts=PARTS["attention"]) -> list[float]:
    """Predicted time of class 0's iteration in each part's kernels (op names of the trace)."""
    from emulator.costs.pricing import compute_prices
    from prismbench.capture import capture_job
    from prismbench.emulate import cost_context

    traces = capture_job(job).traces
    trace = traces[min(traces)]
    times, _ = compute_prices(trace, cost_context(job, "preset"))
    names = np.array(trace.strings)[trace.columns["name"]]
    return [float(times[np.isin(names, kernels)].sum()) for _, kernels in parts]


def _columns(row: dict) -> list[float]:
    """The row's predicted seconds as [rest, part, ...]."""
    return [row["predicted_s"] - sum(row["parts_s"]), *row["parts_s"]]


def fit(rows: list[dict]) -> tuple[float, list[float], list[float]]:
    """(f_rest, [f_part, ...], relative residuals) of the least-squares fit."""
    parts = np.array([_columns(r) for r in rows])
    measured = np.array([r["measured_s"] for r in rows])
    factors, *_ = np.linalg.lstsq(parts / measured[:, None], np.ones(len(rows)), rcond=None)
    residuals = (parts @ factors - measured) / measured
    return float(factors[0]), [float(f) for f in factors[1:]], [float(x) for x in residuals]


def _factors(rest: float, parts: list[float]) -> str:
    return " | ".join(f"{f:.3f}" for f in (rest, *parts))


def held_out(rows: list[dict], precision: str) -> list[str]:
    """Report lines: the factors fitted on `precision`'s rows, applied to every other row
    without context or pipeline parallelism."""
    fitted = [r for r in rows if r["group"][1] == precision]
    rest, factors, _ = fit(fitted)
    lines = [
        "",
        f"Fitted on the {len(fitted)} {precision} rows alone (f_rest, f_part...: "
        f"{_factors(rest, factors).replace(' |', ',')}), applied to the other rows without "
        "context or pipeline parallelism:",
        "",
        "| row | precision | error now | with those factors |",
        "|---|---|--:|--:|",
    ]
    for r in rows:
        if r["group"][1] == precision or not r["plain"]:
            continue
        scaled = float(np.dot(_columns(r), [rest, *factors]))
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
                "parts_s": part_seconds(job, PARTS[args.split]),
                "plain": job.parallel.cp == 1 and job.parallel.pp == 1,
            }
        )
    groups = defaultdict(list)
    for row in rows:
        groups[row["group"]].append(row)
    names = [name for name, _ in PARTS[args.split]]
    lines = [
        f"Run {run_id}, source {args.source}: measured ~ f_rest * rest + "
        + " + ".join(f"f_{n} * {n}" for n in names)
        + " (a diagnosis; nothing applied).",
        "",
        "| GPU | precision | rows | f_rest | "
        + " | ".join(f"f_{n}" for n in names)
        + " | error now: median / max abs | residual of the fit: median / max abs |",
        "|---|---|--:|--:|" + "--:|" * len(names) + "--:|--:|",
    ]
    for (gpu, precision), members in sorted(groups.items()):
        errors = [abs(r["predicted_s"] / r["measured_s"] - 1) for r in members]
        if len(members) < len(names) + 2:  # a factor a part and the rest's, and one row more
            lines.append(
                f"| {gpu} | {precision} | {len(members)} | - | "
                + "- | " * len(names)
                + f"{100 * statistics.median(errors):.1f} / {100 * max(errors):.1f} % | - |"
            )
            continue
        rest, factors, residuals = fit(members)
        absolute = [abs(x) for x in residuals]
        lines.append(
            f"| {gpu} | {precision} | {len(members)} | {_factors(rest, factors)} | "
            f"{100 * statistics.median(errors):.1f} / {100 * max(errors):.1f} % | "
            f"{100 * statistics.median(absolute):.1f} / {100 * max(absolute):.1f} % |"
        )
    lines += [
        "",
        "| row | GPU | precision | seq | " + " | ".join(f"{n} share" for n in names) + " | error |",
        "|---|---|---|--:|" + "--:|" * len(names) + "--:|",
    ]
    for row in sorted(rows, key=lambda r: r["predicted_s"] / r["measured_s"]):
        shares = " | ".join(f"{100 * p / row['predicted_s']:.0f} %" for p in row["parts_s"])
        error = row["predicted_s"] / row["measured_s"] - 1
        gpu, precision = row["group"]
        lines.append(
            f"| {row['name']} | {gpu} | {precision} | {row['seq_len']} | "
            f"{shares} | {100 * error:+.1f} % |"
        )
    if args.held_out_from:
        lines += held_out(rows, args.held_out_from)
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
