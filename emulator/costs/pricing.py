"""Prices of a trace's rows: compute durations, overlap slowdowns, collective durations.

What the execution graph asks of the cost models, in one place: `compute_prices` (every
compute row, through `costs.compute.op_price` and an optional kernel table, with which of
exact row / interpolation / roofline priced it; attention through `costs.attention_rates`
where the job runs a kernel the table did not measure),
`row_overlap` (how much a row slows beside running communication, `costs.overlap`) and
`CommPricer` (a collective's or p2p call's duration over its group's ranks,
`costs.collectives`, and the bytes it moves meanwhile). `op_record` reads the cost-model record
of one row from its tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from emulator.capture.trace import COMPUTE, RankTrace
from emulator.costs.attention_rates import AttentionRates
from emulator.costs.collectives import Topology, collective_time_s
from emulator.costs.compute import op_price
from emulator.costs.host_dispatch import HostDispatch
from emulator.costs.kernel_table import PRICE_SOURCES, KernelTable
from emulator.costs.ops import ATTENTION_OPS, GEMM_OPS, OpRecord
from emulator.costs.overlap import compute_slowdown, memory_slowdown_per_Bps, traffic_bytes
from emulator.world.collectives import collective

TORCH_DTYPES = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "float32": "fp32",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
    "float8_e4m3fnuz": "fp8",
    "float8_e5m2fnuz": "fp8",
}


@dataclass(frozen=True, kw_only=True)
class CostContext:
    """What durations are priced on: the cluster, an optional kernel table, overlap on/off,
    an optional host dispatch model (`costs.host_dispatch`), whether tensor parallelism
    runs asynchronously (`costs.overlap.async_tp_exposed_s`, applied by the graph builder to TP
    collectives next to their GEMMs), whether the tp collective of a column-parallel linear's
    input gradient overlaps its weight-gradient GEMMs (Megatron's asynchronous all-reduce,
    `costs.overlap.weight_grad_overlap_exposed_s`, applied by the graph builder), and the
    rates of the attention kernel the job runs when
    it is not the table's (`costs.attention_rates`; None: the table's or the curves'), and
    whether every launch waits for its kernel (CUDA_LAUNCH_BLOCKING=1: the host's time per op
    then adds to each compute op instead of running ahead, `graph.build`), and the seconds a
    stream idles between two kernels, added per kernel an op launches (measured:
    `costs.host_dispatch.kernel_gap_from_figures`; 0 prices kernel time alone), and whether the
    job's blocks are torch.compile'd (their rows then take the host dispatch model's compiled
    figures, applied by the graph builder)."""

    topology: Topology
    table: KernelTable | None = None
    overlap: bool = True
    host: HostDispatch | None = None  # host dispatch per op (None: the host binds nothing)
    async_tp: bool = False
    tp_grad_overlap: bool = False
    attention: AttentionRates | None = None
    launch_blocking: bool = False
    kernel_gap_s: float = 0.0
    compiled: bool = False  # torch.compile'd blocks: their rows' host time is Inductor's launch

    def __post_init__(self) -> None:
        if not self.kernel_gap_s >= 0:
            raise ValueError(f"kernel_gap_s={self.kernel_gap_s!r} must be >= 0")


def op_record(trace: RankTrace, row: int) -> OpRecord:
    """The cost-model record of compute row `row`: name, dtype, flops, bytes, GEMM/attention dims.

    Shapes come from the row's tensors: GEMMs take the last two inputs of rank >= 2 as A, B
    (linear: x[..., k] and W[n, k]); attention takes query and key (the backward's come after
    grad_out). The dtype is the first floating input's."""
    c = trace.columns
    name = trace.strings[c["name"][row]]
    tensors = trace.tensors(row)
    inputs = [(shape, dtype) for shape, dtype, is_out in tensors if not is_out]
    floats = [TORCH_DTYPES[d] for _, d in inputs if d in TORCH_DTYPES]
    dtype = floats[0] if floats else "fp32"
    common = dict(
        name=name,
        dtype=dtype,
        flops=float(c["flops"][row]),
        bytes_read=float(c["read_bytes"][row]),
        bytes_written=float(c["write_bytes"][row]),
        aten=trace.strings[c["aten"][row]],
    )
    if name in GEMM_OPS:
        mats = [s for s, _ in inputs if len(s) >= 2]
        if len(mats) < 2:
            raise ValueError(f"trace row {row} ({name}): needs two matrix inputs, has {inputs}")
        if name == "linear":
            a, w = mats[0], mats[1]
            m, k, n, batch = int(np.prod(a[:-1])), a[-1], w[0], 1
        else:
            a, b = mats[-2], mats[-1]
            m, k, n = a[-2], a[-1], b[-1]
            batch = int(np.prod(a[:-2])) if len(a) > 2 else 1
        if name == "scaled_mm":
            common["dtype"] = "fp8"
        return OpRecord(**common, m=m, n=n, k=k, batch=max(batch, 1))
    if name in ATTENTION_OPS:
        four_d = [s for s, _ in inputs if len(s) == 4]
        offset = 1 if name == "flash_attn_bwd" else 0
        if len(four_d) < offset + 2:
            raise ValueError(f"trace row {row} ({name}): needs query and key inputs, has {inputs}")
        q, k = four_d[offset], four_d[offset + 1]
        return OpRecord(
            **common,
            batch=q[0],
            heads_q=q[1],
            heads_kv=k[1],
            seq_q=q[2],
            seq_kv=k[2],
            head_dim=q[3],
            causal=bool(c["causal"][row]),
        )
    return OpRecord(**common)


