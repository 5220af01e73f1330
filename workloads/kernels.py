"""Which kernels the job runs: a production framework's choices, one field per choice.

The emulator predicts the program it captures, so the program must run what the framework
behind a measurement runs. `[kernels] framework = "megatron"` picks that framework's
choices; any field given next to it overrides the framework's value. Each choice is
implemented for real by the workloads (loss-parity tests cover every value).

Frameworks (the values each one selects are in the `*_BY_FRAMEWORK` tables below, with
the source of each):
- `prism-86a4f47`: the workloads as they were when the shared H100 profiles were taken
  (commit 86a4f47); keeps those profiles comparable. The default.
- `megatron`: Megatron-LM / Megatron-DeepSpeed.
- `nemo`: NVIDIA NeMo (Megatron-core with Transformer Engine).
- `llm-foundry`: MosaicML llm-foundry (Composer).
- `torchtitan`: PyTorch torchtitan.
- `llm.c`: Karpathy's llm.c.

Fields:
- `loss`: how the cross-entropy runs.
- `norm`: which norm kernels run.
- `vocab_multiple`: the embedding and output layer are padded to a multiple of this many
  rows (1: no padding).
- `fp8_recipe`: torchao float8 scaling recipe for `train.precision = "fp8"`.
- `fp8_casts`: whether the amax/scale/cast work around each fp8 GEMM runs as separate
  kernels or fused into its neighbours (torch.compile, Transformer Engine).
- `pipeline_recv`: the pipeline's receive buffers. "per-microbatch": torch.distributed.
  pipelining, whose stages allocate a receive buffer per micro-batch at setup and keep it;
  "per-transfer": Megatron's 1F1B (`workloads.megatron_schedule`), a buffer allocated by
  each receive and freed once consumed; it runs schedule "1f1b" only, and any number of
  micro-batches (fewer than pp included).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from workloads.config import SpecError

FRAMEWORKS = ("prism-86a4f47", "megatron", "nemo", "llm-foundry", "torchtitan", "llm.c")

LOSSES = ("unfused-fp32",)
NORMS = ("torch",)
FP8_RECIPES = ("tensorwise",)
FP8_CASTS = ("unfused",)
PIPELINE_RECVS = ("per-microbatch", "per-transfer")


def _same_for_all(value: Any) -> dict[str, Any]:
    return {framework: value for framework in FRAMEWORKS}


# One table per field: the framework's choice for it.
LOSS_BY_FRAMEWORK: dict[str, str] = _same_for_all("unfused-fp32")
NORM_BY_FRAMEWORK: dict[str, str] = _same_for_all("torch")
VOCAB_MULTIPLE_BY_FRAMEWORK: dict[str, int] = _same_for_all(1)
FP8_RECIPE_BY_FRAMEWORK: dict[str, str] = _same_for_all("tensorwise")
FP8_CASTS_BY_FRAMEWORK: dict[str, str] = _same_for_all("unfused")
PIPELINE_RECV_BY_FRAMEWORK: dict[str, str] = {
    **_same_for_all("per-microbatch"),
    # Megatron-core allocates each receive in p2p_communication.py (`_communicate`:
    # torch.empty per recv_prev/recv_next) and runs schedules.py's
    # forward_backward_pipelining_without_interleaving; NeMo trains through Megatron-core's
    # schedules (nemo/collections/nlp/models/language_modeling/megatron_gpt_model.py,
    # get_forward_backward_func)
    "megatron": "per-transfer",
    "nemo": "per-transfer",
    # torchtitan pipelines with torch.distributed.pipelining (torchtitan/distributed/
    # pipeline_parallel.py builds PipelineStage and torch's schedules).
    # llm-foundry (Composer FSDP) and llm.c (data parallel only) have no pipeline
    # parallelism, so the value is moot for them: torch's, the prism-86a4f47 one.
}

CHOICES: dict[str, tuple[tuple, dict[str, Any]]] = {
    "loss": (LOSSES, LOSS_BY_FRAMEWORK),
    "norm": (NORMS, NORM_BY_FRAMEWORK),
    "fp8_recipe": (FP8_RECIPES, FP8_RECIPE_BY_FRAMEWORK),
    "fp8_casts": (FP8_CASTS, FP8_CASTS_BY_FRAMEWORK),
    "pipeline_recv": (PIPELINE_RECVS, PIPELINE_RECV_BY_FRAMEWORK),
}


@dataclass(frozen=True, kw_only=True)
class KernelsSpec:
    """The framework whose kernels the job runs; a field left as None takes its choice."""

    framework: str = "prism-86a4f47"
    loss: str | None = None
    norm: str | None = None
    vocab_multiple: int | None = None
    fp8_recipe: str | None = None
    fp8_casts: str | None = None
    pipeline_recv: str | None = None

    def __post_init__(self) -> None:
        if self.framework not in FRAMEWORKS:
            raise SpecError(
                f"kernels.framework={self.framework!r} must be one of {list(FRAMEWORKS)}"
            )
        for name, (allowed, by_framework) in CHOICES.items():
            value = getattr(self, name)
            if value is None:
                object.__setattr__(self, name, by_framework[self.framework])
            elif value not in allowed:
                raise SpecError(f"kernels.{name}={value!r} must be one of {list(allowed)}")
        if self.vocab_multiple is None:
            object.__setattr__(self, "vocab_multiple", VOCAB_MULTIPLE_BY_FRAMEWORK[self.framework])
        value = self.vocab_multiple
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise SpecError(f"kernels.vocab_multiple={value!r} must be a positive integer")

    def overrides(self) -> dict[str, Any]:
        """The fields that differ from the framework's own choices."""
        preset = KernelsSpec(framework=self.framework)
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name != "framework" and getattr(self, f.name) != getattr(preset, f.name)
        }


def padded_vocab(vocab: int, multiple: int) -> int:
    """The vocabulary rounded up to a multiple of `multiple` (Megatron's
    make-vocab-size-divisible-by; llm.c pads GPT-2's 50 257 to 50 304)."""
    return -(-vocab // multiple) * multiple
