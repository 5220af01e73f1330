"""ExecutionGraph: the whole job as one compact event table per class, built from class traces.

A class is a pipeline rank (world.py); its graph is built once from the representative's
RankTrace and its *lanes* are the class's member ranks, shaped like the world's lane axes (the
mesh without pp: (dp, cp, tp) for the job contract). Nodes, in program
order (which is a topological order within the class):

- `compute`: a *segment*, consecutive compute ops of one stream with nothing in between that
  the stream has to wait for or that waits for the stream (a collective issued from it, a wait
  on it), and the same phase and micro-batch; its duration is the sum of the ops'.
- `collective`: one collective call, on the comm stream of its process group (NCCL runs each
  communicator on its own stream). It is enqueued when issued: it starts no earlier than the
  end of the node before it on the *issuing* stream (torch records an event on the current
  stream and makes the NCCL stream wait on it) and the end of the previous call on its own
  comm stream. The issuing stream is the one the program was on when it made the call (the
  trace's `stream` of the comm row, emulator/capture/streams.py).
- `send` / `recv`: point-to-point calls on a stream per (group, peer, direction): torch keeps
  one NCCL communicator per pair of p2p ranks, which runs the calls of one direction in order
  and a send beside a receive (the pipeline schedules post them together with
  `batch_isend_irecv`, NCCL's "sendrecv": full-duplex links carry both at once). The k-th
  send from class a to class b is the k-th recv at b from a (NCCL matches p2p calls in order
  on a communicator).
- `wait`: zero-length node on the issuing stream that makes it wait for a collective or p2p
  (`WaitEvent`; a blocking call that has no WaitEvent gets one right after it), or, for a
  stream wait (`stream.wait_event` / `wait_stream`, e.g. FSDP2's compute stream waiting for
  its all-gather stream), for the last node of the other stream at the recorded event.

Joins: a collective over lane axes inside the class (dp, cp, tp, or combinations) joins the
lanes along those axes; one whose group spans several pp indices (grad-norm all-reduce over
pp, tied embeddings between the first and last stage) joins the matching node of each member
class: the k-th collective with the same (kind, in-class axes, pp indices) in each of them.
The optimizer step is ordinary compute (phase "optimizer").

Async tensor parallelism (`CostContext.async_tp`, `async_tp_pairs`): a tp-group all-gather
and the GEMMs that consume it, and a GEMM and the tp-group reduce-scatter of its output, run
as torch's micro-pipelined fused ops; the collective's node keeps only the time the overlap
rule (`costs.overlap.async_tp_exposed_s`) leaves beyond the GEMMs, so that the compute stream,
which waits for the all-gather and then runs its GEMMs (or runs the GEMM and then waits for the
reduce-scatter), spends the fused op's time.

Megatron's asynchronous input-gradient collective (`CostContext.tp_grad_overlap`,
`weight_grad_pairs`): a backward tp-group all-reduce or reduce-scatter of a column-parallel
input's gradient runs, in Megatron-LM, while the weight-gradient GEMMs of the linears that
read that input compute; the workloads' program issues it after them, so its node keeps only
the time the overlap rule (`costs.overlap.weight_grad_overlap_exposed_s`) leaves beyond them.

Durations are not this module's business: it asks emulator.costs.pricing for every compute
row's duration and overlap slowdown (or takes durations given per trace row, e.g. measured)
and for each collective's duration over the representative's group, or over the lane's group
that straddles nodes where the class's groups sit on them differently (`_Builder.slowest_s`);
replay applies a segment's slowdown to the part of it that overlaps running comm: its
compute-bound ops' factor (`slowdown`) plus its memory-bound ops' share times the traffic of the
collectives running then (`memory_slowdown_per_Bps` x bytes/s; a collective's `traffic_bytes`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from emulator.capture.compile_fusion import block_region
from emulator.capture.trace import COMM, COMPUTE, PHASES, RECORD, STREAM_WAIT, WAIT, RankTrace
from emulator.costs.host_dispatch import dispatch_times_s
from emulator.costs.nccl_tuning import nvls_reduction_supported
from emulator.costs.ops import GEMM_OPS
from emulator.costs.overlap import async_tp_exposed_s, weight_grad_overlap_exposed_s
from emulator.costs.pricing import (
    CommPricer,
    CostContext,
    compute_durations_s,
    op_record,
    row_overlap,
)
from emulator.graph.execution_graph import (
    COLLECTIVE,
    NODE_COLUMNS,
    RECV,
    SEGMENT,
    SEND,
    WAIT_NODE,
    ClassGraph,
    ExecutionGraph,
)
from emulator.world.collectives import collective
from emulator.world.mesh import PIPELINE_AXIS, World

# ---- groups ----------------------------------------------------------------------------------


def axes_of_group(world: World, ranks: np.ndarray) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """(lane axes the group spans, pp indices it holds) for a group given by global ranks.

    The group must be a full mesh group along its lane axes at every pp index it holds (what
    DeviceMesh builds, and the tied-embedding group {first, last stage}); anything else is
    refused rather than guessed."""
    coords = world.coords(ranks)
    pps = tuple(sorted(set(world.class_of(ranks).tolist())))
    varies = (coords != coords[0]).any(axis=0)
    axes = tuple(a for a, v in zip(world.names, varies, strict=True) if v and a != PIPELINE_AXIS)
    size = int(np.prod([world.size(a) for a in axes])) * len(pps)
    if size != len(np.unique(ranks)):
        raise ValueError(
            f"group of {len(ranks)} ranks spans axes {axes} at pp {pps} but is not a full mesh group "
            f"(expected {size} ranks); such groups are not supported by the replay"
        )
    return axes, pps


def _group_label(world: World, axes: tuple[str, ...], pps: tuple[int, ...]) -> str:
    named = [a for a in world.names if a in axes or (a == PIPELINE_AXIS and len(pps) > 1)]
    return "+".join(named) if named else "self"


# ---- async tensor parallelism ------------------------------------------------------------------

_AG, _RS = "all_gather", "reduce_scatter"


def _tp_groups(trace: RankTrace, world: World) -> set[int]:
    """String ids of the trace's groups that are exactly one tp group."""
    found = set()
    for gid, ranks in trace.groups().items():
        try:
            axes, pps = axes_of_group(world, ranks)
        except ValueError:
            continue
        if axes == ("tp",) and len(pps) == 1:
            found.add(trace.strings.index(gid))
    return found


