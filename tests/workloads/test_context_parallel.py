"""Tests for workloads/context_parallel.py's flash calls (the ring's loss parity is in
test_parallel_parity.py, its capture in tests/prismbench/test_capture.py)."""

import pytest
import torch
import torch.nn.functional as F

from workloads.context_parallel import _flash, _flash_backward


def _check_against_sdpa(device: str, dtype: torch.dtype, tolerance: float) -> None:
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 64, 32, generator=gen).to(device, dtype) for _ in range(3))
    for causal, q_part in ((True, q), (False, q[:, :, 32:])):
        out, lse, rest = _flash(q_part, k, v, causal)
        leaves = [t.clone().requires_grad_() for t in (q_part, k, v)]
        expected = F.scaled_dot_product_attention(*leaves, is_causal=causal)
        torch.testing.assert_close(out, expected, rtol=tolerance, atol=tolerance)
        scores = (q_part.float() @ k.float().transpose(-1, -2)) / 32**0.5
        if causal:
            scores = scores.masked_fill(
                torch.ones(64, 64, device=device).triu(1).bool(), -torch.inf
            )
        torch.testing.assert_close(lse, scores.logsumexp(-1), rtol=tolerance, atol=tolerance)
        grad = torch.randn_like(out)
        expected.backward(grad)
        grads = _flash_backward(grad, q_part, k, v, out, lse, causal, rest)
        for got, leaf in zip(grads, leaves, strict=True):
            torch.testing.assert_close(got, leaf.grad, rtol=tolerance, atol=tolerance)


def test_the_flash_calls_are_sdpa_and_its_gradient_on_cpu():
    # a causal call on the local chunks, an unmasked one of half the queries (the ring's steps)
    _check_against_sdpa("cpu", torch.float32, 1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_flash_calls_are_sdpa_and_its_gradient_on_cuda():
    # the CUDA flash ops torch's ring calls, with the outputs the forward returned
    _check_against_sdpa("cuda", torch.bfloat16, 3e-2)
