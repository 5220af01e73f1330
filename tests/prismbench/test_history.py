"""Tests for prismbench/history.py: the DuckDB validation history under concurrent writers."""

from __future__ import annotations

import multiprocessing
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from prismbench import history
from prismbench.validate import CaseResult, MetricResult


def _case(name: str) -> CaseResult:
    return CaseResult(baseline=name, source="s", gpu="g", world_size=8, status="ok", wall_s=1.0,
                      result={"iteration_time_s": 1.1},
                      metrics=[MetricResult("iteration_time_s", 1.1, 1.0)])  # fmt: skip


def _writer(path: str, run_id: str, count: int) -> None:
    history.start_run(Path(path), run_id, commit="c", dirty=False, machine="m", settings={})
    for i in range(count):
        history.add_case(Path(path), run_id, _case(f"{run_id}-{i}"))
    history.finish_run(Path(path), run_id, "complete")


def test_two_validations_writing_at_once_lose_nothing(tmp_path):
    db = str(tmp_path / "h.duckdb")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(db, run, 25)) for run in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    counts = history.read(
        Path(db), "SELECT run_id, count(*) AS n FROM cases GROUP BY run_id ORDER BY run_id"
    )
    assert counts == [{"run_id": "a", "n": 25}, {"run_id": "b", "n": 25}]
    assert len(history.read(Path(db), "SELECT * FROM metric_results")) == 50
    assert {r["status"] for r in history.read(Path(db), "SELECT status FROM runs")} == {"complete"}


def test_a_run_is_running_until_finished(tmp_path):
    db = tmp_path / "h.duckdb"
    history.start_run(db, "r", commit="c", dirty=True, machine="m", settings={"x": 1})
    history.add_case(db, "r", _case("one"))
    (row,) = history.read(db, "SELECT status, ended_at FROM runs")
    assert row == {"status": "running", "ended_at": None}
    history.finish_run(db, "r", "interrupted")
    assert history.read(db, "SELECT status FROM runs") == [{"status": "interrupted"}]
    (metric,) = history.read(db, "SELECT metric, error FROM metric_results")
    assert metric["metric"] == "iteration_time_s" and abs(metric["error"] - 0.1) < 1e-12


