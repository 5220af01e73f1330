"""Tests for emulator.costs.calibrate: grid and CSV logic on CPU; the measurement on a GPU."""

import csv

import pytest
import torch

from emulator.costs.calibrate import (
    attention_grid,
    gemm_grid,
    gqa_attention_grid,
    run_calibration,
    write_kernel_csv,
)
from emulator.costs.kernel_table import COLUMNS, load_kernel_table


def test_gemm_grid_covers_transformer_shapes():
    grid = gemm_grid()
    assert (4096, 3 * 8192 // 8, 8192) in grid  # QKV of hidden 8192 at tp 8, 4k tokens
    assert (65536, 25600, 25600 // 8) in grid or any(m == 65536 for m, _, _ in grid)
    assert len(gemm_grid(quick=True)) < len(grid)


def test_attention_grid_has_both_head_dims_and_long_sequences():
    grid = attention_grid()
    assert {d for *_, d in grid} == {64, 128} and max(s for _, _, s, _ in grid) == 131072


def test_attention_grid_has_one_tensor_parallel_rank_s_heads():
    # a tp 8 rank of a 32-head layer runs 4 heads, at micro-batch 1
    assert (1, 4, 8192, 128) in attention_grid() and (1, 8, 8192, 64) in attention_grid()
    assert {h for b, h, *_ in attention_grid() if b == 1} >= {4, 8, 16}


def test_gqa_attention_grid_has_llama_3_heads_and_one_rank_s_share():
    # (batch, heads_q, seq, head_dim, heads_kv): 32 query heads over 8 key/value heads, and
    # at tp 8 a rank's 4 query heads over 1
    grid = gqa_attention_grid()
    assert (16, 32, 8192, 128, 8) in grid and (1, 4, 8192, 128, 1) in grid
    assert all(heads_q > heads_kv for _, heads_q, _, _, heads_kv in grid)
    assert len(gqa_attention_grid(quick=True)) < len(grid)


def test_csv_has_columns_and_provenance(tmp_path):
    prov = {"gpu": "synthetic", "driver": "x", "torch": "x", "clocks": "x", "date": "x"}
    row = {"op": "copy", "dtype": "bf16", "nbytes": 2048, "time_us": 1.0, "repetitions": 3, "spread_us": 0.1}
    path = write_kernel_csv([row], tmp_path / "k.csv", prov)
    with path.open() as handle:
        reader = csv.DictReader(handle)
        assert tuple(reader.fieldnames) == COLUMNS
        assert next(reader)["gpu"] == "synthetic"
    assert load_kernel_table(path).gpus == ("synthetic",)


def test_unknown_row_field_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown fields"):
        write_kernel_csv([{"op": "mm", "flux": 1}], tmp_path / "k.csv", {})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_without_cuda_raises_clear_error(tmp_path):
    with pytest.raises(RuntimeError, match="calibration needs a CUDA GPU"):
        run_calibration(tmp_path / "k.csv")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_quick_calibration_on_gpu(tmp_path):
    path = run_calibration(tmp_path / "k.csv", quick=True)
    table = load_kernel_table(path)
    assert table.groups
    with path.open(newline="") as handle:  # every row says how many kernels it timed
        assert all(int(row["kernels"]) >= 1 for row in csv.DictReader(handle))
