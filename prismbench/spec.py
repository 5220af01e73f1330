"""The job spec: frozen dataclasses for one training job, loaded from TOML and validated.

A job spec names a model (a registry flavor and/or explicit dims), its parallel layout,
batch, training settings and cluster. Every rule is checked where the dataclass is built;
a broken rule raises `SpecError` with the field and the numbers in the message, before
anything runs. `../shared/data/jobspec.example.toml` (copied to `examples/`) is the contract.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from emulator import hardware
from workloads.config import (
    ModelSpec,
    SpecError,
    check_schedule,
    check_tensor_parallel,
    stage_layer_counts,
)
from workloads.flavors import get_flavor

SCHEDULES = ("1f1b", "interleaved-1f1b", "gpipe", "zero-bubble")
PRECISIONS = ("bf16", "fp16", "fp8", "fp32")
RECOMPUTE_MODES = ("none", "selective", "full")
OPTIMIZERS = ("adamw",)
ZERO_STAGES = (0, 1, 2, 3)

__all__ = [
    "BatchSpec",
    "ClusterSpec",
    "JobSpec",
    "ModelSpec",
    "ParallelSpec",
    "SpecError",
    "TrainSpec",
    "job_spec_from_dict",
    "load_job_spec",
]


def _check_positive_ints(section: str, obj: Any, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise SpecError(f"{section}.{name}={value!r} must be a positive integer")


def _check_choice(section: str, name: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        raise SpecError(f"{section}.{name}={value!r} must be one of {list(choices)}")


@dataclass(frozen=True, kw_only=True)
class ParallelSpec:
    """How the job is split: degrees of tensor, pipeline, context and data parallelism."""

    tp: int = 1
    sequence_parallel: bool | None = None  # default: on whenever tp > 1 (Megatron's advice)
    pp: int = 1
    vpp: int = 1
    schedule: str = "1f1b"
    cp: int = 1  # causal CP is load-balanced: 2*cp chunks, rank i holds i and 2cp-1-i (Llama 3)
    dp: int = 1
    zero: int = 0

    def __post_init__(self) -> None:
        _check_positive_ints("parallel", self, ("tp", "pp", "vpp", "cp", "dp"))
        _check_choice("parallel", "schedule", self.schedule, SCHEDULES)
        _check_choice("parallel", "zero", self.zero, ZERO_STAGES)
        if self.sequence_parallel is None:
            object.__setattr__(self, "sequence_parallel", self.tp > 1)
        if not isinstance(self.sequence_parallel, bool):
            raise SpecError(f"parallel.sequence_parallel={self.sequence_parallel!r} must be a boolean")
        if self.sequence_parallel and self.tp == 1:
            raise SpecError("parallel.sequence_parallel=true needs tp > 1 (tp=1)")
        if self.schedule != "1f1b" and self.pp == 1:
            raise SpecError(f"parallel.schedule={self.schedule!r} needs pp > 1 (pp=1)")

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.cp * self.tp


@dataclass(frozen=True, kw_only=True)
class BatchSpec:
    """Sequence length and batch sizes (global_batch in sequences, micro_batch per rank)."""

    seq_len: int
    micro_batch: int = 1
    global_batch: int

    def __post_init__(self) -> None:
        _check_positive_ints("batch", self, ("seq_len", "micro_batch", "global_batch"))


@dataclass(frozen=True, kw_only=True)
class TrainSpec:
    """Numerics and memory-saving choices of the training step."""

    precision: str = "bf16"  # fp8 = fp8 GEMMs in linear layers, bf16 elsewhere (torchtitan float8)
    recompute: str = "none"
    optimizer: str = "adamw"

    def __post_init__(self) -> None:
        _check_choice("train", "precision", self.precision, PRECISIONS)
        _check_choice("train", "recompute", self.recompute, RECOMPUTE_MODES)
        _check_choice("train", "optimizer", self.optimizer, OPTIMIZERS)


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    """The machines: GPU preset, GPUs per node, intra-node link and inter-node network."""

    gpu: str = "h100-sxm-80g"
    gpus_per_node: int = 8
    intra_node: str | dict = "nvlink4"  # preset name or {bandwidth_GBps, latency_us}
    inter_node: str | dict = "ib-ndr-8x400"

    def __post_init__(self) -> None:
        _check_positive_ints("cluster", self, ("gpus_per_node",))
        try:
            hardware.gpu_preset(self.gpu)
            hardware.intra_node_link(self.intra_node)
            hardware.inter_node_network(self.inter_node)
        except ValueError as err:  # the presets' errors already name the cluster field
            raise SpecError(str(err)) from None


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """One training job; cross-section rules are checked here."""

    model: ModelSpec
    parallel: ParallelSpec = field(default_factory=ParallelSpec)
    batch: BatchSpec
    train: TrainSpec = field(default_factory=TrainSpec)
    cluster: ClusterSpec = field(default_factory=ClusterSpec)

    def __post_init__(self) -> None:
        p = self.parallel
        check_tensor_parallel(self.model, p.tp)
        stage_layer_counts(self.model.layers, p.pp * p.vpp)
        self._check_batch()
        check_schedule(p.schedule, p.pp, p.vpp, self.num_microbatches)
        self._check_precision()

    def _check_batch(self) -> None:
        p, b = self.parallel, self.batch
        if b.global_batch % (p.dp * b.micro_batch):
            raise SpecError(
                f"batch.global_batch({b.global_batch}) is not divisible by "
                f"parallel.dp({p.dp}) * batch.micro_batch({b.micro_batch})"
            )
        if p.cp > 1 and b.seq_len % (2 * p.cp):
            raise SpecError(
                f"batch.seq_len({b.seq_len}) is not divisible by 2*cp({2 * p.cp}) "
                "(load-balanced causal context parallelism)"
            )
        if p.sequence_parallel and (b.seq_len // p.cp) % p.tp:
            raise SpecError(
                f"batch.seq_len({b.seq_len}) / cp({p.cp}) is not divisible by tp({p.tp}): "
                "sequence parallelism shards each rank's sequence over the tp group"
            )
        if self.model.positions == "learned" and b.seq_len > self.model.max_seq_len:
            raise SpecError(
                f"batch.seq_len({b.seq_len}) exceeds model.max_seq_len({self.model.max_seq_len}) "
                "of the learned position table"
            )

    def _check_precision(self) -> None:
        if self.train.precision != "fp8":
            return
        gpu = hardware.gpu_preset(self.cluster.gpu)
        if not gpu.peak_dense_tflops.get("fp8"):
            raise SpecError(
                f"train.precision='fp8' needs fp8 tensor cores; cluster.gpu={self.cluster.gpu!r} has none"
            )

    @property
    def world_size(self) -> int:
        return self.parallel.world_size

    @property
    def num_microbatches(self) -> int:
        return self.batch.global_batch // (self.parallel.dp * self.batch.micro_batch)

    @property
    def tokens_per_iteration(self) -> int:
        return self.batch.global_batch * self.batch.seq_len

    @property
    def stage_layers(self) -> tuple[int, ...]:
        """Layers per virtual pipeline stage (pp * vpp entries), by the rule in workloads.config."""
        return stage_layer_counts(self.model.layers, self.parallel.pp * self.parallel.vpp)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """The fully resolved spec as plain TOML-compatible tables (round-trips through from_dict)."""
        return {name: dataclasses.asdict(getattr(self, name)) for name in _SECTIONS}


_SECTIONS = ("model", "parallel", "batch", "train", "cluster")
_SECTION_TYPES = {
    "parallel": ParallelSpec,
    "batch": BatchSpec,
    "train": TrainSpec,
    "cluster": ClusterSpec,
}


def _field_names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _refuse_unknown(section: str, table: dict, known: set[str]) -> None:
    unknown = sorted(set(table) - known)
    if unknown:
        raise SpecError(
            f"{section}: unknown key(s) {unknown}; known keys are {sorted(known)}"
        )


def _build_model(table: dict) -> ModelSpec:
    _refuse_unknown("model", table, _field_names(ModelSpec))
    table = dict(table)
    name = table.pop("name", None)
    if name is not None:
        base = dataclasses.asdict(get_flavor(name))
        return ModelSpec(**{**base, **table, "name": name})
    required = ("family", "layers", "hidden", "ffn_hidden", "heads", "vocab")
    missing = [key for key in required if key not in table]
    if missing:
        raise SpecError(f"model: without a registry name, {missing} must be given")
    table.setdefault("kv_heads", table["heads"])
    table.setdefault("positions", "rope" if table["family"] == "llama" else "learned")
    return ModelSpec(name="custom", **table)


def _build_section(section: str, table: Any) -> Any:
    cls = _SECTION_TYPES[section]
    if not isinstance(table, dict):
        raise SpecError(f"[{section}] must be a table")
    _refuse_unknown(section, table, _field_names(cls))
    required = [
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    missing = [name for name in required if name not in table]
    if missing:
        raise SpecError(f"{section}: required key(s) {missing} are missing")
    return cls(**table)


def job_spec_from_dict(tables: dict[str, Any]) -> JobSpec:
    """Build and validate a JobSpec from parsed TOML tables (refuses unknown sections and keys)."""
    _refuse_unknown("job spec", tables, set(_SECTIONS))
    if "model" not in tables or "batch" not in tables:
        raise SpecError("job spec: sections [model] and [batch] are required")
    if not isinstance(tables["model"], dict):
        raise SpecError("[model] must be a table")
    sections = {name: _build_section(name, tables[name]) for name in _SECTION_TYPES if name in tables}
    return JobSpec(model=_build_model(tables["model"]), **sections)


def load_job_spec(path: str | Path) -> JobSpec:
    """Read a TOML job spec; a missing file or malformed TOML is a SpecError naming the path."""
    path = Path(path)
    try:
        tables = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise SpecError(f"job spec {str(path)!r}: no such file") from None
    except tomllib.TOMLDecodeError as err:
        raise SpecError(f"job spec {str(path)!r}: invalid TOML: {err}") from None
    return job_spec_from_dict(tables)