def test_a_run_whose_process_was_killed_is_abandoned_by_the_next_run_on_its_host(tmp_path):
    # a validation killed (SIGKILL, a segfault in an emulation) never finishes its run: it read
    # "running" for ever
    db = tmp_path / "h.duckdb"
    code = (
        "import os, signal, pathlib\n"
        "from prismbench import history\n"
        f"history.start_run(pathlib.Path({str(db)!r}), 'killed', commit='c', dirty=False, "
        "machine='m', settings={})\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    assert history.start_run(db, "live", commit="c", dirty=False, machine="m", settings={}) == ["killed"]
    statuses = history.read(db, "SELECT run_id, status, ended_at FROM runs ORDER BY run_id")
    assert statuses == [
        {"run_id": "killed", "status": "abandoned", "ended_at": None},  # when it died: unknown
        {"run_id": "live", "status": "running", "ended_at": None},
    ]
    assert history.start_run(db, "next", commit="c", dirty=False, machine="m", settings={}) == []
    (live,) = history.read(db, "SELECT status FROM runs WHERE run_id = 'live'")
    assert live == {"status": "running"}  # its process, this one, still runs


def _v1_database(path: Path, version: int = 1) -> None:
    """A history as schema version 1 wrote it (no case_variability table)."""
    import duckdb

    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE schema_info (version INTEGER)")
    con.execute("INSERT INTO schema_info VALUES (?)", [version])
    con.execute("CREATE TABLE runs (run_id VARCHAR PRIMARY KEY, commit VARCHAR, dirty BOOLEAN, "
                "machine VARCHAR, started_at TIMESTAMP, ended_at TIMESTAMP, settings VARCHAR, "
                "status VARCHAR)")  # fmt: skip
    con.close()


def test_a_version_1_history_is_migrated_on_its_first_write(tmp_path):
    db = tmp_path / "h.duckdb"
    _v1_database(db)
    history.start_run(db, "r", commit="c", dirty=False, machine="m", settings={})
    assert history.read(db, "SELECT version FROM schema_info") == [
        {"version": history.SCHEMA_VERSION}
    ]
    assert history.read(db, "SELECT * FROM case_variability") == []


def _history_with_an_old_variability_row(db: Path, version: int, missing: tuple[str, ...]) -> None:
    """A history of `version` whose case_variability has neither the columns `missing` (those
    later versions added) nor any but p95_s set in its one row."""
    import duckdb

    _v1_database(db, version=version)
    old = {k: v for k, v in history.VARIABILITY_COLUMNS.items() if k not in missing}
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE case_variability (run_id VARCHAR, baseline VARCHAR, "
                + ", ".join(f"{k} {v}" for k, v in old.items()) + ")")  # fmt: skip
    con.execute("INSERT INTO case_variability (run_id, baseline, p95_s) VALUES ('old', 'b', 2.0)")
    con.close()


def test_a_version_2_history_gains_the_allocation_columns_and_keeps_its_rows(tmp_path):
    db = tmp_path / "h.duckdb"
    later = history.ALLOCATION_COLUMNS + history.NETWORK_TAIL_COLUMNS
    _history_with_an_old_variability_row(db, 2, later)
    history.start_run(db, "r", commit="c", dirty=False, machine="m", settings={})
    (row,) = history.read(db, "SELECT * FROM case_variability")
    # drawn, before version 3, one step per allocation: no split
    assert row["p95_s"] == 2.0 and row["steps_per_allocation"] == 1
    assert row["allocation_std_s"] is None and row["tail_slow_network_share"] is None
    assert history.read(db, "SELECT version FROM schema_info") == [
        {"version": history.SCHEMA_VERSION}
    ]


def test_a_version_3_history_gains_the_network_tail_column_and_keeps_its_rows(tmp_path):
    db = tmp_path / "h.duckdb"
    _history_with_an_old_variability_row(db, 3, history.NETWORK_TAIL_COLUMNS)
    history.start_run(db, "r", commit="c", dirty=False, machine="m", settings={})
    (row,) = history.read(db, "SELECT * FROM case_variability")
    assert row["p95_s"] == 2.0 and row["tail_slow_network_share"] is None
    assert history.read(db, "SELECT version FROM schema_info") == [
        {"version": history.SCHEMA_VERSION}
    ]


def test_a_version_4_history_gains_the_writer_columns_and_keeps_its_running_runs(tmp_path):
    import duckdb

    db = tmp_path / "h.duckdb"
    _v1_database(db, version=4)
    con = duckdb.connect(str(db))
    con.execute("INSERT INTO runs (run_id, status) VALUES ('old', 'running')")
    con.close()
    history.start_run(db, "r", commit="c", dirty=False, machine="m", settings={})
    (old,) = history.read(db, "SELECT status, host, pid FROM runs WHERE run_id = 'old'")
    # no writer recorded: whether its process still runs cannot be told
    assert old == {"status": "running", "host": None, "pid": None}
    assert history.read(db, "SELECT version FROM schema_info") == [{"version": 5}]


def test_a_newer_history_is_refused_untouched(tmp_path):
    db = tmp_path / "h.duckdb"
    _v1_database(db, version=history.SCHEMA_VERSION + 1)
    with pytest.raises(history.HistoryError, match="newer than this code"):
        history.start_run(db, "r", commit="c", dirty=False, machine="m", settings={})
    assert history.read(db, "SELECT count(*) AS n FROM runs") == [{"n": 0}]


def test_a_db_path_that_is_no_duckdb_history_is_refused_naming_db(tmp_path, capsys):
    """A text file, a folder, or a path under a file: a HistoryError naming --db (validate and
    dashboard exit 2 on it), nothing written there."""
    from prismbench.cli import main

    text = tmp_path / "notes.duckdb"
    text.write_text("not a db\n")
    folder = tmp_path / "folder"
    folder.mkdir()
    for db, message in (
        (text, "cannot be opened as a DuckDB history database"),
        (folder, "cannot be opened as a DuckDB history database"),
        (text / "sub" / "h.duckdb", "cannot create its folder"),
    ):
        with pytest.raises(history.HistoryError, match=f"^--db {db}: {message}"):
            history.start_run(db, "r", commit="c", dirty=False, machine="m", settings={})
    out = tmp_path / "page"
    assert main(["dashboard", "--db", str(text), "--out", str(out)]) == 2
    assert capsys.readouterr().err.startswith(f"error: --db {text}: cannot be opened")
    assert text.read_text() == "not a db\n" and list(folder.iterdir()) == [] and not out.exists()


def test_a_duckdb_file_that_is_no_history_is_refused_by_dashboard(tmp_path, capsys):
    import duckdb

    from prismbench.cli import main

    other = tmp_path / "other.duckdb"
    duckdb.connect(str(other)).close()  # a DuckDB database with none of the history's tables
    out = tmp_path / "page"
    assert main(["dashboard", "--db", str(other), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --db {other}: a DuckDB database without") and err.count("\n") == 1
    assert not out.exists()


def _foreign_database(path: Path) -> None:
    """Another program's DuckDB database, with a table of the history's name."""
    import duckdb

    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE runs (x INTEGER)")
    con.execute("INSERT INTO runs VALUES (1)")
    con.close()


def test_another_programs_duckdb_is_refused_untouched(tmp_path):
    import duckdb

    db = tmp_path / "other.duckdb"
    _foreign_database(db)
    for refused in (
        lambda: history.check_openable(db),
        lambda: history.start_run(db, "r", commit="c", dirty=False, machine="m", settings={}),
        lambda: history.read(db, "SELECT * FROM runs"),
    ):
        with pytest.raises(history.HistoryError, match="holds runs and no schema_info"):
            refused()
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT table_name FROM duckdb_tables()").fetchall() == [("runs",)]
    con.close()


def test_validate_refuses_another_programs_duckdb_before_emulating(tmp_path, capsys):
    from prismbench.cli import main

    db = tmp_path / "other.duckdb"
    _foreign_database(db)
    argv = ["validate", "--select", "megatron-readme2022__*", "--db", str(db), "--no-mlflow"]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert "not a validation history" in captured.err and "emulating" not in captured.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.duckdb"]
