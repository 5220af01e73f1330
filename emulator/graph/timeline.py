"""Chrome / Perfetto trace-event JSON of a replay, for chosen ranks (opens in ui.perfetto.dev).

Trace Event Format (Google, "Trace Event Format" document): a process per rank (pid = global
rank, with a process_name metadata event), a thread per stream of its class (tid = stream
index, thread_name metadata), one complete event ("ph": "X", ts/dur in microseconds) per
compute segment, collective, send and recv (waits are zero-length and left out; a segment's
args give its kernels' time and the launch gaps in its span, us), and flow events ("ph": "s"
then "f" with "bp": "e") from the first member of each collective or p2p transfer to every
other member among the chosen ranks.
"""

from __future__ import annotations

import json
from pathlib import Path

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
from emulator.graph.results import ReplayResult

_US = 1e6

# Version of this file's layout (pids, tids, args, flows); Perfetto ignores otherData.
TIMELINE_SCHEMA_VERSION = 2  # 2: a compute segment's args give kernels_us and host_wait_us


def trace_events(graph: ExecutionGraph, result: ReplayResult, ranks=None) -> dict:
    """The trace-event JSON object for `ranks` (default: one representative per class).

    Ranks other than the representatives must have been passed to `replay(..., ranks=)`."""
    world = graph.world
    ranks = (
        [world.representative(p) for p in range(world.pp)]
        if ranks is None
        else [int(r) for r in ranks]
    )
    absent = [r for r in ranks if r not in result.timelines]
    if absent:
        raise ValueError(f"ranks {absent} have no timeline: pass them to replay(..., ranks=)")
    events, members = [], {}
    for rank in ranks:
        tl = result.timelines[rank]
        g = graph.classes[tl.pp]
        lane = np.array(world.lane_of(rank))
        events.append(_meta("process_name", rank, 0, f"rank {rank} (pp {tl.pp})"))
        events += [_meta("thread_name", rank, tid, label) for tid, label in enumerate(g.streams)]
        kind, stream, joins = g["kind"], g["stream"], g["join"]
        order = np.lexsort((tl.start_s, stream))
        for i in order[kind[order] != WAIT_NODE].tolist():
            ts, dur = float(tl.start_s[i] * _US), float((tl.end_s[i] - tl.start_s[i]) * _US)
            tid = int(stream[i])
            events.append(
                {
                    "ph": "X",
                    "name": g.strings[g["name"][i]],
                    "cat": NODE_KINDS[kind[i]],
                    "pid": rank,
                    "tid": tid,
                    "ts": ts,
                    "dur": dur,
                    "args": {
                        "node": i,
                        "group": g.strings[g["group"][i]],
                        "micro_batch": int(g["micro_batch"][i]),
                    }
                    | (_kernels_and_host_wait(tl, i) if kind[i] == SEGMENT else {}),
                }
            )
            key = _instance(g, i, int(kind[i]), int(joins[i]), lane, tl.pp)
            if key is not None:
                members.setdefault(key, []).append((ts, rank, tid, g.strings[g["name"][i]]))
    events += _flows(members)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"prismbench_timeline_schema_version": TIMELINE_SCHEMA_VERSION},
    }


def write_trace(path: str | Path, graph: ExecutionGraph, result: ReplayResult, ranks=None) -> None:
    Path(path).write_text(json.dumps(trace_events(graph, result, ranks)))


def _kernels_and_host_wait(tl, i: int) -> dict:
    """A compute segment's kernel time and the launch gaps in its span (us): the slice of a
    launch-bound segment is longer than its kernels (docs/METRICS.md, host wait)."""
    kernels = float(tl.kernel_s[i])
    return {"kernels_us": kernels * _US,
            "host_wait_us": max(float(tl.end_s[i] - tl.start_s[i]) - kernels, 0.0) * _US}  # fmt: skip


def _meta(name: str, pid: int, tid: int, label: str) -> dict:
    return {"ph": "M", "name": name, "pid": pid, "tid": tid, "args": {"name": label}}


def _instance(g, i: int, kind: int, join: int, lane: np.ndarray, pp: int):
    """A key shared by the chosen ranks that take part in the same instance of node i."""
    if kind == COLLECTIVE:
        mask = int(g["axes"][i])
        fixed = tuple(int(c) for a, c in enumerate(lane) if not mask >> a & 1)
        return ("join", join, fixed) if join >= 0 else ("coll", pp, i, fixed)
    if kind == SEND:
        return ("p2p", pp, i, tuple(lane.tolist()))
    if kind == RECV:
        return ("p2p", int(g["peer_class"][i]), join, tuple(lane.tolist()))
    return None


def _flows(members: dict) -> list[dict]:
    flows, flow_id = [], 0
    for group in members.values():
        if len(group) < 2:
            continue
        group.sort()
        ts0, pid0, tid0, name = group[0]
        for ts, pid, tid, _ in group[1:]:
            flow_id += 1
            common = {"name": name, "cat": "comm", "id": flow_id}
            flows.append({"ph": "s", "pid": pid0, "tid": tid0, "ts": ts0, **common})
            flows.append({"ph": "f", "bp": "e", "pid": pid, "tid": tid, "ts": ts, **common})
    return flows
