"""Tests for prismbench/gate.py and `prismbench gate`: the pre-merge performance gate."""

from __future__ import annotations

import json

import pytest

from prismbench.cli import main
from prismbench.emulate import emulate
from prismbench.gate import FITS, gate, numeric_result_fields
from prismbench.spec import job_spec_from_dict
from prismbench.thresholds import numeric_fields, parse_thresholds
from tests.prismbench.profiles import TINY, TINY_TOML


@pytest.fixture(scope="module")
def reference():
    return emulate(job_spec_from_dict(TINY), name="tiny").to_dict()


def _slower(result: dict, factor: float) -> dict:
    return result | {"iteration_time_s": result["iteration_time_s"] * factor}


def test_a_slowdown_beyond_the_bound_fails_and_one_within_passes(reference):
    thresholds = parse_thresholds("iteration_time_s:+2%,peak_memory_reserved_bytes:+1%")
    failed = gate(reference, _slower(reference, 1.05), thresholds)
    assert not failed.passed
    assert [row.passed for row in failed.rows] == [False, True, True]  # the last: FITS
    assert failed.rows[0].change == pytest.approx(0.05)
    assert gate(reference, _slower(reference, 1.01), thresholds).passed
    assert gate(reference, _slower(reference, 0.5), thresholds).passed  # faster is fine


def test_a_candidate_predicted_to_run_out_of_memory_fails_whatever_the_thresholds(
    reference, tmp_path, capsys
):
    assert not reference["oom"]
    out_of_memory = reference | {"oom": True}
    thresholds = parse_thresholds("iteration_time_s:1000%")
    failed = gate(reference, out_of_memory, thresholds)
    assert not failed.passed
    assert [(row.threshold, row.passed) for row in failed.rows][-1] == (FITS, False)
    assert gate(out_of_memory, reference, thresholds).passed  # a change that makes it fit
    ref = _write(tmp_path / "ref.json", reference)
    cand = _write(tmp_path / "cand.json", out_of_memory)
    assert main(["gate", "--reference", ref, "--candidate", cand, "--fail", "iteration_time_s:1000%"]) == 1
    out = capsys.readouterr().out
    assert "runs out of memory" in out and "FAIL" in out


def test_a_nan_on_either_side_fails_the_gate(reference):
    thresholds = parse_thresholds("iteration_time_s:+2%")
    broken = reference | {"iteration_time_s": float("nan")}
    assert not gate(reference, broken, thresholds).passed
    assert not gate(broken, reference, thresholds).passed


def test_a_nan_is_null_in_the_json_output(reference, tmp_path, capsys):
    # json.dumps wrote NaN, which is no JSON: a strict parser refused the gate's output
    ref = _write(tmp_path / "ref.json", reference)
    cand = _write(tmp_path / "cand.json", reference | {"mfu": float("nan")})
    assert main(["gate", "--reference", ref, "--candidate", cand, "--fail", "mfu:2%", "--json"]) == 1
    out = capsys.readouterr().out
    row = json.loads(out, parse_constant=pytest.fail)["rows"][0]
    assert row["candidate"] is None and row["change"] is None and row["passed"] is False


def test_the_report_gives_tokens_per_second_their_unit(reference, tmp_path, capsys):
    ref = _write(tmp_path / "ref.json", reference)
    assert main(["gate", "--reference", ref, "--candidate", ref, "--fail", "tokens_per_s:-2%"]) == 0
    assert "tokens/s" in capsys.readouterr().out


def _write(path, result):
    path.write_text(json.dumps(result))
    return str(path)


def test_cli_exit_codes(tmp_path, reference, capsys):
    ref = _write(tmp_path / "ref.json", reference)
    cand = _write(tmp_path / "cand.json", _slower(reference, 1.05))
    assert (
        main(["gate", "--reference", ref, "--candidate", cand, "--fail", "iteration_time_s:+2%"])
        == 1
    )
    assert "FAIL" in capsys.readouterr().out
    assert (
        main(["gate", "--reference", ref, "--candidate", cand, "--fail", "iteration_time_s:+10%"])
        == 0
    )
    assert main(["gate", "--reference", ref, "--candidate", cand, "--fail", "iteration_s:+2%"]) == 2
    assert "no numeric field 'iteration_s'" in capsys.readouterr().err
    missing = str(tmp_path / "none.json")
    assert (
        main(["gate", "--reference", ref, "--candidate", missing, "--fail", "iteration_time_s:+2%"])
        == 2
    )
    assert "no such file" in capsys.readouterr().err


