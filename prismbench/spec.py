"""The job spec: a training job (workloads.job) on a cluster, loaded from TOML and validated.

A job spec names a model (a registry flavor and/or explicit dims), its parallel layout,
batch, training settings, kernels and cluster. All but the cluster are the workloads' own types
(`workloads.job`); the cluster, the rules that need its hardware, and TOML loading are here.
Every rule is checked where the dataclass is built; a broken rule raises `SpecError` with the
field and the numbers in the message, before anything runs.
`../shared/data/jobspec.example.toml` is the contract; `examples/jobspec.example.toml` keeps
its values and names every field since added (kernels, and each field's choices: a test).
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from emulator import hardware
from workloads.config import ModelSpec, SpecError, check_positive_ints
from workloads.flavors import get_flavor, parameter_count
from workloads.job import BatchSpec, ParallelSpec, TrainingJob, TrainSpec
from workloads.kernels import KernelsSpec

__all__ = [
    "ClusterSpec",
    "JobSpec",
    "SpecError",
    "job_spec_from_dict",
    "load_job_spec",
    "moot_model_fields",
]


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    """The machines: GPU preset, GPUs per node, intra-node link and inter-node network."""

    gpu: str = "h100-sxm-80g"
    gpus_per_node: int = 8
    # preset name or {bandwidth_GBps, latency_us}; None: the GPU's own (`GpuPreset.intra_node`)
    intra_node: str | dict | None = None
    # preset name or table; None: the GPU's reference system's (`GpuPreset.inter_node`)
    inter_node: str | dict | None = None

    def __post_init__(self) -> None:
        check_positive_ints("cluster", self, ("gpus_per_node",))
        try:
            gpu = hardware.gpu_preset(self.gpu)
            for field_name in ("intra_node", "inter_node"):
                if getattr(self, field_name) is None:
                    object.__setattr__(self, field_name, getattr(gpu, field_name))
            link = hardware.intra_node_link(self.intra_node)
            hardware.inter_node_network(self.inter_node)
        except ValueError as err:  # the presets' errors already name the cluster field
            raise SpecError(str(err)) from None
        self._check_link_of_gpu(gpu, link)
        # each NCCL channel runs one CUDA block on an SM, and compute that overlaps a collective
        # runs on the SMs left (emulator.costs.overlap): the GPU must keep at least one
        if link.channels >= gpu.sm_count:
            raise SpecError(
                f"cluster.intra_node.channels={link.channels} must be below the {gpu.sm_count} "
                f"SMs of cluster.gpu={self.gpu!r}: each NCCL channel occupies one SM"
            )

    def _check_link_of_gpu(self, gpu, link) -> None:
        """A link preset is one GPU generation's board (an A100 has no NVLink 4), and NVLink
        SHARP needs the NVSwitch of a GPU whose own board has it; a table of other figures
        (bandwidth, latency, channels) models any other fabric."""
        own = hardware.intra_node_link(gpu.intra_node)
        if isinstance(self.intra_node, str) and self.intra_node != gpu.intra_node:
            raise SpecError(
                f"cluster.intra_node={self.intra_node!r} is not the fabric of "
                f"cluster.gpu={self.gpu!r}, whose board has {gpu.intra_node!r}: leave "
                "intra_node out (it defaults to the GPU's own), or give a table for another fabric"
            )
        if link.nvls and not own.nvls:
            raise SpecError(
                f"cluster.intra_node.nvls=true: NVLink SHARP needs the NVSwitch of a Hopper board; "
                f"the board of cluster.gpu={self.gpu!r} ({gpu.intra_node!r}) has none"
            )


# torch sizes a tensor's storage in bytes as an int64 ("Storage size calculation overflowed"
# beyond it), and the capture counts each op's FLOPs in an int64 column (emulator.capture.trace)
INT64_MAX = 2**63 - 1
# explain and the replay hold arrays with a row per rank (emulator.world.mesh): 2**20 ranks
# emulated in 58 s and 1.4 GiB on this project's 2-core machine; 10**7 took explain alone 87 s
# and 5 GiB, and at 10**9 it ran out of memory (a numpy traceback, exit 1)
MAX_WORLD_SIZE = 2**20


@dataclass(frozen=True, kw_only=True)
class JobSpec(TrainingJob):
    """One training job on a cluster; the rules that need the cluster's hardware, and the
    sizes the emulator can capture, are here."""

    cluster: ClusterSpec = field(default_factory=ClusterSpec)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_world_size()
        self._check_precision()
        self._check_int64_sizes()

    def _check_world_size(self) -> None:
        p = self.parallel
        if self.world_size > MAX_WORLD_SIZE:
            raise SpecError(
                f"parallel.tp({p.tp}) * pp({p.pp}) * cp({p.cp}) * dp({p.dp}) = {self.world_size:,} "
                f"GPUs is more than the {MAX_WORLD_SIZE:,} the emulator replays (a row per rank)"
            )

    def _check_int64_sizes(self) -> None:
        """The job's largest tensors and ops must fit an int64 (INT64_MAX): past it torch
        cannot build the tensor, or the capture count the op, deep inside a capture. Each
        figure is what the program builds or more: all parameters (the fp32 master and
        gradient buffers hold a stage's whole), a micro-batch's widest activation (fp32 logits
        at most), its widest matmul, its attention's backward (five s x s matmuls per head, as
        torch's flop counter counts flash attention) and a rank's token ids."""
        m, b = self.built_model, self.batch
        tokens = b.micro_batch * b.seq_len
        widest = max(m.hidden, m.ffn_hidden, m.vocab)
        widest_fields = "the widest of model.hidden, ffn_hidden and vocab (as padded)"
        sizes = (
            ("model.layers, hidden, ffn_hidden, vocab (as padded) and max_seq_len",
             "fp32 bytes of the model's parameters", 4 * parameter_count(m)),
            (f"batch.micro_batch x seq_len x {widest_fields}",
             "fp32 bytes of a micro-batch's widest activation", 4 * tokens * widest),
            (f"batch.micro_batch x seq_len x model.hidden x {widest_fields}",
             "FLOPs of a micro-batch's widest matmul", 2 * tokens * m.hidden * widest),
            ("batch.micro_batch x seq_len^2 x model.hidden",
             "FLOPs of a micro-batch's attention backward", 10 * tokens * b.seq_len * m.hidden),
            ("batch.global_batch / parallel.dp x batch.seq_len",
             "int64 bytes of a rank's token ids", 8 * self.local_batch_rows * b.seq_len),
        )  # fmt: skip
        for fields, what, size in sizes:
            if size > INT64_MAX:
                raise SpecError(
                    f"{fields}: the {what} would be {size:.3g}, beyond 2**63 - 1 "
                    f"({INT64_MAX:.3g}): torch sizes tensors, and the capture counts FLOPs, in int64"
                )

    def _check_precision(self) -> None:
        if self.train.precision != "fp8":
            return
        gpu = hardware.gpu_preset(self.cluster.gpu)
        if not gpu.peak_dense_tflops.get("fp8"):
            raise SpecError(
                f"train.precision='fp8' needs fp8 tensor cores; cluster.gpu={self.cluster.gpu!r} has none"
            )

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """The fully resolved spec as plain TOML-compatible tables (round-trips through from_dict).
        A model given by its dims alone has no registry name (`_build_model` calls it "custom"),
        so none is written: `job_spec_from_dict` would look "custom" up as a flavor."""
        tables = {name: dataclasses.asdict(getattr(self, name)) for name in _SECTIONS}
        if self.model.name == CUSTOM_MODEL_NAME:
            del tables["model"]["name"]
        return tables


CUSTOM_MODEL_NAME = "custom"  # a model given by its dims, without a registry name
_SECTIONS = ("model", "parallel", "batch", "train", "kernels", "cluster")
_SECTION_TYPES = {
    "parallel": ParallelSpec,
    "batch": BatchSpec,
    "train": TrainSpec,
    "kernels": KernelsSpec,
    "cluster": ClusterSpec,
}


def _field_names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _refuse_unknown(section: str, table: dict, known: set[str]) -> None:
    unknown = sorted(set(table) - known)
    if unknown:
        raise SpecError(f"{section}: unknown key(s) {unknown}; known keys are {sorted(known)}")


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
    return ModelSpec(name=CUSTOM_MODEL_NAME, **table)


# The model fields one position scheme alone reads: RoPE's base, a learned table's rows.
_READ_BY_POSITIONS = {"rope_theta": "rope", "max_seq_len": "learned"}


def moot_model_fields(model: ModelSpec) -> list[str]:
    """The model fields set, for a scheme of positions that does not read them, to another value
    than the flavor's (without a name, the default), one line each: the CLI says so, so that
    none is ignored silently. A value the flavor or the default gives is no note: a resolved
    spec written out whole names every field."""
    if model.name == CUSTOM_MODEL_NAME:
        base = {f.name: f.default for f in dataclasses.fields(ModelSpec)}
    else:
        base = dataclasses.asdict(get_flavor(model.name))
    return [
        f"model.{name}={getattr(model, name)!r} changes nothing for this job: only "
        f"{positions!r} positions read it (model.positions={model.positions!r})"
        for name, positions in _READ_BY_POSITIONS.items()
        if model.positions != positions and getattr(model, name) != base[name]
    ]


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
    # "top level", not "job spec": the CLI already says "job spec 'PATH':" before the message
    _refuse_unknown("top level", tables, set(_SECTIONS))
    if "model" not in tables or "batch" not in tables:
        raise SpecError("top level: sections [model] and [batch] are required")
    if not isinstance(tables["model"], dict):
        raise SpecError("[model] must be a table")
    sections = {
        name: _build_section(name, tables[name]) for name in _SECTION_TYPES if name in tables
    }
    return JobSpec(model=_build_model(tables["model"]), **sections)


def load_job_spec(path: str | Path) -> JobSpec:
    """Read a TOML job spec; a missing file or malformed TOML is a SpecError naming the path."""
    path = Path(path)
    where = f"job spec {str(path)!r}"
    if path.is_dir():
        raise SpecError(f"{where}: is a directory, not a TOML file")
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise SpecError(f"{where}: no such file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise SpecError(f"{where}: cannot be read ({err})") from None
    if not text.strip():
        raise SpecError(f"{where}: the file is empty; sections [model] and [batch] are required")
    try:
        tables = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise SpecError(f"{where}: invalid TOML: {err}") from None
    try:
        return job_spec_from_dict(tables)
    except SpecError as err:
        raise SpecError(f"{where}: {err}") from None
