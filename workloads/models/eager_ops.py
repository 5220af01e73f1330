"""The workloads' own ops as eager float32 math: what the workloads at 86a4f47 ran on a GPU.

`kernels.custom_ops = "eager"` (workloads.kernels; the `prism-86a4f47` framework's choice). At
commit 86a4f47, when the shared H100 profiles (../shared/data/gpu/h100-sxm-80g/) were taken,
RoPE and position-masked attention (ALiBi, context parallelism) were custom ops whose only
implementation was their reference math, so on a GPU each ran as a chain of eager kernels:
- RoPE: the angles, a float32 upcast, four products, a stack and a downcast per tensor, each
  way (backward: the same rotation by the opposite angle), keeping only the positions;
- position-masked attention: float32 Q.K^T over the whole score matrix, the float32 bias and
  mask, a softmax and P.V, then a cast back; its backward recomputed the probabilities from
  the inputs it kept (q, k, v, positions, slopes) and ran the softmax backward by hand
  (the profile of mpt-7b-l4 shows the float32 SIMT GEMMs and softmax).
The autograd functions here run exactly that: their forward and backward are plain torch ops,
which the capture records one by one and a GPU runs as they are. The fused custom ops
(`rope_ops`, `attention_ops`) are what every production framework runs instead.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from workloads.models.attention_ops import _bias, _expand_kv, _reduce_kv
from workloads.models.rope_ops import rotate


class EagerRope(torch.autograd.Function):
    """RoPE as the eager kernels of its reference math; keeps the positions only."""

    @staticmethod
    def forward(ctx, x: Tensor, positions: Tensor, theta: float) -> Tensor:
        ctx.save_for_backward(positions)
        ctx.theta = theta
        return rotate(x, positions, theta, inverse=False)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (positions,) = ctx.saved_tensors
        return rotate(grad, positions, ctx.theta, inverse=True), None, None


def _probabilities(q, k_full, q_positions, kv_positions, slopes) -> Tensor:
    # 86a4f47's body, line for line: the local `scores` keeps the scaled score matrix alive
    # until the softmax has returned, so three float32 score matrices are live at once, not
    # two; where they sit decides which segments the caching allocator reuses for the logits
    scores = (q.float() @ k_full.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return torch.softmax(scores + _bias(q_positions, kv_positions, slopes), dim=-1)


class EagerMaskedAttention(torch.autograd.Function):
    """Position-masked attention as float32 eager math over the full score matrix (86a4f47's
    `prism::masked_attention` body); keeps its inputs, recomputes the rest in backward."""

    @staticmethod
    def forward(ctx, q, k, v, q_positions, kv_positions, slopes) -> Tensor:
        ctx.save_for_backward(q, k, v, q_positions, kv_positions, slopes)
        heads = q.shape[1]
        p = _probabilities(q, _expand_kv(k, heads), q_positions, kv_positions, slopes)
        return (p @ _expand_kv(v, heads).float()).to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        # the same math as attention_ops.masked_attention_backward, written out again on
        # purpose: the capture records these ops, allocations and frees in this order, as
        # 86a4f47 ran them (the goldens pin it); a shared helper changes when tensors are freed
        q, k, v, q_positions, kv_positions, slopes = ctx.saved_tensors
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
            None,
            None,
            None,
        )


def eager_rope(x: Tensor, positions: Tensor, theta: float) -> Tensor:
    return EagerRope.apply(x, positions, theta)


def eager_masked_attention(q, k, v, q_positions, kv_positions, slopes) -> Tensor:
    return EagerMaskedAttention.apply(q, k, v, q_positions, kv_positions, slopes)
