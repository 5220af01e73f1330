"""Context parallelism over the mesh's "cp" dim: Llama 3's all-gather attention, or torch's ring.

The sequence is cut into 2 * cp chunks and cp rank i holds chunks i and 2 * cp - 1 - i (so
every rank has the same amount of causal work); each block's `attention.core_attention` is
replaced by one of two programs (`kernels.cp_attention`):

- `AllGatherAttention` ("all-gather"), as the Llama 3 paper (Dubey et al. 2024, 3.3.2)
  describes: K and V all-gathered over the cp group with an autograd-aware functional
  collective (backward: a reduce-scatter of dK/dV), the local queries attended to all keys
  with a mask built from absolute positions (causal, plus the ALiBi bias for ALiBi models):
  one fused kernel each way.
- `RingAttention` ("ring"): torch's ring attention, the program of
  `torch.distributed.tensor.experimental.context_parallel` as torchtitan's Dec 2024 runs ran it
  (torch 1963fc8, torchtitan 9dec370: `_templated_ring_attention` and its backward in
  torch/distributed/tensor/experimental/_attention.py, load balancing on, float32 merging,
  torchtitan's default `context_parallel_rotate_method = "allgather"`; read there, written
  here). K and V, repeated to every query head as torchtitan's `repeat_kv` does before SDPA,
  are concatenated and all-gathered once; then cp flash-attention calls: step 0 the local
  queries against the local keys, causal; step i the queries against rank (r - i)'s keys,
  without a mask, on half of one side (all queries against the first key chunk when i <= r,
  the second query chunk against all keys otherwise). Each step's output and logsumexp are
  merged into running float32 ones (out -= sigmoid(lse_i - lse) * (out - out_i); lse -=
  logsigmoid(lse - lse_i)), a half merge rebuilt with `torch.cat`. Backward runs the flash
  backward per step with the merged output and logsumexp, all-gathers K and V again,
  accumulates dQ, dK, dV in float32 and passes dK/dV on around the ring with an all-to-all
  permutation each step (torch's `permute_tensor`). torch does not run it on CPU (it intercepts
  the CUDA attention ops); this is the same algorithm over the CPU flash op, the same shapes
  and collectives, so that capture records what the GPU runs. It takes no attention bias, as
  torch's does not: ALiBi models run "all-gather".

Rule: seq_len % (2 * cp) == 0.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed import _functional_collectives as funcol

from workloads.models.attention_ops import position_masked_attention
from workloads.models.common import local_alibi_slopes
from workloads.models.eager_ops import eager_masked_attention

# torch 2.13 renamed it (the old name warns); torch 2.11 has only the old one.
_all_gather_autograd = getattr(funcol, "all_gather_single_autograd", None) or (
    funcol.all_gather_tensor_autograd
)
_all_gather = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor


def chunk_positions(seq_len: int, cp_rank: int, cp: int, device=None) -> torch.Tensor:
    """Absolute positions of the two load-balanced chunks cp rank `cp_rank` holds."""
    if seq_len % (2 * cp):
        raise ValueError(f"seq_len({seq_len}) must be a multiple of 2 * cp({2 * cp})")
    chunk = seq_len // (2 * cp)
    first = torch.arange(cp_rank * chunk, (cp_rank + 1) * chunk, device=device)
    second_index = 2 * cp - 1 - cp_rank
    second = torch.arange(second_index * chunk, (second_index + 1) * chunk, device=device)
    return torch.cat((first, second))


def shard_sequence(x: torch.Tensor, cp_rank: int, cp: int) -> torch.Tensor:
    """The cp rank's two chunks of x [b, s, ...] along dim 1 (identity when cp == 1)."""
    if cp == 1:
        return x
    chunks = x.chunk(2 * cp, dim=1)
    return torch.cat((chunks[cp_rank], chunks[2 * cp - 1 - cp_rank]), dim=1)


