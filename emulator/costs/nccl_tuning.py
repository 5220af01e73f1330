"""NCCL's own cost model (latency + bytes / bandwidth per algorithm and protocol), transcribed.

Every constant here comes from NVIDIA/nccl `src/graph/tuning.cc` at commit b6475625fbca (NCCL
2.20.3; the tuner's NVLS and NVLS_TREE terms, though that release alone turned NVLS off across
nodes, docs/MODELS.md) unless said otherwise; "tuning.cc" below means that file. Latencies are in microseconds, bandwidths in GB/s; NCCL's time is
`lat + nBytes / (1000 * algbw)` microseconds. What NCCL derives from its topology search
(channels, per-channel bandwidth) is replaced by the geometry in `GroupGeometry`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from emulator.world.collectives import NO_TENSOR_DTYPE

ALGORITHMS = ("tree", "ring", "nvls", "nvls_tree")
PROTOCOLS = ("LL", "LL128", "Simple")

# tuning.cc baseLat[algo][proto]
_BASE_LAT_US = {
    "tree": (6.8, 14.0, 0.0),
    "ring": (6.6, 14.0, 8.4),
    "nvls": (0.0, 0.0, 0.0),
    "nvls_tree": (0.0, 0.0, 0.0),
}
# tuning.cc hwLat[NVLINK | NET][algo][proto] (per-step latency)
_HW_LAT_US = {
    "nvlink": {"tree": (0.6, 1.25, 28.0), "ring": (0.6, 1.9, 3.4), "nvls": (0, 0, 23.0), "nvls_tree": (0, 0, 23.0)},
    "net": {"tree": (5.0, 8.5, 28.0), "ring": (2.7, 4.0, 14.0), "nvls": (0, 0, 18.0), "nvls_tree": (0, 0, 14.0)},
}
# tuning.cc llMaxBws[index1][index2]: index1 = GPU arch for one node, CPU vendor (Intel row
# assumed) for several; index2 = nNodes bucket (1, 2, >2).
_LL_MAX_BW = {"ampere": (87.7, 22.5, 19.0), "hopper": (87.7, 22.5, 19.0), "intel-cpu": (39.0, 39.0, 20.4)}
# tuning.cc per-channel caps [arch][nNodes bucket]
_PER_CH_MAX_RING_LL128 = {"ampere": (20.0, 20.0, 20.0), "hopper": (36.7, 36.7, 36.7)}
_PER_CH_MAX_TREE_LL128 = {"ampere": (20.0, 20.0, 20.0), "hopper": (36.7, 36.7, 29.0)}
_PER_CH_MAX_TREE = {"ampere": (24.0, 23.6, 17.8), "hopper": (38.7, 41.4, 36.0)}
# tuning.cc treeCorrectionFactor[proto][log2(nBytes/64)], 64 B .. 256 MB
_TREE_CORRECTION = np.array([
    [1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0],
    [1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0],
    [.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9],
])
_NET_OVERHEAD_US = 1.0  # tuning.cc getNetOverhead: 1 us on Intel x86 (x3 for Simple)
_RING_PLATEAU_LAT = 1.4  # tuning.cc ncclTopoGetAlgoTime: ring/Simple multi-node all-reduce, compCap >= 80
_NVLS_RATIO = 5.0 / 6.0  # tuning.cc: NVLS / NVLS_TREE bus-to-algorithm bandwidth ratio


@dataclass(frozen=True, kw_only=True)
class GroupGeometry:
    """What NCCL's tuner needs to know about one communicator."""

    n_ranks: int
    n_nodes: int
    arch: str  # "ampere" | "hopper"
    bw_intra_GBps: float  # bus bandwidth the intra-node part can carry (NCCL's nChannels * bwIntra)
    bw_inter_GBps: float  # bus bandwidth across nodes (rails used * per-NIC bandwidth); inf in one node
    channels: int
    nvls: bool  # NVLink SHARP available to this group (NVSwitch with SHARP, > 2 GPUs per node)
    extra_intra_lat_us: float = 0.0
    extra_inter_lat_us: float = 0.0

    @property
    def ppn(self) -> float:
        return self.n_ranks / self.n_nodes