def compute_prices(trace: RankTrace, cost: CostContext) -> tuple[np.ndarray, np.ndarray]:
    """Modelled duration of every compute row (0 elsewhere) and how each was priced (an index
    into `kernel_table.PRICE_SOURCES`, -1 for rows that are not compute), once per distinct op.

    Rows are the same op when name, aten op, flops, bytes, causal flag and first tensor's dtype
    agree (dtypes, since the table's rows are per dtype: a bf16 and an fp8 copy of equal bytes
    are different kernels), and for GEMMs and attention, which the table prices by shape, their
    tensors' shapes too (`shape_signatures`: a GEMM and its transpose move the same flops and
    bytes but are measured apart)."""
    c = trace.columns
    rows = np.flatnonzero(c["kind"] == COMPUTE)
    out = np.zeros(len(trace))
    sources = np.full(len(trace), -1, dtype=np.int8)
    if not len(rows):
        return out, sources
    offsets = trace.ragged["tensor_offsets"]
    has_tensors = offsets[rows + 1] > offsets[rows]
    dtypes = np.append(trace.ragged["tensor_dtype"], -1)  # -1: the row has no tensors
    first_dtype = dtypes[np.where(has_tensors, offsets[rows], len(dtypes) - 1)]
    keys = np.stack(
        [
            *(
                c[k][rows].astype(np.int64)
                for k in ("name", "aten", "flops", "read_bytes", "write_bytes", "causal")
            ),
            first_dtype.astype(np.int64),
            shape_signatures(trace, rows),
        ],
        axis=1,
    )
    _, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    priced = [_price(op_record(trace, int(rows[i])), cost) for i in first]
    out[rows] = np.array([t for t, _ in priced])[inverse.reshape(-1)]
    codes = np.array([PRICE_SOURCES.index(s) for _, s in priced], dtype=np.int8)
    sources[rows] = codes[inverse.reshape(-1)]
    return out, sources


def shape_signatures(trace: RankTrace, rows: np.ndarray) -> np.ndarray:
    """Per row of `rows`, an id shared by exactly the GEMM and attention rows whose tensors have
    the same shapes in the same order (0 for every other op: their price reads no shape)."""
    names = {i for i, s in enumerate(trace.strings) if s in GEMM_OPS or s in ATTENTION_OPS}
    shaped = np.flatnonzero(np.isin(trace.columns["name"][rows], list(names)))
    out = np.zeros(len(rows), dtype=np.int64)
    if len(shaped) == 0:
        return out
    r = trace.ragged
    offsets, dims, dim_offsets = r["tensor_offsets"], r["tensor_dims"], r["tensor_dim_offsets"]
    lo, hi = offsets[rows[shaped]], offsets[rows[shaped] + 1]
    tensor_ranks = np.diff(dim_offsets)
    # each row as one fixed-width key: its tensors' ranks, then their dims, padded with -1
    # (no size is negative), so rows with equal keys have equal shapes in the same order
    ranks = _padded(tensor_ranks, lo, hi - lo)
    shapes = _padded(dims, dim_offsets[lo], dim_offsets[hi] - dim_offsets[lo])
    _, inverse = np.unique(np.hstack([ranks, shapes]), axis=0, return_inverse=True)
    out[shaped] = inverse.reshape(-1) + 1
    return out


