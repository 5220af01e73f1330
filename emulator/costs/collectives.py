"""Collective cost model: how long an NCCL collective over a group of global ranks takes.

The group is its global ranks (numpy array); the node of rank r is r // gpus_per_node. The
algorithm and protocol are chosen as NCCL's tuner does (minimum predicted time over the
candidates of `nccl_tuning`); all_to_all and send/recv, which NCCL runs as point-to-point
transfers outside tuning.cc, are priced from the same link figures. Formulas: docs/MODELS.md.

Sizes follow nccl-tests (PERFORMANCE.md): `nbytes` is the whole buffer S, i.e. the all_gather
output, the reduce_scatter input, the all_reduce / broadcast / reduce buffer, the all_to_all
send buffer, the send/recv message.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from emulator.costs.nccl_tuning import GroupGeometry, candidate_times_us
from emulator.hardware import GpuPreset, LinkPreset, NetworkPreset
from emulator.world.collectives import COST_KINDS, TUNED_KINDS, collective

COLLECTIVES = COST_KINDS  # the kinds priced here (emulator.world.collectives)
_BARRIER_BYTES = 4  # torch's NCCL barrier all-reduces one small tensor


@dataclass(frozen=True, kw_only=True)
class Topology:
    """A homogeneous cluster: nodes of `gpus_per_node` GPUs on `link`, joined by `network`."""

    gpu: GpuPreset
    gpus_per_node: int
    link: LinkPreset
    network: NetworkPreset

    def __post_init__(self) -> None:
        if not isinstance(self.gpus_per_node, int) or self.gpus_per_node < 1:
            raise ValueError(f"cluster.gpus_per_node={self.gpus_per_node!r} must be a positive integer")

    @property
    def network_share_GBps(self) -> float:
        """The network bandwidth one GPU gets while every GPU of its node uses the network.

        An SPMD program runs a collective on all of a node's GPUs at once (each in its own group:
        the tp ranks of a stage all reduce their data-parallel gradients together), so with fewer
        NICs than GPUs (BLOOM's Jean Zay nodes: 4 Omni-Path HFIs for 8 A100s) the GPUs that share
        a NIC share its bandwidth. With a NIC per GPU this is one NIC's bandwidth.
        """
        net = self.network
        return net.nic_bandwidth_GBps * min(1.0, net.nics_per_node / self.gpus_per_node)


def bus_bandwidth_factor(kind: str, n: int) -> float:
    """nccl-tests' algbw -> busbw factor for a collective over n ranks."""
    factor = collective(kind).bus_factor
    if factor is None:
        known = tuple(k for k in COST_KINDS if collective(k).bus_factor is not None)
        raise ValueError(f"collective kind={kind!r} has no bus-bandwidth factor; known: {known}")
    return factor(n)


def _per_node_counts(ranks: np.ndarray, topo: Topology) -> np.ndarray:
    ranks = np.asarray(ranks, dtype=np.int64)
    if ranks.ndim != 1 or ranks.size == 0:
        raise ValueError(f"group_ranks must be a non-empty 1-d array of global ranks, got shape {ranks.shape}")
    if ranks.min() < 0 or np.unique(ranks).size != ranks.size:
        raise ValueError("group_ranks must hold distinct non-negative global ranks")
    _, counts = np.unique(ranks // topo.gpus_per_node, return_counts=True)
    return counts


def group_geometry(group_ranks: np.ndarray, topo: Topology) -> GroupGeometry:
    """Nodes spanned, members per node and the bandwidths NCCL's rings and trees would get.

    With k members per node the inter-node traffic runs on min(k, NICs per node) rails
    (rail-optimised), and gets no more than k GPUs' share of the node's NICs while the node's
    other GPUs run their own groups' collectives (`Topology.network_share_GBps`); the
    least-populated node bounds it.
    """
    counts = _per_node_counts(group_ranks, topo)
    nodes, k = counts.size, int(counts.min())
    rails = min(k, topo.network.nics_per_node)
    bw_inter = (
        min(rails * topo.network.nic_bandwidth_GBps, k * topo.network_share_GBps)
        if nodes > 1
        else math.inf
    )
    bw_intra = topo.link.bandwidth_GBps if counts.max() > 1 else bw_inter
    return GroupGeometry(
        n_ranks=int(counts.sum()),
        n_nodes=nodes,
        arch=topo.gpu.arch,
        bw_intra_GBps=bw_intra,
        bw_inter_GBps=bw_inter,
        channels=topo.link.channels,
        # nvls.cc ncclNvlsInit: no NVLS for a communicator of <= 2 GPUs on a node
        nvls=topo.link.nvls and topo.gpu.arch == "hopper" and k > 2,
        extra_intra_lat_us=topo.link.latency_us,
        extra_inter_lat_us=topo.network.latency_us,
    )


def _p2p_times_s(kind: str, nbytes: np.ndarray, group_ranks: np.ndarray, topo: Topology) -> np.ndarray:
    """all_to_all and send/recv: concurrent point-to-point transfers, bounded by the slower path.

    Latency: tuning.cc ring/Simple base latency plus one NVLink or network step (ours: NCCL's
    tuner does not price point-to-point operations).
    """
    counts = _per_node_counts(group_ranks, topo)
    n, nodes, k = int(counts.sum()), counts.size, int(counts.min())
    lat_us = 8.4 + (14.0 + topo.network.latency_us if nodes > 1 else 3.4 + topo.link.latency_us)
    nic_share = min(
        topo.network.nic_bandwidth_GBps * min(k, topo.network.nics_per_node) / k,
        topo.network_share_GBps,
    )
    if kind == "send_recv":
        bw = nic_share if nodes > 1 else topo.link.bandwidth_GBps
        return (lat_us + nbytes / (1000.0 * bw)) * 1e-6
    intra_bytes = nbytes * (k - 1) / n
    inter_bytes = nbytes * (n - k) / n
    t_intra = intra_bytes / (1000.0 * topo.link.bandwidth_GBps)
    t_inter = inter_bytes / (1000.0 * nic_share) if nodes > 1 else 0.0
    return (lat_us + np.maximum(t_intra, t_inter)) * 1e-6


def _check(kind: str) -> None:
    if kind not in COLLECTIVES:
        raise ValueError(f"collective kind={kind!r} is not known; known: {COLLECTIVES}")


def _call_geometry(group_ranks: np.ndarray, topo: Topology, nvls_reduction: bool) -> GroupGeometry:
    """The group's geometry for one call: no NVLS where it cannot run the call's reduction."""
    geometry = group_geometry(group_ranks, topo)
    return geometry if nvls_reduction else replace(geometry, nvls=False)


def collective_times_s(
    kind: str, nbytes, group_ranks: np.ndarray, topo: Topology, *, nvls_reduction: bool = True
) -> np.ndarray:
    """Vectorised over sizes: predicted seconds for each entry of `nbytes` (NCCL's best choice).
    `nvls_reduction`: whether NVLS can run the call's reduce op on its dtype
    (`nccl_tuning.nvls_reduction_supported`); where not, NCCL's tuner never offers it NVLS."""
    _check(kind)
    sizes = np.atleast_1d(np.asarray(nbytes, dtype=float))
    if (sizes < 0).any():
        raise ValueError("nbytes must be >= 0")
    if np.asarray(group_ranks).size == 1:
        return np.zeros(sizes.shape)
    nccl = collective(kind).nccl
    if nccl == "point_to_point":
        return _p2p_times_s(kind, sizes, group_ranks, topo)
    if nccl == "barrier":
        kind, sizes = "all_reduce", np.full(sizes.shape, float(_BARRIER_BYTES))
    candidates = candidate_times_us(kind, sizes, _call_geometry(group_ranks, topo, nvls_reduction))
    return np.min(np.stack(list(candidates.values())), axis=0) * 1e-6


def collective_time_s(
    kind: str, nbytes: float, group_ranks: np.ndarray, topo: Topology, *, nvls_reduction: bool = True
) -> float:
    """Predicted seconds for one collective of `nbytes` over `group_ranks` (`collective_times_s`)."""
    return float(
        collective_times_s(kind, [nbytes], group_ranks, topo, nvls_reduction=nvls_reduction)[0]
    )


def choose_algorithm(
    kind: str, nbytes: float, group_ranks: np.ndarray, topo: Topology, *, nvls_reduction: bool = True
) -> tuple[str, str, float]:
    """(algorithm, protocol, seconds) NCCL's tuner would pick for a tuned collective
    (`nvls_reduction`: `collective_times_s`'s)."""
    _check(kind)
    if kind not in TUNED_KINDS:
        raise ValueError(
            f"collective kind={kind!r} is not chosen by NCCL's tuner; tuned: {TUNED_KINDS}"
        )
    if np.asarray(group_ranks).size == 1:
        return ("none", "none", 0.0)
    geometry = _call_geometry(group_ranks, topo, nvls_reduction)
    candidates = candidate_times_us(kind, np.array([float(nbytes)]), geometry)
    (algo, proto), time_us = min(candidates.items(), key=lambda item: item[1][0])
    return algo, proto, float(time_us[0]) * 1e-6


def bus_bandwidth_GBps(kind: str, nbytes, group_ranks: np.ndarray, topo: Topology) -> np.ndarray:
    """nccl-tests' busbw (GB/s) of the predicted times, for comparison with published tables."""
    sizes = np.atleast_1d(np.asarray(nbytes, dtype=float))
    times = collective_times_s(kind, sizes, group_ranks, topo)
    return sizes / times / 1e9 * bus_bandwidth_factor(kind, np.asarray(group_ranks).size)