def _gemm_numels(trace: RankTrace, row: int) -> tuple[int, int]:
    """(elements of a GEMM row's first operand, of its output)."""
    op = op_record(trace, row)
    return op.m * op.k * op.batch, op.m * op.n * op.batch


_COMPILED_BLOCK = block_region("layers")  # torchtitan compiles each of `model.layers`


def async_tp_pairs(
    trace: RankTrace, world: World, region_of: Callable[[str], str] = _COMPILED_BLOCK
) -> dict[int, list[int]]:
    """Trace row of each tp-group collective that async TP fuses -> the GEMM rows it overlaps.

    What torch's micro-pipeline TP pass (torch/_inductor/fx_passes/micro_pipeline_tp.py)
    matches, read from the trace in program order, in compiled code only (an Inductor pass:
    GEMMs whose module `region_of` places in a compiled block, torchtitan's `layers.<i>`; its
    output layer runs eager). An all-gather's consumers are the GEMM rows after it, up to the
    next collective other than a one-element all-reduce (torchao's amax synchronisation of an
    fp8 cast), whose first operand holds as many elements as the gathered buffer (the
    gathered tensor itself, or its reassembly by `cat` when the gather dim is not 0, or its fp8
    cast). A reduce-scatter's producer is the compute row just before it, or before the `cat`
    that lays out a scatter along a dim > 0 (torch's pass matches `cat(split(mm))` too), if it
    is a GEMM whose output holds as many elements as the scattered buffer; an add in between,
    as when autograd sums the gradients of q, k and v, leaves the pair unfused. A
    weight-gradient GEMM that reads a gathered gradient transposed has the same count and is
    taken as a consumer, which torch's pass does not fuse: the overlap is then
    overestimated."""
    c = trace.columns
    kinds, names = c["kind"], c["name"]
    gemm_ids = {trace.strings.index(n) for n in GEMM_OPS if n in trace.strings}
    ag = trace.strings.index(_AG) if _AG in trace.strings else -1
    rs = trace.strings.index(_RS) if _RS in trace.strings else -1
    tp = _tp_groups(trace, world)
    modules = c["module"]
    compiled = {m for m in np.unique(modules).tolist() if region_of(trace.strings[m])}
    ar = trace.strings.index("all_reduce") if "all_reduce" in trace.strings else -1
    cat = trace.strings.index("aten.cat") if "aten.cat" in trace.strings else -1

    def _amax_sync(r: int) -> bool:  # torchao's one-element amax all-reduce of an fp8 cast
        return names[r] == ar and c["numel"][r] <= 1

    comm_rows = np.flatnonzero(kinds == COMM)
    compute_rows = np.flatnonzero(kinds == COMPUTE)
    sync_rows = np.flatnonzero((kinds == COMM) | (kinds == WAIT))
    pairs: dict[int, list[int]] = {}
    for k, row in enumerate(comm_rows.tolist()):
        if c["group"][row] not in tp or names[row] not in (ag, rs):
            continue
        numel = int(c["numel"][row])
        if names[row] == ag:
            later = [r for r in comm_rows[k + 1 :].tolist() if not _amax_sync(r)]
            end = later[0] if later else len(kinds)
            rows = [
                r
                for r in range(row + 1, end)
                if kinds[r] == COMPUTE
                and names[r] in gemm_ids
                and modules[r] in compiled
                and _gemm_numels(trace, r)[0] == numel
            ]
        else:
            j = int(np.searchsorted(compute_rows, row)) - 1
            if j > 0 and c["aten"][compute_rows[j]] == cat:
                j -= 1  # the cat that lays out a scatter along a dim > 0
            last = int(compute_rows[j]) if j >= 0 else -1
            synced = np.searchsorted(sync_rows, last, "right") < np.searchsorted(sync_rows, row)
            rows = (
                [last]
                if last >= 0
                and names[last] in gemm_ids
                and modules[last] in compiled
                and not synced
                and _gemm_numels(trace, last)[1] == numel
                else []
            )
        if rows:
            pairs[row] = rows
    return pairs