def _padded(values: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Row i: values[starts[i] : starts[i] + counts[i]], then -1 up to the longest row."""
    width = max(int(counts.max()), 1)
    columns = np.arange(width)
    inside = columns[None, :] < counts[:, None]
    index = np.where(inside, starts[:, None] + columns[None, :], 0)
    taken = values[index] if len(values) else np.zeros(index.shape, dtype=np.int64)
    return np.where(inside, taken, -1).astype(np.int64)


def _price(op: OpRecord, cost: CostContext) -> tuple[float, str]:
    """(duration, price source) of one op: attention by the job's kernel rates when given (rates
    interpolated between published measurements: one kernel; "published-rates", so that they
    are not taken for the table's own interpolation), everything else by `op_price`; plus the
    stream's idle time before each kernel it launches."""
    gpu = cost.topology.gpu
    if cost.attention is not None and op.name in ATTENTION_OPS:
        seconds, source, kernels = cost.attention.time_s(op, gpu), "published-rates", 1.0
    else:
        seconds, source, kernels = op_price(op, gpu, table=cost.table)
    return seconds + kernels * cost.kernel_gap_s, source


def compute_durations_s(trace: RankTrace, cost: CostContext) -> np.ndarray:
    """`compute_prices`' durations alone."""
    return compute_prices(trace, cost)[0]


def price_source_summary(durations: np.ndarray, sources: np.ndarray) -> dict[str, dict[str, float]]:
    """Per price source: how many compute rows it priced and their summed duration (seconds),
    from `compute_prices`' two arrays."""
    return {
        name: {
            "ops": int(np.sum(sources == i)),
            "time_s": float(np.sum(durations[sources == i])),
        }
        for i, name in enumerate(PRICE_SOURCES)
    }


def row_overlap(trace: RankTrace, cost: CostContext | None) -> tuple[np.ndarray, np.ndarray]:
    """How much each row slows beside a running collective (`costs.overlap`), as two arrays:
    the factor of compute-bound rows (GEMMs, attention: the SMs the link's NCCL channels
    take), 1 for memory-bound rows; and what a memory-bound row's factor grows by per byte/s
    of collective traffic beside it (`memory_slowdown_per_Bps`), 0 for compute-bound rows.
    The replay multiplies the second by the traffic of the collectives running then. No cost
    context, or overlap off: factors 1, slopes 0."""
    if cost is None or not cost.overlap:
        return np.ones(len(trace)), np.zeros(len(trace))
    gpu, link = cost.topology.gpu, cost.topology.link
    names = {trace.strings.index(n) for n in (*GEMM_OPS, *ATTENTION_OPS) if n in trace.strings}
    compute_bound = np.isin(trace.columns["name"], list(names))
    s_compute = compute_slowdown(
        gpu, comm_channels=link.channels, comm_GBps=0.0, memory_bound=False
    )
    return (
        np.where(compute_bound, s_compute, 1.0),
        np.where(compute_bound, 0.0, memory_slowdown_per_Bps(gpu)),
    )


class CommPricer:
    """Durations of communication calls over one topology, memoised by (kind, bytes, ranks);
    every call is free when `topology` is None (tests that price compute only)."""

    def __init__(self, topology: Topology | None) -> None:
        self.topology = topology
        self._cache: dict[tuple, float] = {}

    def duration_s(
        self, kind: str, nbytes: float, ranks: np.ndarray, nvls_reduction: bool = True
    ) -> float:
        """`nvls_reduction`: NVLS can run the call's reduce op on its dtype
        (`nccl_tuning.nvls_reduction_supported`)."""
        if self.topology is None:
            return 0.0
        kind = collective(kind).cost_kind
        key = (kind, nbytes, ranks.tobytes(), nvls_reduction)
        if key not in self._cache:
            self._cache[key] = collective_time_s(
                kind, nbytes, ranks, self.topology, nvls_reduction=nvls_reduction
            )
        return self._cache[key]

    def traffic_bytes(self, kind: str, nbytes: float, n_ranks: int, duration_s: float) -> float:
        """Bytes a member moves through its links in a call of `duration_s`
        (`costs.overlap.traffic_bytes`); 0 without a topology or for a kind with no bus
        factor (a barrier)."""
        if self.topology is None or n_ranks < 2:
            return 0.0
        factor = collective(collective(kind).cost_kind).bus_factor
        if factor is None:
            return 0.0
        return traffic_bytes(nbytes, factor(n_ranks), duration_s, self.topology.link.bandwidth_GBps)
