"""Compare the iteration-time errors of `prismbench validate` runs, row by row and per source.

    python results/fidelity/compare_runs.py DB [DB ...]    (each: a DuckDB history; its latest
                                                           complete run is taken)

Prints a markdown table of every baseline the runs share (error of each run, oldest first),
then per source the median and the max |error| of each run: how a change moved the rows it
touched, without re-running the whole table.
"""

import argparse
import statistics

import duckdb


def latest_run(db: str) -> tuple[str, str, bool, dict[str, float]]:
    """(run id, commit, dirty, baseline -> iteration-time error) of the DB's latest complete run."""
    con = duckdb.connect(db, read_only=True)
    run_id, commit, dirty = con.execute(
        "SELECT run_id, commit, dirty FROM runs WHERE status = 'complete' "
        "ORDER BY ended_at DESC LIMIT 1"
    ).fetchone()
    errors = dict(
        con.execute(
            "SELECT baseline, error FROM metric_results WHERE run_id = ? "
            "AND metric = 'iteration_time_s'",
            [run_id],
        ).fetchall()
    )
    return run_id, commit, bool(dirty), errors


def main(dbs: list[str]) -> None:
    runs = [latest_run(db) for db in dbs]
    for db, (run_id, commit, dirty, errors) in zip(dbs, runs, strict=True):
        print(
            f"- {db}: run {run_id}, commit {commit[:10]}{' (dirty)' if dirty else ''}, {len(errors)} rows"
        )
    shared = sorted(set.intersection(*(set(r[3]) for r in runs)))
    print()
    print("| row | " + " | ".join(r[0] for r in runs) + " |")
    print("|---|" + "--:|" * len(runs))
    for name in shared:
        print(f"| {name} | " + " | ".join(f"{r[3][name]:+.1%}" for r in runs) + " |")
    print()
    print("| source | rows | " + " | ".join(f"median, max abs ({r[0][:6]})" for r in runs) + " |")
    print("|---|--:|" + "--:|" * len(runs))
    for source in sorted({n.split("__")[0] for n in shared}):
        names = [n for n in shared if n.split("__")[0] == source]
        cells = []
        for r in runs:
            abs_errors = [abs(r[3][n]) for n in names]
            cells.append(f"{statistics.median(abs_errors):.1%}, {max(abs_errors):.1%}")
        print(f"| {source} | {len(names)} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dbs", nargs="+", metavar="DB", help="a DuckDB history")
    main(parser.parse_args().dbs)