_LINEAR_GEMMS = ("mm", "addmm")  # what a linear layer's forward and backward GEMMs record


def weight_grad_pairs(trace: RankTrace, world: World) -> dict[int, list[int]]:
    """Backward tp-group all-reduce / reduce-scatter row -> the weight-gradient GEMM rows that
    Megatron overlaps it with.

    Read from the trace in program order. The collective's input holds a full activation (its
    `numel`); the linears behind it are those whose backward, since the previous communication
    row, produced such a gradient (a wait row does not end the window: Megatron's backward
    all-gather of a sequence-parallel input, `kernels.sp_regather`, is waited between a linear's
    two GEMMs): a GEMM (mm/addmm) with that many output elements is an input-gradient GEMM, and
    its weight-gradient GEMM is the GEMM next to it (after it, else before it: autograd runs the
    two of one linear back to back) that reads the same output gradient (as many first-operand
    elements). Every linear of a sub-block counts (the
    workloads' separate q, k and v stand for Megatron's fused QKV linear). Row-parallel linears'
    input gradients are sharded, so they do not match, unless a micro-batch's tokens equal the
    linear's local input width (h/tp, ffn/tp): shapes alone cannot tell that one apart."""
    c = trace.columns
    kinds, names = c["kind"], c["name"]
    linear = {trace.strings.index(n) for n in _LINEAR_GEMMS if n in trace.strings}
    backward = PHASES.index("backward")
    wanted = {trace.strings.index(k) for k in ("all_reduce", _RS) if k in trace.strings}
    tp = _tp_groups(trace, world)
    pairs: dict[int, list[int]] = {}
    window: list[int] = []  # linear GEMM rows since the last comm
    for row in np.flatnonzero((kinds == COMPUTE) | (kinds == COMM)).tolist():
        if kinds[row] == COMPUTE:
            if names[row] in linear:
                window.append(row)
            continue
        if (
            kinds[row] == COMM
            and names[row] in wanted
            and c["group"][row] in tp
            and c["phase"][row] == backward
        ):
            wgrads = _weight_grads(trace, window, int(c["numel"][row]))
            if wgrads:
                pairs[row] = wgrads
        window = []
    return pairs


