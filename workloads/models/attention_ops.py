"""Causal attention masked by token positions (ALiBi, context parallelism): one fused kernel.

On a GPU this attention is one fused low-precision kernel each way: FlashAttention-2 takes
ALiBi slopes and applies the causal mask tile by tile (MPT on llm-foundry, BLOOM on
Megatron-DeepSpeed), and context-parallel attention runs flash kernels on the gathered keys.
`position_masked_attention` runs exactly that on CUDA: FlexAttention, compiled, with the
ALiBi term as a score_mod and the position mask as a block mask (bf16 in, fp32 softmax
statistics inside, no score matrix in memory).

Everywhere else (capture under fake tensors on `cpu`, and real CPU runs for loss parity) it
is the custom op pair `prism::masked_attention` / `prism::masked_attention_backward`: the
fake implementation allocates what the flash kernel does (the output and the float32
logsumexp per query row, both saved for backward), so capture prices and sizes the fused
kernel, and the emulator maps the pair to flash attention (prismbench/workload_ops.py). The
CPU implementation is the reference math, written out as the flash backward does it (the
probabilities recomputed from the saved logsumexp) because a custom op's kernel runs below
autograd. FlexAttention is not used on CPU: its backward does not run there in torch 2.13.

Mask: key j is visible to query i when kv_positions[j] <= q_positions[i]; with slopes
(one per local head, float32), the score gets -slope_h * (q_pos - kv_pos) added.
Layout: q [b, h, s_q, d], k/v [b, h_kv, s_kv, d] (GQA when h_kv < h); each output takes the
layout of its input (q for the output and dq, k for dk, v for dv), as FlexAttention lays it out.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import is_fake


def _bias(q_pos: Tensor, kv_pos: Tensor, slopes: Tensor) -> Tensor:
    """Additive score bias [heads or 1, s_q, s_kv] in float32: the ALiBi term and -inf above
    the causal diagonal (by position)."""
    distance = (q_pos[:, None] - kv_pos[None, :]).to(torch.float32)
    bias = -slopes.view(-1, 1, 1) * distance if slopes.numel() else torch.zeros_like(distance)[None]
    return bias.masked_fill(distance < 0, float("-inf"))


def _scores(q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor, slopes: Tensor) -> Tensor:
    scores = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return scores + _bias(q_pos, kv_pos, slopes)


def _expand_kv(t: Tensor, heads: int) -> Tensor:
    return t.repeat_interleave(heads // t.shape[1], dim=1)


def _reduce_kv(grad: Tensor, kv_heads: int) -> Tensor:
    b, h, s, d = grad.shape
    return grad.view(b, kv_heads, h // kv_heads, s, d).sum(dim=2)


def _laid_out_like(t: Tensor, values: Tensor) -> Tensor:
    """`values` in t's dtype and layout: the allocation the fake kernels make (`empty_like`)."""
    return torch.empty_like(t).copy_(values)


@torch.library.custom_op("prism::masked_attention", mutates_args=())
def masked_attention(
    q: Tensor, k: Tensor, v: Tensor, q_positions: Tensor, kv_positions: Tensor, slopes: Tensor
) -> tuple[Tensor, Tensor]:
    """Returns (out [b, h, s_q, d] in q's dtype and layout, logsumexp [b, h, s_q] in float32).

    The output takes q's strides, as FlexAttention's does on CUDA (Inductor's lowering lays it
    out with `infer_dense_strides(size, query.get_stride())`, torch/_inductor/kernel/flex/
    flex_attention.py; `empty_like` gives the same for the dense q the workloads pass): q is a
    transposed [b, s, h, d] projection, so the output is too, and the transpose back to
    [b, s, h * d] before the output projection is a view on the GPU. A contiguous output here
    would make the real CPU run copy where the GPU and the fake kernel do not."""
    heads = q.shape[1]
    scores = _scores(q, _expand_kv(k, heads), q_positions, kv_positions, slopes)
    lse = torch.logsumexp(scores, dim=-1)
    p = torch.exp(scores - lse.unsqueeze(-1))
    return _laid_out_like(q, p @ _expand_kv(v, heads).float()), lse


@masked_attention.register_fake
def _(q, k, v, q_positions, kv_positions, slopes):
    return torch.empty_like(q), q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("prism::masked_attention_backward", mutates_args=())
