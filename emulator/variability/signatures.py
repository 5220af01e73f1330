"""The signatures a noise source aggregates, each as a NoiseMask that applies it alone.

Issue 18 keys durations by signature; a source (emulator.variability.sources) is coarser, and
`source_signatures` splits one into them:
- compute (op class, input shapes): the source's op class (emulator.costs.kernel_table's
  `op_class`) and the dtypes and shapes of the op's input tensors as the capture records them
  (RankTrace.tensors, inputs in order; a GEMM's activation and weight): a kernel is chosen by
  both, and one shape may run in two dtypes (a master weight's fp32 copy, its bf16 cast). A segment is one draw
  with its rows' summed variance (emulator.variability.monte_carlo), so a signature's mask is,
  per segment, the square root of the summed variance of its rows there: the signatures'
  variances add up to the source's in every segment;
- collective (kind, group, members, bytes): the call's kind and group label (the graph's
  `group`: "dp", "tp", "dp+pp", ...), the group's size in ranks (the trace's `group_size`)
  and the message size the capture records (`size_bytes`, nccl-tests' "size": the full
  buffer, i.e. the gathered output of an all-gather, the unreduced input of a reduce-scatter,
  the tensor of an all-reduce or of a send; emulator.world.comm_events). Not the graph's
  `traffic_bytes`, which is what one member moves through its links: it depends on the
  algorithm and on how much of the call the overlap rules leave exposed;
- pipeline transfers: the same, a send and its recv being one call of 2 members;
- where the job is pipelined, each comm signature also names its stage (the graph class; a
  transfer, the sending stage, where it is drawn): the same call may matter on one stage and
  not on another (a stage whose gradient sync has slack until another stage's backward ends).
  Not a collective spanning stages: its members share one draw, so they are one signature;
- network regime on calls: the same keys as those calls', over the calls the regime reaches
  (the model's `network_scope`).
The per-GPU speed factors have none.

Pre-rank: running every signature alone costs a Monte Carlo each (a source can hold hundreds:
one per GEMM shape), so a split runs the `per_source` largest by the variance their noise
would add along the deterministic replay's critical path, the draws added (`critical_nodes`:
one replay, no sampling): compute, the summed variance of their rows there; per-call comm
noise, the sum of (CV x duration)^2 over their calls there; the network regime, one factor
shared by all calls, (sum of durations)^2 times the variance of the regime factor. Noise off
that path moves the step only where it, or another draw, takes up the slack, so the same
figure over the nodes off the path only breaks ties (a source's signatures that all sit off
it: a hidden call, or one on a stage that waits for another). Without a critical path given,
every node counts as on it. The rest run together as one "other" entry.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from emulator.capture.trace import RankTrace
from emulator.costs.pricing import TORCH_DTYPES
from emulator.graph.execution_graph import COLLECTIVE, RECV, SEND, ExecutionGraph
from emulator.graph.replay import replay
from emulator.variability.model import VariabilityModel
from emulator.variability.monte_carlo import NoiseMask
from emulator.variability.sources import NoiseSource, row_op_classes, variances_by_row_label

OTHER = "other"


@dataclass(frozen=True, eq=False)
class Signature:
    """One signature of a source (or `lumped` of them, OTHER), its mask and its pre-rank."""

    name: str
    mask: NoiseMask
    prerank_variance_s2: float  # module docstring: along the critical path
    nodes: int  # graph nodes its noise is applied on, over all classes
    lumped: int = 1  # signatures it stands for: above 1 for OTHER only
    prerank_off_path_variance_s2: float = 0.0  # the same over the nodes off it: ties only

    @property
    def prerank(self) -> tuple[float, float]:
        return (self.prerank_variance_s2, self.prerank_off_path_variance_s2)


def critical_nodes(graph: ExecutionGraph) -> tuple[np.ndarray, ...]:
    """Per class, which nodes the deterministic replay's critical path goes through, with the
    nodes that hold its draws: a receive's send (a transfer is drawn at its send and the path
    may pass through the receive alone) and every member of a collective spanning stages (one
    draw for all of them)."""
    on_path = [np.zeros(len(c), bool) for c in graph.classes]
    for event in replay(graph).critical_path:
        if event.node < 0:
            continue
        g = graph.classes[event.pp]
        members = [(event.pp, event.node)]
        if g["kind"][event.node] == RECV:
            members.append((int(g["peer_class"][event.node]), int(g["join"][event.node])))
        elif g["kind"][event.node] == COLLECTIVE and g["join"][event.node] >= 0:
            members += graph.join_members(int(g["join"][event.node]))
        for p, node in members:
            on_path[p][node] = True
    return tuple(on_path)


def _split_by_path(values, critical) -> tuple[float, float]:
    """Per class node values summed on the critical path and off it (all on without one)."""
    if critical is None:
        return float(sum(v.sum() for v in values)), 0.0
    on = sum(float(v[c].sum()) for v, c in zip(values, critical, strict=True))
    off = sum(float(v[~c].sum()) for v, c in zip(values, critical, strict=True))
    return on, off


def bytes_text(n: float) -> str:
    """A message size in decimal units, three significant digits: 1.07 GB, 512 kB, 8 B."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def comm_signature(trace: RankTrace, graph_class, node: int) -> tuple[str, str, int, int]:
    """The signature of a comm node: (kind, group, members, bytes); a transfer's kind is
    "send/recv"."""
    row = int(graph_class["first_row"][node])
    c = trace.columns
    kind = "send/recv" if graph_class["kind"][node] == SEND else trace.strings[c["name"][row]]
    group = graph_class.strings[graph_class["group"][node]]
    return kind, group, int(c["group_size"][row]), int(c["size_bytes"][row])