class AllGatherAttention(nn.Module):
    """Causal attention of local queries against the K/V of every cp rank.

    Called as core_attention(q, k, v, positions) with the rank's own positions;
    key positions are those of all cp ranks in rank order (the all-gather order),
    computed locally. `alibi`, `total_heads`, `head_offset` and `eager` mirror the replaced
    module's (tensor parallelism may set head_offset afterwards).
    """

    def __init__(
        self, *, group, cp: int, alibi: bool, total_heads: int, head_offset: int, eager: bool
    ) -> None:
        super().__init__()
        self.group = group
        self.cp = cp
        self.alibi = alibi
        self.total_heads = total_heads
        self.head_offset = head_offset
        self.eager = eager

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        k = _all_gather_autograd(k.contiguous(), gather_dim=1, group=self.group)
        v = _all_gather_autograd(v.contiguous(), gather_dim=1, group=self.group)
        seq_len = positions.shape[0] * self.cp
        k_pos = torch.cat(
            [chunk_positions(seq_len, r, self.cp, positions.device) for r in range(self.cp)]
        )
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # -> [b, h, s, d]
        if self.alibi:
            slopes = local_alibi_slopes(self.total_heads, self.head_offset, q.shape[1], q.device)
        else:
            slopes = torch.empty(0, dtype=torch.float32, device=q.device)
        attend = eager_masked_attention if self.eager else position_masked_attention
        out = attend(q, k, v, positions, k_pos, slopes)
        return out.transpose(1, 2)


def _wait(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.wait() if isinstance(tensor, funcol.AsyncCollectiveTensor) else tensor


def _flash(q, k, v, causal: bool) -> tuple[torch.Tensor, torch.Tensor, tuple]:
    """(out, float32 logsumexp [b, h, s], the rest of the op's outputs) of one flash-attention
    call: the CUDA kernel torch's ring calls on a GPU, its CPU counterpart elsewhere (capture,
    CPU runs), which returns nothing more."""
    if q.is_cuda:
        out, lse, *rest = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal)
        return out, lse, tuple(rest[:6])  # sequence offsets, max lengths, RNG seed and offset
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal)
    return out, lse, ()


def _flash_backward(grad_out, q, k, v, out, lse, causal: bool, rest: tuple):
    """(dq, dk, dv) of a `_flash` call; on CUDA `rest` is what the forward's last call returned
    beyond out and logsumexp (torch's ring passes the same to every backward step)."""
    if q.is_cuda:
        cum_q, cum_k, _, _, seed, offset = rest
        return torch.ops.aten._scaled_dot_product_flash_attention_backward(
            grad_out, q, k, v, out, lse, cum_q, cum_k, q.shape[2], k.shape[2], 0.0, causal,
            seed, offset,
        )  # fmt: skip
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad_out, q, k, v, out, lse, 0.0, causal
    )


def _replace_half(full: torch.Tensor, half: torch.Tensor, index: int, add: bool) -> torch.Tensor:
    """`full` with its `index`-th half along the sequence (dim 2) replaced by (or, with `add`,
    increased by) `half`, rebuilt with `torch.cat` as torch's `_partial_update` does."""
    chunks = list(full.chunk(2, dim=2))
    if add:
        chunks[index] += half
    else:
        chunks[index] = half
    return torch.cat(chunks, dim=2)


def _step_inputs(step: int, rank: int, q, k, v):
    """(q, k, v, causal, partial) of ring step `step` on cp rank `rank` (module docstring)."""
    if step == 0:
        return q, k, v, True, False
    if step <= rank:
        return q, k.chunk(2, dim=2)[0], v.chunk(2, dim=2)[0], False, False
    return q.chunk(2, dim=2)[1], k, v, False, True