def masked_attention_backward(
    grad_out: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    q_positions: Tensor,
    kv_positions: Tensor,
    slopes: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    """Returns (dq, dk, dv), each in the dtype and layout of q, k and v: FlexAttention's
    backward lowering lays each gradient out in its input's stride order, as the forward does
    its output (see masked_attention)."""
    heads, kv_heads = q.shape[1], k.shape[1]
    k_full, v_full = _expand_kv(k, heads).float(), _expand_kv(v, heads).float()
    p = torch.exp(_scores(q, k_full, q_positions, kv_positions, slopes) - lse.unsqueeze(-1))
    g = grad_out.float()
    dv = p.transpose(-1, -2) @ g
    dp = g @ v_full.transpose(-1, -2)
    delta = (g * out.float()).sum(dim=-1, keepdim=True)  # flash's D = rowsum(dO * O)
    ds = p * (dp - delta) / math.sqrt(q.shape[-1])
    dq = ds @ k_full
    dk = ds.transpose(-1, -2) @ q.float()
    return (
        _laid_out_like(q, dq),
        _laid_out_like(k, _reduce_kv(dk, kv_heads)),
        _laid_out_like(v, _reduce_kv(dv, kv_heads)),
    )


@masked_attention_backward.register_fake
def _(grad_out, q, k, v, out, lse, q_positions, kv_positions, slopes):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, q_pos, kv_pos, slopes = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, q_pos, kv_pos, slopes)
    ctx.set_materialize_grads(False)  # the logsumexp gets no gradient: no zeros kernel for it


def _backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse, q_pos, kv_pos, slopes = ctx.saved_tensors
    dq, dk, dv = masked_attention_backward(grad_out, q, k, v, out, lse, q_pos, kv_pos, slopes)
    return dq, dk, dv, None, None, None


masked_attention.register_autograd(_backward, setup_context=_setup_context)


@functools.cache
def _compiled_flex_attention():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


# The last block mask built, with the positions tensor it was built from: a forward passes
# one positions tensor to every layer (and recomputation passes it again), so the mask is built
# once per forward, as torchtitan and FlexAttention's documentation do, not once per layer
# (per layer, a real H100 run waited 6-8 ms of host time a layer: results/calibration/README.md).
# One slot: the mask's mask_mod holds the positions, so a cache keyed weakly on them would never
# let go; this one holds one forward's (a few KB) until the next forward's replaces it.
_last_block_mask: list = []


def _block_mask(q_positions: Tensor, kv_positions: Tensor, q_len: int, kv_len: int, compiled):
    """The position mask as a BlockMask, reused while the same positions tensor comes back for
    self-attention (the same tensor for queries and keys); built afresh otherwise."""
    from torch.nn.attention.flex_attention import create_block_mask

    def visible(b, h, q_idx, kv_idx):
        return kv_positions[kv_idx] <= q_positions[q_idx]

    key = (q_len, kv_len, compiled)
    reusable = q_positions is kv_positions
    last = _last_block_mask
    if reusable and last and last[0] is q_positions and last[1] == key:
        return last[2]
    mask = create_block_mask(
        visible, None, None, q_len, kv_len, device=q_positions.device, _compile=compiled
    )
    if reusable:
        last[:] = [q_positions, key, mask]
    return mask


def flex_position_masked_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_positions: Tensor,
    kv_positions: Tensor,
    slopes: Tensor,
    *,
    compiled: bool = True,
) -> Tensor:
    """The same attention as FlexAttention: ALiBi as a score_mod, the position mask as a block
    mask (one per forward, `_block_mask`). Compiled it is one fused kernel each way on CUDA;
    uncompiled it is FlexAttention's reference math (used by the tests to check the two mods
    on CPU)."""
    from torch.nn.attention.flex_attention import flex_attention

    def alibi(score, b, h, q_idx, kv_idx):
        return score - slopes[h] * (q_positions[q_idx] - kv_positions[kv_idx])

    block_mask = _block_mask(q_positions, kv_positions, q.shape[2], k.shape[2], compiled)
    attend = _compiled_flex_attention() if compiled else flex_attention
    return attend(
        q, k, v,
        score_mod=alibi if slopes.numel() else None,
        block_mask=block_mask,
        enable_gqa=k.shape[1] != q.shape[1],
    )  # fmt: skip


def on_real_gpu(t: Tensor) -> bool:
    """True where `t` is a CUDA tensor a GPU kernel will run on (`real`)."""
    return t.is_cuda and real(t)


def real(t: Tensor) -> bool:
    """False for a fake tensor: the capture's CUDA tensors are fake, and choosing a CUDA
    kernel for them asks a GPU that may not be there. Under torch.compile the tensors Dynamo
    traces are fake too, and `is_fake` is a call Dynamo will not trace: a graph break, which in
    a checkpointed block runs the whole block eagerly (results/fidelity/compile_gpu_h200.md);
    compiling means a real run."""
    return torch.compiler.is_compiling() or not is_fake(t)


def position_masked_attention(
    q: Tensor, k: Tensor, v: Tensor, q_positions: Tensor, kv_positions: Tensor, slopes: Tensor
) -> Tensor:
    """Position-masked attention as the GPU runs it: FlexAttention on real CUDA tensors, the
    `prism::masked_attention` op (priced and sized as the flash kernel) everywhere else."""
    if on_real_gpu(q):
        return flex_position_masked_attention(q, k, v, q_positions, kv_positions, slopes)
    return masked_attention(q, k, v, q_positions, kv_positions, slopes)[0]
