"""Tests for prismbench/calibrate_job.py. A CPU has no kernels to profile: the flow after the
profiler (profile file, ingestion, table) is exercised with op records made from the capture;
a GPU run is what checks the profiler's records themselves."""

from __future__ import annotations

import pytest
import torch

from emulator.costs.kernel_table import load_kernel_table
from emulator.hardware import GPU_NAMES, gpu_preset
from prismbench.calibrate_job import calibrate_job, write_ops_jsonl_iterations
from prismbench.capture import capture_job
from prismbench.cli import main
from prismbench.profile_readers import read_ops_jsonl, read_profile_iterations
from prismbench.spec import SpecError, job_spec_from_dict
from tests.prismbench.profiles import TINY, TINY_TOML, compute_rows, profiled

JOB = job_spec_from_dict(TINY)


def _profile_records() -> list[dict]:
    """What profile_iterations would return for one iteration of JOB on a GPU: each captured
    op, 3 us."""
    trace = capture_job(JOB).traces[0]
    return [
        {"op": o.op, "shapes": [list(s) for s in o.shapes], "self_cuda_us": o.kernel_us,
         "kernels": [list(k) for k in o.kernels], "cpu_start_us": float(i)}
        for i, o in enumerate(profiled(trace, r, 3.0) for r in compute_rows(trace))
    ]  # fmt: skip


def _profiles(monkeypatch, records):
    monkeypatch.setattr("emulator.costs.kernel_timing.profile_iterations",
                        lambda step, iterations, warmup, cuda: [records] * iterations)  # fmt: skip


def test_profile_and_rows_are_written(tmp_path, monkeypatch):
    records = _profile_records()
    _profiles(monkeypatch, records)
    result = calibrate_job(JOB, tmp_path / "t.csv", tmp_path / "tiny.ops.jsonl.gz", device="cpu")
    assert len(read_ops_jsonl(tmp_path / "tiny.ops.jsonl.gz")) == len(records)
    assert result.matched_rows == result.trace_rows
    table = load_kernel_table(tmp_path / "t.csv")
    assert table.groups and result.rows[0]["source"] == "profile:tiny"


def test_several_profiled_iterations_are_written_and_pooled_into_the_rows(tmp_path, monkeypatch):
    _profiles(monkeypatch, _profile_records())
    one = calibrate_job(JOB, tmp_path / "one.csv", tmp_path / "one.ops.jsonl.gz", device="cpu")
    three = calibrate_job(JOB, tmp_path / "t.csv", tmp_path / "tiny.ops.jsonl.gz", device="cpu",
                          iterations=3)  # fmt: skip
    assert len(read_profile_iterations(tmp_path / "tiny.ops.jsonl.gz")) == three.profile_iterations == 3
    assert [r["repetitions"] for r in three.rows] == [3 * r["repetitions"] for r in one.rows]


def test_a_profile_that_fails_to_write_leaves_the_old_one(tmp_path):
    profile = tmp_path / "p.ops.jsonl.gz"
    mm = {"op": "aten::mm", "shapes": [[8, 8], [8, 8]], "kernels": [["sm90_gemm", 3.0]]}
    write_ops_jsonl_iterations([[mm]], profile)
    with pytest.raises(TypeError):
        write_ops_jsonl_iterations([[mm | {"op": "aten::add"}, mm | {"shapes": object()}]], profile)
    assert [op.op for op in read_ops_jsonl(profile)] == ["aten::mm"]
    assert [p.name for p in tmp_path.iterdir()] == ["p.ops.jsonl.gz"]


def test_a_profile_without_kernels_is_an_error(tmp_path):
    with pytest.raises(RuntimeError, match="no kernels"):
        calibrate_job(JOB, tmp_path / "t.csv", tmp_path / "p.ops.jsonl.gz", warmup=0, device="cpu")
    assert not (tmp_path / "t.csv").exists()


