"""Pieces shared by the GPT and Llama modules: position encodings, causal core attention, init.

Everything here is stateless apart from `head_offset` and the kernel choices (`unfused`,
`dropout`, `eager`), so it survives building on
`meta` followed by `to_empty(...)` (no buffers), fake tensors and DTensor sharding
of the surrounding linears (local head counts come from tensor shapes).
"""

from __future__ import annotations

import math
import zlib

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from workloads.models.attention_ops import on_real_gpu, position_masked_attention
from workloads.models.eager_ops import eager_masked_attention, eager_rope
from workloads.models.rope_ops import rope
from workloads.models.unfused_attention import unfused_attention

INIT_STD = 0.02  # GPT-2 / Megatron / torchtitan default normal init


def rope_rotate(
    x: torch.Tensor, positions: torch.Tensor, theta: float, *, eager: bool = False
) -> torch.Tensor:
    """Rotate pairs (2i, 2i+1) of the last dim of x [b, s, h, d] by positions * theta^(-2i/d).

    Meta's Llama layout (interleaved pairs, as its complex-number view does), computed
    in float32 from `positions` so context-parallel chunks get their absolute angles; one
    fused op (`prism::rope`, see rope_ops.py), as Megatron-core's fused RoPE kernel runs it,
    or with `eager` its reference math as eager kernels (eager_ops.py, `kernels.custom_ops`).
    """
    if eager:
        return eager_rope(x, positions, float(theta))
    return rope(x, positions, float(theta), False)


def alibi_slopes(heads: int) -> list[float]:
    """ALiBi head slopes of Press et al. 2022 (their reference code, any head count).

    For n a power of two the slopes are 2^(-8/n), 2^(-16/n), ...; otherwise the n'
    = 2^floor(log2 n) slopes are followed by every other slope of the 2n' sequence.
    """

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if heads & (heads - 1) == 0:
        return power_of_two(heads)
    lower = 2 ** math.floor(math.log2(heads))
    return power_of_two(lower) + power_of_two(2 * lower)[0::2][: heads - lower]


def local_alibi_slopes(total_heads: int, head_offset: int, local_heads: int, device) -> torch.Tensor:
    """`alibi_slopes(total_heads)[head_offset : head_offset + local_heads]` as a float32 tensor
    made on `device` (linspace and exp2 kernels), not copied from the host: a copy from the
    host's pageable memory makes the host wait for the GPU's queue, which an H200 profile of the
    MPT job showed in every layer, 4.6-5.5 ms each (results/calibration/README.md); llm-foundry
    builds its ALiBi bias on the device too (`gen_slopes`). Head h's slope is 2^e with e linear
    in h on each of `alibi_slopes`' two runs: -8 (h + 1) / n' below n' = 2^floor(log2 n), then
    -8 (h - n') / n' - 4 / n' (every other slope of the 2n' sequence)."""
    if head_offset < 0 or head_offset + local_heads > total_heads:
        raise ValueError(
            f"head_offset({head_offset}) + local heads({local_heads}) exceeds model heads "
            f"({total_heads})"
        )
    lower = 2 ** math.floor(math.log2(total_heads))

    def exponent(h: int) -> float:
        return -8.0 * (h + 1) / lower if h < lower else -8.0 * (h - lower) / lower - 4.0 / lower

    end = head_offset + local_heads
    runs = [(head_offset, min(end, lower)), (max(head_offset, lower), end)]
    pieces = [
        torch.linspace(exponent(first), exponent(last - 1), last - first, device=device)
        for first, last in runs
        if first < last
    ]
    if len(pieces) < 2:
        return torch.exp2(pieces[0] if pieces else torch.empty(0, device=device))
    return torch.exp2(torch.cat(pieces))


class CausalAttention(nn.Module):
    """Causal SDPA over q [b, s, h, d], k/v [b, s_kv, h_kv, d] (GQA when h_kv < h).

    The causal mask follows sequence order (`is_causal=True`, the flash path), not
    `positions`: a context-parallel attention that holds non-contiguous chunks must
    replace this module. With `alibi=True` attention is `position_masked_attention` (one
    fused kernel on a GPU, see attention_ops.py): bias = -slope_h * (q_pos - k_pos), and
    masked where k_pos > q_pos. `head_offset` is the global index of the first local
    head; tensor parallelism sets it to tp_rank * local_heads. `unfused` (set by
    `workloads.parallelize.set_kernels`, `kernels.attention = "unfused"`) runs
    Megatron's attention with the score matrix in memory instead (unfused_attention.py),
    with attention dropout of probability `dropout`; `eager` (`kernels.custom_ops = "eager"`)
    runs the ALiBi attention as eager float32 math (eager_ops.py). `flash_only`
    (`kernels.attention = "flash2"`) makes SDPA run its FlashAttention-2 backend on a GPU,
    the kernel that setting prices; otherwise torch picks (cuDNN on an H100 with torch 2.11).
    """

    def __init__(self, *, alibi: bool, total_heads: int) -> None:
        super().__init__()
        self.alibi = alibi
        self.total_heads = total_heads
        self.head_offset = 0
        self.unfused = False
        self.dropout = 0.0
        self.eager = False
        self.flash_only = False

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # -> [b, h, s, d]
        gqa = k.shape[1] != q.shape[1]
        if self.unfused:
            slopes = self.local_slopes(q.shape[1], q.device) if self.alibi else None
            out = unfused_attention(q, k, v, alibi_slopes=slopes, dropout=self.dropout)
        elif self.alibi:
            slopes = self.local_slopes(q.shape[1], q.device)
            attend = eager_masked_attention if self.eager else position_masked_attention
            out = attend(q, k, v, positions, positions, slopes)
        elif self.flash_only and on_real_gpu(q):
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        return out.transpose(1, 2)

    def local_slopes(self, local_heads: int, device) -> torch.Tensor:
        """ALiBi slopes of this rank's heads (float32), from `head_offset` on."""
        return local_alibi_slopes(self.total_heads, self.head_offset, local_heads, device)


def default_positions(x: torch.Tensor, positions: torch.Tensor | None) -> torch.Tensor:
    if positions is not None:
        return positions
    return torch.arange(x.shape[1], device=x.device)


def param_seed(seed: int, fqn: str) -> int:
    """A per-parameter seed from the model seed and the parameter's name.

    Seeding by fully qualified name makes a pipeline-split model (global layer keys)
    initialise each parameter exactly as the whole model does.
    """
    return (seed * 1_000_003 + zlib.crc32(fqn.encode())) % (2**63)


def init_parameter(fqn: str, param: torch.Tensor, seed: int | None) -> None:
    """std-0.02 normal for weights and embeddings, zeros for biases, ones for norm weights."""
    with torch.random.fork_rng(enabled=seed is not None):
        if seed is not None:
            torch.manual_seed(param_seed(seed, fqn))
        name = fqn.rsplit(".", 1)[-1]
        owner = fqn.rsplit(".", 2)[-2] if "." in fqn else ""
        with torch.no_grad():
            if name == "bias":
                param.zero_()
            elif owner.endswith("norm"):
                param.fill_(1.0)
            else:
                nn.init.normal_(param, mean=0.0, std=INIT_STD)
