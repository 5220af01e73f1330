"""The validation history in DuckDB: runs, cases and metric results, safe under concurrent writers.

DuckDB lets one process write a database file at a time; a second `duckdb.connect` fails with
a lock error while the first holds it. Every write here is one short transaction on a fresh
connection, retried with back-off while another process holds the lock, so two validations
writing at once both land (`connect_with_retry`). A run is inserted with status "running"
first and set to "complete" (or "interrupted", "failed") last: a run killed half-way never
reads as complete. Nothing is left to finish the run of a process that died (SIGKILL, a
segfault): the next run started on its host marks it "abandoned", found by the host and
process id each run records (`start_run`).

`schema_info` holds the schema version. A database of an older version is brought up to date
on its first write (`MIGRATIONS`); one of a newer version is refused (`HistoryError`).
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

import duckdb

from workloads.config import SpecError

SCHEMA_VERSION = 5  # 2: case_variability (validate --variability); 3: its allocation split;
# 4: the share of its tail in a slower network regime; 5: the host and process id of a run
ENDINGS = ("complete", "interrupted", "failed")  # what a validation ends its own run with
RUN_STATUSES = ("running", *ENDINGS, "abandoned")
# validate --variability, per case: prismbench.validate_variability's figures (seconds, ratios,
# a probability) and the baseline's measured spread (NULL where it has none)
VARIABILITY_COLUMNS = {
    "preset": "VARCHAR",
    "samples": "INTEGER",
    "seed": "BIGINT",
    "deterministic_s": "DOUBLE",
    "mean_s": "DOUBLE",
    "std_s": "DOUBLE",
    "p5_s": "DOUBLE",
    "p50_s": "DOUBLE",
    "p95_s": "DOUBLE",
    "p99_s": "DOUBLE",
    "threshold_s": "DOUBLE",
    "p_exceeds_threshold": "DOUBLE",
    "k_steps": "INTEGER",
    "k_steps_bound_s": "DOUBLE",
    "steps_per_allocation": "INTEGER",
    "allocation_std_s": "DOUBLE",
    "within_allocation_std_s": "DOUBLE",
    "slowdown_mean": "DOUBLE",
    "slowdown_p95": "DOUBLE",
    "tail_slow_network_share": "DOUBLE",
    "predicted_relative_spread": "DOUBLE",
    "monte_carlo_wall_s": "DOUBLE",
    "measured_iterations": "INTEGER",
    "measured_median_s": "DOUBLE",
    "measured_min_s": "DOUBLE",
    "measured_max_s": "DOUBLE",
    "measured_relative_spread": "DOUBLE",
}


def _case_variability(columns: dict[str, str]) -> str:
    return (
        "CREATE TABLE IF NOT EXISTS case_variability (run_id VARCHAR, baseline VARCHAR, "
        + ", ".join(f"{name} {kind}" for name, kind in columns.items())
        + ", PRIMARY KEY (run_id, baseline))"
    )


_CASE_VARIABILITY = _case_variability(VARIABILITY_COLUMNS)
_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS runs (
        run_id VARCHAR PRIMARY KEY, commit VARCHAR, dirty BOOLEAN, machine VARCHAR,
        started_at TIMESTAMP, ended_at TIMESTAMP, settings VARCHAR, status VARCHAR,
        host VARCHAR, pid INTEGER)""",
    """CREATE TABLE IF NOT EXISTS cases (
        run_id VARCHAR, baseline VARCHAR, source VARCHAR, gpu VARCHAR, world_size INTEGER,
        status VARCHAR, error_message VARCHAR, wall_s DOUBLE, result VARCHAR)""",
    """CREATE TABLE IF NOT EXISTS metric_results (
        run_id VARCHAR, baseline VARCHAR, metric VARCHAR, predicted DOUBLE, measured DOUBLE,
        error DOUBLE)""",
    _CASE_VARIABILITY,
)
# What brings a database of version v to v + 1 (after which _SCHEMA's CREATE ... IF NOT EXISTS
# runs): version 2 adds case_variability; version 3 adds the allocation split's columns to it,
# the rows before having been drawn one step per allocation (their split NULL: it cannot be
# made); version 4 adds the tail's share in a slower network regime (NULL before: not kept);
# version 5 adds the host and process id of a run's writer (NULL before: a run of then left
# "running" stays so, as whether its process still runs cannot be told).
ALLOCATION_COLUMNS = ("steps_per_allocation", "allocation_std_s", "within_allocation_std_s")
NETWORK_TAIL_COLUMNS = ("tail_slow_network_share",)


