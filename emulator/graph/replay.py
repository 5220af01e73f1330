"""Mesh-vectorized replay of an ExecutionGraph: per-rank timelines, iteration time, breakdown.

Each class's nodes are walked once, in program order, advancing one clock per stream. A clock
is a *lane value*: the times of all the class's member ranks as an array shaped like the lane
axes (the mesh without pp: (dp, cp, tp) for the job contract), or a plain float when every member is identical (no per-rank speed
factors, no per-lane overrides), which is then the time of every lane: the cost of a uniform
replay does not depend on the world size. Rules (per node, for all lanes at once):

- compute: start = its stream's clock (and no earlier than the host issues its first op,
  `host_s`); duration d x the rank's speed factor; the work left when the rank's busy window
  of comm opens (r) is stretched by the overlap slowdown s for the time w that the window
  still lasts: r' = min(r*s, r + w*(1 - 1/s)) (the work done during w runs at rate 1/s), so
  d' = d - r + r'; end = max(start + d', host_end_s + d' - d), the launch-queue bound of
  emulator.costs.host_dispatch (graph.build.host_bounds). The busy window: a run of the
  rank's comm nodes each starting no later than the ones before it end; s = the segment's
  `slowdown` + `memory_slowdown_per_Bps` x the window's comm traffic (its nodes'
  `traffic_bytes` over its length; emulator.costs.overlap);
- collective: ready = max(own comm stream, issuing stream, the host issuing it); start = max of the members'
  ready along the group's lane axes (keepdims), and over the member classes for a group
  spanning pp; end = start + duration; every member's end is the same;
- send: end = ready + transfer (NCCL's eager path: the sender does not wait for the receiver);
  recv: start = max(ready, the sender's ready) (same lanes of the peer class: a shift along pp),
  end = start + transfer;
- wait: the waiting stream's clock := max(clock, end of the waited node).

Classes advance in turn; a class stops at a recv whose send, or a pp-spanning collective whose
members, are not replayed yet, and resumes when they are (a cycle is a deadlock of the program
and is reported). Definitions of the outputs: docs/METRICS.md.

`replay_samples` runs the same rules for N samples at once (lane values shaped (*lanes, N),
durations drawn per node by the caller, none negative): the Monte Carlo of
emulator.variability. The samples axis is last so that a collective's maximum over lane axes
runs over contiguous runs of samples, not over strides of a few lanes. A comm node keeps the bytes it was built with, so a duration drawn or
overridden for it changes its rate.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from emulator.graph.execution_graph import (
    COLLECTIVE,
    SEGMENT,
    SEND,
    WAIT_NODE,
    ExecutionGraph,
)
from emulator.graph.results import (
    ReplayResult,
    Timeline,
    breakdown,
    critical_path,
)
from emulator.world.mesh import World

# ---- lane arithmetic -------------------------------------------------------------------------

_SHORTEST_S = 1e-15  # a busy window's length is divided by at least this
# A launch-bound end is skipped where it trails the kernels' own end by at least this: far
# above the rounding of the two sums (~1e-14 s at 100 s), so skipping changes no bit.
_HOST_BOUND_MARGIN_S = 1e-9


class _LaneOps(NamedTuple):
    """Arithmetic on lane values, for plain floats (a uniform replay) or arrays."""

    zero: object
    vmax: Callable
    reduce: Callable  # max over the given lane axes, keeping them
    pick: Callable  # one lane's value
    select: Callable  # where(condition, a, b)
    vmin: Callable
    some: Callable  # any lane true
    every: Callable  # every lane true
    least: Callable  # the smallest lane value, a float
    most: Callable  # the largest lane value, a float


def _scalar_ops() -> _LaneOps:
    return _LaneOps(
        0.0, max, lambda x, axes: x, lambda x, lane: x, lambda c, a, b: a if c else b, min,
        bool, bool, float, float,
    )  # fmt: skip


def _array_ops(shape) -> _LaneOps:
    def reduce(x, axes):
        if not np.ndim(x) or not axes:
            return x
        return x.max(axis=axes, keepdims=True)

    def pick(x, lane):
        if not np.ndim(x):
            return float(x)
        return float(x[tuple(i if n > 1 else 0 for i, n in zip(lane, x.shape, strict=True))])

    return _LaneOps(
        np.zeros(shape), np.maximum, reduce, pick, np.where, np.minimum, np.any, np.all,
        lambda x: float(np.min(x)), lambda x: float(np.max(x)),
    )  # fmt: skip


# ---- one class -------------------------------------------------------------------------------


class _Class:
    """Replay state of one class: its cursor, stream clocks and what other classes read."""

    def __init__(
        self, graph: ExecutionGraph, pp: int, ops, factor, overrides, lanes_of_rank, sampled=None
    ):
        self.g = g = graph.classes[pp]
        self.pp, self.n, self.cursor = pp, len(g), 0
        self.ops = ops
        zero, self.vmax, self.reduce, self.pick = ops.zero, ops.vmax, ops.reduce, ops.pick
        self.clock = [zero] * len(g.streams)
        self.busy = zero  # the latest end of the rank's comm nodes: its window's end
        # the busy window (comm nodes overlapping one another up to `busy`): start, bytes moved
        self.window_start = zero
        self.window_bytes = zero
        self.ends: dict[int, object] = {}  # end of comm nodes a wait will read
        self.send_ready: dict[int, object] = {}  # ready of sends a recv will read
        self.factor = factor
        self.tracked = lanes_of_rank  # rank -> lane (coordinates along the lane axes)
        # per tracked rank, one row per node in program order: Timeline's five figures
        self.rows: dict[int, list[tuple]] = {r: [] for r in lanes_of_rank}
        deps = g["dep"][g["dep"] >= 0]
        self.waited = set(deps.tolist())
        nodes, waits = np.unique(deps, return_counts=True)
        self.waits_left = dict(zip(nodes.tolist(), waits.tolist(), strict=True))
        dur = g["duration_s"].tolist()
        for node, value in (overrides or {}).items():
            dur[node] = value
        self.dur = dur
        self.cols = {
            k: g[k].tolist()
            for k in (
                "kind",
                "stream",
                "slowdown",
                "memory_slowdown_per_Bps",
                "traffic_bytes",
                "issue_stream",
                "dep",
                "join",
                "host_s",
                "host_end_s",
            )
        }
        self.base = g["duration_s"].tolist()  # what host_end_s was computed with
        self.sampled = sampled  # (pp, node) -> duration, in replay_samples
        self.axes = [
            tuple(a for a in range(len(graph.lanes)) if m >> a & 1) for m in g["axes"].tolist()
        ]
        self.peer = g["peer_class"].tolist()
        self.deposited: set[int] = set()

    @property
    def done(self) -> bool:
        return self.cursor >= self.n

    def record(self, free, ready, start, end, kernels) -> None:
        if not self.tracked:
            return
        pick = self.pick
        for rank, lane in self.tracked.items():
            r, s, e = pick(ready, lane), pick(start, lane), pick(end, lane)
            # free is ready itself unless the host bound the node: one pick fewer
            self.rows[rank].append((
                r, s, e, r if free is ready else pick(free, lane),
                e - s if kernels is None else pick(kernels, lane),
            ))  # fmt: skip

    def advance(self, job: _Job) -> bool:
        """Replay nodes until blocked or done; True when anything moved."""
        start_cursor = self.cursor
        c, clock, vmax, reduce = self.cols, self.clock, self.vmax, self.reduce
        kinds, streams, slows, slopes, traffic, issue_streams = (
            c["kind"],
            c["stream"],
            c["slowdown"],
            c["memory_slowdown_per_Bps"],
            c["traffic_bytes"],
            c["issue_stream"],
        )
        deps, joins, dur, factor = c["dep"], c["join"], self.dur, self.factor
        host, host_end, base = c["host_s"], c["host_end_s"], self.base
        sampled, pp = self.sampled, self.pp
        least, most, some = self.ops.least, self.ops.most, self.ops.some
        i = self.cursor
        while i < self.n:
            k, s = kinds[i], streams[i]
            kernels = None
            if k == SEGMENT:
                # the lanes' earliest start decides, on one read, whether the host's bounds
                # can bind in any lane; where they cannot, max() would change nothing
                free = clock[s]
                earliest = least(free)
                ready = start = free
                if host[i] > earliest:
                    ready = start = vmax(free, host[i])
                    earliest = host[i]
                if sampled is not None:
                    d = sampled(pp, i)
                else:
                    d = dur[i] if factor is None else dur[i] * factor
                if (
                    (slows[i] > 1.0 or slopes[i] > 0.0)
                    and most(self.busy) > earliest
                    and some(self.busy > start)
                ):
                    d = self._beside_comm(d, start, earliest, slows[i], slopes[i])
                end = start + d
                # launch-bound: kernels wait for the host to issue them (binds where the host
                # finishes issuing later than `base` after the segment's start)
                if host_end[i] > 0.0 and host_end[i] - base[i] > earliest - _HOST_BOUND_MARGIN_S:
                    end = vmax(end, host_end[i] + (d - base[i]))
                clock[s] = end
                kernels = d
            elif k == WAIT_NODE:
                free = ready = start = end = clock[s] = vmax(clock[s], self._waited_end(deps[i]))
            else:
                issue = issue_streams[i]
                if k == COLLECTIVE and not self.tracked:
                    # only the group's latest member's ready is used: the max over the group
                    # commutes with the max over streams, so take it first, on fewer lanes
                    free = ready = reduce(clock[s], self.axes[i])
                    if issue >= 0:
                        free = ready = vmax(ready, reduce(clock[issue], self.axes[i]))
                else:
                    free = ready = clock[s] if issue < 0 else vmax(clock[s], clock[issue])
                if host[i] > 0.0:  # not before the host has issued the call
                    ready = vmax(ready, host[i])
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
                end = clock[s] = start + (dur[i] if sampled is None else sampled(pp, i))
                self._extend_window(start, end, traffic[i])
            if i in self.waited:  # any node a later wait reads: a comm, or a stream's position
                self.ends[i] = end
            self.record(free, ready, start, end, kernels)
            i += 1
        self.cursor = i
        return i > start_cursor

    def _beside_comm(self, d, start, earliest: float, slowdown: float, slope: float):
        """Duration of a segment of work `d` (>= 0) starting at `start` (`earliest` in its
        earliest lane) beside the busy window: it runs at full speed until the window opens,
        then slowed by s = `slowdown` + `slope` x the window's traffic while the window lasts
        (w): the rest r takes min(r s, r + w (1 - 1/s)). Where every lane's window is open,
        or opened before the segment, the guards of the general case change no bit and are
        skipped (a lane value is millions of entries in a Monte Carlo)."""
        vmax, busy, window_start = self.vmax, self.busy, self.window_start
        sl = slowdown
        if slope > 0.0:
            span = busy - window_start
            if self.ops.least(span) >= _SHORTEST_S:
                sl = sl + slope * self.window_bytes / span
            else:
                sl = sl + slope * self.window_bytes / vmax(span, _SHORTEST_S) * (span > 0.0)
        if self.ops.most(window_start) <= earliest:  # no lead: the rest is all of d
            w = vmax(busy - start, 0.0)
            return np.minimum(d * sl, d + w * (1.0 - 1.0 / sl))
        lead = vmax(window_start - start, 0.0)
        w = vmax(busy - vmax(start, window_start), 0.0)
        rest = vmax(d - lead, 0.0)
        return d - rest + np.minimum(rest * sl, rest + w * (1.0 - 1.0 / sl))

    def _extend_window(self, start, end, nbytes: float) -> None:
        """A comm node [start, end) moving `nbytes`: it opens a new busy window if it starts
        after the window ends; else it joins it (a call queued on a comm stream starts as the
        one before it ends), reaching back to its start where it began before the window
        (nodes are replayed in program order, not in time order: a recv waiting for its
        sender, a lane held back at a join). One that ended before the window opened is left
        out rather than joined across the idle time between: the rank keeps only its latest
        window. Keeping every window changes r046 by +0.009 % and 15 other published rows
        not at all (results/fidelity/window_list_probe.py): such calls almost never
        overlap a segment replayed after them."""
        opens = start > self.busy
        if self.ops.every(opens):  # the common case, one comm at a time: no lane arithmetic
            self.window_start, self.window_bytes, self.busy = start, nbytes, end
            return
        select, ws, wb = self.ops.select, self.window_start, self.window_bytes
        before = end < ws
        self.window_start = select(opens, start, select(before, ws, self.ops.vmin(ws, start)))
        self.window_bytes = select(opens, nbytes, select(before, wb, wb + nbytes))
        self.busy = self.vmax(self.busy, end)

    def _waited_end(self, node: int):
        """End of a waited node, forgotten after its last wait (lane values can be large)."""
        self.waits_left[node] -= 1
        return self.ends.pop(node) if self.waits_left[node] == 0 else self.ends[node]

    def end_s(self) -> float:
        return float(max(np.max(t) for t in self.clock)) if self.clock else 0.0

    def end_per_sample(self, samples: int) -> np.ndarray:
        """Latest stream clock of any lane, per sample (replay_samples)."""
        end = np.zeros(samples)
        for t in self.clock:
            if np.ndim(t):
                t = t.reshape(-1, t.shape[-1]).max(axis=0)
            end = np.maximum(end, t)
        return end


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

    speed_factors: array shaped like the mesh (world.shape); compute durations of each rank
    are multiplied by its factor. overrides: {pp: {node: duration_s or lane array}}
    replacing a node's base duration (the speed factor still applies to compute nodes).
    ranks: global ranks whose timelines to keep besides the class representatives."""
    world = graph.world
    lanes = graph.lanes
    overrides = overrides or {}
    uniform = speed_factors is None and not any(
        np.ndim(v) for per in overrides.values() for v in per.values()
    )
    if speed_factors is not None:
        speed_factors = _checked_speed_factors(speed_factors, world)
    ops = _scalar_ops() if uniform else _array_ops(lanes)
    tracked = {p: {world.representative(p): (0,) * len(lanes)} for p in range(world.pp)}
    for r in np.atleast_1d(np.asarray(ranks, dtype=np.int64)).tolist():
        tracked[world.pipeline_index(r)][r] = world.lane_of(r)
    classes = [
        _Class(
            graph,
            p,
            ops,
            _class_factors(speed_factors, world, p),
            overrides.get(p),
            tracked[p],
        )
        for p in range(world.pp)
    ]
    job = _Job(graph, classes, ops.vmax)
    _run(job)
    iteration = max(c.end_s() for c in classes)
    timelines = {r: _timeline(r, c.pp, rows) for c in classes for r, rows in c.rows.items()}
    reps = [timelines[world.representative(p)] for p in range(world.pp)]
    return ReplayResult(
        iteration_time_s=iteration,
        per_class=tuple(
            breakdown(graph, t, iteration, c.end_s()) for t, c in zip(reps, classes, strict=True)
        ),
        critical_path=tuple(critical_path(graph, reps)),
        timelines=timelines,
        uniform=uniform,
    )