def test_refuses_a_gpu_the_jobs_preset_does_not_name_before_anything_runs(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(
        "emulator.costs.kernel_timing.profile_iterations", lambda *a, **k: ran.append(1) or [[]]
    )
    on_an_a100 = {"gpu": "NVIDIA A100-SXM4-80GB"}
    assert JOB.cluster.gpu == "h100-sxm-80g"
    with pytest.raises(SpecError, match="cluster.gpu='h100-sxm-80g': this machine's GPU is 'NVIDIA A100"):
        calibrate_job(JOB, tmp_path / "t.csv", tmp_path / "p.ops.jsonl.gz", provenance=on_an_a100,
                      device="cpu")  # fmt: skip
    assert ran == [] and list(tmp_path.iterdir()) == []


def test_refuses_a_parallel_job(tmp_path):
    job = job_spec_from_dict(
        TINY | {"parallel": {"dp": 2}, "batch": {"seq_len": 64, "global_batch": 4}}
    )
    with pytest.raises(SpecError, match="world size 2") as refused:
        calibrate_job(job, tmp_path / "t.csv", tmp_path / "p.ops.jsonl.gz", device="cpu")
    # what can be done today: rank 0 profiled by record, or a world-size-1 cut calibrated
    assert "record --device cuda --profile" in str(refused.value)
    assert "world-size-1 cut" in str(refused.value) and "device mode" not in str(refused.value)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (["--profile-out", "p.ops.jsonl.gz"], "--profile-out"),
        (["--job", "j.toml", "--quick"], "--quick"),
        (["--json"], "--json"),
        (["--profile-iterations", "3"], "--profile-iterations 3"),
        (["--profile-iterations", "1"], "--profile-iterations 1"),  # the default, yet given
    ],
)
def test_an_option_of_the_other_mode_is_refused(tmp_path, options, named, capsys):
    # the grid (no --job) and a job's profile take different options: one given to the other
    # mode would be ignored
    assert main(["calibrate", "--out", str(tmp_path / "rows.csv"), *options]) == 2
    assert named in capsys.readouterr().err


def _calibrate_on_the_cpu(monkeypatch, tmp_path, records):
    """`calibrate --job` as on a GPU whose profiler gives `records` for each iteration, run on
    the CPU; returns the tiny job's file."""
    real = calibrate_job
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    _profiles(monkeypatch, records)
    monkeypatch.setattr(
        "prismbench.calibrate_job.calibrate_job",
        lambda job, out, profile, provenance, iterations: real(job, out, profile, device="cpu",
                                                              iterations=iterations),
    )  # fmt: skip
    monkeypatch.setattr("emulator.costs.calibrate.gpu_provenance", lambda: {})
    job_file = tmp_path / "tiny.toml"
    job_file.write_text(TINY_TOML)
    return job_file


def test_the_job_mode_prints_its_ingest_result_as_json(tmp_path, monkeypatch, capsys):
    import json

    job_file = _calibrate_on_the_cpu(monkeypatch, tmp_path, _profile_records())
    out = tmp_path / "rows.csv"
    assert main(["calibrate", "--job", str(job_file), "--out", str(out), "--json",
                 "--profile-iterations", "2"]) == 0  # fmt: skip
    printed = json.loads(capsys.readouterr().out)
    assert printed["out"] == str(out) and printed["profile"] == str(tmp_path / "rows.ops.jsonl.gz")
    assert printed["matched_rows"] == printed["trace_rows"] > 0
    assert printed["profile_iterations"] == 2


def test_a_profiler_that_records_no_kernels_is_an_error_and_writes_nothing(
    tmp_path, monkeypatch, capsys
):
    # a CUDA build without CUPTI: the profiler sees the iteration but none of its kernels
    job_file = _calibrate_on_the_cpu(monkeypatch, tmp_path, [])
    assert main(["calibrate", "--job", str(job_file), "--out", str(tmp_path / "rows.csv")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the profiler recorded no kernels") and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.toml"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_calibrate_job_on_gpu_writes_a_profile_and_rows(tmp_path, capsys):
    device = torch.cuda.get_device_name()
    presets = [name for name in GPU_NAMES if gpu_preset(name).is_named(device)]
    if not presets:  # calibrate --job refuses a GPU the job's cluster.gpu does not name
        pytest.skip(f"no GPU preset names {device!r}")
    job_file = tmp_path / "tiny.toml"
    job_file.write_text(TINY_TOML + f'[cluster]\ngpu = "{presets[0]}"\n')
    out = tmp_path / "rows.csv"
    assert main(["calibrate", "--job", str(job_file), "--out", str(out)]) == 0, capsys.readouterr()
    profile = read_ops_jsonl(tmp_path / "rows.ops.jsonl.gz")
    assert profile and all(op.kernels for op in profile)  # the profiler's kernel records
    table = load_kernel_table(out)
    assert table.groups and table.gpus == (device,)
