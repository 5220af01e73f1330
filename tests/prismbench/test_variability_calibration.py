"""Temporal variation measured from the shared H100/H200 profiles, and the `measured` preset
(prismbench/variability_calibration.py)."""

import gzip
import json
import re
from pathlib import Path

import numpy as np
import pytest

from prismbench.cli import main
from prismbench.profile_readers import ProfiledOp, ProfileError, read_profile
from prismbench.variability_calibration import (
    VARIABILITY_TABLES,
    calibrate_jobs,
    job_variation,
    measured_model,
    profile_pools,
    read_jobs,
    read_table,
    resolve_preset,
    temporal_pools,
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


def _iterations(rng, means_us, cv, count, dropped=()):
    """`count` profiled iterations of ops of one signature at positions of `means_us` (us),
    each varying by `cv` over time; the positions of `dropped` missing from iteration 1."""
    iterations = []
    for t in range(count):
        ops = [ProfiledOp("aten::cat", ((8, 8), (8, 8)), (("k", m * (1 + cv * rng.standard_normal())),), 0.0)
               for i, m in enumerate(means_us) if not (t == 1 and i in dropped)]  # fmt: skip
        iterations.append(ops)
    return iterations


def test_temporal_pools_read_an_op_s_spread_over_time_not_over_its_positions():
    rng = np.random.default_rng(0)
    iterations = _iterations(rng, [113.0, 446.0] * 12, 0.02, 20)  # Llama's cat: two sizes, one signature
    ((klass, durations),) = temporal_pools(iterations).values()
    across_positions = np.array(next(iter(profile_pools(iterations[0]).values()))[1])
    assert klass == "memory" and len(durations) == 24 * 20
    assert np.std(durations, ddof=1) / np.mean(durations) == pytest.approx(0.02, rel=0.1)
    assert across_positions.std(ddof=1) / across_positions.mean() > 0.5


def test_a_temporal_pool_of_one_position_reads_its_variance_without_bias():
    """One op a step followed over 8 iterations (what reprofile_gpu.py records): the pool's
    variance (ddof 1) over many runs averages the true one (widened by T / (T - 1), as first
    written, it read 14 % high)."""
    rng = np.random.default_rng(3)
    variances = []
    for _ in range(3000):
        ((_, durations),) = temporal_pools(_iterations(rng, [200.0], 0.02, 8)).values()
        variances.append(np.var(np.asarray(durations) / np.mean(durations), ddof=1))
    assert np.mean(variances) == pytest.approx(0.02**2, rel=0.04)


def test_temporal_pools_follow_only_the_positions_every_iteration_has():
    iterations = _iterations(np.random.default_rng(1), [100.0, 200.0, 300.0], 0.01, 3, dropped=(2,))
    ((_, durations),) = temporal_pools(iterations).values()
    assert len(durations) == 2 * 3  # the third op is missing from iteration 1: it is not followed
    with pytest.raises(ValueError, match="at least 2"):
        temporal_pools(iterations[:1])


def test_a_profile_of_several_iterations_is_measured_over_time(tmp_path):
    """`record --profile-iterations N` writes every iteration: the job's pools follow each op at
    its position, and its iterations' kernel time has a measured CV."""
    from prismbench.calibrate_job import write_ops_jsonl_iterations

    rng = np.random.default_rng(2)
    iterations = _iterations(rng, [113.0, 446.0] * 8, 0.02, 10)
    records = [[{"op": o.op, "shapes": [list(s) for s in o.shapes], "kernels": [list(k) for k in o.kernels],
                 "cpu_start_us": float(i)} for i, o in enumerate(ops)] for ops in iterations]  # fmt: skip
    profile = write_ops_jsonl_iterations(records, tmp_path / "job.ops.jsonl.gz")
    times = dict(iterations=10, iteration_s_min=0.99e-2, iteration_s_median=1e-2, iteration_s_max=1.01e-2)
    job = job_variation("job", profile, **times)
    (fit,) = job.fits
    assert fit.std_s / fit.mean_s == pytest.approx(0.02, rel=0.15)  # over positions: ~60 %
    sums = [sum(o.kernel_us for o in ops) * 1e-6 for ops in iterations]
    assert job.kernel_cv_measured == pytest.approx(np.std(sums, ddof=1) / np.mean(sums))
    one = write_ops_jsonl_iterations(records[:1], tmp_path / "one.ops.jsonl.gz")
    assert job_variation("job", one, **times).kernel_cv_measured is None


@needs_shared
@pytest.mark.parametrize(  # CI reads the H200's (10 s on 2 cores), the H100's is the same code
    "gpu", [pytest.param("h100-sxm-80g", marks=pytest.mark.slow), "h200-141g"]
)
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
def test_cli_measured_preset_samples_a_spread(tmp_path, capsys):
    job = tmp_path / "job.toml"
    job.write_text('[model]\nname = "llama-debug"\n[batch]\nseq_len = 64\nglobal_batch = 8\n')
    assert main(["variability", str(job), "--preset", "measured", "--samples", "200", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["preset"] == "measured"
    assert result["std_s"] > 0 and result["p95_s"] > result["p5_s"]


@pytest.mark.parametrize(
    ("figures", "message"),
    [
        ({"step_cv": -0.5}, "step_cv=-0.5 must be >= 0"),
        ({"temporal_floor_s": float("inf")}, "temporal_floor_s=inf must be a finite number"),
        ({"temporal_cv_by_class": {"gemm": float("nan")}}, r"temporal_cv_by_class\['gemm'\]=nan must be a finite number"),
        ({"temporal_cv_by_class": {"gemm": 0.5}}, r"temporal_cv_by_class\['gemm'\]=0.5 must be in \[0, 0.15\]"),
        ({"temporal_cv_by_class": {"gemm": "x"}}, r"temporal_cv_by_class\['gemm'\]='x' must be a finite number"),
        ({"temporal_cv_by_class": [0.01]}, r"temporal_cv_by_class must be an object of a CV per noise class"),
    ],
)  # fmt: skip
def test_a_table_of_a_figure_the_model_cannot_draw_is_refused_naming_it(tmp_path, figures, message):
    """A table edited by hand or written broken: each of these ended in a traceback (exit 1),
    an infinite floor only once the Monte Carlo's times were summarized."""
    table = json.loads((VARIABILITY_TABLES / "h100-sxm-80g.json").read_text())
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(table | figures))
    with pytest.raises(SpecError, match=rf"{re.escape(str(path))}: {message}"):
        resolve_preset("measured", "h100-sxm-80g", path)


def test_cli_a_table_of_a_negative_step_cv_exits_2_before_any_capture(tmp_path, capsys):
    table = json.loads((VARIABILITY_TABLES / "h100-sxm-80g.json").read_text())
    path = write_table(table | {"step_cv": -0.5}, tmp_path / "mine.json")
    job = tmp_path / "job.toml"
    job.write_text('[model]\nname = "llama-debug"\n[batch]\nseq_len = 64\nglobal_batch = 8\n')
    argv = ["variability", str(job), "--preset", "measured", "--variability-table", str(path)]
    assert main(argv) == 2
    assert f"error: {path}: step_cv=-0.5 must be >= 0" in capsys.readouterr().err
