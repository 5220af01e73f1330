"""Tests for prismbench/microbench_rows.py: microbenchmark rows as the capture sees the op."""

from __future__ import annotations

import pytest
import torch

from emulator.costs.calibrate import write_kernel_csv
from emulator.costs.kernel_table import load_kernel_table
from emulator.costs.ops import gemm_op
from prismbench.microbench_rows import CALLS, microbench_rows, recorded_fields

# The header and three rows in the format of ../shared/data/gpu/h100-sxm-80g/microbench-kernels.csv
# (kernel names shortened); the times are the shared file's.
CSV = """op,dtype,shape,flops,bytes,kernel_us,repetitions,kernels
mm,bf16,"[512, 768, 768]",603979776,2752512,3.968,10,nvjet_sm90_tst_64x48_64x15_2x1_v_bz_NNT
scaled_mm,fp8,"[512, 50257, 768]",39523713024,90453760,,0,ERROR mat2 shape (768x50257) must be divisible by 16
layer_norm_bwd,bf16,"[8192, 768]",0,37748736,48.25,10,GammaBetaBackwardCUDAKernelTemplate;layer_norm_grad_input_kernel
silu_mul_fwd,bf16,"[8192, 768]",0,37748736,15.486,10,vectorized_elementwise_kernel;vectorized_elementwise_kernel
"""


def test_rows_say_what_the_capture_records(tmp_path):
    path = tmp_path / "microbench-kernels.csv"
    path.write_text(CSV)
    rows, skipped = microbench_rows(path, {"gpu": "H100"})
    assert [r["source"] for r in rows] == ["microbench-kernels.csv:2", "microbench-kernels.csv:4"]
    mm, norm = rows
    assert (mm["op"], mm["m"], mm["n"], mm["k"], mm["time_us"]) == ("mm", 512, 768, 768, 3.968)
    assert norm["aten"] == "aten.native_layer_norm_backward" and norm["op"] == "norm"
    # grad_out, input, mean, rstd, weight read; grad_input, grad_weight, grad_bias written
    assert norm["nbytes"] > 3 * 8192 * 768 * 2
    assert len(skipped) == 2 and "no time" in skipped[0] and "several captured ops" in skipped[1]
    table = load_kernel_table(write_kernel_csv(rows, tmp_path / "t.csv", {}))
    assert table.lookup(gemm_op("mm", 512, 768, 768), 132)[1] == "exact"  # an H100's SMs


def test_rms_norm_is_recorded_as_the_fused_op_a_gpu_runs():
    assert recorded_fields("rms_norm_bwd", [64, 32])["aten"] == "aten._fused_rms_norm_backward"


@pytest.mark.parametrize("op", ["mm", "scaled_mm"])
def test_gemm_operands_are_standard_normal_not_uninitialised_memory(op):
    # a product of standard-normal operands has standard deviation sqrt(k); zeros give 0
    torch.manual_seed(0)
    out = CALLS[op][0](64, 64, 256)().float()
    assert out.std().item() == pytest.approx(256**0.5, rel=0.2)


def test_attention_inputs_are_random():
    torch.manual_seed(0)
    out = CALLS["sdpa_fwd"][0](2, 4, 64, 16)().float()
    # the first query attends to the first key only: its output is that value row, N(0, 1)
    assert out[:, :, 0].std().item() == pytest.approx(1.0, rel=0.3)


def test_embedding_tokens_spread_over_the_vocabulary():
    grad_weight = CALLS["embedding_bwd"][0](256, 1000, 8)()[0]
    assert int((grad_weight != 0).any(dim=1).sum()) > 100  # rows the backward scatters into
