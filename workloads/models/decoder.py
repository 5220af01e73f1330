"""The decoder skeleton GPT and Llama share: the pre-norm block and the model's plumbing.

`TransformerBlock` is the residual pre-norm block with torchtitan's child names
(`attention_norm`, `attention`, `ffn_norm`, `feed_forward`), which the tensor-parallel
plans and the recompute and compile wrappers address. `DecoderLM` holds what is the same
in both models around their own modules: tying the output to the input embedding, keeping
it tied through `to_empty`, the forward over whatever pieces this pipeline stage kept
(`tok_embeddings`, `norm` and `output` may be None), and the per-name seeded init.
A model sets its modules in `__init__` (their order is the parameter order) and says how
tokens become hidden states in `embed`.
"""

from __future__ import annotations

import torch
from torch import nn

from workloads.config import ModelSpec
from workloads.models.common import default_positions, init_parameter


class TransformerBlock(nn.Module):
    def __init__(
        self,
        attention_norm: nn.Module,
        attention: nn.Module,
        ffn_norm: nn.Module,
        feed_forward: nn.Module,
    ) -> None:
        super().__init__()
        self.attention_norm = attention_norm
        self.attention = attention
        self.ffn_norm = ffn_norm
        self.feed_forward = feed_forward

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), positions)
        return x + self.feed_forward(self.ffn_norm(x))


class DecoderLM(nn.Module):
    spec: ModelSpec
    tok_embeddings: nn.Embedding | None
    layers: nn.ModuleDict
    norm: nn.Module | None
    output: nn.Linear | None

    def embed(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.tok_embeddings(tokens)

    def _tie_embeddings(self) -> None:
        if self.spec.tie_embeddings and self.tok_embeddings is not None and self.output is not None:
            self.output.weight = self.tok_embeddings.weight

    def to_empty(self, *, device, recurse: bool = True):
        # Module.to_empty makes a new parameter per module, which unties shared weights.
        super().to_empty(device=device, recurse=recurse)
        self._tie_embeddings()
        return self

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        # x: token ids where this stage holds `tok_embeddings`, else the previous stage's
        # hidden states; the result is logits where it holds `output`, else hidden states
        positions = default_positions(x, positions)
        h = self.embed(x, positions) if self.tok_embeddings is not None else x
        for layer in self.layers.values():
            h = layer(h, positions)
        if self.norm is not None:
            h = self.norm(h)
        if self.output is not None:
            h = self.output(h)
        return h

    def init_weights(self, seed: int | None = None) -> None:
        """Reinitialise every parameter; with a seed, each one from (seed, its name)."""
        for fqn, param in self.named_parameters():
            if self.spec.tie_embeddings and fqn == "output.weight":
                fqn = "tok_embeddings.weight"
            init_parameter(fqn, param, seed)
