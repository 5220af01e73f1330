"""Emulate every baseline under results/baselines/ and write the fidelity table.

    python results/fidelity/run_fidelity.py [--only SUBSTRING] [--workers N]

Writes results/fidelity/fidelity.csv (one row per baseline emulated) and the generated
block of results/fidelity/README.md (per-source error statistics and every row). Captures
are cached (~/.cache/prismbench or $PRISMBENCH_CACHE), so a re-run after a cost-model
change only re-prices. A baseline that fails to emulate is listed with its error, never
dropped silently. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

from prismbench.baselines import load_baselines
from prismbench.emulate import emulate
from prismbench.fidelity import FidelityRecord, compare, measured_iteration_s, summarize

HERE = Path(__file__).resolve().parent
BASELINES = HERE.parent / "baselines"
BEGIN, END = "<!-- BEGIN GENERATED -->", "<!-- END GENERATED -->"


def run(only: str | None, workers: int | None) -> tuple[list[FidelityRecord], list[tuple[str, str]]]:
    baselines = [b for b in load_baselines(BASELINES) if not only or only in b.name]
    baselines = [b for b in baselines if measured_iteration_s(b) is not None]
    baselines.sort(key=lambda b: (b.job.parallel.pp, b.job.world_size))  # quick ones first
    records, failures = [], []
    for i, baseline in enumerate(baselines, 1):
        started = time.perf_counter()
        try:
            result = emulate(baseline.job, name=baseline.name, workers=workers)
        except Exception as err:  # noqa: BLE001  (reported in the table, never dropped)
            failures.append((baseline.name, f"{type(err).__name__}: {err}".splitlines()[0][:200]))
            print(f"[{i}/{len(baselines)}] {baseline.name}: FAILED {failures[-1][1]}", file=sys.stderr)
            continue
        record = compare(baseline, result)
        records.append(record)
        print(
            f"[{i}/{len(baselines)}] {baseline.name}: measured {record.measured_iteration_s:.3f} s, "
            f"predicted {record.predicted_iteration_s:.3f} s ({100 * record.error:+.1f} %) "
            f"in {time.perf_counter() - started:.0f} s",
            file=sys.stderr,
            flush=True,
        )
    return records, failures


def write_csv(records: list[FidelityRecord], path: Path) -> None:
    rows = [r.to_dict() for r in records]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(FidelityRecord.__dataclass_fields__))
        writer.writeheader()
        writer.writerows(rows)


def markdown(records: list[FidelityRecord], failures: list[tuple[str, str]]) -> str:
    lines = [
        "| source | rows | mean error | mean abs error | median abs error | max abs error | goal (median <= 5 %, max <= 15 %) |",
        "|---|--:|--:|--:|--:|--:|---|",
    ]
    for s in summarize(records):
        goal = {True: "met", False: "NOT met", None: f"n/a (< 5 rows)"}[s.goal_met]
        lines.append(
            f"| {s.source} | {s.rows} | {100 * s.mean_error:+.1f} % | {100 * s.mean_abs_error:.1f} % "
            f"| {100 * s.median_abs_error:.1f} % | {100 * s.max_abs_error:.1f} % | {goal} |"
        )
    lines += [
        "",
        "| baseline | GPUs | measured (s) | from | predicted (s) | error | compute / exposed comm / bubble (s) |",
        "|---|--:|--:|---|--:|--:|---|",
    ]
    for r in sorted(records, key=lambda r: (r.source, r.gpus, r.baseline)):
        origin = "eq. 3 TFLOP/s" if r.measured_from == "tflops_eq3" else (
            "derived" if r.measured_from.startswith("derived") else "reported"
        )
        lines.append(
            f"| {r.baseline} | {r.gpus} | {r.measured_iteration_s:.3f} | {origin} | "
            f"{r.predicted_iteration_s:.3f} | {100 * r.error:+.1f} % | "
            f"{r.compute_s:.3f} / {r.exposed_comm_s:.3f} / {r.bubble_s:.3f} |"
        )
    if failures:
        lines += ["", "Baselines that failed to emulate:", ""]
        lines += [f"- `{name}`: {error}" for name, error in failures]
    return "\n".join(lines)


def write_readme(block: str, path: Path) -> None:
    text = path.read_text() if path.exists() else f"# Fidelity\n\n{BEGIN}\n{END}\n"
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    path.write_text(f"{head}{BEGIN}\n{block}\n{END}{tail}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="emulate only baselines whose name contains this")
    parser.add_argument("--workers", type=int, default=None, help="capture processes")
    args = parser.parse_args()
    records, failures = run(args.only, args.workers)
    suffix = "" if not args.only else "-partial"
    write_csv(records, HERE / f"fidelity{suffix}.csv")
    if not args.only:
        write_readme(markdown(records, failures), HERE / "README.md")
    print(markdown(records, failures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
