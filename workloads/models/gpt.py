"""GPT (GPT-2/3, Megatron, MPT, BLOOM shapes): single-device PyTorch, torchtitan-like names.

Pre-LayerNorm decoder with biases on every linear, a GELU MLP (`w1` up, `w2` down),
learned absolute positions or ALiBi, and optionally tied input/output embeddings.
Parallelism is applied from outside (workloads/parallelize.py) by module name.

Tied embeddings: `output.weight is tok_embeddings.weight` only while one module
holds both. A pipeline split that keeps `tok_embeddings` on the first stage and
`output` on the last leaves two independent parameters that start equal
(`init_weights` seeds both from the name `tok_embeddings.weight`); keeping them
equal during training needs an all-reduce of their gradients between the two
stages, as Megatron does. These models do not do that themselves.

Not modelled: BLOOM's LayerNorm after the word embedding (2 * hidden parameters,
< 0.0001 % of BLOOM-176B), MPT's bias-free linears and LayerNorms (MPT sets
no_bias=True; the biases here add < 0.1 % of its parameters), dropout.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from workloads.config import ModelSpec
from workloads.models.common import CausalAttention
from workloads.models.decoder import DecoderLM, TransformerBlock


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.head_dim = spec.head_dim
        kv_dim = spec.kv_heads * spec.head_dim
        self.wq = nn.Linear(spec.hidden, spec.hidden, bias=True)
        self.wk = nn.Linear(spec.hidden, kv_dim, bias=True)
        self.wv = nn.Linear(spec.hidden, kv_dim, bias=True)
        self.wo = nn.Linear(spec.hidden, spec.hidden, bias=True)
        self.core_attention = CausalAttention(
            alibi=spec.positions == "alibi", total_heads=spec.heads
        )

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, -1, self.head_dim)
        k = self.wk(x).view(b, s, -1, self.head_dim)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        out = self.core_attention(q, k, v, positions)
        return self.wo(out.reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.w1 = nn.Linear(spec.hidden, spec.ffn_hidden, bias=True)
        self.w2 = nn.Linear(spec.ffn_hidden, spec.hidden, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # tanh approximation, as GPT-2/3, Megatron and llm.c use
        return self.w2(F.gelu(self.w1(x), approximate="tanh"))


def _block(spec: ModelSpec) -> TransformerBlock:
    return TransformerBlock(
        nn.LayerNorm(spec.hidden, eps=spec.norm_eps),
        Attention(spec),
        nn.LayerNorm(spec.hidden, eps=spec.norm_eps),
        FeedForward(spec),
    )


class GPT(DecoderLM):
    def __init__(self, spec: ModelSpec, layer_ids: Iterable[int] | None = None) -> None:
        # layer_ids: build only these blocks (a pipeline stage's), keyed by their global index
        super().__init__()
        if spec.family != "gpt":
            raise ValueError(f"GPT needs model.family='gpt', got {spec.family!r} ({spec.name})")
        self.spec = spec
        self.tok_embeddings = nn.Embedding(spec.vocab, spec.hidden)
        self.pos_embeddings: nn.Embedding | None = (
            nn.Embedding(spec.max_seq_len, spec.hidden) if spec.positions == "learned" else None
        )
        ids = range(spec.layers) if layer_ids is None else layer_ids
        self.layers = nn.ModuleDict({str(i): _block(spec) for i in ids})
        self.norm = nn.LayerNorm(spec.hidden, eps=spec.norm_eps)
        self.output = nn.Linear(spec.hidden, spec.vocab, bias=False)
        self._tie_embeddings()

    def embed(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        if self.pos_embeddings is not None:
            h = h + self.pos_embeddings(positions)
        return h