def _adding_variability_columns(names: tuple[str, ...]) -> tuple[str, ...]:
    """The statements that add `names` (VARIABILITY_COLUMNS) to an older case_variability."""
    return tuple(
        f"ALTER TABLE case_variability ADD COLUMN {name} {VARIABILITY_COLUMNS[name]}"
        for name in names
    )


MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        _case_variability(
            {
                k: v
                for k, v in VARIABILITY_COLUMNS.items()
                if k not in ALLOCATION_COLUMNS + NETWORK_TAIL_COLUMNS
            }
        ),
    ),
    2: (
        *_adding_variability_columns(ALLOCATION_COLUMNS),
        "UPDATE case_variability SET steps_per_allocation = 1",
    ),
    3: _adding_variability_columns(NETWORK_TAIL_COLUMNS),
    4: ("ALTER TABLE runs ADD COLUMN host VARCHAR", "ALTER TABLE runs ADD COLUMN pid INTEGER"),
}


class HistoryError(SpecError):
    """A history database this code cannot open or write (no DuckDB file, a newer schema)."""


LOCK_WAIT_S = 120.0


def connect_with_retry(path: Path, *, wait_s: float = LOCK_WAIT_S) -> duckdb.DuckDBPyConnection:
    """A connection to `path`, waiting (up to `wait_s`) while another process holds its lock.
    A path that is no DuckDB database (another file, a folder, one that cannot be created) or a
    lock held past `wait_s` is a HistoryError naming --db, not DuckDB's traceback."""
    deadline, delay = time.monotonic() + wait_s, 0.05
    while True:
        try:
            return duckdb.connect(str(path))
        except duckdb.IOException as err:
            if "lock" not in str(err).lower():
                raise HistoryError(
                    f"--db {path}: cannot be opened as a DuckDB history database: give a DuckDB "
                    f"file, or a path where one can be created ({err})"
                ) from None
            if time.monotonic() > deadline:
                raise HistoryError(
                    f"--db {path}: another process has held its lock for over {wait_s:g} s ({err})"
                ) from None
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


