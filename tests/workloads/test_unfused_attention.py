"""Megatron's unfused attention computes what the fused kernels compute, with its own kernels."""

import pytest
import torch
import torch.nn.functional as F

from workloads.models.attention_ops import masked_attention
from workloads.models.unfused_attention import (
    causal_softmax,
    causal_softmax_backward_,
    unfused_attention,
)


def _qkv(b=2, heads=4, kv_heads=4, s=16, d=8):
    gen = torch.Generator().manual_seed(0)
    # [b, s, h, d] transposed to [b, h, s, d], the strided views the models hand over
    q, k, v = (
        torch.randn(b, s, h, d, generator=gen, requires_grad=True).transpose(1, 2)
        for h in (heads, kv_heads, kv_heads)
    )
    return q, k, v


def _grads(out, inputs):
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    return torch.autograd.grad(out, inputs, grad)


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_unfused_attention_equals_causal_sdpa_forward_and_backward(kv_heads):
    q, k, v = _qkv(kv_heads=kv_heads)
    fused = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kv_heads != 4)
    unfused = unfused_attention(q, k, v, alibi_slopes=None, dropout=0.0)
    torch.testing.assert_close(unfused, fused)
    for a, b in zip(_grads(unfused, (q, k, v)), _grads(fused, (q, k, v)), strict=True):
        torch.testing.assert_close(a, b)


def test_unfused_alibi_equals_the_position_masked_kernel():
    # slope * key position differs from ALiBi's -slope * (q - k) by a constant per softmax row
    q, k, v = _qkv()
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    positions = torch.arange(q.shape[2])
    fused = masked_attention(q, k, v, positions, positions, slopes)[0]
    unfused = unfused_attention(q, k, v, alibi_slopes=slopes, dropout=0.0)
    torch.testing.assert_close(unfused, fused)
    for a, b in zip(_grads(unfused, (q, k, v)), _grads(fused, (q, k, v)), strict=True):
        torch.testing.assert_close(a, b)


def test_attention_dropout_drops_probabilities_and_rescales_the_rest():
    q, k, v = _qkv(b=1, heads=1, kv_heads=1, s=64, d=4)
    v = torch.eye(64)[None, None].requires_grad_()  # the output rows are the probabilities
    torch.manual_seed(0)
    probs = unfused_attention(q, k, v, alibi_slopes=None, dropout=0.5)[0, 0]
    kept = unfused_attention(q, k, v, alibi_slopes=None, dropout=0.0)[0, 0]
    visible = torch.ones(64, 64).tril().bool()
    dropped = (probs == 0) & visible
    assert 0.4 < dropped.sum() / visible.sum() < 0.6
    torch.testing.assert_close(probs[~dropped & visible], 2 * kept[~dropped & visible])
    probs.sum().backward()  # dropout's mask is kept for backward
    assert v.grad is not None


def test_the_fused_softmax_masks_future_keys_and_its_backward_writes_over_the_gradient():
    scores = torch.randn(3, 5, 5)
    probs = causal_softmax(scores)
    future = torch.ones(5, 5).triu(1).bool()
    assert (probs[:, future] == 0).all()
    torch.testing.assert_close(probs, torch.softmax(scores.masked_fill(future, -torch.inf), -1))
    grad = torch.randn(3, 5, 5)
    expected = torch.func.vjp(
        lambda x: torch.softmax(x.masked_fill(future, -torch.inf), -1), scores
    )[1](grad)[0]
    storage = grad.data_ptr()
    causal_softmax_backward_(grad, probs)
    assert grad.data_ptr() == storage
    torch.testing.assert_close(grad, expected)


def test_the_softmax_ops_pass_torch_library_checks():
    scores = torch.randn(2, 4, 4, requires_grad=True)
    torch.library.opcheck(causal_softmax, (scores,))
    torch.library.opcheck(causal_softmax_backward_, (torch.randn(2, 4, 4), torch.rand(2, 4, 4)))