def _timeline(rank: int, pp: int, rows: list[tuple]) -> Timeline:
    """A tracked rank's Timeline from its rows (_Class.record's order of the five figures)."""
    ready, start, end, free, kernels = np.array(rows, dtype=float).reshape(-1, 5).T
    return Timeline(rank=rank, pp=pp, ready_s=ready, start_s=start, end_s=end, free_s=free,
                    kernel_s=kernels)  # fmt: skip


def replay_samples(graph: ExecutionGraph, samples: int, durations) -> np.ndarray:
    """Iteration time (s) of `samples` replays of `graph` at once, one per entry of the result.

    Lane values carry a samples axis last: arrays shaped (*lanes, samples), or any shape that
    broadcasts to it. `durations(pp, node)` gives each compute and comm node's duration as
    such a value (compute: before the overlap slowdown, which applies as in `replay`). Nothing
    else changes: the same rules, so durations equal to the graph's reproduce `replay`'s
    iteration time exactly."""
    if samples < 1:
        raise ValueError(f"samples={samples!r} must be >= 1")
    ops = _array_ops((*graph.lanes, samples))
    classes = [_Class(graph, p, ops, None, None, {}, durations) for p in range(graph.world.pp)]
    _run(_Job(graph, classes, ops.vmax))
    end = np.zeros(samples)
    for c in classes:
        end = np.maximum(end, c.end_per_sample(samples))
    return end


def _checked_speed_factors(speed_factors, world: World) -> np.ndarray:
    speed_factors = np.asarray(speed_factors, dtype=float)
    if speed_factors.shape != world.shape:
        raise ValueError(
            f"speed_factors shape {speed_factors.shape} != mesh {world.names} {world.shape}"
        )
    if (speed_factors <= 0).any():
        raise ValueError("speed_factors must be > 0")
    return speed_factors


def _class_factors(speed_factors, world: World, p: int):
    """Class p's slice of the speed factors: shaped like its lanes."""
    if speed_factors is None or world.pipeline_position is None:
        return speed_factors
    return np.take(speed_factors, p, axis=world.pipeline_position)


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