def _weight_grads(trace: RankTrace, gemms: list[int], numel: int) -> list[int]:
    """The weight-gradient GEMMs paired with the input-gradient GEMMs (output: `numel`)."""
    shapes = [_gemm_numels(trace, r) for r in gemms]
    used: set[int] = set()
    partners: list[int] = []
    for i, (first, out) in enumerate(shapes):
        if i in used or out != numel:
            continue
        for j in (i + 1, i - 1):
            if 0 <= j < len(gemms) and j not in used and shapes[j][0] == first:
                used.update((i, j))
                partners.append(gemms[j])
                break
    return sorted(partners)


# ---- building --------------------------------------------------------------------------------


class _Builder:
    """Walks one class trace in program order and emits nodes (see module docstring)."""

    def __init__(
        self,
        trace: RankTrace,
        world: World,
        pp: int,
        durations_s,
        slowdowns,
        memory_slopes,
        comm,
        spreads_s,
    ):
        self.trace, self.world, self.pp, self.comm = trace, world, pp, comm
        self.rep = world.representative(pp)
        self.durations, self.slowdowns, self.spreads = durations_s, slowdowns, spreads_s
        self.memory_slopes = memory_slopes
        self.cols = {k: [] for k in NODE_COLUMNS}
        self.slow_weight: list[float] = []
        self.slope_weight: list[float] = []
        self.streams: dict[object, int] = {}
        self.labels: list[str] = []
        self.strings: dict[str, int] = {"": 0}
        self.last_on_stream: dict[int, int] = {}
        self.open_segment: dict[int, int] = {}
        self.node_of_seq: dict[int, int] = {}
        self.recorded: dict[int, int] = {}  # stream event id -> last node of its stream then
        self.pp_keys: list[tuple] = []  # per collective node spanning pp: its match key
        self.groups = trace.groups()
        self.group_info: dict[str, tuple] = {}
        self.placed: dict[object, np.ndarray] = {}  # group key -> one group of each placement
        # group key -> 1 where some placement of it spans several nodes (set with placed)
        self.spans_nodes: dict[object, int] = {}
        # async TP: collective row -> summed duration of the GEMMs it overlaps
        self.async_tp: dict[int, float] = {}
        # Megatron's async input-gradient collective row -> (weight-gradient GEMM seconds, their
        # mean slowdown beside communication)
        self.weight_grad_overlap: dict[int, tuple[float, float]] = {}

    def intern(self, s: str) -> int:
        return self.strings.setdefault(s, len(self.strings))

    def stream(self, key, label: str) -> int:
        if key not in self.streams:
            self.streams[key] = len(self.streams)
            self.labels.append(label)
        return self.streams[key]

    def add(self, **values) -> int:
        i = len(self.cols["kind"])
        s = values["stream"]
        values.setdefault("prev", self.last_on_stream.get(s, -1))
        self.last_on_stream[s] = i
        for k in NODE_COLUMNS:
            self.cols[k].append(values.get(k, -1 if k in _MINUS_ONE else 0))
        self.slow_weight.append(0.0)
        self.slope_weight.append(0.0)
        return i

    def build(self) -> ClassGraph:
        c = self.trace.columns
        kinds = c["kind"]
        rows = np.flatnonzero(
            (kinds == COMPUTE)
            | (kinds == COMM)
            | (kinds == WAIT)
            | (kinds == RECORD)
            | (kinds == STREAM_WAIT)
        )
        lists = {
            k: c[k][rows].tolist()
            for k in ("kind", "stream", "phase", "micro_batch", "flops", "seq")
        }
        durs, slows = self.durations[rows].tolist(), self.slowdowns[rows].tolist()
        slopes = self.memory_slopes[rows].tolist()
        variances = (self.spreads[rows] ** 2).tolist()
        waited = set(c["comm_seq"][kinds == WAIT].tolist())
        tags = c["tag"][rows].tolist()
        cols, weight, slope_weight = self.cols, self.slow_weight, self.slope_weight
        for j, row in enumerate(rows.tolist()):
            kind = lists["kind"][j]
            s_trace = lists["stream"][j]
            s = self.stream(("compute", s_trace), f"compute {s_trace}")
            if kind == COMPUTE:
                n = self.segment_for(row, s, lists["phase"][j], lists["micro_batch"][j])
                cols["duration_s"][n] += durs[j]
                cols["variance_s2"][n] += variances[j]
                weight[n] += durs[j] * slows[j]
                slope_weight[n] += durs[j] * slopes[j]
                cols["flops"][n] += lists["flops"][j]
                cols["rows"][n] += 1
            elif kind == COMM:
                n = self.comm_node(row, s, lists["phase"][j], lists["micro_batch"][j])
                self.node_of_seq[lists["seq"][j]] = n
                if not c["async_op"][row] and lists["seq"][j] not in waited:
                    self.wait_node(row, s, n)
            elif kind == WAIT:
                self.wait_node(row, s, self.node_of_seq[int(c["comm_seq"][row])])
            elif kind == RECORD:
                self.open_segment.pop(s, None)  # later ops must not join the recorded node
                self.recorded[tags[j]] = self.last_on_stream.get(s, -1)
            elif self.recorded.get(tags[j], -1) >= 0:  # STREAM_WAIT on something recorded
                self.wait_node(row, s, self.recorded[tags[j]])
        for n, w in enumerate(weight):
            if cols["kind"][n] == SEGMENT and cols["duration_s"][n] > 0:
                cols["slowdown"][n] = w / cols["duration_s"][n]
                cols["memory_slowdown_per_Bps"][n] = slope_weight[n] / cols["duration_s"][n]
        nodes = {k: np.asarray(v, dtype=NODE_COLUMNS[k]) for k, v in cols.items()}
        return ClassGraph(
            pp=self.pp, nodes=nodes, streams=tuple(self.labels), strings=tuple(self.strings)
        )

    def segment_for(self, row: int, stream: int, phase: int, mb: int) -> int:
        """The open compute segment of `stream`, or a new one where the phase or micro-batch
        changes."""
        cols = self.cols
        n = self.open_segment.get(stream)
        if n is None or cols["phase"][n] != phase or cols["micro_batch"][n] != mb:
            label = (
                f"{PHASES[phase] if phase >= 0 else 'compute'} mb{mb}"
                if mb >= 0
                else (PHASES[phase] if phase >= 0 else "compute")
            )
            n = self.add(
                kind=SEGMENT,
                stream=stream,
                name=self.intern(label),
                first_row=row,
                phase=phase,
                micro_batch=mb,
                slowdown=1.0,
            )
            self.open_segment[stream] = n
        return n

    def wait_node(self, row: int, issuing: int, target: int) -> None:
        self.open_segment.pop(issuing, None)
        self.add(
            kind=WAIT_NODE,
            stream=issuing,
            name=self.intern("wait"),
            first_row=row,
            rows=1,
            dep=target,
            slowdown=1.0,
            phase=self.cols["phase"][target],
            micro_batch=self.cols["micro_batch"][target],
        )

    def slowest_s(
        self, key, kind: str, nbytes: float, ranks: np.ndarray, axes, nvls_reduction: bool = True
    ) -> float:
        """The call's duration in the slowest lane: every member of the class makes it in its
        own group (`World.lane_groups`), and where the groups sit on the nodes differently
        the lanes that straddle two nodes finish last, holding the others at the next
        collective they share. `key` names the group (`ranks`, over lane axes `axes`);
        `nvls_reduction`: `CommPricer.duration_s`'s."""
        if key not in self.placed:
            placed = self.world.placements(self.world.lane_groups(ranks, axes))
            self.placed[key] = placed
            # asked per call instead, this was 20 % of building a 128-micro-batch graph
            node_counts = (np.unique(self.world.node_of(g)).size for g in placed)
            self.spans_nodes[key] = int(any(n > 1 for n in node_counts))
        return max(self.comm.duration_s(kind, nbytes, g, nvls_reduction) for g in self.placed[key])

    def comm_node(self, row: int, issuing: int, phase: int, mb: int) -> int:
        c, strings = self.trace.columns, self.trace.strings
        kind = strings[c["name"][row]]
        gid = strings[c["group"][row]]
        ranks = self.groups[gid]
        self.open_segment.pop(issuing, None)
        base = dict(
            first_row=row,
            rows=1,
            phase=phase,
            micro_batch=mb,
            slowdown=1.0,
            issue=self.last_on_stream.get(issuing, -1),
        )
        base["issue_stream"] = issuing if base["issue"] >= 0 else -1
        nbytes = float(c["size_bytes"][row])
        if collective(kind).joins == "peer":
            peer = int(c["peer"][row])
            if self.world.lane_of(peer) != self.world.lane_of(self.rep):
                offset = self.world.coords(peer)[0] - self.world.coords(self.rep)[0]
                raise ValueError(
                    f"class {self.pp}: {kind} to rank {peer} is not along {PIPELINE_AXIS} "
                    f"(offset {offset})"
                )
            peer_class = self.world.class_of(peer)
            arrow = "->" if kind == "send" else "<-"
            s = self.stream(("p2p", gid, peer_class, kind), f"p2p {gid} {arrow} pp{peer_class}")
            duration = self.slowest_s(("p2p", peer), kind, nbytes, np.array([self.rep, peer]), ())
            return self.add(
                kind=SEND if kind == "send" else RECV,
                stream=s,
                name=self.intern(kind),
                group=self.intern("pp"),
                duration_s=duration,
                traffic_bytes=self.comm.traffic_bytes(kind, nbytes, 2, duration),
                crosses_nodes=self.spans_nodes[("p2p", peer)],
                peer_class=peer_class,
                **base,
            )
        axes, pps = self.group_info.get(gid) or self.group_info.setdefault(
            gid, axes_of_group(self.world, ranks)
        )
        label = _group_label(self.world, axes, pps)
        s = self.stream(("group", gid), f"comm {gid} ({label})")
        mask = sum(1 << self.world.lane_axes.index(a) for a in axes)
        nvls = nvls_reduction_supported(strings[c["reduce_op"][row]], strings[c["dtype"][row]])
        duration = call_s = self.slowest_s(gid, kind, nbytes, ranks, axes, nvls)
        if row in self.async_tp:
            duration = async_tp_exposed_s(duration, self.async_tp[row], len(ranks))
        if row in self.weight_grad_overlap:
            duration = weight_grad_overlap_exposed_s(duration, *self.weight_grad_overlap[row])
        # a node that keeps only the exposed part of its call moves that part of its bytes, at
        # the call's rate (the rest move beside the GEMMs: Megatron's rule slows them by the
        # factor beside comm, async TP's takes no slowdown)
        traffic = self.comm.traffic_bytes(kind, nbytes, len(ranks), call_s)
        traffic *= duration / call_s if call_s > 0 else 0.0
        n = self.add(
            kind=COLLECTIVE,
            stream=s,
            name=self.intern(kind),
            group=self.intern(label),
            duration_s=duration,
            traffic_bytes=traffic,
            crosses_nodes=self.spans_nodes[gid],
            axes=mask,
            **base,
        )
        if len(pps) > 1:
            self.pp_keys.append((n, (kind, axes, pps)))
        return n


