"""Hardware presets: frozen dataclasses for GPUs, intra-node links and inter-node networks,
loaded from the TOML data files beside this module (one file per machine, sources cited there).

Bandwidth conventions (used by every cost model):
- `LinkPreset.bandwidth_GBps`: what NCCL can move per GPU, per direction, over the intra-node
  fabric (NVLink line rate x NCCL's per-link efficiency); `line_rate_GBps` is the datasheet figure.
- `NetworkPreset.nic_bandwidth_GBps`: what NCCL moves per NIC, per direction.
- `latency_us` on links and networks is an extra per-step latency added to NCCL's own per-step
  latencies (src/graph/tuning.cc); the shipped presets use 0.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Mapping
from dataclasses import InitVar, dataclass, field
from functools import cache
from pathlib import Path
from types import MappingProxyType

from emulator.costs.ops import DTYPES

_DATA_DIR = Path(__file__).parent
ARCHS = ("ampere", "hopper")
NCCL_DEFAULT_CHANNELS = 16  # a link preset's NCCL channels where its file names none
# CUDA compute capability (major) of each architecture: how a real GPU is told apart.
ARCH_OF_COMPUTE_CAPABILITY = {8: "ampere", 9: "hopper"}
# A real GPU is a preset when its architecture and SM count match and its total memory (the
# device property totalGlobalMem, the total cudaMemGetInfo reports) is within this of the
# preset's usable capacity: the published totals vary by ~0.01 GiB with the driver; the SM
# count tells an H100 PCIe (114) from the SXM (132) at the same capacity.
CAPACITY_MATCH_TOLERANCE = 0.01


def _check_positive(owner: str, name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{owner}.{name}={value!r} must be a positive finite number")


# What a GPU fabric can move per GPU (or NIC) per direction, with a factor of 10 of headroom
# on both sides of what exists (1 Gb Ethernet 0.125 GB/s, NVLink 5 900 GB/s): a figure outside
# it is a unit slip (bits for bytes, bytes for GB), and priced it gives ~0 s or inf.
BANDWIDTH_RANGE_GBPS = (0.01, 10_000.0)
MAX_LATENCY_US = 1e6  # one second a step


def _check_bandwidth(owner: str, name: str, value: object) -> None:
    _check_positive(owner, name, value)
    low, high = BANDWIDTH_RANGE_GBPS
    if not low <= value <= high:
        raise ValueError(
            f"{owner}.{name}={value!r} GB/s is outside [{low}, {high:g}] GB/s, beyond any GPU "
            "fabric or NIC (GB/s per GPU or NIC, per direction: a unit slip?)"
        )


def _check_latency(owner: str, value: object) -> None:
    _check_non_negative(owner, "latency_us", value)
    if value > MAX_LATENCY_US:
        raise ValueError(
            f"{owner}.latency_us={value!r} is above {MAX_LATENCY_US:g} us (one second a step: "
            "microseconds, not nanoseconds?)"
        )


def _check_non_negative(owner: str, name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{owner}.{name}={value!r} must be a finite number >= 0")


def _check_count(owner: str, name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{owner}.{name}={value!r} must be a positive integer")


def _check_flag(owner: str, name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{owner}.{name}={value!r} must be a boolean (true or false)")


def _check_name(owner: str, value: object) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{owner}.name={value!r} must be a non-empty string")


def _check_fraction(owner: str, name: str, value: object) -> None:
    _check_positive(owner, name, value)
    if value > 1:
        raise ValueError(f"{owner}.{name}={value!r} must be a fraction in (0, 1]")


@dataclass(frozen=True, kw_only=True)
class GpuPreset:
    """One GPU model: dense peaks per dtype, HBM, SMs and measured efficiency fractions."""

    name: str
    arch: str
    sm_count: int
    hbm_bandwidth_GBps: float
    hbm_capacity_bytes: int  # DRAM, as the datasheet counts it
    usable_capacity_bytes: int  # what CUDA offers a process (cudaMemGetInfo's total), cited per preset
    power_W: float
    # the link preset of the GPU's own board (cluster.intra_node's default); a job naming another
    # is refused, as no such machine exists
    intra_node: str
    # the network preset of its reference system (cluster.inter_node's default); NICs are not on
    # the board, so a job may name any other
    inter_node: str
    peak_dense_tflops: Mapping[str, float]
    gemm_efficiency: float
    hbm_efficiency: float
    attention_efficiency: float
    attention_head_dim: int
    boost_clock_MHz: float | None = None
    # what torch.cuda.get_device_name() says on this GPU: how a measured kernel table's `gpu`
    # column is told to belong to it (`prismbench.emulate.check_table_gpu`)
    device_names: tuple[str, ...] = ()

    def is_named(self, gpu: str) -> bool:
        """Whether `gpu`, a measurement's GPU column, names this GPU: one of its
        `device_names` (torch's), or the preset's own name (how a user names it in a job spec
        and in `ingest-profile --provenance gpu=...`)."""
        return gpu == self.name or gpu in self.device_names

    def __post_init__(self) -> None:
        owner = f"gpu[{self.name}]"
        if not all(isinstance(n, str) and n for n in self.device_names):
            raise ValueError(f"{owner}.device_names={self.device_names!r} must be non-empty strings")
        object.__setattr__(self, "device_names", tuple(self.device_names))
        if self.arch not in ARCHS:
            raise ValueError(f"{owner}.arch={self.arch!r} must be one of {ARCHS}")
        if self.intra_node not in _catalog().links:
            raise ValueError(
                f"{owner}.intra_node={self.intra_node!r} is not a link preset; known: "
                f"{', '.join(_catalog().links)}"
            )
        if self.inter_node not in _catalog().networks:
            raise ValueError(
                f"{owner}.inter_node={self.inter_node!r} is not a network preset; known: "
                f"{', '.join(_catalog().networks)}"
            )
        for name in ("sm_count", "hbm_bandwidth_GBps", "hbm_capacity_bytes", "power_W", "attention_head_dim"):
            _check_positive(owner, name, getattr(self, name))
        if not 0 < self.usable_capacity_bytes <= self.hbm_capacity_bytes:
            raise ValueError(
                f"{owner}.usable_capacity_bytes={self.usable_capacity_bytes} must be in "
                f"(0, hbm_capacity_bytes={self.hbm_capacity_bytes}]"
            )
        for name in ("gemm_efficiency", "hbm_efficiency", "attention_efficiency"):
            _check_fraction(owner, name, getattr(self, name))
        for dtype, tflops in self.peak_dense_tflops.items():
            if dtype not in DTYPES:
                raise ValueError(f"{owner}.peak_dense_tflops has unknown dtype {dtype!r}; known: {DTYPES}")
            _check_positive(owner, f"peak_dense_tflops.{dtype}", tflops)
        for dtype in ("fp32", "bf16", "fp16"):
            if dtype not in self.peak_dense_tflops:
                raise ValueError(f"{owner}.peak_dense_tflops lacks {dtype!r}")
        object.__setattr__(self, "peak_dense_tflops", MappingProxyType(dict(self.peak_dense_tflops)))

    def peak_tflops(self, dtype: str) -> float:
        """Dense tensor-core peak for `dtype`; refuses a dtype the GPU has no units for (fp8 on A100)."""
        if dtype not in DTYPES:
            raise ValueError(f"dtype={dtype!r} is not known; known: {DTYPES}")
        if dtype not in self.peak_dense_tflops:
            raise ValueError(
                f"gpu {self.name!r} ({self.arch}) has no {dtype} tensor cores: cannot price {dtype} "
                f"work on it; use bf16 (train.precision) or a GPU with {dtype}"
            )
        return self.peak_dense_tflops[dtype]


@dataclass(frozen=True, kw_only=True)
class LinkPreset:
    """Intra-node GPU fabric; bandwidths are per GPU, per direction."""

    name: str
    bandwidth_GBps: float
    latency_us: float = 0.0
    line_rate_GBps: float | None = None
    links: int | None = None
    nvls: bool = False
    channels: int = NCCL_DEFAULT_CHANNELS
    # the job-spec field an explicit table came from ("cluster.intra_node"): its errors name
    # that field, which the spec's author wrote, rather than a preset
    spec_field: InitVar[str | None] = None

    def __post_init__(self, spec_field: str | None) -> None:
        owner = spec_field or f"intra_node[{self.name}]"
        _check_name(owner, self.name)
        _check_bandwidth(owner, "bandwidth_GBps", self.bandwidth_GBps)
        _check_latency(owner, self.latency_us)
        _check_count(owner, "channels", self.channels)
        _check_flag(owner, "nvls", self.nvls)
        if self.links is not None:
            _check_count(owner, "links", self.links)
        if self.line_rate_GBps is not None:
            _check_bandwidth(owner, "line_rate_GBps", self.line_rate_GBps)
            if self.line_rate_GBps < self.bandwidth_GBps:
                raise ValueError(
                    f"{owner}.bandwidth_GBps({self.bandwidth_GBps}) exceeds line_rate_GBps({self.line_rate_GBps})"
                )


# field -> its key in an explicit cluster.inter_node table, where it differs
_NETWORK_SPEC_KEYS = {"nic_bandwidth_GBps": "bandwidth_GBps"}


@dataclass(frozen=True, kw_only=True)
class NetworkPreset:
    """Inter-node network: NICs per node (rail-optimised, one rail per NIC), bandwidth per NIC."""

    name: str
    nics_per_node: int
    nic_bandwidth_GBps: float
    nic_Gbps: float | None = None
    latency_us: float = 0.0
    # the job-spec field an explicit table came from ("cluster.inter_node"), as in LinkPreset;
    # its errors then call the per-NIC bandwidth by the table's key
    spec_field: InitVar[str | None] = None

    def __post_init__(self, spec_field: str | None) -> None:
        owner = spec_field or f"inter_node[{self.name}]"
        bandwidth = _NETWORK_SPEC_KEYS["nic_bandwidth_GBps"] if spec_field else "nic_bandwidth_GBps"
        _check_name(owner, self.name)
        _check_count(owner, "nics_per_node", self.nics_per_node)
        _check_bandwidth(owner, bandwidth, self.nic_bandwidth_GBps)
        _check_latency(owner, self.latency_us)
        if self.nic_Gbps is not None:
            _check_positive(owner, "nic_Gbps", self.nic_Gbps)
            if self.nic_bandwidth_GBps > self.nic_Gbps / 8:
                raise ValueError(
                    f"{owner}.{bandwidth}({self.nic_bandwidth_GBps}) exceeds the line rate "
                    f"nic_Gbps/8 ({self.nic_Gbps / 8})"
                )


@dataclass(frozen=True)
class _Catalog:
    gpus: dict[str, dict] = field(default_factory=dict)
    links: dict[str, dict] = field(default_factory=dict)
    networks: dict[str, dict] = field(default_factory=dict)


@cache
def _catalog() -> _Catalog:
    catalog = _Catalog()
    shelves = {"gpu": catalog.gpus, "link": catalog.links, "network": catalog.networks}
    for path in sorted(_DATA_DIR.glob("*.toml")):
        with path.open("rb") as handle:
            table = tomllib.load(handle)
        kind = table.pop("kind", None)
        if kind not in shelves:
            raise ValueError(f"{path.name}: kind={kind!r} must be one of {tuple(shelves)}")
        if table.get("name") != path.stem:
            raise ValueError(f"{path.name}: name={table.get('name')!r} must equal the file name {path.stem!r}")
        shelves[kind][path.stem] = table
    return catalog


def _build(cls, table: Mapping, what: str):
    try:
        return cls(**table)
    except TypeError as error:
        raise ValueError(f"{what}: bad table {dict(table)!r}: {error}") from None


def _gpu_from_table(table: dict) -> GpuPreset:
    table = dict(table)
    efficiency = table.pop("efficiency", {})
    return _build(
        GpuPreset,
        {
            **table,
            "gemm_efficiency": efficiency.get("gemm"),
            "hbm_efficiency": efficiency.get("hbm"),
            "attention_efficiency": efficiency.get("attention"),
            "attention_head_dim": efficiency.get("attention_head_dim"),
        },
        f"gpu preset {table.get('name')!r}",
    )


GPU_NAMES: tuple[str, ...] = tuple(_catalog().gpus)
LINK_NAMES: tuple[str, ...] = tuple(_catalog().links)
NETWORK_NAMES: tuple[str, ...] = tuple(_catalog().networks)


def gpu_preset(name: str) -> GpuPreset:
    """The GPU preset called `name` (e.g. "h100-sxm-80g")."""
    if not isinstance(name, str) or name not in _catalog().gpus:
        raise ValueError(f"cluster.gpu={name!r} is not a known GPU preset; known: {', '.join(GPU_NAMES)}")
    return _gpu_from_table(_catalog().gpus[name])


def gpu_presets_matching(compute_capability_major: int, sm_count: int, total_bytes: int) -> list[str]:
    """The GPU presets a real GPU is (`torch.cuda.get_device_properties()`: major,
    multi_processor_count, total_memory): same architecture and SM count, usable capacity within
    CAPACITY_MATCH_TOLERANCE. A MIG slice or a GPU no preset describes matches none. Form factor
    and interconnect are not told apart: an A100 80GB PCIe (108 SMs) is taken for the SXM
    preset, an H800 for the H100 SXM, as their SMs and memory are the same."""
    arch = ARCH_OF_COMPUTE_CAPABILITY.get(compute_capability_major)
    return [
        name
        for name in GPU_NAMES
        if (preset := gpu_preset(name)).arch == arch
        and preset.sm_count == sm_count
        and abs(total_bytes - preset.usable_capacity_bytes)
        <= CAPACITY_MATCH_TOLERANCE * preset.usable_capacity_bytes
    ]


def _explicit(value: Mapping, field_name: str, cls: type, spec_keys: Mapping[str, str]) -> dict:
    """The table as `cls`'s keyword arguments (`spec_keys`: field -> the table's key for it,
    where they differ), its unknown and missing keys refused by the table's names."""
    spec_field = f"cluster.{field_name}"
    fields = {spec_keys.get(f.name, f.name): f.name for f in dataclasses.fields(cls)}
    known = set(fields)
    unknown = sorted(set(value) - known)
    if unknown:
        raise ValueError(f"{spec_field}: unknown key(s) {unknown}; known keys are {sorted(known)}")
    required = ("bandwidth_GBps", "latency_us")
    missing = [key for key in required if key not in value]
    if missing:
        raise ValueError(
            f"{spec_field} table lacks {', '.join(missing)}; give {', '.join(required)} "
            f"(bandwidth per GPU per direction in GB/s, latency in microseconds) or a preset name"
        )
    table = {fields[key]: item for key, item in value.items()}
    return {"name": "explicit", **table, "spec_field": spec_field}