def _refuse_foreign(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    """Refuse a DuckDB database that holds tables but is no history: every history has held
    `schema_info` since its first write, and another database's `runs` table would take
    validate's rows (or answer the dashboard's queries) with DuckDB's binder errors."""
    tables = {name for (name,) in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
    if tables and "schema_info" not in tables:
        raise HistoryError(
            f"--db {path}: a DuckDB database that is not a validation history (it holds "
            f"{', '.join(sorted(tables))} and no schema_info): give the --db `prismbench "
            "validate` wrote, or a new path"
        )


def check_openable(path: Path) -> None:
    """Refuse, creating nothing, a --db the history cannot be written to: an existing file or
    folder DuckDB cannot open or another program's database, or a new path under a file.
    `validate` checks it before it makes its MLflow store beside the history, so a bad --db
    leaves no store behind it."""
    if path.exists():
        con = connect_with_retry(path)
        try:
            _refuse_foreign(con, path)
        finally:
            con.close()
        return
    folder = path.parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        raise HistoryError(f"--db {path}: cannot create its folder ({folder} is a file)")


def write(path: Path, statements: Callable[[duckdb.DuckDBPyConnection], None]) -> None:
    """Run `statements` in one transaction on a short-lived connection (created schema first)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise HistoryError(f"--db {path}: cannot create its folder ({err})") from None
    con = connect_with_retry(path)
    try:
        con.begin()
        _ensure_schema(con, path)
        statements(con)
        con.commit()
    finally:
        con.close()


def _ensure_schema(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    """Create the tables, or migrate an older database's; refuse a newer one or a foreign one."""
    _refuse_foreign(con, path)
    con.execute("CREATE TABLE IF NOT EXISTS schema_info (version INTEGER)")
    (version,) = con.execute("SELECT max(version) FROM schema_info").fetchone()
    if version is not None and version > SCHEMA_VERSION:
        raise HistoryError(
            f"{path}: history schema version {version} is newer than this code's "
            f"{SCHEMA_VERSION}; update prismbench or give another --db"
        )
    for old in range(version or SCHEMA_VERSION, SCHEMA_VERSION):
        for statement in MIGRATIONS[old]:
            con.execute(statement)
    for ddl in _SCHEMA:
        con.execute(ddl)
    if version is None:
        con.execute("INSERT INTO schema_info VALUES (?)", [SCHEMA_VERSION])
    elif version < SCHEMA_VERSION:
        con.execute("UPDATE schema_info SET version = ?", [SCHEMA_VERSION])


def start_run(
    path: Path, run_id: str, *, commit: str, dirty: bool, machine: str, settings: dict
) -> list[str]:
    """Insert the run as "running", by this host and process; first mark "abandoned" the runs
    this host left "running" whose process has ended (`_abandon_dead_runs`). Returns their ids,
    so that the caller can say so."""
    host = platform.node()
    abandoned: list[str] = []

    def statements(con) -> None:
        abandoned[:] = _abandon_dead_runs(con, host)
        con.execute(
            "INSERT INTO runs VALUES (?, ?, ?, ?, current_timestamp, NULL, ?, 'running', ?, ?)",
            [run_id, commit, dirty, machine, json.dumps(settings, sort_keys=True), host,
             os.getpid()],
        )  # fmt: skip

    write(path, statements)
    return abandoned


def _abandon_dead_runs(con: duckdb.DuckDBPyConnection, host: str) -> list[str]:
    """Mark "abandoned" the "running" runs of `host` whose process is gone, and return their
    ids: the process died without finishing them (killed, a segfault) and nothing else will. A
    run whose process id another process has taken since stays "running" (never marked
    wrongly, at worst left as it was), as do other hosts' runs, whose processes cannot be seen
    from here. ended_at stays NULL: when the process died is not known."""
    running = con.execute(
        "SELECT run_id, pid FROM runs WHERE status = 'running' AND host = ? ORDER BY started_at",
        [host],
    ).fetchall()
    dead = [run_id for run_id, pid in running if not _process_exists(pid)]
    for run_id in dead:
        con.execute("UPDATE runs SET status = 'abandoned' WHERE run_id = ?", [run_id])
    return dead


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: delivers nothing, only checks the process is there
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def add_case(path: Path, run_id: str, case) -> None:
    """One case (a `validate.CaseResult`), its metric results and, with --variability, its
    step-time distribution, in one transaction."""

    def statements(con) -> None:
        con.execute(
            "INSERT INTO cases VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [run_id, case.baseline, case.source, case.gpu, case.world_size, case.status,
             case.error_message, case.wall_s, json.dumps(case.result) if case.result else None],
        )  # fmt: skip
        for m in case.metrics:
            con.execute(
                "INSERT INTO metric_results VALUES (?, ?, ?, ?, ?, ?)",
                [run_id, case.baseline, m.metric, m.predicted, m.measured, m.error],
            )
        if case.variability is not None:
            con.execute(
                f"INSERT INTO case_variability (run_id, baseline, {', '.join(VARIABILITY_COLUMNS)}) "
                f"VALUES ({', '.join(['?'] * (2 + len(VARIABILITY_COLUMNS)))})",
                [run_id, case.baseline, *(case.variability[k] for k in VARIABILITY_COLUMNS)],
            )

    write(path, statements)


def finish_run(path: Path, run_id: str, status: str) -> None:
    if status not in ENDINGS:
        raise ValueError(f"status={status!r} must be one of {ENDINGS}")
    write(
        path,
        lambda con: con.execute(
            "UPDATE runs SET status = ?, ended_at = current_timestamp WHERE run_id = ?",
            [status, run_id],
        ),
    )


def read(path: Path, query: str, params: list | None = None) -> list[dict]:
    """Rows of a read-only query as dicts (waits for a writer's lock like the writes do)."""
    con = connect_with_retry(path)
    try:
        _refuse_foreign(con, path)
        try:
            cursor = con.execute(query, params or [])
        except duckdb.CatalogException as err:  # a DuckDB file, but not validate's history
            raise HistoryError(
                f"--db {path}: a DuckDB database without the validation history's tables (runs, "
                f"cases, metric_results): give the --db `prismbench validate` wrote "
                f"({str(err).splitlines()[0]})"
            ) from None
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    finally:
        con.close()
