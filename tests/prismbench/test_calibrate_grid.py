"""Tests for prismbench/calibrate_grid.py: the grid and the rows, timed with a fake clock on CPU
(the kernel times themselves need a GPU: `prismbench calibrate` there)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from emulator.capture.fused_ops import gpu_fused_ops
from emulator.capture.op_recorder import OpRecorder
from emulator.capture.trace import COMPUTE
from emulator.costs.calibrate import run_calibration, write_kernel_csv
from emulator.costs.kernel_table import load_kernel_table, row_fields, row_op
from emulator.costs.pricing import op_record
from prismbench.calibrate_grid import calibration_cases, measure_cases, measure_grid
from workloads.models.common import CausalAttention

MEASURED = ("time_us", "repetitions", "spread_us", "kernels")


def fake_clock(fn, repetitions, warmup):
    fn()  # the callable runs for real (on CPU here)
    return 12.5, 0.5, 4


def test_the_grid_covers_fp8_unaligned_vocabularies_norms_activations_casts_embedding_and_sdpa():
    cases = calibration_cases()
    ops = {op for op, _ in cases}
    assert {"scaled_mm", "mm", "layer_norm_bwd", "rms_norm_bwd", "gelu_fwd", "add", "cast_bf16_fp8",
            "embedding_bwd", "sdpa_fwd", "sdpa_bwd"} <= ops  # fmt: skip
    assert all(d % 16 == 0 for op, shape in cases if op == "scaled_mm" for d in shape)
    assert ("mm", [8192, 50257, 768]) in cases  # GPT-2's unaligned output layer
    assert not {op for op, _ in calibration_cases(fp8=False)} & {"scaled_mm"}
    assert len(calibration_cases(quick=True)) < len(cases)


def test_the_grid_covers_fp16_and_fp32_gemms_non_causal_and_grouped_query_attention():
    cases = calibration_cases(quick=True)
    for op in ("mm_fp16", "mm_fp32"):
        assert (op, [4096, 16384, 4096]) in cases  # a 4096-wide layer's MLP up projection
        assert (op, [8192, 50257, 768]) in cases  # GPT-2's unaligned output layer
    ops = {op for op, _ in cases}
    assert {"sdpa_noncausal_fwd", "sdpa_noncausal_bwd"} <= ops
    # Llama 3 8B's 32 query heads over 8 key/value heads, and a tp 8 rank's 4 over 1
    assert ("sdpa_bwd", [64, 32, 2048, 128, 8]) in cases
    assert ("sdpa_fwd", [1, 4, 4096, 128, 1]) in cases


def test_rows_name_the_captured_op_and_carry_the_measured_time():
    seen = []

    def counting_clock(fn, repetitions, warmup):
        seen.append(repetitions)
        return fake_clock(fn, repetitions, warmup)

    cases = [
        ("layer_norm_bwd", [64, 32]),
        ("add", [64, 32]),
        ("sdpa_bwd", [1, 2, 64, 16]),
        ("mm", [8, 50257, 4]),
    ]
    rows, skipped = measure_cases(
        cases, time_fn=counting_clock, device="cpu", repetitions=3, warmup=1
    )
    assert skipped == [] and seen == [3, 3, 3, 3]
    norm, add, attention, unaligned = rows
    assert norm["aten"] == "aten.native_layer_norm_backward" and norm["time_us"] == 12.5
    assert all(row["kernels"] == 4 for row in rows)  # what the clock counted, for the idle gaps
    assert add["op"] == "elementwise" and add["nbytes"] == 3 * 64 * 32 * 2
    assert attention["op"] == "flash_attn_bwd" and attention["causal"] == "true"
    assert (unaligned["m"], unaligned["n"], unaligned["k"]) == (8, 50257, 4)


def test_fp16_fp32_and_non_causal_rows_carry_their_dtype_and_mask():
    cases = [
        ("mm_fp16", [8, 50257, 4]),
        ("mm_fp32", [16, 8, 4]),
        ("sdpa_noncausal_bwd", [1, 2, 64, 16]),
    ]
    fp16, fp32, attention = measure_cases(cases, time_fn=fake_clock, device="cpu")[0]
    assert (fp16["op"], fp16["dtype"], fp16["n"]) == ("mm", "fp16", 50257)
    assert (fp32["op"], fp32["dtype"], fp32["m"]) == ("mm", "fp32", 16)
    assert attention["op"] == "flash_attn_bwd" and attention["causal"] == "false"


def _workload_attention_fields(heads_q: int, heads_kv: int) -> dict:
    """The fields the capture records for the workloads' attention backward (q [b, s, h, d])."""
    recorder = OpRecorder()
    with FakeTensorMode(), gpu_fused_ops(), recorder:
        q = torch.randn(2, 64, heads_q, 16, dtype=torch.bfloat16, requires_grad=True)
        k, v = (
            torch.randn(2, 64, heads_kv, 16, dtype=torch.bfloat16, requires_grad=True)
            for _ in range(2)
        )
        attention = CausalAttention(alibi=False, total_heads=heads_q)
        attention(q, k, v, torch.arange(64)).sum().backward()
    trace = recorder.trace()
    c = trace.columns
    (row,) = [
        i for i in range(len(trace))
        if c["kind"][i] == COMPUTE and trace.strings[c["aten"][i]].endswith("attention_backward")
    ]  # fmt: skip
    return row_fields(op_record(trace, row))


def test_a_grouped_query_row_is_the_op_the_workloads_attention_records(tmp_path):
    (row,), _ = measure_cases([("sdpa_bwd", [2, 8, 64, 16, 2])], time_fn=fake_clock, device="cpu")
    captured = _workload_attention_fields(heads_q=8, heads_kv=2)
    assert {k: v for k, v in row.items() if k not in MEASURED} == captured
    table = load_kernel_table(write_kernel_csv([row], tmp_path / "k.csv", {}))
    assert table.lookup(row_op(captured), 132)[1] == "exact"  # an H100's SMs


def test_a_case_that_cannot_run_is_skipped_with_why():
    def failing_clock(fn, repetitions, warmup):
        raise RuntimeError("CUDA out of memory\nmore")

    rows, skipped = measure_cases([("add", [4, 4])], time_fn=failing_clock, device="cpu")
    assert rows == [] and skipped == ["add [4, 4]: CUDA out of memory"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_quick_calibration_with_the_grid_on_gpu(tmp_path):
    said = []
    path = run_calibration(
        tmp_path / "k.csv", quick=True, extra=lambda: measure_grid(True, progress=said.append)
    )
    assert [line for line in said if line.startswith("skipped")] == []
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    atens = {row["aten"] for row in rows}
    if torch.cuda.get_device_capability() >= (8, 9):  # float8 GEMMs: Ada, Hopper and later
        assert "aten._scaled_mm" in atens
    assert {"aten._scaled_dot_product_flash_attention_backward", "aten._to_copy"} <= atens
    assert {"fp16", "fp32"} <= {row["dtype"] for row in rows if row["op"] == "mm"}
    attention = [row for row in rows if row["op"] == "flash_attn_bwd"]
    assert {row["causal"] for row in attention} == {"true", "false"}
    assert any(int(row["heads_kv"]) < int(row["heads_q"]) for row in attention)
    assert load_kernel_table(path).groups


def test_the_device_checks_run_the_grid_and_job_gpu_tests():
    script = (Path(__file__).parents[2] / "results" / "device_checks.sh").read_text()
    assert (
        "step calibrate 240 $py -m pytest -q -m gpu -p no:cacheprovider \\\n"
        "    tests/prismbench/test_calibrate_grid.py tests/prismbench/test_calibrate_job.py"
    ) in script
