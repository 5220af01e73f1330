"""Temporal variation measured from the shared H100/H200 profiles, and the `measured` preset
(prismbench/variability_calibration.py)."""

import gzip
import json
import re
from pathlib import Path

import pytest

from prismbench.cli import main
from prismbench.profile_readers import ProfileError, read_profile
from prismbench.variability_calibration import (
    VARIABILITY_TABLES,
    calibrate_jobs,
    measured_model,
    profile_pools,
    read_jobs,
    read_table,
    resolve_preset,
    write_table,
)
from workloads.config import SpecError

SHARED_GPU = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "gpu"
needs_shared = pytest.mark.skipif(
    not SHARED_GPU.is_dir(), reason="../shared/data/gpu is not beside the repo"
)


@needs_shared
def test_every_profiled_op_lands_in_one_pool_of_its_class():
    ops = read_profile(
        SHARED_GPU / "h100-sxm-80g/profiles/llama3-8b-l2-s8192-mb2-none.ops.jsonl.gz"
    )
    pools = profile_pools(ops)
    assert sum(len(durations) for _, durations in pools.values()) == len(ops)
    classes = {klass for klass, _ in pools.values()}
    assert classes == {"gemm", "attention", "memory"}
    mm = [d for (op, *_), (klass, d) in pools.items() if op == "aten::mm"]
    assert mm and all(klass == "gemm" for (op, *_), (klass, _) in pools.items() if op == "aten::mm")


@needs_shared
@pytest.mark.parametrize("gpu", ["h100-sxm-80g", "h200-141g"])
def test_the_committed_tables_are_what_the_shared_measurements_give(gpu):
    variation = calibrate_jobs(read_jobs(SHARED_GPU / gpu))
    table = json.loads((VARIABILITY_TABLES / f"{gpu}.json").read_text())
    assert table["temporal_cv_by_class"] == pytest.approx(variation.noise.cv_by_class, rel=1e-9)
    assert table["temporal_floor_s"] == pytest.approx(variation.noise.floor_s, rel=1e-9)
    assert table["step_cv"] == pytest.approx(variation.step_cv, rel=1e-9)
    assert table["step_cv_dispersion"] == pytest.approx(variation.step_cv_dispersion, rel=1e-6)
    assert table["step_cv_dispersion"] > 0  # the jobs' step spreads differ beyond their ranges'


def test_a_table_write_that_fails_leaves_the_old_table_and_nothing_else(tmp_path, monkeypatch):
    path = write_table({"step_cv": 0.01}, tmp_path / "h100-sxm-80g.json")

    def disk_full(self, text):
        with open(self, "w") as handle:
            handle.write(text[:3])
        raise OSError("No space left on device")

    monkeypatch.setattr(Path, "write_text", disk_full)
    with pytest.raises(OSError, match="No space left"):
        write_table({"step_cv": 0.02}, path)
    assert list(tmp_path.iterdir()) == [path]
    assert json.loads(path.read_text()) == {"step_cv": 0.01}


def test_a_summary_without_iteration_times_is_refused_naming_the_field(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"job": {"iterations": 8}}))
    with pytest.raises(ValueError, match="iteration_s_min"):
        read_jobs(tmp_path)


def test_a_profile_without_ops_is_refused_naming_it(tmp_path):
    times = {"iterations": 8, "iteration_s_min": 1.0, "iteration_s_median": 1.1,
             "iteration_s_max": 1.2}  # fmt: skip
    (tmp_path / "summary.json").write_text(json.dumps({"job": times}))
    profile = tmp_path / "profiles" / "job.ops.jsonl.gz"
    profile.parent.mkdir()
    with gzip.open(profile, "wt") as handle:  # a runtime event only: no op launched a kernel
        handle.write(json.dumps({"op": "Activity Buffer Request", "kernels": [["k", 1.0]]}) + "\n")
    with pytest.raises(ProfileError, match=re.escape(f"{profile}: no op with GPU time")):
        read_jobs(tmp_path)


def test_measured_preset_reads_the_jobs_gpu_table():
    table = json.loads((VARIABILITY_TABLES / "h100-sxm-80g.json").read_text())
    model = resolve_preset("measured", "h100-sxm-80g")
    assert model.temporal_cv_by_class == table["temporal_cv_by_class"]
    assert model.step_cv == table["step_cv"] > 0
    assert model.step_cv_dispersion == table["step_cv_dispersion"] > 0
    older = {k: v for k, v in table.items() if k != "step_cv_dispersion"}
    assert measured_model(older).step_cv_dispersion == 0.0  # a table from before the field
    assert resolve_preset("prism-high", "h100-sxm-80g").temporal_cv > model.temporal_cv_of("gemm")
    with pytest.raises(SpecError, match="no measured variability for gpu 'a100-sxm-80g'"):
        resolve_preset("measured", "a100-sxm-80g")
    with pytest.raises(SpecError, match="must be one of"):
        resolve_preset("prism-medium", "h100-sxm-80g")


def test_measured_preset_reads_a_table_given_by_path(tmp_path):
    table = json.loads((VARIABILITY_TABLES / "h100-sxm-80g.json").read_text())
    mine = write_table(table | {"step_cv": 0.02}, tmp_path / "mine.json")
    assert resolve_preset("measured", "h100-sxm-80g", mine).step_cv == 0.02
    with pytest.raises(SpecError, match=f"--variability-table {mine}: .* give --preset measured"):
        resolve_preset("prism-low", "h100-sxm-80g", mine)
    with pytest.raises(
        SpecError, match="measured on gpu 'h100-sxm-80g', the job's cluster.gpu is 'h200-141g'"
    ):
        resolve_preset("measured", "h200-141g", mine)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "cannot read a variability table"),
        ('{"schema_version": 0}', "schema_version 0, expected 1"),
        ("[1]", "schema_version None, expected 1"),
        ('{"schema_version": 1, "gpu": "h100-sxm-80g"}', "a variability table needs temporal_cv_by_class"),
    ],
)
def test_a_table_that_is_not_one_is_refused_naming_the_file(tmp_path, text, message):
    path = tmp_path / "table.json"
    path.write_text(text)
    with pytest.raises(SpecError, match=f"{path}: {message}"):
        read_table(path)


def test_cli_measured_preset_on_a_gpu_without_a_table_exits_2(tmp_path, capsys):
    job = tmp_path / "job.toml"
    job.write_text(
        '[model]\nname = "llama-debug"\n[batch]\nseq_len = 64\nglobal_batch = 8\n'
        '[cluster]\ngpu = "a100-sxm-80g"\n'
    )
    assert main(["variability", str(job), "--preset", "measured"]) == 2
    assert "no measured variability for gpu 'a100-sxm-80g'" in capsys.readouterr().err


@pytest.mark.integration
def test_cli_measured_preset_samples_a_spread(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PRISMBENCH_CACHE", str(tmp_path / "cache"))
    job = tmp_path / "job.toml"
    job.write_text('[model]\nname = "llama-debug"\n[batch]\nseq_len = 64\nglobal_batch = 8\n')
    assert main(["variability", str(job), "--preset", "measured", "--samples", "200", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["preset"] == "measured"
    assert result["std_s"] > 0 and result["p95_s"] > result["p5_s"]
