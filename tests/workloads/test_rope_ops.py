"""Tests for workloads/models/rope_ops.py: the fused RoPE op, its backward, and what fake mode sees."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from workloads.models.rope_ops import rope

THETA = 10_000.0


def test_backward_is_the_exact_vector_jacobian_product():
    x = torch.randn(1, 5, 2, 8, dtype=torch.float64, requires_grad=True)
    positions = torch.tensor([0, 3, 4, 9, 100])
    assert torch.autograd.gradcheck(lambda t: rope(t, positions, THETA, False), (x,))


def test_inverse_undoes_the_rotation():
    x = torch.randn(2, 6, 3, 16, dtype=torch.float64)
    positions = torch.arange(6) * 7
    back = rope(rope(x, positions, THETA, False), positions, THETA, True)
    torch.testing.assert_close(back, x)


def test_rotation_keeps_the_dtype_and_the_norm_of_every_pair():
    x = torch.randn(1, 4, 2, 8, dtype=torch.bfloat16)
    out = rope(x, torch.arange(4), THETA, False)
    assert out.dtype == torch.bfloat16 and out.shape == x.shape
    pair_norms = lambda t: t.float().unflatten(-1, (-1, 2)).norm(dim=-1)  # noqa: E731
    torch.testing.assert_close(pair_norms(out), pair_norms(x), atol=0.05, rtol=0.02)


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def test_fake_mode_sees_one_op_forward_and_one_backward():
    with FakeTensorMode():
        x = torch.empty(1, 4096, 8, 128, dtype=torch.bfloat16, requires_grad=True)
        positions = torch.arange(4096)
        ops = _Ops()
        with ops:
            rope(x, positions, THETA, False).sum().backward()
    assert [op for op in ops.seen if "rope" in op] == ["prism.rope.default"] * 2
    assert x.grad.shape == x.shape


@pytest.mark.parametrize("transposed", [False, True], ids=["contiguous", "transposed"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_opcheck_passes(dtype, transposed):
    # the fake kernel against the real one (shapes, dtypes, strides), autograd and tracing;
    # transposed: the layout of the gradient unfused attention hands RoPE's backward
    x = torch.randn(2, 3, 6, 16, dtype=dtype).transpose(1, 2) if transposed else (
        torch.randn(2, 6, 3, 16, dtype=dtype))  # fmt: skip
    torch.library.opcheck(rope, (x.requires_grad_(), torch.arange(6) * 5, THETA, False))
