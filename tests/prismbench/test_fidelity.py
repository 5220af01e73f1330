"""Comparing an emulation with a baseline: which measured time, the error, per-source goals."""

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest

from prismbench.baselines import load_baseline
from prismbench.explain import explain
from prismbench.fidelity import FidelityRecord, compare, measured_iteration_s, summarize

BASELINES = Path(__file__).resolve().parents[2] / "results" / "baselines"


def baseline(prefix: str):
    (path,) = BASELINES.glob(f"{prefix}*.toml")
    return load_baseline(path)


def fake_result(iteration_time_s: float) -> SimpleNamespace:
    return SimpleNamespace(
        iteration_time_s=iteration_time_s,
        peak_memory_allocated_bytes=1,
        peak_memory_reserved_bytes=2,
        device_total_estimate_bytes=3,
        oom=False,
        breakdown={"compute_s": 0.5, "exposed_comm_s": 0.1, "bubble_s": 0.0},
        wall_s=1.0,
    )


def test_a_reported_iteration_time_is_used_as_is():
    b = baseline("llmc__gpt2-124m__8g")
    assert measured_iteration_s(b) == (0.3, "iteration_time")


def test_a_derived_iteration_time_says_how():
    b = baseline("llmfoundry__mpt-125m__32g__r161")
    seconds, how = measured_iteration_s(b)
    assert how.startswith("derived: global_batch*seq_len")
    assert seconds == pytest.approx(832 * 2048 / (127122 * 32))


def test_narayanan_rows_use_the_time_their_eq3_flops_take_at_the_reported_rate():
    b = baseline("narayanan2021__megatron-gpt-1.7b__32g")
    seconds, how = measured_iteration_s(b)
    eq3 = explain(b.job).flops.narayanan_eq3_flops_per_iteration
    assert how == "tflops_eq3"
    assert seconds == pytest.approx(eq3 / (137e12 * 32))


def test_error_is_relative_to_the_measurement_and_signed():
    b = baseline("llmc__gpt2-124m__8g")
    record = compare(b, fake_result(0.33))
    assert record.error == pytest.approx(0.1)
    assert record.source == "llmc" and record.gpus == 8
    assert compare(b, fake_result(0.27)).error == pytest.approx(-0.1)


def record(source: str, error: float) -> FidelityRecord:
    fields = {f.name: 0 for f in dataclasses.fields(FidelityRecord)}
    return FidelityRecord(**fields | {"source": source, "error": error, "baseline": source, "measured_from": "x", "model": "m"})


def test_the_goal_is_judged_only_for_sources_with_five_rows():
    rows = [record("a", e) for e in (0.01, -0.02, 0.03, 0.04, -0.05)] + [record("b", 0.5)]
    by_source = {s.source: s for s in summarize(rows)}
    assert by_source["a"].goal_met is True and by_source["a"].median_abs_error == pytest.approx(0.03)
    assert by_source["b"].goal_met is None
    missed = summarize([record("c", e) for e in (0.01, 0.02, 0.03, 0.04, 0.2)])[0]
    assert missed.goal_met is False  # median 3 % but one row beyond 15 %
