"""The eager custom ops (the workloads at 86a4f47) compute what the fused ops compute."""

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from workloads.models.attention_ops import masked_attention
from workloads.models.eager_ops import eager_masked_attention, eager_rope
from workloads.models.rope_ops import rope


def _grads(out, inputs):
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    return torch.autograd.grad(out, inputs, grad)


def test_eager_rope_equals_the_fused_op_both_ways():
    x = torch.randn(2, 8, 3, 16, requires_grad=True)
    positions = torch.arange(3, 11)  # a context-parallel chunk's absolute positions
    eager, fused = eager_rope(x, positions, 500.0), rope(x, positions, 500.0, False)
    torch.testing.assert_close(eager, fused)
    torch.testing.assert_close(_grads(eager, (x,)), _grads(fused, (x,)))


def test_eager_masked_attention_equals_the_fused_op_both_ways():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 12, 8, generator=gen, requires_grad=True)
    k, v = (torch.randn(2, 2, 12, 8, generator=gen, requires_grad=True) for _ in range(2))  # GQA
    positions, slopes = torch.arange(12), torch.tensor([0.5, 0.25, 0.125, 0.0625])
    eager = eager_masked_attention(q, k, v, positions, positions, slopes)
    fused = masked_attention(q, k, v, positions, positions, slopes)[0]
    torch.testing.assert_close(eager, fused)
    for a, b in zip(_grads(eager, (q, k, v)), _grads(fused, (q, k, v)), strict=True):
        torch.testing.assert_close(a, b)


def test_eager_ops_keep_only_their_inputs_for_backward():
    x = torch.randn(1, 4, 2, 8, requires_grad=True)
    out = eager_rope(x, torch.arange(4), 10_000.0)
    assert [t.shape for t in out.grad_fn.saved_tensors] == [torch.Size([4])]  # the positions


class _ScoreMatricesAtSoftmax(TorchDispatchMode):
    """Counts the live float32 [b, h, s, s] tensors when the softmax is called."""

    def __init__(self, shape):
        super().__init__()
        self.shape, self.made, self.live_at_softmax = torch.Size(shape), [], []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._softmax.default:
            self.live_at_softmax.append(sum(r() is not None for r in self.made))
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.shape == self.shape:
            self.made.append(weakref.ref(out))
        return out


def test_eager_masked_attention_frees_its_score_matrices_when_86a4f47_did():
    # 86a4f47's body keeps the scaled scores in a local until the softmax returns: two score
    # matrices are live when it is called (the allocator replay of mpt-7b depends on it)
    q, k, v = (torch.randn(1, 2, 6, 4, requires_grad=True) for _ in range(3))
    positions, slopes = torch.arange(6), torch.tensor([0.5, 0.25])
    counter = _ScoreMatricesAtSoftmax((1, 2, 6, 6))
    with counter:
        out = eager_masked_attention(q, k, v, positions, positions, slopes)
        out.sum().backward()
    assert counter.live_at_softmax == [2, 2]  # forward, and backward's recomputation