def _nsteps(kind: str, n: int) -> int:
    return 2 * (n - 1) if kind == "all_reduce" else n - 1 if kind in ("all_gather", "reduce_scatter") else n


def _n_inter_steps(kind: str, nodes: int) -> int:
    if kind == "all_reduce":
        return 2 * nodes if nodes > 1 else 0
    return nodes - 1 if kind in ("all_gather", "reduce_scatter") else nodes


# src/include/device.h ncclNvlsSupported: the NCCL data types NVLS reduces, with the device
# reductions it runs for each (ncclDevSum, ncclDevMinMax), keyed here by torch's dtype names.
# Types not listed (int8, uint8: torch's float8 travels as uint8 before NCCL 2.24) get none.
_NVLS_REDUCTIONS = {
    **dict.fromkeys(("int32", "uint32", "int64", "uint64", "float16", "bfloat16"), {"SUM", "MIN", "MAX"}),
    **dict.fromkeys(("float32", "float64"), {"SUM"}),
}


def nvls_reduction_supported(reduce_op: str, dtype: str) -> bool:
    """Whether NVLS can run a call of c10d reduce op `reduce_op` ("SUM", "AVG", ...; "" for a
    call that reduces nothing, which NCCL issues as a sum) on torch dtype `dtype`: enqueue.cc
    offers NVLS only where ncclNvlsSupported(op, type) holds, after it turns AVG into a
    pre-multiplied sum (floats) or a sum divided after (integers), neither of which NVLS runs;
    so FSDP2's averaging reduce-scatter never runs on NVLS. A call of no tensor (a barrier,
    which NCCL runs as a float32 sum) or of no recorded dtype is taken as one NVLS can run."""
    if dtype in ("", NO_TENSOR_DTYPE):
        return True
    return (reduce_op or "SUM") in _NVLS_REDUCTIONS.get(dtype, ())


def algorithm_allowed(kind: str, algo: str, geo: GroupGeometry) -> bool:
    """Which (collective, algorithm) pairs tuning.cc considers (CollNet is not modelled)."""
    if algo == "ring":
        return True
    if algo == "tree":
        return kind == "all_reduce"
    if algo == "nvls":
        return geo.nvls and geo.n_nodes == 1 and kind in ("all_reduce", "all_gather", "reduce_scatter")
    return geo.nvls and geo.n_nodes > 1 and kind == "all_reduce"  # nvls_tree


def _bus_bw(kind: str, algo: str, proto: int, geo: GroupGeometry) -> float:
    """tuning.cc's busBw refinements, then the bus -> algorithm bandwidth ratio."""
    bucket = min(geo.n_nodes, 3) - 1
    bw = geo.bw_intra_GBps if geo.n_nodes <= 2 else geo.bw_inter_GBps
    if algo == "tree" and geo.n_nodes == 2:
        # ours, not tuning.cc: its two-node tree runs at the intra-node figure, as if the NICs
        # kept up; they carry S a direction (each tree's half up and the other's down), so
        # algBw (busBw x 0.5) <= B_inter. Binds where a node's rails carry < half of NVLink.
        bw = min(bw, 2 * geo.bw_inter_GBps)
    if algo == "ring":
        bw = min(geo.bw_intra_GBps, geo.bw_inter_GBps)  # a ring crossing nodes runs at its slowest hop
    if algo == "nvls":
        bw = min(geo.bw_intra_GBps, geo.bw_inter_GBps)
    if algo == "nvls_tree":
        bw = min(geo.bw_intra_GBps, geo.bw_inter_GBps if geo.n_nodes <= 2 else geo.bw_inter_GBps / 2)
    ch = geo.channels
    ll_max = _LL_MAX_BW[geo.arch if geo.n_nodes == 1 else "intel-cpu"][bucket]
    if algo == "ring" and proto == 0:
        factor = 0.25 if (geo.n_nodes > 1 or kind in ("all_reduce", "reduce")) else 1.0 / 3.0
        bw = min(ll_max, bw * factor)
    elif algo == "ring" and proto == 1:
        bw = min(bw * (0.7 if geo.ppn < 2 else 0.92), ch * _PER_CH_MAX_RING_LL128[geo.arch][bucket])
    elif algo == "tree":
        bw = min(bw * 0.92, ch * _PER_CH_MAX_TREE[geo.arch][bucket])
        if proto == 0:
            bw = min(bw / 3.8, ll_max)
        elif proto == 1:
            bw = min(bw * (7.0 / 9.0 if geo.n_nodes == 1 else 120.0 / 128.0), ch * _PER_CH_MAX_TREE_LL128[geo.arch][bucket])
    if algo == "ring":
        return bw * geo.n_ranks / _nsteps(kind, geo.n_ranks)
    if algo in ("nvls", "nvls_tree"):
        return bw * _NVLS_RATIO
    return bw * 0.5


