"""Tests for emulator.costs.kernel_table on a tiny SYNTHETIC table (made-up times, not measurements)."""

import pytest

from emulator.costs.calibrate import write_kernel_csv
from emulator.costs.compute import curve_time_s, op_time_s
from emulator.costs.kernel_table import load_kernel_table
from emulator.costs.ops import gemm_op
from emulator.hardware import gpu_preset

H100 = gpu_preset("h100-sxm-80g")
SYNTHETIC = {"gpu": "synthetic", "driver": "synthetic", "torch": "synthetic", "clocks": "synthetic", "date": "synthetic"}


def _gemm_row(s, time_us):
    return {"op": "mm", "dtype": "bf16", "m": s, "n": s, "k": s, "batch": 1, "time_us": time_us,
            "repetitions": 1, "spread_us": 0.0}


@pytest.fixture
def table(tmp_path):
    # synthetic rates: 100 TFLOP/s at 2048^3 and 400 TFLOP/s at 4096^3
    rows = [_gemm_row(2048, 2 * 2048**3 / 100e12 * 1e6), _gemm_row(4096, 2 * 4096**3 / 400e12 * 1e6)]
    return load_kernel_table(write_kernel_csv(rows, tmp_path / "synthetic.csv", SYNTHETIC))


def test_exact_row_is_returned(table):
    op = gemm_op("mm", 2048, 2048, 2048)
    assert op_time_s(op, H100, table=table) == pytest.approx(op.flops / 100e12)


def test_linear_shares_the_gemm_rows(table):
    op = gemm_op("linear", 4096, 4096, 4096)
    assert op_time_s(op, H100, table=table) == pytest.approx(op.flops / 400e12)


def test_interpolates_in_log_space_between_rows(table):
    op = gemm_op("mm", 2896, 2896, 2896)  # ~ geometric middle of 2048 and 4096
    rate = op.flops / op_time_s(op, H100, table=table)
    assert 190e12 < rate < 210e12  # geometric mean of 100 and 400 is 200


def test_falls_back_to_curves_far_from_rows(table):
    op = gemm_op("mm", 65536, 65536, 512)
    assert op_time_s(op, H100, table=table) == curve_time_s(op, H100)


def test_other_dtype_falls_back(table):
    op = gemm_op("mm", 2048, 2048, 2048, dtype="fp16")
    assert op_time_s(op, H100, table=table) == curve_time_s(op, H100)


def test_missing_columns_are_named(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("op,dtype,time_us\nmm,bf16,1.0\n")
    with pytest.raises(ValueError, match="lacks columns"):
        load_kernel_table(path)
