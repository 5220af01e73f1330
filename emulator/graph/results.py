"""What a replay gives: per-rank timelines, the per-class breakdown of the iteration, the
critical path (definitions: docs/METRICS.md), and the functions that derive the last two from
the timelines.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

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

# the critical path's name for the host thread issuing ops (emulator.costs.host_dispatch)
HOST_EVENT = "host dispatch"
# The categories of a class's breakdown, in the order each instant is claimed (METRICS.md)
BREAKDOWN_FIELDS = ("compute_s", "exposed_comm_s", "bubble_s", "host_wait_s", "idle_s")


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
    """Per node of the class of `rank` (seconds): when it was ready, started and ended; when
    its stream was free (free_s <= ready_s: before ready_s the host had not issued it); how
    long its kernels ran (a launch-bound segment ends later than start + kernel_s, its kernels
    waiting for the host to issue them: emulator.costs.host_dispatch)."""

    rank: int
    pp: int
    ready_s: np.ndarray
    start_s: np.ndarray
    end_s: np.ndarray
    free_s: np.ndarray
    kernel_s: np.ndarray


@dataclass(frozen=True, kw_only=True)
class ClassBreakdown:
    """One class (its representative rank); the five times sum to the iteration time."""

    pp: int
    compute_s: float
    exposed_comm_s: float
    bubble_s: float
    host_wait_s: float
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


def _coverage(bounds: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """For each elementary interval [bounds[k], bounds[k+1]): is it inside some [lo, hi)?"""
    keep = hi > lo
    delta = np.zeros(len(bounds) + 1)
    np.add.at(delta, np.searchsorted(bounds, lo[keep]), 1)
    np.add.at(delta, np.searchsorted(bounds, hi[keep]), -1)
    return np.cumsum(delta)[: len(bounds) - 1] > 0


def breakdown(
    graph: ExecutionGraph, t: Timeline, iteration_s: float, end_s: float
) -> ClassBreakdown:
    """Partition [0, iteration] for the representative rank (docs/METRICS.md, "Breakdown")."""
    g = graph.classes[t.pp]
    kind = g["kind"]
    seg, coll = kind == SEGMENT, kind == COLLECTIVE
    p2p = (kind == SEND) | (kind == RECV)
    # a rank that reaches a collective spanning stages before another stage does waits on the
    # pipeline, as for a recv whose sender has not sent
    pipeline_wait = (kind == RECV) | (coll & (g["join"] >= 0))
    lo_comm = np.where(coll & ~pipeline_wait, t.ready_s, t.start_s)
    comm = coll | p2p
    nodes = kind != WAIT_NODE
    # a launch-bound segment's kernels are booked as running back to back at its end, its
    # waits for the host before them: their sum is exact, their order within it is not known
    kernels_from = t.end_s[seg] - t.kernel_s[seg]
    ends = [t.free_s, t.ready_s, t.start_s, t.end_s, kernels_from, np.array([0.0, iteration_s])]
    bounds = np.unique(np.clip(np.concatenate(ends), 0.0, iteration_s))
    widths = np.diff(bounds)
    in_compute = _coverage(bounds, kernels_from, t.end_s[seg])
    in_launch_gaps = _coverage(bounds, t.start_s[seg], kernels_from) & ~in_compute
    in_comm = _coverage(bounds, lo_comm[comm], t.end_s[comm])
    in_unissued = _coverage(bounds, t.free_s, t.ready_s)
    in_wait = _coverage(bounds, t.ready_s[pipeline_wait], t.start_s[pipeline_wait])
    if nodes.any():
        span = (np.min(t.ready_s[nodes]), np.max(t.end_s[nodes]))
        in_span = _coverage(bounds, np.array([span[0]]), np.array([span[1]]))
    else:
        in_span = np.zeros(len(widths), bool)
    # a segment's whole span is compute or launch gaps, claimed before comm and bubble: where
    # in the span the gaps fall is not known, so no other category may depend on it
    in_segment = in_compute | in_launch_gaps
    compute = float(widths[in_compute].sum())
    exposed = float(widths[~in_segment & in_comm].sum())
    rest = ~in_segment & ~in_comm
    bubble_mask = rest & (in_wait | (~in_span if graph.world.pp > 1 else False))
    bubble = float(widths[bubble_mask].sum())
    host_wait = in_launch_gaps | (rest & ~bubble_mask & in_unissued)
    by_group: dict[str, float] = {}
    for label, busy in zip(g.text("group"), t.end_s - t.start_s, strict=True):
        if label:
            by_group[label] = by_group.get(label, 0.0) + float(busy)
    return ClassBreakdown(
        pp=t.pp,
        compute_s=compute,
        exposed_comm_s=exposed,
        host_wait_s=float(widths[host_wait].sum()),
        bubble_s=bubble,
        idle_s=float(widths[rest & ~bubble_mask & ~in_unissued].sum()),  # the rest: never < 0
        end_s=end_s,
        flops=round(g["flops"].sum()),
        comm_s_by_group=by_group,
    )


def critical_path(graph: ExecutionGraph, reps: list[Timeline]) -> list[CriticalEvent]:
    """The chain of events that sets the iteration time, first event first.

    Walked back on the representative ranks from the latest end: each step goes to the
    predecessor (same stream, issuing stream, waited comm, matching send, the latest member of
    a pp-spanning join) whose end is the node's start. With per-rank factors a join may be set
    by another lane of the class; the path then continues from the representative's own
    predecessors. Where the host's dispatch binds instead (a node that starts when the host
    issues it, `host_s`, or a compute segment whose kernels wait in the launch queue,
    `host_end_s`), the path begins with a `host` event: the host issuing ops from the
    iteration's start until then (HOST_EVENT)."""
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
        issued = float(g["host_end_s"][i] - g["duration_s"][i])
        if kind == SEGMENT and g["host_end_s"][i] > 0 and issued > tl.start_s[i] + eps:
            # its end waited for the host's launches: the host until `issued`, then the
            # segment's own work (end = issued + its duration)
            path[-1] = replace(path[-1], start_s=issued, duration_s=float(tl.end_s[i]) - issued)
            path.append(_host_event(p, issued))
            break
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
        src = graph.classes[source[0]]
        if cur is None and at > eps and abs(float(src["host_s"][source[1]]) - at) <= eps:
            path.append(_host_event(source[0], at))  # started when the host issued it
    return path[::-1]


def _host_event(pp: int, until_s: float) -> CriticalEvent:
    return CriticalEvent(
        pp=pp, node=-1, name=HOST_EVENT, kind="host", start_s=0.0, duration_s=until_s
    )


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
