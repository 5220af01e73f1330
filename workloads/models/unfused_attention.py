"""Attention with the score matrix in memory, as Megatron-LM ran it before flash attention.

`kernels.attention = "unfused"` (workloads.kernels). Megatron-LM's ParallelAttention
(megatron/model/transformer.py at a8d172b31e, May 2021, the code of Narayanan et al. 2021;
CoreAttention at 2e90a342f5, May 2022, Korthikanti et al. 2022; Megatron-DeepSpeed's, which
BLOOM trained with, adds ALiBi as the GEMM's input) runs per layer and micro-batch:
1. `torch.baddbmm`: the scores Q.K^T / sqrt(d) of all b x heads in one batched GEMM, written
   in the compute dtype ([b*h, s, s]); with ALiBi the bias is baddbmm's input (beta = 1),
   otherwise beta = 0 and the input is not read;
2. `FusedScaleMaskSoftmax`: one fused kernel (`scaled_upper_triang_masked_softmax`) that masks
   the keys after each query and writes the probabilities in the compute dtype (float32
   inside); its backward is one kernel written over the incoming gradient ("backward pass is
   completely in-place", scaled_upper_triang_masked_softmax_cuda.cu). Megatron takes it for
   16 < s <= 2048 (2021) or 4096 (2022) and falls back to float32 torch ops beyond; the
   fallback is not modelled: the fused kernel runs at any length;
3. attention dropout (`--attention-dropout`, 0.1 by default; `train.attention_dropout`):
   `native_dropout`, the one kernel each way that `F.dropout` runs on CUDA, keeping a byte mask;
4. `torch.bmm`: probabilities times V.
Autograd keeps the probabilities, dropout's mask and its output for backward: Korthikanti et
al.'s 5 a s^2 b bytes per layer.

One difference in layout: Megatron holds activations as [s, b, h, d], so b x heads fold into
one batch stride without a copy; the models here hold [b, s, h, d], and folding them copies Q,
K and V when b > 1 (a tensor of s x d per head, against s x s for the scores).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from workloads.models.cuda_kernels import register_compiled_cuda_kernel


def _future_keys(s_q: int, s_k: int, device) -> Tensor:
    """True where key j comes after query i (queries are the last s_q of the s_k positions)."""
    return torch.ones(s_q, s_k, dtype=torch.bool, device=device).triu(1 + s_k - s_q)


def _masked_softmax(scores: Tensor) -> Tensor:
    masked = scores.float().masked_fill(_future_keys(*scores.shape[-2:], scores.device), -math.inf)
    return torch.softmax(masked, dim=-1).to(scores.dtype)


def _softmax_backward_over_grad(grad: Tensor, probs: Tensor) -> None:
    p, g = probs.float(), grad.float()
    grad.copy_(p * (g - (g * p).sum(dim=-1, keepdim=True)))


@torch.library.custom_op("prism::causal_softmax", mutates_args=())
def causal_softmax(scores: Tensor) -> Tensor:
    """Softmax over the last dim of scores [batch, s_q, s_k], future keys masked, float32
    inside and returned in the scores' dtype (Megatron's scaled_upper_triang_masked_softmax)."""
    return _masked_softmax(scores)


@causal_softmax.register_fake
def _(scores):
    return torch.empty_like(scores)


@torch.library.custom_op("prism::causal_softmax_backward_", mutates_args=("grad",))
def causal_softmax_backward_(grad: Tensor, probs: Tensor) -> None:
    """The softmax's backward, written over `grad` (the gradient of the probabilities)."""
    _softmax_backward_over_grad(grad, probs)


@causal_softmax_backward_.register_fake
def _(grad, probs):
    return None


# on CUDA one fused kernel each way, as Megatron's (workloads.models.cuda_kernels)
register_compiled_cuda_kernel(causal_softmax, _masked_softmax)
register_compiled_cuda_kernel(causal_softmax_backward_, _softmax_backward_over_grad)


def _setup_context(ctx, inputs, output) -> None:
    ctx.save_for_backward(output)


def _backward(ctx, grad):
    (probs,) = ctx.saved_tensors
    grad = grad.contiguous()  # a fresh GEMM or dropout output: Megatron writes over it too
    causal_softmax_backward_(grad, probs)
    return grad


causal_softmax.register_autograd(_backward, setup_context=_setup_context)


def _fold_heads(t: Tensor, heads: int) -> Tensor:
    """[b, h_t, s, d] -> [b*heads, s, d], repeating K/V heads for GQA as Megatron-core does."""
    if t.shape[1] != heads:
        t = t.repeat_interleave(heads // t.shape[1], dim=1)
    return t.reshape(-1, *t.shape[2:])


def unfused_attention(
    q: Tensor, k: Tensor, v: Tensor, *, alibi_slopes: Tensor | None, dropout: float
) -> Tensor:
    """Causal attention over q [b, h, s, d], k/v [b, h_kv, s, d] in sequence order; returns
    [b, h, s, d]. `alibi_slopes` (float32, one per head) adds slope * key position to each
    score, which equals ALiBi's -slope * (query - key) within a softmax row."""
    b, heads, s, d = q.shape
    q3, k3, v3 = (_fold_heads(t, heads) for t in (q, k, v))
    if alibi_slopes is None:
        bias, beta = q3.new_empty(()), 0.0  # not read: beta = 0
    else:
        positions = torch.arange(k.shape[2], device=q.device, dtype=torch.float32)
        bias = (alibi_slopes.view(heads, 1, 1) * positions).to(q.dtype)  # [h, 1, s_k]
        bias, beta = bias.expand(b, heads, 1, -1).reshape(b * heads, 1, -1), 1.0
    scores = torch.baddbmm(bias, q3, k3.transpose(1, 2), beta=beta, alpha=1.0 / math.sqrt(d))
    probs = causal_softmax(scores)
    if dropout:
        probs = torch.native_dropout(probs, dropout, True)[0]
    return torch.bmm(probs, v3).view(b, heads, s, -1)
