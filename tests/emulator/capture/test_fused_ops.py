"""Tests for emulator/capture/fused_ops.py: nn.RMSNorm captured as the fused op pair a CUDA build runs."""

import contextlib

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from emulator.capture.fused_ops import gpu_fused_ops
from tests.emulator.capture.recorded_rows import compute_rows

HIDDEN = 64


def _record_norm(weight_dtype=torch.bfloat16, fused=True):
    """Forward and backward of one RMSNorm on a bf16 activation; (aten op, phase) rows and grads."""
    with gpu_fused_ops() if fused else contextlib.nullcontext(), FakeTensorMode():
        norm = nn.RMSNorm(HIDDEN, eps=1e-5, dtype=weight_dtype)
        x = torch.empty(2, 8, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
        rows = compute_rows(lambda: norm(x).sum().backward(), skip=("aten.sum",))
    return rows, x.grad, norm.weight.grad


def test_rms_norm_is_one_fused_kernel_forward_and_one_backward():
    rows, _, _ = _record_norm()
    norm_rows = [r for r in rows if "rms_norm" in r[0]]
    assert norm_rows == [
        ("aten._fused_rms_norm", "forward"),
        ("aten._fused_rms_norm_backward", "backward"),
    ]
    assert not any(op in {"aten.pow", "aten.rsqrt", "aten.mean"} for op, _ in rows)


def test_without_the_routing_the_cpu_path_decomposes():
    rows, _, _ = _record_norm(fused=False)
    ops = {op for op, _ in rows}
    assert {"aten.pow", "aten.rsqrt", "aten.mean"} <= ops
    assert "aten._fused_rms_norm" not in ops


def test_fused_gradients_have_the_shapes_and_dtypes_of_their_inputs():
    _, grad_x, grad_w = _record_norm()
    assert grad_x.shape == (2, 8, HIDDEN) and grad_x.dtype == torch.bfloat16
    assert grad_w.shape == (HIDDEN,) and grad_w.dtype == torch.bfloat16


@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")  # the path tested
def test_weight_of_another_dtype_takes_the_composite_path_as_cuda_does():
    rows, _, grad_w = _record_norm(weight_dtype=torch.float32)
    assert "aten._fused_rms_norm" not in {op for op, _ in rows}
    assert grad_w.dtype == torch.float32


def test_routing_is_undone_on_exit():
    original = torch.nn.functional.rms_norm
    with gpu_fused_ops():
        assert torch.nn.functional.rms_norm is not original
    assert torch.nn.functional.rms_norm is original


def test_fused_forward_matches_the_composite_on_real_cpu_tensors():
    # CPU has no `_fused_rms_norm_backward` kernel (CUDA/XPU only), so only the forward runs real
    norm = nn.RMSNorm(HIDDEN, eps=1e-5)
    x = torch.randn(2, 8, HIDDEN)
    expected = norm(x)
    with gpu_fused_ops(), torch.no_grad():
        torch.testing.assert_close(norm(x), expected)
