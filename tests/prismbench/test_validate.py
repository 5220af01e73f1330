"""Tests for prismbench/validate.py and `prismbench validate` on tiny baselines."""

from __future__ import annotations

import contextlib
import functools
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prismbench import history
from prismbench.baselines import load_baselines
from prismbench.cli import main
from prismbench.emulate import emulate
from prismbench.orphans import PARENT_POLL_S
from prismbench.spec import job_spec_from_dict
from prismbench.thresholds import parse_thresholds
from prismbench.validate import gate_failures, select_baselines, summarize, validate
from tests.prismbench.processes import HAS_PROC, children, kill_survivors
from workloads.config import SpecError

TINY_JOB = """[job.model]
name = "gpt-debug"
[job.batch]
seq_len = 64
global_batch = 2
"""


def _validate_args(baselines_dir, *more: str) -> list[str]:
    return ["validate", "--baselines", str(baselines_dir), *more]


@pytest.fixture(scope="module")
def predicted_s():
    return emulate(
        job_spec_from_dict(
            {"model": {"name": "gpt-debug"}, "batch": {"seq_len": 64, "global_batch": 2}}
        )
    ).iteration_time_s


@pytest.fixture
def baselines_dir(tmp_path, predicted_s):
    """Two baselines of the tiny job: measured 10 % slower and 50 % slower than predicted."""
    directory = tmp_path / "baselines"
    directory.mkdir()
    for name, factor in (("mine__tiny__1g__r001", 1.1), ("mine__tiny__1g__r002", 1.5)):
        (directory / f"{name}.toml").write_text(
            TINY_JOB
            + f"[measured]\niteration_time_s = {predicted_s * factor!r}\n"
            + '[provenance]\nsource = "a test"\ncsv_row = 2\nmodel = "gpt-debug"\n'
        )
    return directory


def test_a_cpu_recording_is_emulated_but_not_scored(tmp_path, baselines_dir, capsys):
    """A GPU prediction against a CPU's time would be a 1000x "error": say why it is not scored."""
    (baselines_dir / "mine__tiny__cpu.toml").write_text(
        TINY_JOB
        + "[measured]\niteration_time_s = 0.05\npeak_mem_bytes = 1073741824\n"
        + 'peak_mem_kind = "cpu_max_rss"\ndevice = "cpu"\n'
        + '[provenance]\nkind = "recorded"\nsource = "prismbench record"\nmodel = "gpt-debug"\n'
        + 'machine = "here"\nsoftware = "torch"\ncommit = "abc"\ndate = "2026-11-29"\n'
    )
    args = _validate_args(baselines_dir, "--db", str(tmp_path / "h.duckdb"), "--no-mlflow")
    assert main([*args, "--all", "--gate", "iteration_time_s:60%"]) == 0
    printed = capsys.readouterr()
    assert "not scored: mine__tiny__cpu: measured on a CPU; the emulator predicts" in printed.out
    assert "mine__tiny__cpu: not scored (measured on a CPU" in printed.err  # the progress line
    assert main([*args, "--select", "cpu", "--gate", "iteration_time_s:60%"]) == 1  # gates nothing


def test_a_baseline_name_in_both_folders_is_refused(tmp_path, baselines_dir, capsys):
    # two cases of one name: with --variability a DuckDB primary-key traceback half-way through
    # the run, without it two cases the history cannot tell apart
    (baselines_dir / "recorded").mkdir()
    shutil.copy(baselines_dir / "mine__tiny__1g__r001.toml", baselines_dir / "recorded")
    db = tmp_path / "h.duckdb"
    assert main(_validate_args(baselines_dir, "--all", "--db", str(db), "--no-mlflow")) == 2
    assert "['mine__tiny__1g__r001'] in it and in its recorded/" in capsys.readouterr().err
    assert not db.exists()


