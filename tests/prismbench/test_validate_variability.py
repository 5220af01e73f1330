"""Tests for `prismbench validate --variability` (prismbench/validate_variability.py): the
step-time distribution of each case in DuckDB, MLflow and the summary, on two tiny baselines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prismbench import history
from prismbench.baselines import load_baselines
from prismbench.cli import main
from prismbench.validate import validate
from prismbench.validate_variability import PLOT_NAME, VariabilitySettings
from workloads.config import SpecError

TINY_JOB = """[job.model]
name = "gpt-debug"
[job.batch]
seq_len = 64
global_batch = 2
"""
PROVENANCE = '[provenance]\nsource = "a test"\ncsv_row = 2\nmodel = "gpt-debug"\n'
SPREAD = "iterations = 8\niteration_time_s_min = 0.0095\niteration_time_s_max = 0.011\n"


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(autouse=True)
def private_cache(cache_dir, monkeypatch):
    """One capture cache for the module: the tests capture the tiny job once."""
    monkeypatch.setenv("PRISMBENCH_CACHE", str(cache_dir))


@pytest.fixture
def baselines_dir(tmp_path):
    """The tiny job twice: recorded with a spread of repeated iterations, and one figure."""
    directory = tmp_path / "baselines"
    directory.mkdir()
    measured = "[measured]\niteration_time_s = 0.01\n"
    (directory / "mine__tiny__1g__r001.toml").write_text(TINY_JOB + measured + SPREAD + PROVENANCE)
    (directory / "mine__tiny__1g__r002.toml").write_text(TINY_JOB + measured + PROVENANCE)
    return directory


def _args(baselines_dir, db: Path, *more: str) -> list[str]:
    return ["validate", "--baselines", str(baselines_dir), "--all", "--db", str(db),
            "--workers", "1", *more]  # fmt: skip


def _children(db: Path):
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{db.parent / 'mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=["prismbench-validate"])
    return runs[runs["params.baseline"].notna()].set_index("params.baseline")


def test_the_flag_stores_the_distribution_in_duckdb_mlflow_and_the_summary(
    history_dir, baselines_dir, capsys
):
    import mlflow

    db = history_dir / "p.duckdb"
    flags = ("--variability", "prism-high", "--variability-samples", "200")
    assert main(_args(baselines_dir, db, *flags)) == 0
    out = capsys.readouterr().out
    assert "Step-time distribution per case (prism-high, 200 samples, seed 0)" in out
    assert " ms" in out and "±" in out
    rows = history.read(db, "SELECT * FROM case_variability ORDER BY baseline")
    assert [(r["baseline"], r["preset"], r["samples"], r["seed"]) for r in rows] == [
        ("mine__tiny__1g__r001", "prism-high", 200, 0),
        ("mine__tiny__1g__r002", "prism-high", 200, 0),
    ]
    recorded, single = rows
    assert recorded["p5_s"] <= recorded["p50_s"] <= recorded["p95_s"] <= recorded["p99_s"]
    assert recorded["std_s"] > 0 and recorded["monte_carlo_wall_s"] > 0
    # 200 samples: 20 allocations of 10 steps, the spread split between and within them
    assert recorded["steps_per_allocation"] == 10
    assert recorded["within_allocation_std_s"] > 0 and recorded["allocation_std_s"] is not None
    (case,) = history.read(db, "SELECT result FROM cases WHERE baseline = 'mine__tiny__1g__r001'")
    assert recorded["deterministic_s"] == json.loads(case["result"])["iteration_time_s"]
    assert recorded["measured_iterations"] == 8
    assert recorded["measured_relative_spread"] == pytest.approx(0.075)
    assert single["measured_iterations"] is None and single["measured_relative_spread"] is None
    children = _children(db)
    assert children.loc["mine__tiny__1g__r001", "metrics.variability_p95_s"] == recorded["p95_s"]
    assert children.loc["mine__tiny__1g__r001", "metrics.variability_measured_relative_spread"]
    run_id = children.loc["mine__tiny__1g__r001", "run_id"]
    assert PLOT_NAME in {a.path for a in mlflow.MlflowClient().list_artifacts(run_id)}


def test_without_the_flag_nothing_is_written(history_dir, baselines_dir, capsys):
    db = history_dir / "p.duckdb"
    assert main(_args(baselines_dir, db)) == 0
    assert "Step-time distribution" not in capsys.readouterr().out
    assert history.read(db, "SELECT * FROM case_variability") == []
    (settings,) = history.read(db, "SELECT settings FROM runs")
    assert "variability" not in json.loads(settings["settings"])
    assert not any(c.startswith("metrics.variability") for c in _children(db).columns)
    assert not (history_dir / "artifacts").exists()


@pytest.mark.parametrize(
    ("flags", "option"),
    [
        (("--variability", "prism-medium"), "--variability"),
        (("--variability", "none", "--variability-samples", "0"), "--variability-samples"),
        (("--variability", "none", "--variability-seed", "-1"), "--variability-seed"),
        (("--variability-samples", "10"), "--variability-samples"),
        (("--variability-steps-per-allocation", "5"), "--variability-steps-per-allocation"),
        (
            ("--variability", "none", "--variability-samples", "100"),
            "--variability-samples=100 makes 10 allocation(s) of --variability-steps-per-allocation=10",
        ),
        (
            ("--variability", "none", "--variability-steps-per-allocation", "0"),
            "--variability-steps-per-allocation",
        ),
    ],
)
def test_a_bad_value_exits_2_naming_the_option(tmp_path, baselines_dir, capsys, flags, option):
    db = tmp_path / "p.duckdb"
    assert main(_args(baselines_dir, db, "--no-mlflow", *flags)) == 2
    assert option in capsys.readouterr().err
    assert not db.exists()  # refused before anything ran


def test_the_library_refuses_bad_settings_naming_the_option():
    with pytest.raises(SpecError, match="--variability 'x'"):
        VariabilitySettings(preset="x")
    with pytest.raises(SpecError, match="--variability-samples"):
        VariabilitySettings(preset="none", samples=0)


def test_the_same_seed_stores_the_same_figures(tmp_path, baselines_dir):
    db = tmp_path / "h.duckdb"
    chosen = load_baselines(baselines_dir)[:1]
    runs = [
        validate(chosen, db_path=db, workers=1,
                 variability=VariabilitySettings(preset="prism-low", samples=200, seed=seed))
        for seed in (5, 5, 6)
    ]  # fmt: skip
    assert runs[1].cases[0].result["from_cache"]  # the distribution comes from the capture cache
    figures = [
        {k: v for k, v in row.items() if k not in ("run_id", "monte_carlo_wall_s")}
        for run in runs
        for row in history.read(db, "SELECT * FROM case_variability WHERE run_id = ?", [run.run_id])
    ]
    assert figures[0] == figures[1]
    assert figures[0]["p95_s"] != figures[2]["p95_s"]


def test_the_measured_preset_samples_cases_on_a_measured_gpu(tmp_path, baselines_dir):
    settings = VariabilitySettings(preset="measured", samples=200)
    run = validate(load_baselines(baselines_dir), db_path=tmp_path / "h.duckdb", workers=1,
                   variability=settings)  # fmt: skip
    assert {c.variability["preset"] for c in run.cases} == {"measured"}
    assert all(c.variability["std_s"] > 0 for c in run.cases)


def test_the_measured_preset_refuses_a_selection_with_an_unmeasured_gpu(
    tmp_path, baselines_dir, capsys
):
    a100 = TINY_JOB + '[job.cluster]\ngpu = "a100-sxm-80g"\n'
    (baselines_dir / "mine__tiny__1g__r003.toml").write_text(
        a100 + "[measured]\niteration_time_s = 0.01\n" + PROVENANCE
    )
    db = tmp_path / "h.duckdb"
    assert main(_args(baselines_dir, db, "--variability", "measured")) == 2
    assert "no measured variability for gpu a100-sxm-80g" in capsys.readouterr().err
    # neither the history nor an MLflow store beside it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["baselines"]


def _own_table(tmp_path: Path, **figures) -> Path:
    """The committed H100 table with `figures` changed, as one's own table of that GPU."""
    table = json.loads(Path("results/variability/h100-sxm-80g.json").read_text()) | figures
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(table))
    return path