def segment_rows(trace: RankTrace, graph: ClassGraph) -> tuple[np.ndarray, np.ndarray]:
    """(trace rows, segment node of each): every compute row of `trace` and the segment of
    `graph` (built from `trace`) that holds it, grouped by segment in node order.

    A segment holds `rows` consecutive compute rows of its stream from `first_row` on (the
    builder closes a stream's segment only at events that are not compute rows)."""
    c = trace.columns
    comp = np.flatnonzero(c["kind"] == COMPUTE)
    comp = comp[np.lexsort((comp, c["stream"][comp]))]  # by stream, then in trace order
    where = np.zeros(len(c["kind"]), np.int64)
    where[comp] = np.arange(len(comp))
    seg = np.flatnonzero(graph["kind"] == SEGMENT)
    count = graph["rows"][seg]
    node = np.repeat(seg, count)
    k = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
    return comp[np.repeat(where[graph["first_row"][seg]], count) + k], node


_MINUS_ONE = {"prev", "issue", "issue_stream", "dep", "join", "peer_class"}


def build_graph(
    traces_by_class: dict[int, RankTrace],
    world: World,
    cost: CostContext | None,
    *,
    durations_s: dict[int, np.ndarray] | None = None,
    spreads_s: dict[int, np.ndarray] | None = None,
    comm_durations: bool = True,
    dispatch_s: dict[int, np.ndarray] | None = None,
) -> ExecutionGraph:
    """The ExecutionGraph of the job from one trace per class (pp index).

    `durations_s[p]` (optional, one entry per trace row) replaces the modelled compute
    durations of class p (measured kernels, or tests); `cost` may then be None, and comm is
    free unless `cost` is given. `spreads_s[p]` (optional, one entry per trace row): the
    standard deviation of each compute row's duration; a segment's `variance_s2` sums their
    squares (emulator.variability). `comm_durations=False` makes every comm free (tests).
    `dispatch_s[p]` (optional, one entry per trace row): the host seconds spent issuing each
    row (emulator.costs.host_dispatch); without it, `cost.host` prices them, and with neither
    the host binds nothing (`host_bounds`). With `cost.launch_blocking` the host cannot run
    ahead: a compute row's dispatch time adds to its duration instead (a collective's call
    time is left out, and collectives still overlap compute where the program lets them, which
    blocking launches would serialise: both under-count)."""
    if len(world.lane_axes) > 7:
        raise ValueError(
            f"world has {len(world.lane_axes)} lane axes; the graph's int8 mask holds 7"
        )
    missing = set(range(world.pp)) - set(traces_by_class)
    if missing:
        raise ValueError(f"traces_by_class lacks classes {sorted(missing)} of pp({world.pp})")
    classes, pp_keys = [], []
    for p in range(world.pp):
        trace = traces_by_class[p]
        if durations_s is not None and p in durations_s:
            durs = np.asarray(durations_s[p], dtype=float)
            if durs.shape != (len(trace),):
                raise ValueError(
                    f"durations_s[{p}] has shape {durs.shape}, trace has {len(trace)} rows"
                )
        elif cost is not None:
            durs = compute_durations_s(trace, cost)
        else:
            raise ValueError(f"class {p}: neither durations_s nor a cost context to price compute")
        dispatch = _dispatch_of(trace, p, cost, dispatch_s)
        blocking = dispatch is not None and cost is not None and cost.launch_blocking
        if blocking:  # the host waits for each kernel: its dispatch time is on the stream
            durs = durs + np.where(trace.columns["kind"] == COMPUTE, dispatch, 0.0)
        slows, slopes = row_overlap(trace, cost)
        topology = cost.topology if (cost is not None and comm_durations) else None
        spreads = np.zeros(len(trace)) if spreads_s is None else np.asarray(spreads_s[p], float)
        if spreads.shape != (len(trace),):
            raise ValueError(
                f"spreads_s[{p}] has shape {spreads.shape}, trace has {len(trace)} rows"
            )
        b = _Builder(trace, world, p, durs, slows, slopes, CommPricer(topology), spreads)
        if cost is not None and cost.async_tp:
            pairs = async_tp_pairs(trace, world)
            b.async_tp = {row: float(durs[gemms].sum()) for row, gemms in pairs.items()}
        if cost is not None and cost.tp_grad_overlap:
            for row, gemms in weight_grad_pairs(trace, world).items():
                gemm_s = float(durs[gemms].sum())
                if gemm_s > 0:
                    slowdown = float(np.average(slows[gemms], weights=durs[gemms]))
                    b.weight_grad_overlap[row] = (gemm_s, slowdown)
        graph = b.build()
        if dispatch is not None and not blocking:
            host_bounds(trace, graph, durs, dispatch)
        classes.append(graph)
        pp_keys.append(b.pp_keys)
    _match_p2p(classes)
    offsets, join_class, join_node = _match_pp_collectives(classes, pp_keys)
    return ExecutionGraph(
        world=world,
        classes=tuple(classes),
        join_offsets=offsets,
        join_class=join_class,
        join_node=join_node,
    )