def test_a_case_the_history_cannot_store_fails_the_run(tmp_path, baselines_dir, monkeypatch):
    # the run was left "running" (the status "failed" was never written) and the error waited
    # for every queued case (two workers: the pool's case)
    db = tmp_path / "h.duckdb"

    def broken(*_args) -> None:
        raise history.HistoryError(f"--db {db}: another process has held its lock for over 120 s")

    monkeypatch.setattr(history, "add_case", broken)
    with pytest.raises(history.HistoryError, match="held its lock"):
        validate(load_baselines(baselines_dir), db_path=db, workers=2)
    assert history.read(db, "SELECT status FROM runs") == [{"status": "failed"}]


def test_a_case_that_fails_to_emulate_is_recorded_and_fails_the_gate(
    tmp_path, baselines_dir, monkeypatch
):
    import prismbench.emulate

    def broken(*_args, **_kwargs):
        raise RuntimeError("no kernel image")

    # one worker: the case runs in this process, where the emulator is the patched one
    monkeypatch.setattr(prismbench.emulate, "emulate", broken)
    chosen = load_baselines(baselines_dir)[:1]
    run = validate(chosen, db_path=tmp_path / "h.duckdb", workers=1, use_cache=False)
    assert run.status == "complete"
    assert [(c.status, c.error_message) for c in run.cases] == [
        ("failed", "RuntimeError: no kernel image")
    ]
    assert [f[:2] for f in gate_failures(run.cases, [])] == [("mine__tiny__1g__r001", "emulation")]


def test_a_long_case_is_named_while_it_runs(tmp_path, baselines_dir, monkeypatch):
    """A cold capture of a large job runs for minutes: validate says which case it is waiting on."""
    import prismbench.emulate
    import prismbench.validate

    real_emulate = prismbench.emulate.emulate

    def slow(*args, **kwargs):
        time.sleep(0.35)
        return real_emulate(*args, **kwargs)

    monkeypatch.setattr(prismbench.emulate, "emulate", slow)
    monkeypatch.setattr(prismbench.validate, "HEARTBEAT_S", 0.1)
    said = []
    chosen = load_baselines(baselines_dir)[:1]
    validate(chosen, db_path=tmp_path / "h.duckdb", workers=1, use_cache=False, progress=said.append)
    waiting = [line for line in said if line.startswith("... still running")]
    assert waiting and all(line.endswith(": mine__tiny__1g__r001") for line in waiting)
    assert said[-1].startswith("[1/1] mine__tiny__1g__r001: iteration_time_s")


def test_cases_on_workers_are_named_while_they_run():
    from types import SimpleNamespace

    from prismbench.orphans import spawn_pool
    from prismbench.validate import _finished

    calls = [(SimpleNamespace(name=f"case{i}"), functools.partial(time.sleep, 0.6 * i)) for i in (1, 2, 3)]
    waited = []
    with spawn_pool(2) as pool:
        order = [b.name for b, _, _ in _finished(pool, 2, calls, waited.append, every_s=0.1)]
    assert order == ["case1", "case2", "case3"]
    # the pool marks the call it queues next as running too: only the two a worker runs are named
    assert ["case1", "case2"] in waited and ["case1", "case2", "case3"] not in waited
    assert ["case2", "case3"] in waited and ["case3"] in waited


def test_select_by_glob_or_substring_and_refuse_nothing(baselines_dir):
    all_ = load_baselines(baselines_dir)
    assert [b.name for b in select_baselines(all_, ["r002"], False)] == ["mine__tiny__1g__r002"]
    assert len(select_baselines(all_, ["mine__*"], False)) == 2
    with pytest.raises(SpecError, match="default selection names baselines not found"):
        select_baselines(all_, None, False)
    with pytest.raises(SpecError, match="no baseline name matches"):
        select_baselines(all_, ["nothing"], False)
    with pytest.raises(SpecError, match=r"\['nothing'\]: no baseline name matches"):
        select_baselines(all_, ["r002", "nothing"], False)  # a typo beside a match
    with pytest.raises(SpecError, match="an empty or blank expression matches every baseline"):
        select_baselines(all_, [""], False)
    with pytest.raises(SpecError, match="an empty or blank expression"):
        select_baselines(all_, ["r002", "  "], False)