def comm_signature_name(key: tuple, exact: bool = False) -> str:
    """ "all_gather on dp (256 members), 1.07 GB", then ", stage 2" where the key names one
    (kind, group, members, bytes[, stage]); `exact`: the bytes in full."""
    kind, group, members, nbytes, *stage = key
    size = f"{nbytes:,} B" if exact else bytes_text(nbytes)
    where = f", stage {stage[0]}" if stage else ""
    return f"{kind} on {group} ({members} members), {size}{where}"


def _shape_names(trace: RankTrace, rows: np.ndarray) -> list[str]:
    """Each row's input tensors, dtype and shape, as one string: "bf16[8192, 4096] x
    bf16[4096, 4096]" (the cost model's dtype names, emulator.costs.pricing; torch's for the
    others, "int64[8192]")."""
    r = trace.ragged
    off, dim_off, dims = r["tensor_offsets"], r["tensor_dim_offsets"], r["tensor_dims"]
    outputs, dtypes = r["tensor_is_output"], r["tensor_dtype"]
    names = []
    for row in rows.tolist():
        shapes = [
            TORCH_DTYPES.get(trace.strings[dtypes[t]], trace.strings[dtypes[t]])
            + "[" + ", ".join(map(str, dims[dim_off[t] : dim_off[t + 1]].tolist())) + "]"
            for t in range(off[row], off[row + 1])
            if not outputs[t]
        ]
        names.append(" x ".join(shapes) or "no inputs")
    return names


def compute_signature_variances_s2(
    graph: ExecutionGraph,
    traces: dict[int, RankTrace],
    spreads_s: dict[int, np.ndarray],
    op_class_name: str,
) -> dict[str, tuple[np.ndarray, ...]]:
    """Per signature of op class `op_class_name` ("gemm bf16[8192, 4096] x bf16[4096, 4096]"): per
    graph class, each node's variance (s^2) from that signature's rows; summed over signatures
    they give the class's part of the graph's `variance_s2` (sources.op_class_variances_s2)."""
    def shapes_of_the_class(trace: RankTrace, rows: np.ndarray) -> np.ndarray:
        labels = np.full(len(rows), None, dtype=object)
        mine = row_op_classes(trace, rows) == op_class_name
        labels[mine] = _shape_names(trace, rows[mine])
        return labels

    parts = variances_by_row_label(graph, traces, spreads_s, shapes_of_the_class)
    return {f"{op_class_name} {k}": v for k, v in parts.items()}


def comm_signature_nodes(
    graph: ExecutionGraph, traces: dict[int, RankTrace], selected: tuple[np.ndarray, ...]
) -> dict[str, tuple[np.ndarray, ...]]:
    """Per signature (`comm_signature_name`, the bytes in full where two sizes print alike;
    the stage where the graph has several classes, but for a collective spanning stages: its
    members share one draw, so they are one signature) of the comm nodes `selected` (per
    class, per node): per class, which of them have it."""
    out: dict[tuple, list[np.ndarray]] = {}
    staged = len(graph.classes) > 1
    for p, g in enumerate(graph.classes):
        for node in np.flatnonzero(selected[p]).tolist():
            stage = (p,) if staged and g["join"][node] < 0 else ()
            key = comm_signature(traces[p], g, node) + stage
            out.setdefault(key, [np.zeros(len(c), bool) for c in graph.classes])[p][node] = True
    names = [comm_signature_name(key) for key in out]
    return {
        comm_signature_name(key, exact=names.count(comm_signature_name(key)) > 1): tuple(masks)
        for key, masks in sorted(out.items())
    }


