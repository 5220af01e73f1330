"""Tests for prismbench/compare.py: per-op-class predicted vs measured compute."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from emulator.costs.pricing import CostContext, compute_prices
from prismbench.capture import capture_job
from prismbench.cli import main
from prismbench.compare import compare_ops
from prismbench.emulate import topology_of
from prismbench.spec import job_spec_from_dict
from tests.prismbench.profiles import (
    TINY,
    TINY_TOML,
    compute_rows,
    profiled,
    write_jsonl,
)

JOB = job_spec_from_dict(TINY)
COST = CostContext(topology=topology_of(JOB))


@pytest.fixture(scope="module")
def trace():
    return capture_job(JOB).traces[0]


def test_a_profile_measuring_exactly_the_prediction_has_no_error(trace):
    durations, _ = compute_prices(trace, COST)
    ops = [profiled(trace, r, durations[r] * 1e6) for r in compute_rows(trace)]
    classes = compare_ops(ops, trace, COST)
    assert sum(c.measured_s for c in classes) == pytest.approx(sum(c.predicted_s for c in classes))
    assert all(abs(c.error_s) < 1e-12 for c in classes)
    assert all(c.matched == c.trace_ops == c.profile_ops for c in classes)
    assert all(c.priced_by["roofline"] == c.trace_ops for c in classes)  # no table given


def test_the_slowest_class_comes_first_and_one_sided_ops_still_count(trace):
    durations, _ = compute_prices(trace, COST)
    rows = compute_rows(trace)
    slow = trace.strings[trace.columns["aten"][rows[0]]]
    ops = [
        profiled(
            trace,
            r,
            durations[r] * 1e6 * (10 if trace.strings[trace.columns["aten"][r]] == slow else 1),
        )
        for r in rows
    ]
    slow_error_us = 9e6 * sum(
        durations[r] for r in rows if trace.strings[trace.columns["aten"][r]] == slow
    )
    gpu_only_us = slow_error_us / 2  # a one-sided class, smaller than the slow class's error
    gpu_only = profiled(trace, rows[0], gpu_only_us)
    gpu_only = type(gpu_only)("aten::gpu_only_kernel", ((3, 3),), (("k", gpu_only_us),), 0.0)
    classes = compare_ops([*ops, gpu_only], trace, COST)
    assert classes[0].aten == slow and classes[0].error_s < 0
    extra = next(c for c in classes if c.aten == "aten.gpu_only_kernel")
    assert (extra.trace_ops, extra.profile_ops) == (0, 1)
    assert extra.measured_s == pytest.approx(gpu_only_us * 1e-6)


def _job_and_a_profile_twice_as_slow(tmp_path, trace) -> tuple[Path, Path]:
    """The tiny job's spec, and a profile in which every op took twice its price."""
    durations, _ = compute_prices(trace, COST)
    profile = write_jsonl(
        tmp_path / "tiny.ops.jsonl.gz",
        [profiled(trace, r, 2 * durations[r] * 1e6) for r in compute_rows(trace)],
    )
    job = tmp_path / "tiny.toml"
    job.write_text(TINY_TOML)
    return job, profile


