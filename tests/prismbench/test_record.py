"""Tests for prismbench/record.py and `prismbench record`: a real two-process CPU run."""

from __future__ import annotations

import pytest

from prismbench.baselines import load_baselines
from prismbench.cli import main
from prismbench.record import record
from prismbench.spec import job_spec_from_dict
from workloads.config import SpecError

TWO_RANKS = '[model]\nname = "gpt-debug"\n[parallel]\ndp = 2\n[batch]\nseq_len = 32\nglobal_batch = 2\n'


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
    assert measured.iteration_time_s_min <= measured.iteration_time_s <= measured.iteration_time_s_max
    assert measured.peak_mem_kind == "cpu_max_rss" and measured.peak_mem_bytes > 10 * 2**20
    assert provenance.kind == "recorded" and "1 torch thread(s)" in provenance.notes
    assert provenance.machine and provenance.software and provenance.commit and provenance.date


def test_refuses_what_cannot_run_here(tmp_path):
    big = job_spec_from_dict(
        {"model": {"name": "gpt-debug"}, "parallel": {"dp": 32}, "batch": {"seq_len": 32, "global_batch": 32}}
    )
    with pytest.raises(SpecError, match="world size 32 is above 16"):
        record(big)
    small = job_spec_from_dict({"model": {"name": "gpt-debug"}, "batch": {"seq_len": 32, "global_batch": 1}})
    with pytest.raises(SpecError, match="iterations=0"):
        record(small, iterations=0)
    job = tmp_path / "one.toml"
    job.write_text(TWO_RANKS)
    assert main(["record", str(job), "--out", str(tmp_path / "one.json")]) == 2  # not a .toml
