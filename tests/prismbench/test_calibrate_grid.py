"""Tests for prismbench/calibrate_grid.py: the grid and the rows, timed with a fake clock on CPU
(the kernel times themselves need a GPU: `prismbench calibrate` there)."""

from __future__ import annotations

from prismbench.calibrate_grid import calibration_cases, measure_cases


def test_the_grid_covers_fp8_unaligned_vocabularies_norms_activations_casts_embedding_and_sdpa():
    cases = calibration_cases()
    ops = {op for op, _ in cases}
    assert {"scaled_mm", "mm", "layer_norm_bwd", "rms_norm_bwd", "gelu_fwd", "add", "cast_bf16_fp8",
            "embedding_bwd", "sdpa_fwd", "sdpa_bwd"} <= ops  # fmt: skip
    assert all(d % 16 == 0 for op, shape in cases if op == "scaled_mm" for d in shape)
    assert ("mm", [8192, 50257, 768]) in cases  # GPT-2's unaligned output layer
    assert not {op for op, _ in calibration_cases(fp8=False)} & {"scaled_mm"}
    assert len(calibration_cases(quick=True)) < len(cases)


def test_rows_name_the_captured_op_and_carry_the_measured_time():
    seen = []

    def fake_clock(fn, repetitions, warmup):
        fn()  # the callable runs for real (on CPU here)
        seen.append(repetitions)
        return 12.5, 0.5, 4

    cases = [
        ("layer_norm_bwd", [64, 32]),
        ("add", [64, 32]),
        ("sdpa_bwd", [1, 2, 64, 16]),
        ("mm", [8, 50257, 4]),
    ]
    rows, skipped = measure_cases(cases, time_fn=fake_clock, device="cpu", repetitions=3, warmup=1)
    assert skipped == [] and seen == [3, 3, 3, 3]
    norm, add, attention, unaligned = rows
    assert norm["aten"] == "aten.native_layer_norm_backward" and norm["time_us"] == 12.5
    assert all(row["kernels"] == 4 for row in rows)  # what the clock counted, for the idle gaps
    assert add["op"] == "elementwise" and add["nbytes"] == 3 * 64 * 32 * 2
    assert attention["op"] == "flash_attn_bwd" and attention["causal"] == "true"
    assert (unaligned["m"], unaligned["n"], unaligned["k"]) == (8, 50257, 4)


def test_a_case_that_cannot_run_is_skipped_with_why():
    def failing_clock(fn, repetitions, warmup):
        raise RuntimeError("CUDA out of memory\nmore")

    rows, skipped = measure_cases([("add", [4, 4])], time_fn=failing_clock, device="cpu")
    assert rows == [] and skipped == ["add [4, 4]: CUDA out of memory"]
