"""Tests for emulator.costs.ops: the op record validates itself and counts work correctly."""

import pytest

from emulator.costs.ops import OpRecord, attention_op, gemm_op


def test_gemm_flops_and_bytes():
    op = gemm_op("bmm", 4, 8, 16, batch=2, dtype="bf16")
    assert op.flops == 2 * 4 * 8 * 16 * 2
    assert op.bytes_read == (4 * 16 + 16 * 8) * 2 * 2 and op.bytes_written == 4 * 8 * 2 * 2


def test_attention_backward_is_two_and_a_half_forward():
    kw = dict(batch=1, heads_q=8, heads_kv=8, seq_q=128, seq_kv=128, head_dim=64, causal=False)
    assert attention_op("flash_attn_bwd", **kw).flops == 2.5 * attention_op("flash_attn_fwd", **kw).flops


def test_unknown_op_name_is_refused():
    with pytest.raises(ValueError, match="op.name='conv2d' is not in the vocabulary"):
        OpRecord(name="conv2d", dtype="bf16")


def test_scaled_mm_must_be_fp8():
    with pytest.raises(ValueError, match="scaled_mm is an fp8 GEMM"):
        gemm_op("scaled_mm", 8, 8, 8, dtype="bf16")


def test_gemm_needs_shape():
    with pytest.raises(ValueError, match="m, n, k must be >= 1"):
        OpRecord(name="mm", dtype="bf16", flops=1.0)
