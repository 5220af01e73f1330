"""Emulate every baseline under results/baselines/ and write the fidelity table.

    python results/fidelity/run_fidelity.py [--only SUBSTRING ...] [--workers N] [--shard K/N]
                                            [--min-work LAYER_PASSES] [--max-work LAYER_PASSES]
                                            [--update]
    python results/fidelity/run_fidelity.py --merge N [--update]
    python results/fidelity/run_fidelity.py --from-db DB [--run RUN_ID]
    python results/fidelity/run_fidelity.py --from-db DB1 --from-db DB2 ... [--update]

Shards let N processes share the baselines (most are one class, so one core each);
`--merge N` then combines their files into fidelity.csv and the README. With `--update`,
the rows run replace those of the same baselines in the existing fidelity.csv and the
others are kept (to add the baselines a run skipped without running the rest again).

Writes results/fidelity/fidelity.csv (one row per baseline emulated) and the generated
block of results/fidelity/README.md (per-source error statistics and every row). Captures
are cached (~/.cache/prismbench or $PRISMBENCH_CACHE), so a re-run after a cost-model
change only re-prices. A baseline that fails to emulate is listed with its error, never
dropped silently. Progress goes to stderr.

`--from-db` emulates nothing: it writes the same two outputs from a stored `prismbench validate`
run (DB's latest complete run, or RUN_ID), so the table and the harness's history give the same
figures from one run. The run's commit and id head the generated block. Given several DBs, the
table joins their latest runs (say, one per group of sources run at one commit); a baseline in
two of them is refused. With `--update`, the table's rows of baselines the runs did not emulate
are kept, and the header says where they came from (a change that moves only some sources).

After a new table, run `python results/fidelity/misses.py` too: `misses.md` (the rows beyond 15 %
beside their own tables) is written from `fidelity.csv`, and a test checks the two agree.
"""

from __future__ import annotations

import argparse
import collections
import csv
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from prismbench.baselines import load_baselines
from prismbench.checkout import git_version
from prismbench.emulate import emulate
from prismbench.fidelity import FidelityRecord, compare, measured_iteration_s, summarize

HERE = Path(__file__).resolve().parent
BASELINES = HERE.parent / "baselines"
BEGIN, END = "<!-- BEGIN GENERATED -->", "<!-- END GENERATED -->"


def capture_work(baseline) -> int:
    """Rough capture cost: layer passes the captured ranks run (quick baselines go first)."""
    return baseline.job.num_microbatches * baseline.job.model.layers


def comparable_baselines() -> list:
    """Baselines with a measured iteration time to compare with, quickest capture first."""
    baselines = [b for b in load_baselines(BASELINES) if measured_iteration_s(b) is not None]
    return sorted(baselines, key=capture_work)


def run(
    only: list[str] | None,
    workers: int | None,
    shard: tuple[int, int] = (0, 1),
    max_work: int | None = None,
    min_work: int = 0,
    on_record=lambda record: None,
    on_failure=lambda name, error: None,
) -> tuple[list[FidelityRecord], list[tuple[str, str]]]:
    baselines = [b for b in comparable_baselines() if not only or any(o in b.name for o in only)]
    baselines = [b for b in baselines if max_work is None or capture_work(b) <= max_work]
    baselines = [b for b in baselines if capture_work(b) >= min_work]
    baselines = baselines[shard[0] :: shard[1]]
    records, failures = [], []
    for i, baseline in enumerate(baselines, 1):
        started = time.perf_counter()
        try:
            result = emulate(baseline.job, name=baseline.name, workers=workers)
        except Exception as err:  # noqa: BLE001  (reported in the table, never dropped)
            failures.append((baseline.name, f"{type(err).__name__}: {err}".splitlines()[0][:200]))
            on_failure(*failures[-1])
            print(
                f"[{i}/{len(baselines)}] {baseline.name}: FAILED {failures[-1][1]}", file=sys.stderr
            )
            continue
        record = compare(baseline, result)
        records.append(record)
        on_record(record)
        print(
            f"[{i}/{len(baselines)}] {baseline.name}: measured {record.measured_iteration_s:.3f} s, "
            f"predicted {record.predicted_iteration_s:.3f} s ({100 * record.error:+.1f} %) "
            f"in {time.perf_counter() - started:.0f} s",
            file=sys.stderr,
            flush=True,
        )
    return records, failures