def test_bad_input_exits_2_before_either_side_is_emulated(tmp_path, reference, capsys, monkeypatch):
    import prismbench.emulate

    def no_emulation(*_args, **_kwargs):
        raise AssertionError("emulated before both sides were checked")

    monkeypatch.setattr(prismbench.emulate, "emulate", no_emulation)
    job = tmp_path / "tiny.toml"
    job.write_text(TINY_TOML)
    binary = tmp_path / "result.json"
    binary.write_bytes(b"\xff\xfe{}")
    fail = ["--fail", "iteration_time_s:+2%"]
    assert main(["gate", "--reference", str(job), "--candidate", str(binary), *fail]) == 2
    assert "not JSON" in capsys.readouterr().err
    assert main(["gate", "--reference", str(job), "--candidate", str(tmp_path / "no.json"), *fail]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["gate", "--reference", str(job), "--candidate", str(tmp_path), *fail]) == 2
    assert "is a directory" in capsys.readouterr().err
    # a field neither side can have: refused before the job spec is emulated
    saved = tmp_path / "saved.json"
    saved.write_text(json.dumps(reference))
    typo = ["--fail", "iteration_s:+2%"]
    assert main(["gate", "--reference", str(saved), "--candidate", str(job), *typo]) == 2
    assert "no numeric field 'iteration_s'" in capsys.readouterr().err
    assert main(["gate", "--reference", str(job), "--candidate", str(job), *typo]) == 2
    assert "an emulate result has no field 'iteration_s'" in capsys.readouterr().err


@pytest.mark.parametrize("field", ["breakdown.nope_s", "kernel_table", "breakdown", "iteration_time_s.x"])
def test_a_job_spec_s_field_that_is_no_number_is_refused_before_emulating(
    tmp_path, capsys, monkeypatch, field
):
    # only the top-level key was checked: these were refused after both sides' emulations
    import prismbench.emulate

    def no_emulation(*_args, **_kwargs):
        raise AssertionError("emulated before the field was checked")

    monkeypatch.setattr(prismbench.emulate, "emulate", no_emulation)
    job = tmp_path / "tiny.toml"
    job.write_text(TINY_TOML)
    assert main(["gate", "--reference", str(job), "--candidate", str(job), "--fail", f"{field}:+2%"]) == 2
    assert f"an emulate result has no field {field!r} that is a number" in capsys.readouterr().err


def test_the_numeric_fields_known_before_emulating_are_a_result_s(reference):
    assert sorted(numeric_result_fields()) == sorted(numeric_fields(reference))


def test_cli_emulates_a_job_spec_and_refuses_an_old_result(tmp_path, reference, capsys):
    job = tmp_path / "tiny.toml"
    job.write_text(TINY_TOML)
    ref = _write(tmp_path / "ref.json", reference)
    args = [
        "gate",
        "--reference",
        ref,
        "--candidate",
        str(job),
        "--fail",
        "iteration_time_s:1%",
        "--json",
    ]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["passed"] is True
    progress = [line for line in captured.err.splitlines() if not line.startswith("note: ")]
    assert progress and all(line.startswith("candidate: ") for line in progress)  # the side emulated
    old = _write(tmp_path / "old.json", reference | {"schema_version": 1})
    assert (
        main(["gate", "--reference", old, "--candidate", ref, "--fail", "iteration_time_s:1%"]) == 2
    )
    assert "schema_version=1" in capsys.readouterr().err


def test_a_gate_between_two_micro_batch_sizes(tmp_path):
    """The same job with micro-batch 1 and 2 (twice the micro-batches at 1): the step time and
    the peak memory move, and the gate passes or fails by its thresholds."""
    spec = '[model]\nname = "gpt-debug"\n[batch]\nseq_len = 64\nglobal_batch = 4\nmicro_batch = {}\n'
    one, two = tmp_path / "mb1.toml", tmp_path / "mb2.toml"
    one.write_text(spec.format(1))
    two.write_text(spec.format(2))
    memory_rise = "peak_memory_allocated_bytes:+0.5%"  # it rises 0.83 %
    assert main(["gate", "--reference", str(one), "--candidate", str(two), "--fail", memory_rise]) == 1
    assert main(["gate", "--reference", str(two), "--candidate", str(one), "--fail", memory_rise]) == 0
    assert main(["gate", "--reference", str(one), "--candidate", str(two), "--fail", "iteration_time_s:1000%"]) == 0


