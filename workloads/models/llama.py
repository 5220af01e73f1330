"""Llama 2/3 (RoPE, SwiGLU, RMSNorm, grouped-query attention): single-device PyTorch.

Module names follow torchtitan's Llama (`attention.wq/wk/wv/wo`, `feed_forward.w1/w2/w3`,
`attention_norm`, `ffn_norm`, `norm`, `output`) so its tensor-parallel plans apply.
RoPE angles are computed in forward from `positions` (no buffers, so building on
`meta` and `to_empty` loses nothing). Not modelled: Llama 3.1's RoPE frequency
scaling for long context (it changes no shape and no cost).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from workloads.config import ModelSpec
from workloads.models.common import CausalAttention, rope_rotate
from workloads.models.decoder import DecoderLM, TransformerBlock
from workloads.models.norms import RMSNorm


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.head_dim = spec.head_dim
        self.rope_theta = spec.rope_theta
        kv_dim = spec.kv_heads * spec.head_dim
        self.wq = nn.Linear(spec.hidden, spec.hidden, bias=False)
        self.wk = nn.Linear(spec.hidden, kv_dim, bias=False)
        self.wv = nn.Linear(spec.hidden, kv_dim, bias=False)
        self.wo = nn.Linear(spec.hidden, spec.hidden, bias=False)
        self.core_attention = CausalAttention(alibi=False, total_heads=spec.heads)
        self.eager_rope = False  # `kernels.custom_ops = "eager"` (workloads.parallelize)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, -1, self.head_dim)
        k = self.wk(x).view(b, s, -1, self.head_dim)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        q = rope_rotate(q, positions, self.rope_theta, eager=self.eager_rope)
        k = rope_rotate(k, positions, self.rope_theta, eager=self.eager_rope)
        out = self.core_attention(q, k, v, positions)
        return self.wo(out.reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.w1 = nn.Linear(spec.hidden, spec.ffn_hidden, bias=False)
        self.w2 = nn.Linear(spec.ffn_hidden, spec.hidden, bias=False)
        self.w3 = nn.Linear(spec.hidden, spec.ffn_hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def _block(spec: ModelSpec) -> TransformerBlock:
    return TransformerBlock(
        RMSNorm(spec.hidden, eps=spec.norm_eps),
        Attention(spec),
        RMSNorm(spec.hidden, eps=spec.norm_eps),
        FeedForward(spec),
    )


class Llama(DecoderLM):
    def __init__(self, spec: ModelSpec, layer_ids: Iterable[int] | None = None) -> None:
        # layer_ids: build only these blocks (a pipeline stage's), keyed by their global index
        super().__init__()
        if spec.family != "llama":
            raise ValueError(f"Llama needs model.family='llama', got {spec.family!r} ({spec.name})")
        self.spec = spec
        self.tok_embeddings = nn.Embedding(spec.vocab, spec.hidden)
        ids = range(spec.layers) if layer_ids is None else layer_ids
        self.layers = nn.ModuleDict({str(i): _block(spec) for i in ids})
        self.norm = RMSNorm(spec.hidden, eps=spec.norm_eps)
        self.output = nn.Linear(spec.hidden, spec.vocab, bias=False)
        self._tie_embeddings()