def from_db(
    db: Path, run_id: str | None
) -> tuple[list[FidelityRecord], list[tuple[str, str]], str]:
    """The records and failures of a stored validate run (DB's latest complete one when
    `run_id` is None) for every comparable baseline it emulated, and a line naming the run."""
    from prismbench.history import read

    runs = read(db, "SELECT run_id, commit, dirty, ended_at FROM runs WHERE status = 'complete' "
                    "ORDER BY ended_at")  # fmt: skip
    if run_id is not None:
        runs = [r for r in runs if r["run_id"] == run_id]
    if not runs:
        raise SystemExit(f"--from-db {db}: no complete run{f' {run_id}' if run_id else ''}")
    run_row = runs[-1]
    cases = read(db, "SELECT baseline, status, error_message, result FROM cases WHERE run_id = ?",
                 [run_row["run_id"]])  # fmt: skip
    by_name = {b.name: b for b in comparable_baselines()}
    records, failures = [], []
    for case in sorted(cases, key=lambda c: c["baseline"]):
        baseline = by_name.get(case["baseline"])
        if baseline is None:
            continue  # recorded (results/baselines/recorded/) or no iteration time to compare
        if case["status"] != "ok":
            failures.append((case["baseline"], case["error_message"] or case["status"]))
            continue
        result = json.loads(case["result"])
        records.append(compare(baseline, SimpleNamespace(**result)))
    dirty = " (uncommitted changes)" if run_row["dirty"] else ""
    label = f"From `prismbench validate` run {run_row['run_id']} at {run_row['commit'][:7]}{dirty}."
    return records, failures, label


_WHOSE = " whose header was: "


def from_dbs(
    dbs: list[Path], run_id: str | None, update: bool, table: Path = HERE / "fidelity.csv"
) -> tuple[list[FidelityRecord], list[tuple[str, str]], str]:
    """The records, failures and header of a table joining the runs of `dbs` (`from_db`
    each); with `update`, plus `table`'s rows of the baselines none of them emulated, the
    header then naming where those came from (its README's previous header). A baseline in
    two runs is refused (ValueError)."""
    records, failures, labels = [], [], []
    for db in dbs:
        more, more_failures, label = from_db(db, run_id)
        twice = {r.baseline for r in records} & {r.baseline for r in more}
        if twice:
            raise ValueError(f"--from-db {db}: {len(twice)} baseline(s) also in an earlier "
                             f"DB's run ({', '.join(sorted(twice)[:3])}, ...)")  # fmt: skip
        records, failures = records + more, failures + more_failures
        labels.append(label)
    label = " ".join(labels)
    if update:
        fresh = {r.baseline for r in records} | {name for name, _ in failures}
        kept = [r for r in read_csv(table) if r.baseline not in fresh]
        sources = collections.Counter(r.source for r in kept)
        named = ", ".join(f"{source} {n}" for source, n in sorted(sources.items()))
        kept_line = f" The {len(kept)} rows it did not run ({named}) are the previous table's,"
        origin = previous_label(table.with_name("README.md"))
        # the previous table kept these same rows: they come from what its header named
        if origin is not None and kept_line + _WHOSE in origin:
            origin = origin.split(kept_line + _WHOSE, 1)[1]
        label += f"{kept_line}{_WHOSE}{origin}"
        records += kept
    return sorted(records, key=lambda r: r.baseline), failures, label


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
        goal = {True: "met", False: "NOT met", None: "n/a (< 5 rows)"}[s.goal_met]
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
        origin = (
            "eq. 3 TFLOP/s"
            if r.measured_from == "tflops_eq3"
            else ("derived" if r.measured_from.startswith("derived") else "reported")
        )
        lines.append(
            f"| {r.baseline} | {r.gpus} | {r.measured_iteration_s:.3f} | {origin} | "
            f"{r.predicted_iteration_s:.3f} | {100 * r.error:+.1f} % | "
            f"{r.compute_s:.3f} / {r.exposed_comm_s:.3f} / {r.bubble_s:.3f} |"
        )
    if failures:
        lines += ["", "Baselines that failed to emulate:", ""]
        lines += [f"- `{name}`: {error}" for name, error in failures]
    done = {r.baseline for r in records} | {name for name, _ in failures}
    pending = [b for b in comparable_baselines() if b.name not in done]
    if pending:
        lines += [
            "",
            "Baselines not run (capture work in layer passes over the run's `--max-work`, or the"
            " run was stopped before them):",
            "",
        ]
        lines += [f"- `{b.name}`: {capture_work(b):,}" for b in pending]
    return "\n".join(lines)


def read_csv(path: Path) -> list[FidelityRecord]:
    types = {f.name: f.type for f in FidelityRecord.__dataclass_fields__.values()}
    records = []
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            values = {}
            for key, text in row.items():
                kind = str(types[key])
                if text == "":
                    values[key] = None
                elif kind.startswith("bool"):
                    values[key] = text == "True"
                elif kind.startswith("int"):
                    values[key] = int(text)
                elif kind.startswith("float"):
                    values[key] = float(text)
                else:
                    values[key] = text
            records.append(FidelityRecord(**values))
    return records


