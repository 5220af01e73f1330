"""The single-device models: `GPT` and `Llama`, and `build_model(spec)` choosing by family."""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn

from workloads.config import ModelSpec
from workloads.models.gpt import GPT
from workloads.models.llama import Llama

MODELS_BY_FAMILY: dict[str, type[nn.Module]] = {"gpt": GPT, "llama": Llama}


def build_model(spec: ModelSpec, layer_ids: Iterable[int] | None = None) -> GPT | Llama:
    """Construct the model for `spec` on the current default device (use `with torch.device(d)`);
    `layer_ids`: only these transformer blocks (a pipeline stage's), None for all."""
    return MODELS_BY_FAMILY[spec.family](spec, layer_ids)


__all__ = ["GPT", "Llama", "MODELS_BY_FAMILY", "build_model"]