def _kv_of(buffer: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return buffer[: k.numel()].view(k.shape), buffer[k.numel() :].view(k.shape)


def _ring_kv(k: torch.Tensor, v: torch.Tensor, group, *, keep_sent: bool):
    """(step, K, V of cp rank (r - step), the kept concatenation) for each ring step, as torch's
    all-gather rotation gives them: the local K and V concatenated and all-gathered at step 0,
    waited for at step 1 (so the gather overlaps step 0's kernel). torch concatenates the step's
    K and V to send on every step but the last; with this rotation only the first is sent, the
    others are made anyway. Its forward drops each concatenation at once (`exchange_buffers`
    returns None into the same name); its backward keeps each until the next and the last to
    its end (`keep_sent`: the caller's loop variable holds it)."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    gathered = buffers = sent = None
    for step in range(size):
        if step > 0:
            if buffers is None:  # waited for only now, after step 0's kernel (`next_buffer`)
                buffers = list(_wait(gathered).chunk(size))
            k, v = _kv_of(buffers[(rank - step) % size], k)
        if step < size - 1:
            sent = torch.cat([k.flatten(), v.flatten()])
            if gathered is None:
                gathered = _all_gather(sent, 0, group)
            if not keep_sent:
                sent = None
        yield step, k, v, sent


class _RingFlashAttention(torch.autograd.Function):
    """torch's `_templated_ring_attention` (forward) and its backward, over [b, h, s, d]."""

    @staticmethod
    def forward(ctx, q, k, v, group):
        rank = dist.get_rank(group)
        k, v = k.contiguous(), v.contiguous()
        out = lse = None
        for step, k_i, v_i, _ in _ring_kv(k, v, group, keep_sent=False):
            q_s, k_s, v_s, causal, partial = _step_inputs(step, rank, q, k_i, v_i)
            block_out, block_lse, rest = _flash(q_s, k_s, v_s, causal)
            block_out, block_lse = block_out.float(), block_lse.float().unsqueeze(-1)
            if out is None:
                out, lse = block_out, block_lse
                continue
            run_out = out.chunk(2, dim=2)[1] if partial else out
            run_lse = lse.chunk(2, dim=2)[1] if partial else lse
            run_out = run_out - F.sigmoid(block_lse - run_lse) * (run_out - block_out)
            run_lse = run_lse - F.logsigmoid(run_lse - block_lse)
            if partial:
                lse = _replace_half(lse, run_lse, 1, add=False)
                out = _replace_half(out, run_out, 1, add=False)
            else:
                out, lse = run_out, run_lse
        out, lse = out.to(q.dtype), lse.squeeze(-1)
        ctx.group, ctx.rest = group, rest
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        group = ctx.group
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        grad_q = torch.zeros_like(q, dtype=torch.float32)
        grad_k = torch.zeros_like(k, dtype=torch.float32)
        grad_v = torch.zeros_like(v, dtype=torch.float32)
        to_next = list(range(1, size)) + [0]
        grad_kv = None
        for step, k_i, v_i, _sent in _ring_kv(k, v, group, keep_sent=True):
            q_s, k_s, v_s, causal, partial = _step_inputs(step, rank, q, k_i, v_i)
            if partial:
                out_s, dout_s = out.chunk(2, dim=2)[1], grad_out.chunk(2, dim=2)[1]
                lse_s = lse.chunk(2, dim=2)[1].contiguous()
            else:
                out_s, dout_s, lse_s = out, grad_out, lse
            dq, dk, dv = _flash_backward(dout_s, q_s, k_s, v_s, out_s, lse_s, causal, ctx.rest)
            if step > 0:
                # the dK/dV accumulated so far for the keys this step used, from the last rank
                grad_k, grad_v = _kv_of(_wait(grad_kv), grad_k)
                if step <= rank:
                    grad_k = _replace_half(grad_k, dk, 0, add=True)
                    grad_v = _replace_half(grad_v, dv, 0, add=True)
                else:
                    grad_k += dk
                    grad_v += dv
            else:
                grad_k += dk
                grad_v += dv
            sent_grads = torch.cat([grad_k.flatten(), grad_v.flatten()])
            grad_kv = funcol.permute_tensor(sent_grads, to_next, group)
            if step <= rank:
                grad_q += dq
            else:
                grad_q = _replace_half(grad_q, dq, 1, add=True)
        grad_k, grad_v = _kv_of(_wait(grad_kv).to(k.dtype), k)
        return grad_q.to(q.dtype), grad_k, grad_v, None


class RingAttention(nn.Module):
    """torch's ring attention over the cp group (module docstring); called as
    core_attention(q, k, v, positions) with q [b, s, h, d], k/v [b, s, h_kv, d]."""

    def __init__(self, *, group) -> None:
        super().__init__()
        self.group = group

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        repeats = q.shape[2] // k.shape[2]
        if repeats > 1:  # torchtitan's repeat_kv: expand, then a copy
            b, s, h_kv, d = k.shape
            k, v = (t.unsqueeze(3).expand(b, s, h_kv, repeats, d).reshape(b, s, h_kv * repeats, d)
                    for t in (k, v))  # fmt: skip
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # -> [b, h, s, d]
        out = _RingFlashAttention.apply(q, k, v, self.group)
        return out.transpose(1, 2)


def apply_context_parallel(model: nn.Module, cp_mesh, *, method: str = "all-gather") -> None:
    """Replace every block's core attention by the context-parallel one of `method`
    (`kernels.cp_attention`; no-op when cp == 1)."""
    cp = cp_mesh.size()
    if cp == 1:
        return
    group = cp_mesh.get_group()
    for block in model.layers.values():
        old = block.attention.core_attention
        if method == "ring":
            if old.alibi or old.unfused:
                raise ValueError("ring attention takes no attention bias and no unfused kernel")
            block.attention.core_attention = RingAttention(group=group)
            continue
        block.attention.core_attention = AllGatherAttention(
            group=group,
            cp=cp,
            alibi=old.alibi,
            total_heads=old.total_heads,
            head_offset=old.head_offset,
            eager=old.eager,
        )