def updated(records: list[FidelityRecord], update: bool) -> list[FidelityRecord]:
    """`records`, plus (with `update`) the table's rows of the baselines they do not cover."""
    if not update:
        return records
    fresh = {r.baseline for r in records}
    return [r for r in read_csv(HERE / "fidelity.csv") if r.baseline not in fresh] + records


def emulated_label(kept_from: str | None = None) -> str:
    """The header of a table this script emulated itself: the commit it ran at and, with
    `--update`, where the rows it did not run come from (the previous table's header)."""
    commit, dirty = git_version()
    state = " (uncommitted changes)" if dirty else ""
    label = f"Emulated by `run_fidelity.py` at {commit[:7]}{state}."
    if kept_from:
        label += f" The rows it did not run are the previous table's: {kept_from}"
    return label


def previous_label(path: Path) -> str | None:
    """The first line of the README's generated block (the runs the table came from)."""
    text = path.read_text() if path.exists() else ""
    if BEGIN not in text:
        return None
    block = text.split(BEGIN, 1)[1].lstrip("\n")
    first = block.split("\n", 1)[0]
    return first if first.startswith(("From ", "Emulated ")) else None


def write_readme(block: str, path: Path) -> None:
    text = path.read_text() if path.exists() else f"# Fidelity\n\n{BEGIN}\n{END}\n"
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    path.write_text(f"{head}{BEGIN}\n{block}\n{END}{tail}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only",
        action="append",
        help="emulate only baselines whose name contains this (repeatable)",
    )
    parser.add_argument("--workers", type=int, default=None, help="capture processes")
    parser.add_argument("--shard", default="0/1", help="K/N: run every N-th baseline from K")
    parser.add_argument("--merge", type=int, metavar="N", help="combine N shards' files")
    parser.add_argument(
        "--max-work", type=int, help="skip baselines whose capture work (layer passes) is larger"
    )
    parser.add_argument(
        "--min-work", type=int, default=0, help="skip baselines whose capture work is smaller"
    )
    parser.add_argument(
        "--update", action="store_true", help="keep fidelity.csv's rows of baselines not run"
    )
    parser.add_argument(
        "--from-db", type=Path, metavar="DB", action="append",
        help="a validate run's DuckDB (repeatable: the table joins their latest runs)",
    )  # fmt: skip
    parser.add_argument(
        "--run", metavar="RUN_ID", help="with one --from-db: this run, not the latest"
    )
    args = parser.parse_args()
    if args.from_db:
        if args.run and len(args.from_db) > 1:
            parser.exit(2, "--run: give one --from-db with it (a run id names one DB's run)\n")
        try:
            records, failures, label = from_dbs(args.from_db, args.run, args.update)
        except ValueError as err:
            parser.exit(2, f"{err}\n")
        write_csv(records, HERE / "fidelity.csv")
        write_readme(f"{label}\n\n{markdown(records, failures)}", HERE / "README.md")
        print(label)
        print(markdown(records, failures))
        return 0
    if args.merge:
        records, failures = [], []
        for k in range(args.merge):
            records += read_csv(HERE / f"shard-{k}.csv")
            failures += [
                tuple(line.split("\t", 1))
                for line in (HERE / f"shard-{k}.failures").read_text().splitlines()
            ]
            (HERE / f"shard-{k}.csv").unlink()
            (HERE / f"shard-{k}.failures").unlink()
        label = emulated_label(previous_label(HERE / "README.md") if args.update else None)
        records = updated(records, args.update)
        write_csv(records, HERE / "fidelity.csv")
        write_readme(f"{label}\n\n{markdown(records, failures)}", HERE / "README.md")
        print(markdown(records, failures))
        return 0
    k, n = (int(x) for x in args.shard.split("/"))
    if n > 1:  # shards write as they go, so an interrupted run keeps what it measured
        csv_path, failures_path = HERE / f"shard-{k}.csv", HERE / f"shard-{k}.failures"
        csv_path.write_text(",".join(FidelityRecord.__dataclass_fields__) + "\n")
        failures_path.write_text("")

        def on_record(record):
            with csv_path.open("a", newline="") as f:
                csv.DictWriter(f, fieldnames=list(FidelityRecord.__dataclass_fields__)).writerow(
                    record.to_dict()
                )

        def on_failure(name, error):
            with failures_path.open("a") as f:
                f.write(f"{name}\t{error}\n")

        run(args.only, args.workers, (k, n), args.max_work, args.min_work, on_record, on_failure)
        return 0
    records, failures = run(args.only, args.workers, max_work=args.max_work, min_work=args.min_work)
    whole_table = args.update or not args.only
    label = emulated_label(previous_label(HERE / "README.md") if args.update else None)
    records = updated(records, args.update)
    write_csv(records, HERE / ("fidelity.csv" if whole_table else "fidelity-partial.csv"))
    if whole_table:
        write_readme(f"{label}\n\n{markdown(records, failures)}", HERE / "README.md")
    print(markdown(records, failures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