def intra_node_link(value: str | Mapping) -> LinkPreset:
    """A preset name ("nvlink3", "nvlink4") or a table {bandwidth_GBps, latency_us[, nvls, channels]}.

    An explicit `bandwidth_GBps` is what NCCL can use per GPU per direction (not the line rate).
    """
    if isinstance(value, str):
        if value not in _catalog().links:
            raise ValueError(
                f"cluster.intra_node={value!r} is not a known link preset; known: {', '.join(LINK_NAMES)}"
            )
        return _build(LinkPreset, _catalog().links[value], f"link preset {value!r}")
    if not isinstance(value, Mapping):
        raise ValueError(f"cluster.intra_node={value!r} must be a preset name or a table")
    return LinkPreset(**_explicit(value, "intra_node", LinkPreset, {}))


def inter_node_network(value: str | Mapping) -> NetworkPreset:
    """A preset name ("ib-ndr-8x400", ...) or a table {bandwidth_GBps, latency_us[, nics_per_node]}.

    An explicit `bandwidth_GBps` is per NIC, per direction, as NCCL can use it; `nics_per_node`
    defaults to 8 (one NIC per GPU on an 8-GPU node).
    """
    if isinstance(value, str):
        if value not in _catalog().networks:
            raise ValueError(
                f"cluster.inter_node={value!r} is not a known network preset; "
                f"known: {', '.join(NETWORK_NAMES)}"
            )
        return _build(NetworkPreset, _catalog().networks[value], f"network preset {value!r}")
    if not isinstance(value, Mapping):
        raise ValueError(f"cluster.inter_node={value!r} must be a preset name or a table")
    table = _explicit(value, "inter_node", NetworkPreset, _NETWORK_SPEC_KEYS)
    return NetworkPreset(**{"nics_per_node": 8, **table})