def _noisy_comm(source: NoiseSource, graph: ExecutionGraph, model: VariabilityModel):
    """Per class, the comm nodes whose noise `source` applies: its per-call noise (a
    collective or pipeline source) or the network regime (a network one), with a duration."""
    mask, out = source.mask, []
    for p, c in enumerate(graph.classes):
        kind = c["kind"]
        comm = ((kind == COLLECTIVE) | (kind == SEND)) & (c["duration_s"] > 0)
        if source.category == "network":
            per_class = mask.network_comm
            comm &= model.regime_reaches(c)
        else:
            per_class = mask.comm
        out.append(comm & (True if per_class is None else np.asarray(per_class[p], bool)))
    return tuple(out)


def _comm_prerank_s2(source, graph, model, masks, critical) -> tuple[float, float]:
    durations = [
        np.where(m, c["duration_s"], 0.0) for c, m in zip(graph.classes, masks, strict=True)
    ]
    if source.category == "network":
        factors = np.array([r.factor for r in model.network])
        weights = np.array([r.probability for r in model.network])
        spread = float(np.average((factors - np.average(factors, weights=weights)) ** 2,
                                  weights=weights))  # fmt: skip
        on, off = _split_by_path(durations, critical)
        return on**2 * spread, off**2 * spread
    cv = model.pipeline_transfer_cv if source.category == "pipeline" else model.collective_cv
    on, off = _split_by_path([d**2 for d in durations], critical)
    return on * cv**2, off * cv**2


def source_signatures(
    source: NoiseSource,
    graph: ExecutionGraph,
    model: VariabilityModel,
    traces: dict[int, RankTrace],
    spreads_s: dict[int, np.ndarray],
    critical: tuple[np.ndarray, ...] | None = None,
) -> tuple[Signature, ...]:
    """Every signature of `source` (module docstring), largest pre-rank first (then by
    name), along `critical` (`critical_nodes`; None: every node counts as on the path); none
    for the per-GPU speed factors."""
    found, field = [], _field(source)
    if source.category == "compute" and source.op_class is not None:
        parts = compute_signature_variances_s2(graph, traces, spreads_s, source.op_class)
        for name, variances in parts.items():
            if not any(v.any() for v in variances):
                continue
            std = tuple(np.sqrt(v) for v in variances)
            on, off = _split_by_path(variances, critical)
            found.append(Signature(name, replace(source.mask, **{field: std}), on,
                                   sum(int((v > 0).sum()) for v in variances),
                                   prerank_off_path_variance_s2=off))  # fmt: skip
    elif source.category in ("collective", "pipeline", "network"):
        noisy = _noisy_comm(source, graph, model)
        for name, masks in comm_signature_nodes(graph, traces, noisy).items():
            on, off = _comm_prerank_s2(source, graph, model, masks, critical)
            found.append(Signature(name, replace(source.mask, **{field: masks}), on,
                                   sum(int(m.sum()) for m in masks),
                                   prerank_off_path_variance_s2=off))  # fmt: skip
    return tuple(sorted(found, key=lambda s: (-s.prerank[0], -s.prerank[1], s.name)))


def _field(source: NoiseSource) -> str:
    """The NoiseMask field that a signature of `source` narrows."""
    if source.category == "compute":
        return "segment_std_s"
    return "network_comm" if source.category == "network" else "comm"


def split_source(
    source: NoiseSource, signatures: tuple[Signature, ...], per_source: int
) -> tuple[Signature, ...]:
    """The `per_source` first of `source`'s `signatures` (pre-ranked) and one OTHER entry
    applying the rest together (their variances added, their calls joined); all of them where
    at most one would be left over."""
    if per_source < 1:
        raise ValueError(f"per_source={per_source!r} must be >= 1")
    if len(signatures) <= per_source + 1:
        return signatures
    kept, rest = signatures[:per_source], signatures[per_source:]
    field = _field(source)
    parts = [getattr(s.mask, field) for s in rest]
    if field == "segment_std_s":
        joined = tuple(
            np.sqrt(sum(np.square(s) for s in per_class)) for per_class in zip(*parts, strict=True)
        )
    else:
        joined = tuple(np.logical_or.reduce(per_class) for per_class in zip(*parts, strict=True))
    other = Signature(f"{OTHER} ({len(rest)} signatures)", replace(source.mask, **{field: joined}),
                      sum(s.prerank_variance_s2 for s in rest), sum(s.nodes for s in rest),
                      lumped=len(rest),
                      prerank_off_path_variance_s2=sum(s.prerank_off_path_variance_s2 for s in rest))  # fmt: skip
    return (*kept, other)
