"""Model dimensions (`ModelSpec`) and the rule that splits layers over pipeline stages.

`ModelSpec` is the single description of a model's shape: the flavor registry
holds named ones, the job spec builds one from TOML, and the GPT/Llama modules
are constructed from it. It imports nothing but the standard library.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

FAMILIES = ("gpt", "llama")
SINGLE_STAGE_SCHEDULES = ("1f1b", "gpipe")
MULTI_STAGE_SCHEDULES = ("interleaved-1f1b", "zero-bubble")
POSITIONS_BY_FAMILY = {"gpt": ("learned", "alibi"), "llama": ("rope",)}


class SpecError(ValueError):
    """An invalid specification: the message names the field and the rule."""


# TOML's booleans are Python's, and bool is a subclass of int: every check of a number refuses
# them by name
def check_positive_ints(section: str, obj: Any, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise SpecError(f"{section}.{name}={value!r} must be a positive integer")


def is_finite_number(value: Any) -> bool:
    """A finite int or float, not a bool (TOML's and JSON's true is Python's: an int)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def check_positive_number(section: str, name: str, value: Any) -> None:
    if not is_finite_number(value) or value <= 0:
        raise SpecError(f"{section}.{name}={value!r} must be a positive finite number")


def check_flag(section: str, name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise SpecError(f"{section}.{name}={value!r} must be a boolean (true or false)")


def check_choice(section: str, name: str, value: Any, choices: tuple) -> None:
    # `in` compares by ==, and True == 1 == 1.0: a choice must match in type as well
    if not any(type(value) is type(choice) and value == choice for choice in choices):
        raise SpecError(f"{section}.{name}={value!r} must be one of {list(choices)}")


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Shape of a decoder-only transformer (GPT or Llama family)."""

    name: str
    family: str
    layers: int
    hidden: int
    ffn_hidden: int
    heads: int
    kv_heads: int
    vocab: int
    positions: str
    max_seq_len: int = 2048  # table size for learned positions; RoPE/ALiBi ignore it
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False  # GPT (Megatron, GPT-2) shares input and output embeddings

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise SpecError(f"model.name={self.name!r} must be a non-empty string")
        if self.family not in FAMILIES:
            raise SpecError(f"model.family={self.family!r} must be one of {FAMILIES}")
        check_positive_ints(
            "model",
            self,
            ("layers", "hidden", "ffn_hidden", "heads", "kv_heads", "vocab", "max_seq_len"),
        )
        check_positive_number("model", "rope_theta", self.rope_theta)
        check_positive_number("model", "norm_eps", self.norm_eps)
        check_flag("model", "tie_embeddings", self.tie_embeddings)
        allowed = POSITIONS_BY_FAMILY[self.family]
        if self.positions not in allowed:
            raise SpecError(
                f"model.positions={self.positions!r} is not valid for family {self.family!r}: "
                f"use one of {allowed}"
            )
        if self.hidden % self.heads:
            raise SpecError(
                f"model.heads({self.heads}) does not divide model.hidden({self.hidden})"
            )
        if self.positions == "rope" and self.hidden // self.heads % 2:
            raise SpecError(
                f"model.hidden({self.hidden}) / model.heads({self.heads}) = "
                f"{self.hidden // self.heads}: RoPE rotates pairs of a head's channels, so the "
                "head dimension must be even"
            )
        if self.heads % self.kv_heads:
            raise SpecError(
                f"model.kv_heads({self.kv_heads}) does not divide model.heads({self.heads})"
            )
        if self.family == "gpt" and self.kv_heads != self.heads:
            raise SpecError(
                f"model.kv_heads({self.kv_heads}) must equal model.heads({self.heads}) for GPT "
                "(multi-head attention)"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def stage_layer_counts(layers: int, stages: int) -> tuple[int, ...]:
    """Layers per (virtual) pipeline stage, in stage order.

    Rule: every stage starts with c = ceil(layers / stages) layers; the surplus
    d = stages * c - layers (< stages) is removed one layer at a time from the
    outermost stages inwards (first, last, second, second-to-last, ...), because
    the first stage also holds the embedding and the last the output layer and
    loss. For Llama 3.1 405B (126 layers, 16 stages) this gives 7, 8 x 14, 7, as
    the Llama 3 paper describes. Refused when there are fewer layers than stages.
    """
    if stages < 1:
        raise SpecError(f"pipeline stages({stages}) must be at least 1")
    if layers < stages:
        raise SpecError(
            f"model.layers({layers}) is fewer than pipeline stages pp*vpp({stages}): "
            "every stage needs at least one layer"
        )
    per_stage = -(-layers // stages)
    counts = [per_stage] * stages
    surplus = stages * per_stage - layers
    order = [i // 2 if i % 2 == 0 else stages - 1 - i // 2 for i in range(stages)]
    for stage in order[:surplus]:
        counts[stage] -= 1
    return tuple(counts)


def check_schedule(
    schedule: str,
    pp: int,
    vpp: int,
    num_microbatches: int,
    pipeline_recv: str = "per-microbatch",
) -> None:
    """Refuse pipeline settings torch's schedules cannot run.

    1f1b and gpipe run one stage per rank; interleaved-1f1b needs vpp >= 2;
    zero-bubble (torch's ScheduleInterleavedZeroBubble) runs with any vpp.
    Schedule1F1B refuses fewer micro-batches than stages; the multi-stage
    schedules run max(1, m // pp) rounds and need m to be a multiple of them.
    pipeline_recv (`kernels.pipeline_recv`) "per-transfer" runs Megatron's 1F1B
    (workloads.megatron_schedule): `per_transfer_refusal` says which pipelines it runs.
    """
    known = (*SINGLE_STAGE_SCHEDULES, *MULTI_STAGE_SCHEDULES)
    if schedule not in known:
        raise SpecError(f"parallel.schedule={schedule!r} must be one of {list(known)}")
    if schedule in SINGLE_STAGE_SCHEDULES and vpp != 1:
        raise SpecError(
            f"parallel.vpp({vpp}) > 1 needs an interleaved schedule; "
            f"schedule={schedule!r} runs one stage per rank"
        )
    if schedule == "interleaved-1f1b" and vpp < 2:
        raise SpecError(f"parallel.schedule='interleaved-1f1b' needs vpp >= 2 (vpp={vpp})")
    if pp == 1:
        return
    if pipeline_recv == "per-transfer":
        refusal = per_transfer_refusal(schedule, pp, num_microbatches)
        if refusal:
            raise SpecError(refusal)
        return
    if schedule == "1f1b" and num_microbatches < pp:
        raise SpecError(
            f"parallel.schedule='1f1b' needs micro-batches per iteration({num_microbatches}) "
            f">= pp({pp}) with kernels.pipeline_recv='per-microbatch' (torch's Schedule1F1B): "
            "raise batch.global_batch or lower dp/micro_batch, or run Megatron's 1F1B with "
            "kernels.pipeline_recv='per-transfer'"
        )
    rounds = max(1, num_microbatches // pp)
    if schedule in MULTI_STAGE_SCHEDULES and num_microbatches % rounds:
        raise SpecError(
            f"parallel.schedule={schedule!r}: micro-batches per iteration({num_microbatches}) "
            f"must be a multiple of max(1, micro-batches // pp({pp}))={rounds}"
        )


def per_transfer_refusal(schedule: str, pp: int, num_microbatches: int) -> str | None:
    """Why Megatron's 1F1B with per-transfer buffers (workloads.megatron_schedule) cannot run
    a pipeline, None where it can: schedule "1f1b" with any number of micro-batches, and
    "interleaved-1f1b" with a multiple of pp (Megatron-LM's get_forward_backward_func
    asserts it for its interleaved schedule)."""
    if schedule not in ("1f1b", "interleaved-1f1b"):
        return (
            f"kernels.pipeline_recv='per-transfer' runs Megatron's 1F1B, plain or interleaved: "
            f"parallel.schedule={schedule!r} needs kernels.pipeline_recv='per-microbatch' "
            "(torch.distributed.pipelining)"
        )
    if schedule == "interleaved-1f1b" and num_microbatches % pp:
        return (
            "kernels.pipeline_recv='per-transfer' with parallel.schedule='interleaved-1f1b' "
            f"needs micro-batches per iteration({num_microbatches}) to be a multiple of "
            f"pp({pp}), as Megatron's interleaved schedule does"
        )
    return None


def check_tensor_parallel(model: ModelSpec, tp: int) -> None:
    """tp must divide heads, kv_heads and ffn_hidden.

    Replicating kv heads when tp > kv_heads (one kv head serving tp/kv_heads ranks) is
    not implemented by the workloads, so it is refused rather than emulated wrongly.
    """
    if model.heads % tp:
        raise SpecError(f"parallel.tp({tp}) does not divide model.heads({model.heads})")
    if model.kv_heads % tp:
        raise SpecError(
            f"parallel.tp({tp}) does not divide model.kv_heads({model.kv_heads}): "
            "kv-head replication (tp > kv_heads) is not supported"
        )
    if model.ffn_hidden % tp:
        raise SpecError(f"parallel.tp({tp}) does not divide model.ffn_hidden({model.ffn_hidden})")
