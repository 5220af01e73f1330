"""Tests for emulator.costs.compute: limits and monotonicity of the roofline curves."""

import pytest

from emulator.costs.compute import op_time_s
from emulator.costs.ops import MEMORY_OPS, attention_op, gemm_op, memory_op
from emulator.hardware import gpu_preset

H100 = gpu_preset("h100-sxm-80g")
A100 = gpu_preset("a100-sxm-80g")


def test_gemm_time_grows_with_size():
    times = [op_time_s(gemm_op("mm", s, s, s), H100) for s in (256, 1024, 4096, 16384)]
    assert times == sorted(times) and len(set(times)) == 4


@pytest.mark.parametrize("dim", ["m", "n"])
def test_a_gemm_one_tile_row_past_another_never_runs_faster(dim):
    # 4096 x 4096 weights over 128-row tiles: 122 rows fill 32 tiles, 138 rows 64, both one wave
    # of 132 SMs. Computing 16 more rows of output cannot take less time than the 122 alone.
    shapes = [_rows(dim, rows) for rows in range(64, 1500, 2)]
    times = [op_time_s(gemm_op("mm", *shape), H100) for shape in shapes]
    assert all(a <= b for a, b in zip(times, times[1:], strict=False))


def _rows(dim, rows):
    return (rows, 4096, 4096) if dim == "m" else (8192, rows, 4096)


def test_one_wave_of_whole_tiles_takes_one_tiles_time():
    # 128 to 512 rows of a 4096-wide output: 32 to 128 tiles, one wave of the H100's 132 SMs
    one_tile_row = op_time_s(gemm_op("mm", 128, 4096, 4096), H100)
    for rows in (130, 300, 512):
        assert op_time_s(gemm_op("mm", rows, 4096, 4096), H100) == pytest.approx(one_tile_row)


def test_large_gemm_runs_at_measured_fraction_of_peak():
    op = gemm_op("mm", 16384, 16384, 16384, dtype="fp16")
    achieved = op.flops / op_time_s(op, A100)
    assert achieved == pytest.approx(312e12 * A100.gemm_efficiency, rel=0.01)


def test_fp8_gemm_faster_than_bf16_on_h100():
    bf16 = op_time_s(gemm_op("mm", 8192, 8192, 8192, dtype="bf16"), H100)
    fp8 = op_time_s(gemm_op("scaled_mm", 8192, 8192, 8192, dtype="fp8"), H100)
    assert fp8 < 0.6 * bf16


def test_fp8_gemm_refused_on_a100():
    with pytest.raises(ValueError, match="no fp8"):
        op_time_s(gemm_op("scaled_mm", 1024, 1024, 1024, dtype="fp8"), A100)


def test_skinny_gemm_is_memory_bound():
    op = gemm_op("mm", 1, 8192, 8192)  # a GEMV: 1 row
    assert op_time_s(op, H100) == pytest.approx(op.bytes_total / (3350e9 * H100.hbm_efficiency))


def test_a_tiny_kernel_takes_next_to_no_kernel_time():
    # the stream's idle time between kernels is the pricing's (tests/emulator/costs/test_pricing.py)
    assert op_time_s(memory_op("elementwise", bytes_read=64, bytes_written=64), H100) < 1e-7


@pytest.mark.parametrize("name", MEMORY_OPS)
def test_memory_ops_monotonic_in_bytes(name):
    times = [op_time_s(memory_op(name, bytes_read=b, bytes_written=b), H100) for b in (1e3, 1e6, 1e9)]
    assert times == sorted(times) and times[0] < times[-1]


def test_causal_attention_costs_half():
    kw = dict(batch=1, heads_q=32, heads_kv=8, seq_q=8192, seq_kv=8192, head_dim=128)
    full = attention_op("flash_attn_fwd", causal=False, **kw)
    causal = attention_op("flash_attn_fwd", causal=True, **kw)
    assert causal.flops == full.flops / 2
    assert op_time_s(causal, H100) < 0.55 * op_time_s(full, H100)


def test_attention_backward_slower_than_forward_and_grows_with_seq():
    kw = dict(batch=1, heads_q=32, heads_kv=8, head_dim=128)
    fwd = [op_time_s(attention_op("flash_attn_fwd", seq_q=s, seq_kv=s, **kw), H100) for s in (2048, 8192, 32768)]
    bwd = op_time_s(attention_op("flash_attn_bwd", seq_q=8192, seq_kv=8192, **kw), H100)
    assert fwd == sorted(fwd) and bwd > 2.5 * fwd[1]


def test_attention_efficiency_higher_at_head_dim_128():
    def tflops(d):
        op = attention_op("flash_attn_fwd", batch=2, heads_q=4096 // d, heads_kv=4096 // d, seq_q=8192, seq_kv=8192, head_dim=d)
        return op.flops / op_time_s(op, A100)
    assert tflops(128) > tflops(64)
