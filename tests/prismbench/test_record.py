"""Tests for prismbench/record.py and `prismbench record`: a real two-process CPU run."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from prismbench.baselines import load_baseline, load_baselines
from prismbench.cli import main
from prismbench.record import record, write_record
from prismbench.spec import job_spec_from_dict
from workloads.config import SpecError

TWO_RANKS = (
    '[model]\nname = "gpt-debug"\n[parallel]\ndp = 2\n[batch]\nseq_len = 32\nglobal_batch = 2\n'
)


@pytest.mark.integration
def test_record_times_a_real_two_process_run(tmp_path, capsys):
    job = tmp_path / "two.toml"
    job.write_text(TWO_RANKS)
    out = tmp_path / "recorded" / "two.toml"
    assert main(["record", str(job), "--out", str(out), "--iterations", "3", "--warmup", "1"]) == 0
    assert "not a GPU allocator's" in capsys.readouterr().out
    (baseline,) = load_baselines(out.parent)  # a recorded baseline validate can score
    measured, provenance = baseline.measured, baseline.provenance
    assert baseline.name == "two" and baseline.job.parallel.dp == 2
    assert measured.iterations == 3
    assert (
        measured.iteration_time_s_min <= measured.iteration_time_s <= measured.iteration_time_s_max
    )
    assert measured.peak_mem_kind == "cpu_max_rss" and measured.peak_mem_bytes > 10 * 2**20
    assert provenance.kind == "recorded" and "1 torch thread(s)" in provenance.notes
    assert provenance.machine and provenance.software and provenance.commit and provenance.date


def test_refuses_what_cannot_run_here(tmp_path):
    big = job_spec_from_dict(
        {
            "model": {"name": "gpt-debug"},
            "parallel": {"dp": 32},
            "batch": {"seq_len": 32, "global_batch": 32},
        }
    )
    with pytest.raises(SpecError, match="world size 32 is above 16"):
        record(big)
    small = job_spec_from_dict(
        {"model": {"name": "gpt-debug"}, "batch": {"seq_len": 32, "global_batch": 1}}
    )
    with pytest.raises(SpecError, match="iterations=0"):
        record(small, iterations=0)
    job = tmp_path / "one.toml"
    job.write_text(TWO_RANKS)
    assert main(["record", str(job), "--out", str(tmp_path / "one.json")]) == 2  # not a .toml


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_a_cuda_record_without_a_gpu_is_refused_naming_the_option(tmp_path, capsys):
    job = tmp_path / "one.toml"
    job.write_text('[model]\nname = "gpt-debug"\n[batch]\nseq_len = 32\nglobal_batch = 1\n')
    out = tmp_path / "one.toml.out.toml"
    with pytest.raises(SpecError, match="--device cuda: no CUDA GPU"):
        record(
            job_spec_from_dict(
                {"model": {"name": "gpt-debug"}, "batch": {"seq_len": 32, "global_batch": 1}}
            ),
            device="cuda",
        )
    assert main(["record", str(job), "--out", str(out), "--device", "cuda"]) == 2
    assert "--device cuda" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.gpu
@pytest.mark.integration
def test_a_cuda_record_keeps_the_allocator_peaks_of_both_iterations(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    job = job_spec_from_dict(
        {"model": {"name": "gpt-debug"}, "batch": {"seq_len": 64, "global_batch": 2}}
    )
    recording = record(job, iterations=3, warmup=2, device="cuda", profile=True)
    measured = recording.to_dict()["measured"]
    assert measured["peak_mem_kind"] == "allocator_reserved"
    steady, first = measured["peak_steady"], measured["peak_first_iteration"]
    assert measured["peak_mem_bytes"] == steady["reserved"] >= steady["allocated"] > 0
    assert first["reserved"] >= first["allocated"] > 0
    baseline = load_baseline(write_record(recording, tmp_path / "cuda.toml"))
    assert "CUDA run on" in baseline.provenance.notes
    assert any(op["op"] == "aten::mm" and op["kernels"] for op in recording.profile)


def test_a_profile_needs_cuda():
    job = job_spec_from_dict(
        {"model": {"name": "gpt-debug"}, "batch": {"seq_len": 32, "global_batch": 1}}
    )
    with pytest.raises(SpecError, match="--profile"):
        record(job, profile=True)


def test_a_recording_s_provenance_needs_no_harness_storage():
    # GPU machines run `record` with torch alone installed: it must not import duckdb
    code = "import sys; from prismbench.record import provenance; provenance(); print('duckdb' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