def _dispatch_of(trace: RankTrace, p: int, cost, dispatch_s) -> np.ndarray | None:
    if dispatch_s is not None and p in dispatch_s:
        dispatch = np.asarray(dispatch_s[p], dtype=float)
        if dispatch.shape != (len(trace),):
            raise ValueError(
                f"dispatch_s[{p}] has shape {dispatch.shape}, trace has {len(trace)} rows"
            )
        return dispatch
    if cost is not None and cost.host is not None:
        return dispatch_times_s(trace, cost.host, _COMPILED_BLOCK if cost.compiled else None)
    return None


def host_bounds(trace: RankTrace, graph: ClassGraph, durations_s, dispatch_s) -> None:
    """Fill `host_s` and `host_end_s` of `graph`'s nodes from the host's dispatch of each row.

    The host issues the rows in trace order, row r at H_r = the sum of dispatch_s up to r.
    A comm node can start no earlier than its row is issued (host_s = H_r). A compute segment
    of rows j with durations k_j runs each kernel once it is issued and its predecessor ended,
    so it starts no earlier than H_first and ends no earlier than max_j (H_j + sum_{l >= j} k_l)
    (the launch queue: its end is max(stream start + sum k, host_end_s), exactly)."""
    issued = np.cumsum(dispatch_s)
    kind, first = graph["kind"], graph["first_row"]
    comm = (kind == COLLECTIVE) | (kind == SEND) | (kind == RECV)
    graph["host_s"][comm] = issued[first[comm]]
    rows, node = segment_rows(trace, graph)
    if not len(rows):
        return
    k, h = np.asarray(durations_s, float)[rows], issued[rows]
    starts = np.flatnonzero(np.r_[True, node[1:] != node[:-1]])
    ends = np.r_[starts[1:], len(rows)]
    after = np.r_[np.cumsum(k[::-1])[::-1], 0.0]  # after[i] = sum of k[i:]
    tail = after[:-1] - np.repeat(after[ends], ends - starts)  # sum of k[i:] within the segment
    graph["host_s"][node[starts]] = h[starts]
    graph["host_end_s"][node[starts]] = np.maximum.reduceat(h + tail, starts)