@pytest.mark.parametrize("oom", [None, "no"])
def test_a_saved_result_without_a_true_or_false_oom_is_refused(tmp_path, reference, capsys, oom):
    # the gate always checks whether the candidate fits: a missing "oom" was a KeyError's
    # traceback (exit 1), a string one read as "runs out of memory"
    broken = {k: v for k, v in reference.items() if k != "oom"}
    if oom is not None:
        broken["oom"] = oom
    ref, cand = _write(tmp_path / "ref.json", reference), _write(tmp_path / "cand.json", broken)
    assert main(["gate", "--reference", ref, "--candidate", cand, "--fail", "iteration_time_s:+2%"]) == 2
    assert f"oom={oom!r} must be true or false" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("field", "value"),
    [("iteration_time_s", -1.0), ("iteration_time_s", 0), ("peak_memory_reserved_bytes", 0),
     ("peak_memory_allocated_bytes", "12 GiB"), ("world_size", None),
     ("iteration_time_s", float("inf"))],  # Infinity: gated as a move of -100 %, exit 1
)  # fmt: skip
def test_a_saved_result_with_a_figure_no_emulation_gives_is_refused(
    tmp_path, reference, capsys, field, value
):
    # an iteration of -1 s was gated as a real move: a crossed threshold (exit 1) or a pass
    ref = _write(tmp_path / "ref.json", reference)
    cand = _write(tmp_path / "cand.json", reference | {field: value})
    assert main(["gate", "--reference", ref, "--candidate", cand, "--fail", "iteration_time_s:+2%"]) == 2
    assert f"{field}={value!r} must be a finite number > 0" in capsys.readouterr().err


def test_a_move_from_a_zero_reference_fails_only_a_bound_in_its_direction(reference):
    # a rise from 0 has no relative size, but it is a rise: -X% (bounds a fall) must hold
    idle = {"breakdown": reference["breakdown"] | {"bubble_s": 0.0}}
    rose = {"breakdown": reference["breakdown"] | {"bubble_s": 0.01}}
    passed = {
        bound: gate(reference | idle, reference | rose, parse_thresholds(f"breakdown.bubble_s:{bound}")).rows[0].passed
        for bound in ("+5%", "-5%", "5%")
    }
    assert passed == {"+5%": False, "-5%": True, "5%": False}
    assert gate(reference | idle, reference | idle, parse_thresholds("breakdown.bubble_s:+5%")).passed


def test_a_baseline_file_is_gated_on_its_job_table(tmp_path, capsys):
    # wherever a command takes JOB.toml a baseline file works too (README): gate refused one
    # with "unknown key(s) ['job', 'measured', 'provenance']"
    from prismbench.baselines import baseline_to_toml
    from prismbench.record import Recording, provenance, to_baseline

    recording = Recording(job=job_spec_from_dict(TINY).to_dict(), iteration_s=[0.05], warmup=1,
                          threads_per_rank=1, peak_mem_bytes=2**30, peak_mem_kind="cpu_max_rss",
                          provenance=provenance())  # fmt: skip
    baseline = tmp_path / "tiny.toml"
    baseline.write_text(baseline_to_toml(to_baseline(recording, "tiny")))
    args = ["--reference", str(baseline), "--candidate", str(baseline), "--fail", "iteration_time_s:+2%"]
    assert main(["gate", *args]) == 0
    assert "is a baseline: its [job] table is the job" in capsys.readouterr().err


def test_every_fail_option_given_is_checked(reference, tmp_path):
    # argparse kept the last --fail alone: a 5 % slowdown passed a gate given twice
    ref = _write(tmp_path / "ref.json", reference)
    cand = _write(tmp_path / "cand.json", _slower(reference, 1.05))
    fails = ["--fail", "iteration_time_s:+2%", "--fail", "peak_memory_reserved_bytes:+1%"]
    assert main(["gate", "--reference", ref, "--candidate", cand, *fails]) == 1


def test_sides_of_different_sizes_are_said_not_failed(reference, tmp_path, capsys):
    # a result names its job after its file: its size is what tells two results mixed up
    doubled = reference | {
        "world_size": 2 * reference["world_size"],
        "per_class": 2 * reference["per_class"],
    }
    result = gate(reference, doubled, parse_thresholds("iteration_time_s:+2%"))
    assert result.passed
    assert [(d.field, d.reference, d.candidate) for d in result.layout_differences] == [
        ("world_size", reference["world_size"], 2 * reference["world_size"]),
        ("pipeline_stages", len(reference["per_class"]), 2 * len(reference["per_class"])),
    ]
    assert gate(reference, _slower(reference, 1.01), []).layout_differences == ()

    (tmp_path / "ref.json").write_text(json.dumps(reference))
    (tmp_path / "cand.json").write_text(json.dumps(doubled))
    sides = ["--reference", str(tmp_path / "ref.json"), "--candidate", str(tmp_path / "cand.json")]
    assert main(["gate", *sides, "--fail", "iteration_time_s:+2%"]) == 0
    world, stages = reference["world_size"], len(reference["per_class"])
    assert (
        f"note: the two sides are jobs of different sizes: world_size {world} -> {2 * world}; "
        f"pipeline_stages {stages} -> {2 * stages}"
    ) in capsys.readouterr().out
    assert main(["gate", *sides, "--fail", "iteration_time_s:+2%", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["layout_differences"][0] == {
        "field": "world_size", "reference": world, "candidate": 2 * world,
    }  # fmt: skip

