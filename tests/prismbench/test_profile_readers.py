"""Tests for prismbench/profile_readers.py's iterations: profiles of several iterations of a job,
as `record --profile-iterations N` writes them (jsonl) and torch.profiler marks them (Chrome
traces), and the older profiles of one iteration, which read as they always did."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from prismbench.calibrate_job import write_ops_jsonl_iterations
from prismbench.profile_readers import (
    ProfileError,
    read_chrome_trace,
    read_profile,
    read_profile_iterations,
)
from tests.prismbench.profiles import FIXTURE


def _record(op: str, us: float, start_us: float) -> dict:
    """An op record as `kernel_timing.op_records` makes it."""
    return {"op": op, "shapes": [[8, 8], [8, 8]], "self_cuda_us": us,
            "kernels": [["gemm", us]], "cpu_start_us": start_us}  # fmt: skip


def _three_iterations() -> list[list[dict]]:
    # the same two ops in each iteration, the mm a little slower each time
    return [
        [_record("aten::mm", 3.0 + k, 100.0 * k), _record("aten::add", 1.0, 100.0 * k + 50)]
        for k in range(3)
    ]


def _write_lines(path: Path, records: list[dict]) -> Path:
    with gzip.open(path, "wt") as handle:
        handle.write("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_a_profile_of_three_iterations_reads_back_each_in_order(tmp_path):
    path = write_ops_jsonl_iterations(_three_iterations(), tmp_path / "p.ops.jsonl.gz")
    iterations = read_profile_iterations(path)
    assert [[(o.op, o.kernel_us) for o in ops] for ops in iterations] == [
        [("aten::mm", 3.0), ("aten::add", 1.0)],
        [("aten::mm", 4.0), ("aten::add", 1.0)],
        [("aten::mm", 5.0), ("aten::add", 1.0)],
    ]


def test_read_profile_reads_the_first_iteration_alone(tmp_path):
    several = write_ops_jsonl_iterations(_three_iterations(), tmp_path / "several.ops.jsonl.gz")
    first = _write_lines(tmp_path / "first.ops.jsonl.gz", _three_iterations()[0])
    assert read_profile(several) == read_profile(first)


def test_a_profile_without_iteration_numbers_is_one_iteration(tmp_path):
    records = [r for iteration in _three_iterations() for r in iteration]
    path = _write_lines(tmp_path / "legacy.ops.jsonl.gz", records)  # as profiles were before
    (only,) = read_profile_iterations(path)
    assert len(only) == 6 and read_profile(path) == only


@pytest.mark.parametrize(
    ("numbers", "line", "rule"),
    [
        ([0, 1, 0], 3, "iteration 0 after iteration 1: a profile lists its iterations in order"),
        ([0, 2], 2, "iteration 2 after iteration 0: iteration 1 has no op"),
        ([1], 1, "iteration 1 on the first record: iteration 0 has no op"),
        ([0, -1], 2, "'iteration' must be an integer >= 0"),
        ([0, "1"], 2, r"'iteration' must be an integer >= 0 .* got '1'"),
        ([0, 1.0], 2, "'iteration' must be an integer >= 0"),
        ([None, 0], 1, r"'iteration' must be an integer >= 0 .* got None"),
    ],
)
def test_malformed_iteration_numbers_are_refused_naming_the_line(tmp_path, numbers, line, rule):
    records = [_record("aten::mm", 3.0, 10.0 * i) | {"iteration": n} for i, n in enumerate(numbers)]
    path = _write_lines(tmp_path / "bad.ops.jsonl.gz", records)
    with pytest.raises(ProfileError, match=rf"bad.ops.jsonl.gz:{line}: {rule}"):
        read_profile_iterations(path)


def test_an_iteration_holding_no_op_is_refused_naming_its_first_line(tmp_path):
    # iteration 1's one record is a runtime event, which is no op
    runtime = _record("Activity Buffer Request", 0.5, 60.0) | {"iteration": 1}
    records = [_record("aten::mm", 3.0, 0.0) | {"iteration": 0}, runtime]
    path = _write_lines(tmp_path / "p.ops.jsonl.gz", records)
    with pytest.raises(ProfileError, match=r"p.ops.jsonl.gz:2: iteration 1 .* holds no op"):
        read_profile_iterations(path)


def test_the_writer_refuses_an_iteration_without_records(tmp_path):
    with pytest.raises(ValueError, match=r"iteration\(s\) \[1\] hold no op record"):
        write_ops_jsonl_iterations([[_record("aten::mm", 3.0, 0.0)], []], tmp_path / "p.gz")
    assert not list(tmp_path.iterdir())


def _annotated_trace(path: Path, name: str, ranges: list[tuple[float, float]]) -> Path:
    """The small Chrome trace (aten::addmm at 105 us, aten::gelu at 160, aten::sum at 200),
    with a host annotation `name` over each (start, end) and its copy on the GPU timeline."""
    trace = json.loads(FIXTURE.read_text())
    for start, end in ranges:
        mark = {"ph": "X", "name": name, "pid": 1, "tid": 1, "ts": start, "dur": end - start}
        trace["traceEvents"] += [mark | {"cat": "user_annotation"},
                                 mark | {"cat": "gpu_user_annotation", "pid": 0, "tid": 7}]  # fmt: skip
    path.write_text(json.dumps(trace))
    return path


def test_a_chrome_trace_splits_at_torch_profiler_steps(tmp_path):
    # torch.profiler's schedule: ProfilerStep#3 and #4 ran, then #5 opened as the trace ended
    path = _annotated_trace(tmp_path / "steps.json", "ProfilerStep#3", [(90.0, 155.0)])
    trace = json.loads(path.read_text())
    for n, (start, end) in ((4, (155.0, 250.0)), (5, (250.0, 251.0))):
        trace["traceEvents"].append({"ph": "X", "cat": "user_annotation", "pid": 1, "tid": 1,
                                     "name": f"ProfilerStep#{n}", "ts": start, "dur": end - start})  # fmt: skip
    path.write_text(json.dumps(trace))
    addmm, gelu, total = read_chrome_trace(FIXTURE)
    assert read_profile_iterations(path) == [[addmm], [gelu, total]]
    assert read_profile(path) == [addmm]


def test_a_chrome_trace_splits_at_prismbench_iteration_ranges(tmp_path):
    path = _annotated_trace(
        tmp_path / "ours.json", "prismbench.iteration", [(100.0, 170.0), (190.0, 230.0)]
    )
    addmm, gelu, total = read_chrome_trace(FIXTURE)
    assert read_profile_iterations(path) == [[addmm, gelu], [total]]


def test_a_chrome_trace_without_marks_is_one_iteration():
    assert read_profile_iterations(FIXTURE) == [read_chrome_trace(FIXTURE)]


@pytest.mark.parametrize(
    ("field", "value", "rule"),
    [
        ("kernels", [["gemm", float("nan")]], "the us of kernel 'gemm' must be a finite number >= 0, got nan"),
        ("kernels", [["gemm", float("inf")]], "the us of kernel 'gemm' must be a finite number >= 0, got inf"),
        ("kernels", [["gemm", -3.0]], "the us of kernel 'gemm' must be a finite number >= 0, got -3.0"),
        ("kernels", [["gemm", "3"]], "the us of kernel 'gemm' must be a finite number >= 0, got '3'"),
        ("kernels", [["gemm"]], r"each of kernels must be a \[name, us\] pair, got \['gemm'\]"),
        ("kernels", 5, r"kernels must be a list of \[name, us\] pairs, got 5"),
        ("op", 5, "op must be a string"),
        ("shapes", 5, "shapes must be a list of input shapes, got 5"),
        ("cpu_start_us", "x", "cpu_start_us must be a finite number, got 'x'"),
    ],
)  # fmt: skip
def test_a_jsonl_record_of_another_form_is_refused_naming_its_line_and_field(
    tmp_path, field, value, rule
):
    """A NaN or negative kernel time would reach the rows written and the JSON printed (NaN,
    which strict parsers refuse); a string, a traceback."""
    records = [_record("aten::mm", 3.0, 0.0), _record("aten::add", 1.0, 50.0) | {field: value}]
    path = _write_lines(tmp_path / "bad.ops.jsonl.gz", records)
    with pytest.raises(ProfileError, match=rf"bad.ops.jsonl.gz:2: {rule}"):
        read_profile_iterations(path)


@pytest.mark.parametrize(
    ("cat", "field", "value", "rule"),
    [
        ("kernel", "dur", float("nan"), "dur must be a finite number >= 0, got nan"),
        ("kernel", "dur", -5.0, "dur must be a finite number >= 0, got -5.0"),
        ("kernel", "dur", "5", "dur must be a finite number >= 0, got '5'"),
        ("kernel", "name", None, "name must be a string, got None"),
        ("cpu_op", "ts", None, "ts must be a finite number, got None"),
        ("cpu_op", "pid", None, "pid must be an integer or a string, got None"),
        ("cpu_op", "args", 5, "args must be an object, got 5"),
    ],
)
def test_a_chrome_trace_event_of_another_form_is_refused_naming_it(
    tmp_path, cat, field, value, rule
):
    trace = json.loads(FIXTURE.read_text())
    index = next(i for i, e in enumerate(trace["traceEvents"]) if e.get("cat") == cat)
    trace["traceEvents"][index][field] = value
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(trace))
    with pytest.raises(ProfileError, match=rf"bad.json: traceEvents\[{index}\] \({cat}\): {rule}"):
        read_profile_iterations(path)