def _match_p2p(classes: list[ClassGraph]) -> None:
    """recv.join := index of the matching send in the peer class (k-th to k-th per direction)."""
    sends: dict[tuple[int, int], np.ndarray] = {}
    for g in classes:
        for b in np.unique(g["peer_class"][g["kind"] == SEND]).tolist():
            sends[(g.pp, b)] = np.flatnonzero((g["kind"] == SEND) & (g["peer_class"] == b))
    for g in classes:
        for a in np.unique(g["peer_class"][g["kind"] == RECV]).tolist():
            recvs = np.flatnonzero((g["kind"] == RECV) & (g["peer_class"] == a))
            matched = sends.get((a, g.pp), np.array([], np.int64))
            if len(matched) != len(recvs):
                raise ValueError(
                    f"class {a} sends {len(matched)} messages to class {g.pp}, which receives {len(recvs)}"
                )
            g["join"][recvs] = matched


def _match_pp_collectives(classes, pp_keys):
    """Join table of collectives spanning pp: the k-th with the same key in every member class."""
    by_key: dict[tuple, dict[int, list[int]]] = {}
    for p, keys in enumerate(pp_keys):
        for n, key in keys:
            by_key.setdefault(key, {}).setdefault(p, []).append(n)
    offsets, members_c, members_n = [0], [], []
    for key, per_class in by_key.items():
        pps = key[2]
        counts = {p: len(per_class.get(p, [])) for p in pps}
        if len(set(counts.values())) != 1:
            raise ValueError(
                f"{key[0]} over {key[1]} at pp {pps}: member classes issue {counts} calls"
            )
        for k in range(counts[pps[0]]):
            for p in pps:
                node = per_class[p][k]
                classes[p]["join"][node] = len(offsets) - 1
                members_c.append(p)
                members_n.append(node)
            offsets.append(len(members_c))
    return (
        np.asarray(offsets, np.int64),
        np.asarray(members_c, np.int64),
        np.asarray(members_n, np.int64),
    )
