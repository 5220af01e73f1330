"""Compare a `prismbench validate` run (DuckDB history) with results/fidelity/fidelity.csv.

    python results/fidelity/rerun_vs_csv.py DB [RUN_ID]    (default: the latest complete run)

Prints, per source, the rows' median |error| and mean error of iteration time in fidelity.csv
(the last full fidelity run) and in the validate run, and every row whose error moved by more
than one point, largest first: how a change of the workloads or models moved the published
rows, without re-running the whole table.
"""

import argparse
import csv
import statistics
from pathlib import Path

import duckdb

CSV = Path(__file__).with_name("fidelity.csv")


def main(db: str, run_id: str | None = None) -> None:
    con = duckdb.connect(db, read_only=True)
    if run_id is None:
        (run_id,) = con.execute(
            "SELECT run_id FROM runs WHERE status = 'complete' ORDER BY ended_at DESC LIMIT 1"
        ).fetchone()
    (commit,) = con.execute("SELECT commit FROM runs WHERE run_id = ?", [run_id]).fetchone()
    after = dict(
        con.execute(
            "SELECT baseline, error FROM metric_results WHERE run_id = ? "
            "AND metric = 'iteration_time_s'",
            [run_id],
        ).fetchall()
    )
    before = {r["baseline"]: (r["source"], float(r["error"])) for r in csv.DictReader(CSV.open())}
    both = sorted(set(after) & set(before))
    print(f"run {run_id} (commit {commit}) against {CSV.name}: {len(both)} rows in both")
    print("| source | rows | median abs error before | after | mean error before | after |")
    print("|---|--:|--:|--:|--:|--:|")
    for source in sorted({before[b][0] for b in both}):
        rows = [b for b in both if before[b][0] == source]
        old = [before[b][1] for b in rows]
        new = [after[b] for b in rows]
        print(
            f"| {source} | {len(rows)} | {statistics.median(map(abs, old)):.1%} | "
            f"{statistics.median(map(abs, new)):.1%} | {statistics.mean(old):+.1%} | "
            f"{statistics.mean(new):+.1%} |"
        )
    moved = sorted(
        (b for b in both if abs(after[b] - before[b][1]) > 0.01),
        key=lambda b: -abs(after[b] - before[b][1]),
    )
    print(f"\n{len(moved)} rows moved by more than 1 point:")
    print("| baseline | before | after |")
    print("|---|--:|--:|")
    for b in moved:
        print(f"| {b} | {before[b][1]:+.1%} | {after[b]:+.1%} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("db", metavar="DB", help="a DuckDB history")
    parser.add_argument(
        "run_id", nargs="?", metavar="RUN_ID", help="default: the latest complete run"
    )
    args = parser.parse_args()
    main(args.db, args.run_id)