def _latency_us(kind: str, algo: str, proto: int, geo: GroupGeometry) -> float:
    lat = _BASE_LAT_US[algo][proto]
    intra = _HW_LAT_US["nvlink"][algo][proto] + geo.extra_intra_lat_us
    inter = _HW_LAT_US["net"][algo][proto] + geo.extra_inter_lat_us
    if proto == 2:
        inter += geo.extra_inter_lat_us  # tuning.cc adds the network latency twice for Simple (flush)
    nodes, n = geo.n_nodes, geo.n_ranks
    if algo == "ring":
        if kind in ("broadcast", "reduce"):
            return lat + (inter if nodes > 1 else intra)  # pipelined chain, sameChannels case
        if nodes > 1:
            intra = max(intra, _NET_OVERHEAD_US * (3 if proto == 2 else 1))
        inter_steps = _n_inter_steps(kind, nodes)
        # tuning.cc counts 2 x nodes network steps of an all-reduce, more than its 2 (n - 1)
        # steps when every node holds one member: no intra-node step is left (tuning.cc's
        # count goes negative there, and an intra-node latency would take time away)
        intra_steps = max(_nsteps(kind, n) - inter_steps, 0)
        return lat + intra_steps * intra + inter_steps * inter
    if algo == "tree":
        return lat + 2 * ((n // nodes - 1) * intra + math.floor(math.log2(nodes)) * inter)
    if algo == "nvls":
        return intra + (inter if nodes > 1 else 0.0)
    return lat + intra + 2 * math.floor(math.log2(nodes)) * inter  # nvls_tree


def candidate_times_us(kind: str, nbytes: np.ndarray, geo: GroupGeometry) -> dict[tuple[str, str], np.ndarray]:
    """Predicted time (us) of every allowed (algorithm, protocol) for each size in `nbytes`."""
    out: dict[tuple[str, str], np.ndarray] = {}
    log_size = np.floor(np.log2(np.maximum(nbytes, 64) / 64)).astype(int)
    for algo in ALGORITHMS:
        if not algorithm_allowed(kind, algo, geo):
            continue
        for proto, proto_name in enumerate(PROTOCOLS):
            if algo in ("nvls", "nvls_tree") and proto_name != "Simple":
                continue
            bw = np.full(nbytes.shape, _bus_bw(kind, algo, proto, geo), dtype=float)
            if bw.flat[0] <= 0:
                continue
            lat = _latency_us(kind, algo, proto, geo)
            if algo == "tree":
                small = log_size < _TREE_CORRECTION.shape[1]
                bw[small] *= _TREE_CORRECTION[proto][log_size[small]]
            lat_arr = np.full(nbytes.shape, lat)
            if algo == "ring" and proto_name == "Simple" and geo.n_nodes > 1 and kind == "all_reduce":
                plateau = nbytes / (geo.channels * geo.n_ranks) >= 64
                lat_arr[plateau] *= _RING_PLATEAU_LAT
            out[(algo, proto_name)] = lat_arr + nbytes / (1000.0 * bw)
    return out