def test_validate_scores_stores_and_gates(tmp_path, baselines_dir):
    run = validate(load_baselines(baselines_dir), db_path=tmp_path / "h.duckdb", workers=1)
    assert run.status == "complete"
    errors = sorted(case.metrics[0].error for case in run.cases)
    assert errors == [pytest.approx(1 / 1.5 - 1), pytest.approx(1 / 1.1 - 1)]
    (row,) = summarize(run.cases)
    assert (row.metric, row.cases) == ("iteration_time_s", 2)
    assert row.max_abs_error == pytest.approx(1 - 1 / 1.5)
    failures = gate_failures(run.cases, parse_thresholds("iteration_time_s:20%", option="--gate"))
    assert [f[0] for f in failures] == ["mine__tiny__1g__r002"]


def test_cli_exit_codes_and_mlflow(history_dir, baselines_dir, capsys):
    import mlflow

    db = history_dir / "p.duckdb"
    args = _validate_args(baselines_dir, "--all", "--db", str(db), "--workers", "1")
    assert main([*args, "--gate", "iteration_time_s:20%", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert [f["baseline"] for f in out["gate_failures"]] == ["mine__tiny__1g__r002"]
    mlflow.set_tracking_uri(f"sqlite:///{history_dir / 'mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=["prismbench-validate"])
    assert len(runs) == 3  # the parent and one child per case
    assert main([*args, "--no-mlflow", "--gate", "iteration_time_s:60%"]) == 0
    assert main([*args, "--no-mlflow", "--gate", "iteration_s:60%"]) == 2
    assert "not validated metrics" in capsys.readouterr().err


def test_every_figure_validate_scores_can_be_gated():
    from prismbench.baselines import ALLOCATOR_PEAKS, PEAK_MEMORY_FIELD
    from prismbench.validate import VALIDATED_METRICS

    scored = {"iteration_time_s", *PEAK_MEMORY_FIELD.values(), *ALLOCATOR_PEAKS}
    assert set(VALIDATED_METRICS) == scored
    assert "first_iteration_peak_memory_reserved_bytes" in VALIDATED_METRICS


def test_a_run_mlflow_cannot_log_still_prints_its_figures_and_gate_then_exits_1(
    history_dir, baselines_dir, capsys, monkeypatch
):
    import prismbench.mlflow_log

    def broken(*args, **kwargs):
        raise OSError("[Errno 20] Not a directory: 'mlartifacts'")

    monkeypatch.setattr(prismbench.mlflow_log, "log_run", broken)
    args = _validate_args(baselines_dir, "--all", "--db", str(history_dir / "p.duckdb"),
                          "--workers", "1", "--gate", "iteration_time_s:60%")  # fmt: skip
    assert main(args) == 1
    out, err = capsys.readouterr()
    assert "gate passed: iteration_time_s:60%" in out
    assert "logging run" in err and "Not a directory" in err and "the run is complete in" in err


def test_a_case_the_measured_range_lets_pass_is_said(capsys):
    from rich.console import Console

    from prismbench import report
    from prismbench.validate import CaseResult, MetricResult, ValidationRun

    metric = MetricResult("iteration_time_s", 0.87, 1.0, slack_below=0.2, slack_above=0.05)
    case = CaseResult(baseline="b", source="s", gpu="g", world_size=1, status="ok", wall_s=0.0,
                      metrics=[metric])  # fmt: skip
    run = ValidationRun(run_id="r", db_path=Path("h.duckdb"), cases=[case], status="complete")
    thresholds = parse_thresholds("iteration_time_s:5%", option="--gate")
    assert not gate_failures([case], thresholds)
    console = Console(record=True, width=200)
    report.render_validation(run, summarize([case]), [], console, thresholds)
    text = console.export_text()
    assert ("gate: b: iteration_time_s error -13.0% is within iteration_time_s:5% only as the "
            "measured iterations reached -20.0% .. +5.0% of their median") in text  # fmt: skip
    assert "gate passed" in text


def test_validate_says_whether_its_gate_passed(tmp_path, baselines_dir, capsys):
    args = _validate_args(baselines_dir, "--all", "--db", str(tmp_path / "h.duckdb"),
                          "--no-mlflow", "--workers", "1")  # fmt: skip
    assert main([*args, "--gate", "iteration_time_s:60%"]) == 0
    assert "gate passed: iteration_time_s:60%" in capsys.readouterr().out
    assert main([*args, "--gate", "peak_memory_reserved_bytes:5%"]) == 1
    printed = capsys.readouterr().out
    assert "gate FAILED: peak_memory_reserved_bytes:5%: no selected case measures it" in printed
    assert "nan" not in printed  # no case, so no error to print


def test_every_gate_option_given_is_checked(tmp_path, baselines_dir):
    # argparse kept the last --gate alone: the iteration-time bound below was dropped
    args = _validate_args(baselines_dir, "--all", "--db", str(tmp_path / "h.duckdb"), "--no-mlflow",
                          "--workers", "1", "--gate", "iteration_time_s:5%",
                          "--gate", "iteration_time_s:+1000%")  # fmt: skip
    assert main(args) == 1


def test_validate_json_is_strict_json_when_a_gate_has_no_error(tmp_path, baselines_dir, capsys):
    args = _validate_args(baselines_dir, "--all", "--db", str(tmp_path / "h.duckdb"),
                          "--no-mlflow", "--workers", "1", "--json")  # fmt: skip
    assert main([*args, "--gate", "peak_memory_reserved_bytes:5%"]) == 1

    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    out = json.loads(capsys.readouterr().out, parse_constant=refuse)
    assert out["gate_failures"] == [
        {"baseline": "-", "metric": "peak_memory_reserved_bytes", "error": None,
         "threshold": "peak_memory_reserved_bytes:5%: no selected case measures it"}
    ]  # fmt: skip


@pytest.mark.parametrize(
    "options", [["--tracking-uri", "ftp://nowhere"], ["--no-mlflow", "--tracking-uri", "ftp://x"]]
)
def test_an_mlflow_store_that_cannot_be_used_is_refused_before_any_emulation(
    tmp_path, baselines_dir, options, capsys
):
    db = tmp_path / "p.duckdb"
    assert main([*_validate_args(baselines_dir, "--all", "--db", str(db)), *options]) == 2
    assert "--tracking-uri" in capsys.readouterr().err
    assert not db.exists()  # no run was started, so none is left "running"


@pytest.mark.parametrize(("db", "says"), [("notes.duckdb", "cannot be opened"),
                                          ("notes.duckdb/h.duckdb", "cannot create its folder")])  # fmt: skip
def test_a_bad_db_is_refused_before_the_mlflow_store_is_made_beside_it(
    tmp_path, baselines_dir, db, says, capsys
):
    # the store (mlflow.db and its lock) was made beside --db, then the history refused it
    (tmp_path / "notes.duckdb").write_text("not a db\n")
    assert main(_validate_args(baselines_dir, "--all", "--db", str(tmp_path / db))) == 2
    assert says in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["baselines", "notes.duckdb"]


@pytest.mark.parametrize(
    ("where", "options", "says"),
    [
        ("none", ["--all"], "no such directory of baselines"),
        ("empty", ["--all"], "no baseline"),
        ("baselines", ["--all", "--select", "tiny"], "--select"),
    ],
)
def test_a_selection_that_cannot_be_run_is_refused_before_a_run_starts(
    tmp_path, baselines_dir, where, options, says, capsys
):
    (tmp_path / "empty").mkdir()
    folder = baselines_dir if where == "baselines" else tmp_path / where
    db = tmp_path / "p.duckdb"
    assert main([*_validate_args(folder, "--db", str(db), "--no-mlflow"), *options]) == 2
    assert says in capsys.readouterr().err
    assert not db.exists()


def test_ctrl_c_ends_a_command_with_a_line_not_a_traceback(monkeypatch, capsys):
    import prismbench.cli as cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_cmd_workloads", interrupted)
    assert main(["workloads"]) == 130
    assert capsys.readouterr().err.strip() == "interrupted"


def test_sigterm_ends_a_command_with_its_own_line_and_exit_status(monkeypatch, capsys):
    import os
    import signal
    import time

    import prismbench.cli as cli

    def terminated(args):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)  # the handler raises in here

    def reached_the_tests_own_handler(signum, frame):
        raise AssertionError("main did not handle SIGTERM")  # instead of ending pytest

    monkeypatch.setattr(cli, "_cmd_workloads", terminated)
    previous = signal.signal(signal.SIGTERM, reached_the_tests_own_handler)
    try:
        assert main(["workloads"]) == 143
        assert capsys.readouterr().err.strip() == "terminated"
        assert signal.getsignal(signal.SIGTERM) is reached_the_tests_own_handler
    finally:
        signal.signal(signal.SIGTERM, previous)


def _signalled_inside_a_finalizer(signum, then_s: float):
    """A command that signals itself from a finalizer (a weakref callback, whose exceptions
    Python prints as "Exception ignored" and drops), then works on for `then_s` and returns 0."""
    import os
    import weakref

    class Lock:
        pass

    def command(args):
        lock = Lock()
        weakref.finalize(lock, os.kill, os.getpid(), signum)  # its handler runs inside os.kill
        del lock
        time.sleep(then_s)  # the interrupt, delivered again, is raised in here
        return 0

    return command


@contextlib.contextmanager
def _python_s_own_interrupt_handlers():
    """SIGINT as in a terminal (a suite started in the background with `&` has it ignored,
    which Python leaves so); a SIGTERM reaching the test rather than `main` fails it."""

    def reached_the_test(signum, frame):
        raise AssertionError("a signal reached the test after main returned")

    previous = {
        signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler),
        signal.SIGTERM: signal.signal(signal.SIGTERM, reached_the_test),
    }
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@pytest.mark.parametrize(
    ("signum", "exit_status", "line"),
    [(signal.SIGTERM, 143, "terminated"), (signal.SIGINT, 130, "interrupted")],
)
@pytest.mark.parametrize("then_s", [30.0, 0.0], ids=["working-on", "returning"])
def test_an_interrupt_python_dropped_in_a_callback_still_ends_the_command(
    monkeypatch, capsys, signum, exit_status, line, then_s
):
    import prismbench.cli as cli

    monkeypatch.setattr(cli, "_cmd_workloads", _signalled_inside_a_finalizer(signum, then_s))
    hook = sys.unraisablehook
    with _python_s_own_interrupt_handlers():
        # before, 0: after the 30 s of work, or at once (and the interrupt came after main)
        assert main(["workloads"]) == exit_status
        time.sleep(0.05)  # a re-delivery left armed would arrive here
    err = capsys.readouterr().err
    assert err.strip() == line and "Exception ignored" not in err
    assert sys.unraisablehook is hook


def test_a_gate_allows_for_how_far_the_measured_runs_reached_on_the_error_s_side():
    from prismbench.validate import CaseResult, MetricResult

    def case(predicted, below, above):
        metric = MetricResult("iteration_time_s", predicted, 1.0, slack_below=below,
                              slack_above=above)  # fmt: skip
        return CaseResult(baseline="b", source="s", gpu="g", world_size=1, status="ok", wall_s=0.0,
                          metrics=[metric])  # fmt: skip

    thresholds = parse_thresholds("iteration_time_s:10%", option="--gate")
    assert gate_failures([case(1.12, 0.0, 0.0)], thresholds)  # +12 % against 10 %
    assert not gate_failures([case(1.12, 0.0, 0.03)], thresholds)  # runs reached +3 %
    # one slow iteration (+30 %) widens the bound above the median, not below it
    assert gate_failures([case(0.88, 0.01, 0.30)], thresholds)


def test_a_gate_on_a_metric_no_selected_case_measures_fails():
    from prismbench.validate import CaseResult, MetricResult

    timed_only = CaseResult(baseline="b", source="s", gpu="g", world_size=1, status="ok",
                            wall_s=0.0, metrics=[MetricResult("iteration_time_s", 1.0, 1.0)])  # fmt: skip
    thresholds = parse_thresholds("peak_memory_reserved_bytes:5%", option="--gate")
    ((baseline, metric, _, why),) = gate_failures([timed_only], thresholds)
    assert (baseline, metric) == ("-", "peak_memory_reserved_bytes") and "no selected case" in why


def test_results_are_cached_by_spec_code_and_tables(tmp_path, baselines_dir, monkeypatch):
    monkeypatch.setenv("PRISMBENCH_CACHE", str(tmp_path / "cache"))
    chosen = load_baselines(baselines_dir)[:1]
    first = validate(chosen, db_path=tmp_path / "h.duckdb", workers=1)
    again = validate(chosen, db_path=tmp_path / "h.duckdb", workers=1)
    fresh = validate(chosen, db_path=tmp_path / "h.duckdb", workers=1, use_cache=False)
    assert [r.cases[0].result["from_cache"] for r in (first, again, fresh)] == [False, True, False]
    assert again.cases[0].metrics == first.cases[0].metrics
    # a case's wall time is the worker's own on it, not the time since it was queued
    assert all(r.cases[0].wall_s == r.cases[0].result["case_wall_s"] > 0 for r in (first, again))


def test_artifacts_are_written_and_logged(history_dir, baselines_dir):
    import mlflow

    db = history_dir / "p.duckdb"
    args = _validate_args(baselines_dir, "--select", "r001", "--db", str(db), "--workers", "1")
    assert main([*args, "--artifacts"]) == 0
    (case_dir,) = (history_dir / "artifacts").glob("*/mine__tiny__1g__r001")
    assert (case_dir / "timeline.json").stat().st_size > 0
    assert list((case_dir / "memory").glob("*.png"))
    mlflow.set_tracking_uri(f"sqlite:///{history_dir / 'mlflow.db'}")
    child = mlflow.search_runs(
        experiment_names=["prismbench-validate"],
        filter_string="params.baseline = 'mine__tiny__1g__r001'",
    )
    names = {a.path for a in mlflow.MlflowClient().list_artifacts(child.run_id[0])}
    assert {"timeline.json", "memory", "result.json"} <= names


def test_the_default_selection_covers_every_source_and_every_gpu_generation():
    from prismbench.validate import load_all_baselines

    chosen = select_baselines(load_all_baselines("results/baselines"), None, False)
    everything = load_all_baselines("results/baselines")
    assert {b.name.split("__")[0] for b in chosen} == {b.name.split("__")[0] for b in everything}
    assert {b.job.cluster.gpu.split("-")[0] for b in chosen} == {"a100", "h100", "h200"}
    assert any(b.job.parallel.vpp > 1 for b in chosen) and any(
        b.job.parallel.zero == 3 for b in chosen
    )
    # what the README says it covers: r013's tp 8 without SP was once labelled "+ sequence"
    assert any(b.job.parallel.sequence_parallel for b in chosen)
    assert any(b.job.model.positions == "alibi" for b in chosen)


def test_a_malformed_baseline_is_refused_with_exit_2(tmp_path, baselines_dir, capsys):
    (baselines_dir / "mine__bad__1g__r003.toml").write_text(
        TINY_JOB
        + "[measured]\niteration_time_s = -1\n"
        + '[provenance]\nsource = "t"\ncsv_row = 2\nmodel = "m"\n'
    )
    assert main(_validate_args(baselines_dir, "--all", "--db", str(tmp_path / "h.duckdb"))) == 2
    err = capsys.readouterr().err
    assert (
        "mine__bad__1g__r003.toml" in err
        and "measured.iteration_time_s=-1 must be a positive number" in err
    )


def _start_validation(baselines_dir, db, workers: int):
    """`python -m prismbench validate` of every baseline on `workers` workers (its stderr in
    <db>.stderr), and those workers' pids (with the resource tracker's) once its run is in the
    history."""
    args = _validate_args(baselines_dir, "--all", "--db", str(db), "--no-mlflow", "--no-cache",
                          "--workers", str(workers))  # fmt: skip
    with db.with_suffix(".stderr").open("w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "prismbench", *args],
                                stdout=subprocess.DEVNULL, stderr=stderr)  # fmt: skip
    deadline = time.monotonic() + 60
    while (
        not (db.exists() and history.read(db, "SELECT run_id FROM runs"))
        or len(children(proc.pid)) < workers + 1
    ) and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc, children(proc.pid)


@pytest.mark.skipif(not HAS_PROC, reason="finds the workers in Linux /proc")
def test_a_killed_validation_is_not_recorded_complete_leaves_no_workers_and_is_marked_later(
    tmp_path, baselines_dir
):
    db = tmp_path / "h.duckdb"
    proc, workers = _start_validation(baselines_dir, db, workers=2)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    survivors = kill_survivors(workers, 10 * PARENT_POLL_S)
    (run,) = history.read(db, "SELECT run_id, status, ended_at FROM runs")
    assert run["status"] == "running" and run["ended_at"] is None
    assert len(workers) == 3 and survivors == []
    # the next validation on this host finds its process gone, marks it and says so
    said = []
    validate(load_baselines(baselines_dir)[:1], db_path=db, workers=1, use_cache=False,
             progress=said.append)  # fmt: skip
    statuses = history.read(db, "SELECT run_id, status FROM runs ORDER BY started_at")
    assert [r["status"] for r in statuses] == ["abandoned", "complete"]
    assert said[0] == (f"history {db}: marked 1 earlier run(s) of this host 'abandoned' (left "
                       f"'running' by a process that has ended): {run['run_id']}")  # fmt: skip


@pytest.mark.skipif(not HAS_PROC, reason="finds the workers in Linux /proc")
def test_sigterm_ends_a_validation_as_ctrl_c_does(tmp_path, baselines_dir, monkeypatch):
    monkeypatch.setenv("PRISMBENCH_CACHE", str(tmp_path / "cache"))
    # eight jobs (each emulation writes its own result file) on two workers: the six queued
    # ones must not be emulated before validate ends
    first = (baselines_dir / "mine__tiny__1g__r001.toml").read_text()
    for n in range(2, 9):
        (baselines_dir / f"mine__tiny__1g__r00{n}.toml").write_text(
            first.replace("global_batch = 2", f"global_batch = {2 * n}")
        )
    db = tmp_path / "h.duckdb"
    proc, workers = _start_validation(baselines_dir, db, workers=2)
    proc.send_signal(signal.SIGTERM)  # to validate alone, as `kill` sends it
    assert proc.wait(timeout=60) == 143
    err = db.with_suffix(".stderr").read_text()
    assert err.splitlines()[-1] == "terminated" and "Traceback" not in err
    assert history.read(db, "SELECT status FROM runs") == [{"status": "interrupted"}]
    assert len(list((tmp_path / "cache" / "results").glob("*.json"))) < 8
    assert len(workers) == 3 and kill_survivors(workers, 10 * PARENT_POLL_S) == []


def _kernel_rows(path: Path, gpu: str) -> str:
    """A one-row kernel table measured on `gpu` (a made-up GEMM time)."""
    from emulator.costs.calibrate import write_kernel_csv

    row = {"op": "mm", "dtype": "bf16", "m": 64, "n": 64, "k": 64, "batch": 1, "time_us": 9.0,
           "repetitions": 1, "spread_us": 0.0, "source": "mine"}  # fmt: skip
    provenance = {"gpu": gpu, "driver": "", "torch": "", "clocks": "", "date": ""}
    return str(write_kernel_csv([row], path, provenance))


def test_a_users_kernel_table_prices_the_cases_and_keys_the_result_cache(
    tmp_path, baselines_dir, monkeypatch
):
    monkeypatch.setenv("PRISMBENCH_CACHE", str(tmp_path / "cache"))
    chosen = load_baselines(baselines_dir)[:1]
    rows = _kernel_rows(tmp_path / "rows.csv", "NVIDIA H100 80GB HBM3")
    runs = [
        validate(chosen, db_path=tmp_path / "h.duckdb", workers=1, kernel_tables=tables)
        for tables in ((), (rows,), (rows,))
    ]
    results = [r.cases[0].result for r in runs]
    assert [r["from_cache"] for r in results] == [False, False, True]  # not the plain run's
    assert results[1]["kernel_table"] == f"{rows} over results/kernels/h100-sxm-80g.csv"


def test_a_kernel_table_of_another_gpu_is_refused_before_a_run_starts(
    tmp_path, baselines_dir, capsys
):
    rows = _kernel_rows(tmp_path / "rows.csv", "NVIDIA A100-SXM4-80GB")
    db = tmp_path / "p.duckdb"
    args = _validate_args(baselines_dir, "--db", str(db), "--no-mlflow", "--all")
    assert main([*args, "--kernel-table", rows]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"error: --kernel-table: {rows}: rows measured on 'NVIDIA A100-SXM4-80GB'"
    )
    assert "cases on h100-sxm-80g: mine__tiny__1g__r001, mine__tiny__1g__r002" in err
    assert not db.exists()


def test_a_kernel_table_that_cannot_be_read_is_refused_without_a_selection_to_make(
    tmp_path, baselines_dir, capsys
):
    # a missing file or one without the columns was told to "select cases on the table's GPU"
    broken = tmp_path / "broken.csv"
    broken.write_text("a,b\n")
    args = _validate_args(baselines_dir, "--db", str(tmp_path / "p.duckdb"), "--no-mlflow", "--all")
    for table, says in ((tmp_path / "none.csv", "No such file"), (broken, "lacks columns")):
        assert main([*args, "--kernel-table", str(table)]) == 2
        err = capsys.readouterr().err
        assert says in err and "select cases" not in err


def test_a_case_predicted_to_run_out_of_memory_fails_the_gate_without_a_threshold():
    # every baseline records a run that completed: a prediction that it does not fit is wrong
    # whatever --gate says (a change that makes a job not fit is what a gate must catch first)
    from prismbench.validate import PREDICTED_OOM, CaseResult, MetricResult

    def case(oom):
        return CaseResult(baseline="b", source="s", gpu="g", world_size=1, status="ok", wall_s=0.0,
                          result={"oom": oom},
                          metrics=[MetricResult("iteration_time_s", 1.0, 1.0)])  # fmt: skip

    assert gate_failures([case(True)], []) == [
        ("b", "oom", pytest.approx(float("nan"), nan_ok=True), PREDICTED_OOM)
    ]
    assert gate_failures([case(False)], []) == []


def test_validate_help_names_every_way_it_exits_1(capsys):
    # gate_failures fails a run on a failed emulation and on a predicted OOM, with or without
    # --gate (the README says so); --help said only the first
    assert main(["validate", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "fails to emulate" in help_text and "predicted to run out of memory" in help_text