def test_a_table_of_one_s_own_gpu_is_drawn_and_stored_with_the_run(tmp_path, baselines_dir):
    db = tmp_path / "h.duckdb"
    chosen = load_baselines(baselines_dir)[:1]
    mine = _own_table(tmp_path, step_cv=0.05)
    runs = [
        validate(chosen, db_path=db, workers=1,
                 variability=VariabilitySettings(preset="measured", samples=200, table=table))
        for table in (None, str(mine))
    ]  # fmt: skip
    committed, own = (run.cases[0].variability for run in runs)
    assert own["std_s"] > 5 * committed["std_s"]  # a 5 % step CV against the H100's 0.3 %
    (settings,) = history.read(db, "SELECT settings FROM runs WHERE run_id = ?", [runs[1].run_id])
    assert json.loads(settings["settings"])["variability"]["table"] == str(mine)


def test_a_table_is_refused_with_another_preset_or_a_case_on_another_gpu(
    tmp_path, baselines_dir, capsys
):
    mine = str(_own_table(tmp_path))
    db = tmp_path / "h.duckdb"
    assert main(_args(baselines_dir, db, "--variability", "prism-low", "--variability-table", mine)) == 2
    assert "which --variability prism-low does not draw; give --variability measured" in capsys.readouterr().err
    assert main(_args(baselines_dir, db, "--variability-table", mine)) == 2
    assert "--variability-table given without --variability PRESET" in capsys.readouterr().err
    (baselines_dir / "mine__tiny__1g__r003.toml").write_text(
        TINY_JOB + '[job.cluster]\ngpu = "a100-sxm-80g"\n[measured]\niteration_time_s = 0.01\n' + PROVENANCE
    )
    assert main(_args(baselines_dir, db, "--variability", "measured", "--variability-table", mine)) == 2
    assert "measured on gpu 'h100-sxm-80g'; selected cases run on a100-sxm-80g" in capsys.readouterr().err
    assert not db.exists()