def test_cli_prints_json_with_totals(tmp_path, trace, capsys):
    job, profile = _job_and_a_profile_twice_as_slow(tmp_path, trace)
    assert (
        main(["compare", str(job), "--profile", str(profile), "--no-kernel-table", "--json"]) == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["error"] == pytest.approx(-0.5)
    assert out["classes"][0]["error_s"] < 0


def test_cli_table_says_the_total_error_the_json_gives(tmp_path, trace, capsys):
    job, profile = _job_and_a_profile_twice_as_slow(tmp_path, trace)
    assert main(["compare", str(job), "--profile", str(profile), "--no-kernel-table"]) == 0
    assert "ms of kernels (-50.0%)" in " ".join(capsys.readouterr().out.split())


def test_cli_refuses_a_missing_profile(tmp_path, capsys):
    job = tmp_path / "tiny.toml"
    job.write_text(TINY_TOML)
    assert main(["compare", str(job), "--profile", str(tmp_path / "none.json")]) == 2
    assert "no such profile file" in capsys.readouterr().err


def test_cli_leaves_a_source_out_of_the_gpu_s_own_table(tmp_path, trace, capsys):
    # leave-one-out against the committed table: --skip-source alone, no --kernel-table
    durations, _ = compute_prices(trace, COST)
    profile = write_jsonl(
        tmp_path / "tiny.ops.jsonl.gz",
        [profiled(trace, r, durations[r] * 1e6) for r in compute_rows(trace)],
    )
    job = tmp_path / "tiny.toml"
    job.write_text(TINY_TOML)

    def exact_rows(*options):
        assert main(["compare", str(job), "--profile", str(profile), "--json", *options]) == 0
        return sum(c["priced_by"]["exact"] for c in json.loads(capsys.readouterr().out)["classes"])

    assert exact_rows("--skip-source", "profile:") < exact_rows()


@pytest.mark.parametrize(
    "options",
    [["--skip-source", "no-such-source:"], ["--no-kernel-table", "--skip-source", "profile:"]],
)
def test_cli_refuses_a_skip_that_would_change_nothing(tmp_path, options, capsys):
    job = tmp_path / "tiny.toml"
    job.write_text(TINY_TOML)
    assert main(["compare", str(job), "--profile", str(tmp_path / "p.json"), *options]) == 2
    assert "--skip-source" in capsys.readouterr().err


def test_cli_refuses_a_profile_of_another_job(tmp_path, trace, capsys):
    profile = write_jsonl(
        tmp_path / "tiny.ops.jsonl.gz", [profiled(trace, r, 1.0) for r in compute_rows(trace)]
    )
    other = tmp_path / "other.toml"
    other.write_text(TINY_TOML.replace("seq_len = 64", "seq_len = 32"))
    assert main(["compare", str(other), "--profile", str(profile), "--no-kernel-table"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {profile}: not a profile of the job other:"), err


def test_cli_says_when_the_table_holds_the_profiles_own_rows(tmp_path, trace, capsys):
    profile = write_jsonl(
        tmp_path / "tiny.ops.jsonl.gz", [profiled(trace, r, 3.0) for r in compute_rows(trace)]
    )
    job = tmp_path / "tiny.toml"
    job.write_text(TINY_TOML)
    rows = tmp_path / "rows.csv"
    ingest = ["ingest-profile", str(profile), "--job", str(job), "--out", str(rows), "--json"]
    assert main([*ingest, "--provenance", "gpu=NVIDIA H100 80GB HBM3"]) == 0
    capsys.readouterr()
    compare = ["compare", str(job), "--profile", str(profile), "--kernel-table", str(rows), "--json"]
    assert main(compare) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["in_sample_source"] == "profile:tiny"
    assert err.endswith(
        "note: the kernel table holds this profile's own rows (source profile:tiny): the "
        "comparison is in-sample; pass --skip-source profile:tiny to leave them out\n"
    )
    assert main([*compare, "--skip-source", "profile:tiny"]) == 0  # leave-one-out: no note
    out, err = capsys.readouterr()
    assert json.loads(out)["in_sample_source"] is None and "in-sample" not in err


def test_cli_compares_the_first_of_a_profile_s_iterations_and_says_so(tmp_path, trace, capsys):
    """A profile of several iterations (`record --profile-iterations`): the first is set against
    the one predicted iteration; the second, here 10x slower, is not read."""
    from prismbench.calibrate_job import write_ops_jsonl_iterations

    durations, _ = compute_prices(trace, COST)

    def iteration(factor):
        return [{"op": op.op, "shapes": [list(s) for s in op.shapes], "kernels": [list(k) for k in op.kernels],
                 "cpu_start_us": 0.0}
                for op in (profiled(trace, r, factor * durations[r] * 1e6) for r in compute_rows(trace))]  # fmt: skip

    profile = write_ops_jsonl_iterations([iteration(2), iteration(20)], tmp_path / "two.ops.jsonl.gz")
    job = tmp_path / "tiny.toml"
    job.write_text(TINY_TOML)
    argv = ["compare", str(job), "--profile", str(profile), "--no-kernel-table"]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["error"] == pytest.approx(-0.5) and out["profile_iterations"] == 2
    assert main(argv) == 0
    assert "the profile holds 2 iterations: the first is compared" in " ".join(capsys.readouterr().out.split())
