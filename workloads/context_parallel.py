"""Context parallelism over the mesh's "cp" dim: Llama 3's all-gather attention.

torch's `torch.distributed.tensor.experimental.context_parallel` is not used: it
shards SDPA by intercepting the CUDA flash / efficient / cuDNN attention ops, and
the CPU build dispatches SDPA to `_scaled_dot_product_flash_attention_for_cpu`,
which it does not handle. Instead, as the Llama 3 paper (Dubey et al. 2024, 3.3.2)
describes: the sequence is cut into 2 * cp chunks and cp rank i holds chunks i and
2 * cp - 1 - i (so every rank has the same amount of causal work); each block's
`attention.core_attention` is replaced by `AllGatherAttention`, which all-gathers K
and V over the cp group with an autograd-aware functional collective (backward is
a reduce-scatter of dK/dV) and attends the local queries to all keys with a mask
built from absolute positions (causal, plus the ALiBi bias for ALiBi models).
Rule: seq_len % (2 * cp) == 0.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed import _functional_collectives as funcol

from workloads.models.attention_ops import position_masked_attention
from workloads.models.common import alibi_slopes
from workloads.models.eager_ops import eager_masked_attention

# torch 2.13 renamed it (the old name warns); torch 2.11 has only the old one.
_all_gather_autograd = getattr(funcol, "all_gather_single_autograd", None) or (
    funcol.all_gather_tensor_autograd
)


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
            slopes = alibi_slopes(self.total_heads)[
                self.head_offset : self.head_offset + q.shape[1]
            ]
            slopes = torch.tensor(slopes, dtype=torch.float32, device=q.device)
        else:
            slopes = torch.empty(0, dtype=torch.float32, device=q.device)
        attend = eager_masked_attention if self.eager else position_masked_attention
        out = attend(q, k, v, positions, k_pos, slopes)
        return out.transpose(1, 2)


def apply_context_parallel(model: nn.Module, cp_mesh) -> None:
    """Replace every block's core attention by the all-gather one (no-op when cp == 1)."""
    cp = cp_mesh.size()
    if cp == 1:
        return
    group = cp_mesh.get_group()
    for block in model.layers.values():
        old = block.attention.core_attention
        block.attention.core_attention = AllGatherAttention(
            group=group,
            cp=cp,
            alibi=old.alibi,
            total_heads=old.total_heads,
            head_offset=old.head_offset,
            eager=old.eager,
        )
