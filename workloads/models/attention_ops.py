"""Causal attention masked by token positions (ALiBi, context parallelism) as one custom op.

On a GPU this attention is one fused kernel: FlashAttention-2 takes ALiBi slopes and
applies the causal mask tile by tile (MPT, BLOOM on flash-attn), and context-parallel
attention runs flash kernels on the gathered keys. Written with plain torch ops it would
materialise an s x s bias through a dozen elementwise kernels, which is neither what a
GPU runs nor what it costs. So `prism::masked_attention` and its backward are custom ops:
their CPU implementation is the reference math (an additive bias and SDPA), their fake
implementation allocates only the outputs, and the emulator maps them to flash attention.
The CPU implementation is written out (scores, softmax, and the softmax backward by hand)
because a custom op's kernel runs below autograd.

Mask: key j is visible to query i when kv_positions[j] <= q_positions[i]; with slopes
(one per local head, float32), the score gets -slope_h * (q_pos - kv_pos) added.
Layout: q [b, h, s_q, d], k/v [b, h_kv, s_kv, d] (GQA when h_kv < h).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def _bias(q_pos: Tensor, kv_pos: Tensor, slopes: Tensor, heads: int) -> Tensor:
    """Additive score bias [heads or 1, s_q, s_kv] in float32: the ALiBi term and -inf above
    the causal diagonal (by position)."""
    distance = (q_pos[:, None] - kv_pos[None, :]).to(torch.float32)
    bias = -slopes.view(-1, 1, 1) * distance if slopes.numel() else torch.zeros_like(distance)[None]
    return bias.masked_fill(distance < 0, float("-inf"))


def _probabilities(q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor, slopes: Tensor) -> Tensor:
    scores = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return torch.softmax(scores + _bias(q_pos, kv_pos, slopes, q.shape[1]), dim=-1)


def _expand_kv(t: Tensor, heads: int) -> Tensor:
    return t.repeat_interleave(heads // t.shape[1], dim=1)


def _reduce_kv(grad: Tensor, kv_heads: int) -> Tensor:
    b, h, s, d = grad.shape
    return grad.view(b, kv_heads, h // kv_heads, s, d).sum(dim=2)


@torch.library.custom_op("prism::masked_attention", mutates_args=())
def masked_attention(
    q: Tensor, k: Tensor, v: Tensor, q_positions: Tensor, kv_positions: Tensor, slopes: Tensor
) -> Tensor:
    heads = q.shape[1]
    p = _probabilities(q, _expand_kv(k, heads), q_positions, kv_positions, slopes)
    return (p @ _expand_kv(v, heads).float()).to(q.dtype)


@masked_attention.register_fake
def _(q, k, v, q_positions, kv_positions, slopes):
    return torch.empty_like(q)


@torch.library.custom_op("prism::masked_attention_backward", mutates_args=())
def masked_attention_backward(
    grad_out: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_positions: Tensor,
    kv_positions: Tensor,
    slopes: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    # softmax backward by hand: a custom op's kernel runs below autograd
    heads, kv_heads = q.shape[1], k.shape[1]
    k_full, v_full = _expand_kv(k, heads).float(), _expand_kv(v, heads).float()
    p = _probabilities(q, k_full, q_positions, kv_positions, slopes)
    g = grad_out.float()
    dv = p.transpose(-1, -2) @ g
    dp = g @ v_full.transpose(-1, -2)
    ds = p * (dp - (dp * p).sum(dim=-1, keepdim=True)) / math.sqrt(q.shape[-1])
    dq = ds @ k_full
    dk = ds.transpose(-1, -2) @ q.float()
    return (
        dq.to(q.dtype),
        _reduce_kv(dk, kv_heads).to(k.dtype),
        _reduce_kv(dv, kv_heads).to(v.dtype),
    )


@masked_attention_backward.register_fake
def _(grad_out, q, k, v, q_positions, kv_positions, slopes):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad_out):
    q, k, v, q_pos, kv_pos, slopes = ctx.saved_tensors
    dq, dk, dv = masked_attention_backward(grad_out, q, k, v, q_pos, kv_pos, slopes)
    return dq, dk, dv, None, None, None


masked_attention.register_autograd(_backward, setup_context=_setup_context)
