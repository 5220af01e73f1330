"""The single-device models: `GPT` and `Llama`, and `build_model(spec)` choosing by family."""

from __future__ import annotations

from torch import nn

from workloads.config import ModelSpec
from workloads.models.gpt import GPT
from workloads.models.llama import Llama

MODELS_BY_FAMILY: dict[str, type[nn.Module]] = {"gpt": GPT, "llama": Llama}


def build_model(spec: ModelSpec) -> GPT | Llama:
    """Construct the model for `spec` on the current default device (use `with torch.device(d)`)."""
    return MODELS_BY_FAMILY[spec.family](spec)


__all__ = ["GPT", "Llama", "MODELS_BY_FAMILY", "build_model"]
