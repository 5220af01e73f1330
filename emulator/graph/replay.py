"""Mesh-vectorized replay of an ExecutionGraph: per-rank timelines, iteration time, breakdown.

Each class's nodes are walked once, in program order, advancing one clock per stream. A clock
is a *lane value*: the times of all the class's member ranks as an array shaped (dp, cp, tp)
(the mesh without pp), or a plain float when every member is identical (no per-rank speed
factors, no per-lane overrides), which is then the time of every lane: the cost of a uniform
replay does not depend on the world size. Rules (per node, for all lanes at once):

- compute: start = its stream's clock; duration x the rank's speed factor, stretched by the
  overlap slowdown s for the time w that a collective of the rank is still running:
  d' = min(d*s, d + w*(1 - 1/s))  (the work done during w runs at rate 1/s);
- collective: ready = max(own comm stream, issuing stream); start = max of the members'
  ready along the group's lane axes (keepdims), and over the member classes for a group
  spanning pp; end = start + duration; every member's end is the same;
- send: end = ready + transfer (NCCL's eager path: the sender does not wait for the receiver);
  recv: start = max(ready, the sender's ready) (same lanes of the peer class: a shift along pp),
  end = start + transfer;
- wait: the waiting stream's clock := max(clock, end of the waited node).

Classes advance in turn; a class stops at a recv whose send, or a pp-spanning collective whose
members, are not replayed yet, and resumes when they are (a cycle is a deadlock of the program
and is reported). Definitions of the outputs: docs/METRICS.md.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from emulator.graph.execution_graph import (
    COLLECTIVE,
    NODE_KINDS,
    RECV,
    SEGMENT,
    SEND,
    WAIT_NODE,
    ExecutionGraph,
)


@dataclass(frozen=True, kw_only=True)
class CriticalEvent:
    pp: int
    node: int
    name: str
    kind: str
    start_s: float
    duration_s: float


@dataclass(frozen=True, kw_only=True, eq=False)
class Timeline:
    """Per node of the class of `rank`: when it was ready, started and ended (seconds)."""

    rank: int
    pp: int
    ready_s: np.ndarray
    start_s: np.ndarray
    end_s: np.ndarray


@dataclass(frozen=True, kw_only=True)
class ClassBreakdown:
    """One class (its representative rank); the four times sum to the iteration time."""

    pp: int
    compute_s: float
    exposed_comm_s: float
    bubble_s: float
    idle_s: float
    end_s: float  # latest end over the class's ranks
    flops: int  # FLOPs of one rank of the class in the step
    comm_s_by_group: dict[str, float]


@dataclass(frozen=True, kw_only=True, eq=False)
class ReplayResult:
    iteration_time_s: float
    per_class: tuple[ClassBreakdown, ...]
    critical_path: tuple[CriticalEvent, ...]
    timelines: dict[int, Timeline]  # rank -> timeline (representatives and requested ranks)
    uniform: bool  # True when all lanes were replayed as one

    def to_dict(self) -> dict:
        """Figures as plain JSON-able values (timelines left out: see emulator.graph.timeline)."""
        return {
            "iteration_time_s": self.iteration_time_s,
            "uniform": self.uniform,
            "per_class": [asdict(c) for c in self.per_class],
            "critical_path": [asdict(e) for e in self.critical_path],
        }


# ---- lane arithmetic -------------------------------------------------------------------------


def _scalar_ops():
    return 0.0, max, lambda x, axes: x, lambda x, lane: x


def _array_ops(lanes):
    def reduce(x, axes):
        return x.max(axis=axes, keepdims=True) if axes and np.ndim(x) else x

    def pick(x, lane):
        if not np.ndim(x):
            return float(x)
        return float(x[tuple(i if n > 1 else 0 for i, n in zip(lane, x.shape, strict=True))])

    return np.zeros(lanes), np.maximum, reduce, pick


# ---- one class -------------------------------------------------------------------------------


class _Class:
    """Replay state of one class: its cursor, stream clocks and what other classes read."""

    def __init__(self, graph: ExecutionGraph, pp: int, ops, factor, overrides, lanes_of_rank):
        self.g = g = graph.classes[pp]
        self.pp, self.n, self.cursor = pp, len(g), 0
        zero, self.vmax, self.reduce, self.pick = ops
        self.clock = [zero] * len(g.streams)
        self.busy = zero
        self.ends: dict[int, object] = {}  # end of comm nodes a wait will read
        self.send_ready: dict[int, object] = {}  # ready of sends a recv will read
        self.factor = factor
        self.tracked = lanes_of_rank  # rank -> lane (dp, cp, tp)
        self.times = {r: np.zeros((3, len(g))) for r in lanes_of_rank}
        self.waited = set(g["dep"][g["dep"] >= 0].tolist())
        dur = g["duration_s"].tolist()
        for node, value in (overrides or {}).items():
            dur[node] = value
        self.dur = dur
        self.cols = {
            k: g[k].tolist() for k in ("kind", "stream", "slowdown", "issue_stream", "dep", "join")
        }
        self.axes = [tuple(a for a in range(3) if m >> a & 1) for m in g["axes"].tolist()]
        self.peer = g["peer_class"].tolist()
        self.deposited: set[int] = set()

    @property
    def done(self) -> bool:
        return self.cursor >= self.n

    def record(self, i, ready, start, end) -> None:
        pick = self.pick
        for rank, lane in self.tracked.items():
            t = self.times[rank]
            t[0, i], t[1, i], t[2, i] = pick(ready, lane), pick(start, lane), pick(end, lane)

    def advance(self, job: _Job) -> bool:
        """Replay nodes until blocked or done; True when anything moved."""
        start_cursor = self.cursor
        c, clock, vmax, reduce = self.cols, self.clock, self.vmax, self.reduce
        kinds, streams, slows, issue_streams = (
            c["kind"],
            c["stream"],
            c["slowdown"],
            c["issue_stream"],
        )
        deps, joins, dur, factor = c["dep"], c["join"], self.dur, self.factor
        i = self.cursor
        while i < self.n:
            k, s = kinds[i], streams[i]
            if k == SEGMENT:
                start = clock[s]
                d = dur[i] if factor is None else dur[i] * factor
                sl = slows[i]
                if sl > 1.0:
                    w = vmax(self.busy - start, 0.0)
                    d = np.minimum(d * sl, d + w * (1.0 - 1.0 / sl))
                end = clock[s] = start + d
                ready = start
            elif k == WAIT_NODE:
                ready = start = end = clock[s] = vmax(clock[s], self.ends[deps[i]])
            else:
                ready = (
                    clock[s] if issue_streams[i] < 0 else vmax(clock[s], clock[issue_streams[i]])
                )
                if k == COLLECTIVE:
                    mine = reduce(ready, self.axes[i])
                    if joins[i] < 0:
                        start = mine
                    else:
                        start = job.join(joins[i], self, i, mine)
                        if start is None:
                            break
                elif k == SEND:
                    start = ready
                    self.send_ready[i] = ready
                else:  # RECV
                    src = job.classes[self.peer[i]]
                    if src.cursor <= joins[i]:
                        break
                    start = vmax(ready, src.send_ready.pop(joins[i]))
                end = clock[s] = start + dur[i]
                self.busy = vmax(self.busy, end)
            if i in self.waited:  # any node a later wait reads: a comm, or a stream's position
                self.ends[i] = end
            self.record(i, ready, start, end)
            i += 1
        self.cursor = i
        return i > start_cursor

    def end_s(self) -> float:
        return float(max(np.max(t) for t in self.clock)) if self.clock else 0.0


class _Job:
    """All classes and the pp-spanning joins between them."""

    def __init__(self, graph: ExecutionGraph, classes: list[_Class], vmax):
        self.graph, self.classes, self.vmax = graph, classes, vmax
        self.deposits: dict[int, list] = {}
        self.starts: dict[int, object] = {}

    def join(self, j: int, cls: _Class, node: int, ready):
        """Start of join j once every member class has reached it; None until then."""
        if j not in self.starts:
            if node not in cls.deposited:
                cls.deposited.add(node)
                self.deposits.setdefault(j, []).append(ready)
            members = self.graph.join_offsets[j + 1] - self.graph.join_offsets[j]
            if len(self.deposits[j]) < members:
                return None
            start = self.deposits.pop(j)
            value = start[0]
            for x in start[1:]:
                value = self.vmax(value, x)
            self.starts[j] = value
        return self.starts[j]


# ---- entry point -----------------------------------------------------------------------------


def replay(
    graph: ExecutionGraph,
    *,
    speed_factors: np.ndarray | None = None,
    overrides: dict[int, dict[int, object]] | None = None,
    ranks=(),
) -> ReplayResult:
    """Replay `graph` once.

    speed_factors: array shaped like the mesh (dp, pp, cp, tp); compute durations of each rank
    are multiplied by its factor. overrides: {pp: {node: duration_s or lane array (dp, cp, tp)}}
    replacing a node's base duration (the speed factor still applies to compute nodes).
    ranks: global ranks whose timelines to keep besides the class representatives."""
    world = graph.world
    lanes = graph.lanes
    overrides = overrides or {}
    uniform = speed_factors is None and not any(
        np.ndim(v) for per in overrides.values() for v in per.values()
    )
    if speed_factors is not None:
        speed_factors = np.asarray(speed_factors, dtype=float)
        if speed_factors.shape != world.shape:
            raise ValueError(
                f"speed_factors shape {speed_factors.shape} != mesh (dp, pp, cp, tp) {world.shape}"
            )
        if (speed_factors <= 0).any():
            raise ValueError("speed_factors must be > 0")
    ops = _scalar_ops() if uniform else _array_ops(lanes)
    tracked = {p: {world.representative(p): (0, 0, 0)} for p in range(world.pp)}
    for r in np.atleast_1d(np.asarray(ranks, dtype=np.int64)).tolist():
        dp, pp, cp, tp = world.coords(r)[0].tolist()
        tracked[pp][r] = (dp, cp, tp)
    classes = [
        _Class(
            graph,
            p,
            ops,
            None if speed_factors is None else speed_factors[:, p, :, :],
            overrides.get(p),
            tracked[p],
        )
        for p in range(world.pp)
    ]
    job = _Job(graph, classes, ops[1])
    _run(job)
    iteration = max(c.end_s() for c in classes)
    timelines = {
        r: Timeline(rank=r, pp=c.pp, ready_s=t[0], start_s=t[1], end_s=t[2])
        for c in classes
        for r, t in c.times.items()
    }
    reps = [timelines[world.representative(p)] for p in range(world.pp)]
    return ReplayResult(
        iteration_time_s=iteration,
        per_class=tuple(
            _breakdown(graph, t, iteration, c.end_s()) for t, c in zip(reps, classes, strict=True)
        ),
        critical_path=tuple(critical_path(graph, reps)),
        timelines=timelines,
        uniform=uniform,
    )


def _run(job: _Job) -> None:
    pending = list(job.classes)
    while pending:
        moved = [c.advance(job) for c in pending]
        pending = [c for c in pending if not c.done]
        if pending and not any(moved):
            stuck = ", ".join(
                f"pp{c.pp} at node {c.cursor} ({c.g.strings[c.g['name'][c.cursor]]})"
                for c in pending
            )
            raise RuntimeError(f"replay deadlock: no class can advance: {stuck}")


# ---- breakdown and critical path ---------------------------------------------------------------


def _coverage(bounds: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """For each elementary interval [bounds[k], bounds[k+1]): is it inside some [lo, hi)?"""
    keep = hi > lo
    delta = np.zeros(len(bounds) + 1)
    np.add.at(delta, np.searchsorted(bounds, lo[keep]), 1)
    np.add.at(delta, np.searchsorted(bounds, hi[keep]), -1)
    return np.cumsum(delta)[: len(bounds) - 1] > 0


def _breakdown(
    graph: ExecutionGraph, t: Timeline, iteration_s: float, end_s: float
) -> ClassBreakdown:
    """Partition [0, iteration] for the representative rank (docs/METRICS.md, "Breakdown")."""
    g = graph.classes[t.pp]
    kind = g["kind"]
    seg, coll = kind == SEGMENT, kind == COLLECTIVE
    p2p = (kind == SEND) | (kind == RECV)
    recv = kind == RECV
    lo_comm = np.where(coll, t.ready_s, t.start_s)
    comm = coll | p2p
    nodes = kind != WAIT_NODE
    ends = [t.ready_s, t.start_s, t.end_s, np.array([0.0, iteration_s])]
    bounds = np.unique(np.clip(np.concatenate(ends), 0.0, iteration_s))
    widths = np.diff(bounds)
    in_compute = _coverage(bounds, t.start_s[seg], t.end_s[seg])
    in_comm = _coverage(bounds, lo_comm[comm], t.end_s[comm])
    in_wait = _coverage(bounds, t.ready_s[recv], t.start_s[recv])
    if nodes.any():
        span = (np.min(t.ready_s[nodes]), np.max(t.end_s[nodes]))
        in_span = _coverage(bounds, np.array([span[0]]), np.array([span[1]]))
    else:
        in_span = np.zeros(len(widths), bool)
    compute = float(widths[in_compute].sum())
    exposed = float(widths[~in_compute & in_comm].sum())
    rest = ~in_compute & ~in_comm
    bubble_mask = rest & (in_wait | (~in_span if graph.world.pp > 1 else False))
    bubble = float(widths[bubble_mask].sum())
    by_group: dict[str, float] = {}
    for label, busy in zip(g.text("group"), t.end_s - t.start_s, strict=True):
        if label:
            by_group[label] = by_group.get(label, 0.0) + float(busy)
    return ClassBreakdown(
        pp=t.pp,
        compute_s=compute,
        exposed_comm_s=exposed,
        bubble_s=bubble,
        idle_s=float(widths[rest & ~bubble_mask].sum()),  # the rest of the partition, so never < 0
        end_s=end_s,
        flops=int(g["flops"].sum()),
        comm_s_by_group=by_group,
    )


def critical_path(graph: ExecutionGraph, reps: list[Timeline]) -> list[CriticalEvent]:
    """The chain of events that sets the iteration time, first event first.

    Walked back on the representative ranks from the latest end: each step goes to the
    predecessor (same stream, issuing stream, waited comm, matching send, the latest member of
    a pp-spanning join) whose end is the node's start. With per-rank factors a join may be set
    by another lane of the class; the path then continues from the representative's own
    predecessors."""
    t = {x.pp: x for x in reps}
    total = max((float(x.end_s.max()) for x in reps if len(x.end_s)), default=0.0)
    eps = 1e-9 * max(total, 1e-9)
    cur = max(
        ((x.pp, int(np.argmax(x.end_s))) for x in reps if len(x.end_s)),
        key=lambda pi: t[pi[0]].end_s[pi[1]],
        default=None,
    )
    path = []
    while cur is not None:
        p, i = cur
        g, tl = graph.classes[p], t[p]
        kind = int(g["kind"][i])
        if kind != WAIT_NODE:
            path.append(_event(g, p, i, tl))
        at, source = float(tl.start_s[i]), (p, i)
        if kind in (COLLECTIVE, RECV) and tl.ready_s[i] < at - eps:
            join = int(g["join"][i])
            if kind == RECV:
                source = (int(g["peer_class"][i]), join)
                path.append(_event(graph.classes[source[0]], *source, t[source[0]]))
            elif join >= 0:
                source = max(graph.join_members(join), key=lambda m: t[m[0]].ready_s[m[1]])
            at = float(t[source[0]].ready_s[source[1]])
        cur = _binding(graph, t, source, at, eps)
    return path[::-1]


def _binding(graph, t, node, at, eps):
    p, i = node
    g, tl = graph.classes[p], t[p]
    preds = [int(g[col][i]) for col in ("prev", "issue", "dep")]
    found = [(float(tl.end_s[j]), j) for j in preds if j >= 0 and abs(tl.end_s[j] - at) <= eps]
    return (p, max(found)[1]) if found and at > eps else None


def _event(g, p, i, tl) -> CriticalEvent:
    return CriticalEvent(
        pp=p,
        node=i,
        name=g.strings[g["name"][i]],
        kind=NODE_KINDS[g["kind"][i]],
        start_s=float(tl.start_s[i]),
        duration_s=float(tl.end_s[i] - tl.start_s[i]),
    )
