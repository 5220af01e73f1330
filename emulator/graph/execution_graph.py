"""ExecutionGraph: the whole job as one compact node table per class (the data; graph.build
makes it, graph.replay runs it, graph.timeline draws it). Node kinds and columns are described
in graph.build's docstring; an ExecutionGraph saves to and loads from one .npz.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from emulator.world.mesh import World

NODE_KINDS = ("compute", "collective", "send", "recv", "wait")
SEGMENT, COLLECTIVE, SEND, RECV, WAIT_NODE = range(len(NODE_KINDS))
NODE_COLUMNS = {
    "kind": np.int8,
    "stream": np.int16,
    "name": np.int32,  # index into ClassGraph.strings
    "group": np.int32,  # group label ("tp", "dp+cp", "pp"), index into strings
    "duration_s": np.float64,
    "variance_s2": np.float64,  # compute: sum of its ops' duration variances (independent ops)
    # compute: beside comm, its ops' factor weighted by their time, memory-bound ops at 1 (their
    # part is the next column's; costs.overlap)
    "slowdown": np.float64,
    # compute: what its slowdown grows by per byte/s of comm traffic beside it (memory-bound ops)
    "memory_slowdown_per_Bps": np.float64,
    "traffic_bytes": np.float64,  # comm: bytes a member moves through its links (costs.overlap)
    # compute: its ops' FLOPs (float: a segment of a huge micro-batch can pass int64)
    "flops": np.float64,
    "first_row": np.int64,  # trace row of the node's first event
    "rows": np.int64,  # trace rows merged into the node
    "phase": np.int8,
    "micro_batch": np.int32,
    "prev": np.int64,  # previous node on the same stream, -1
    "issue": np.int64,  # comm: last node on the issuing stream before it, -1
    "issue_stream": np.int16,  # comm: the issuing stream, -1 when `issue` is -1
    "dep": np.int64,  # wait: the comm node waited on, -1
    "axes": np.int8,  # collective: bit mask over the world's lane axes joined inside the class
    "join": np.int64,  # pp-spanning collective: join id; recv: matching send node; else -1
    "peer_class": np.int32,  # send/recv: the other class; -1
    "host_s": np.float64,  # earliest start the host allows: its first row issued (0: no host model)
    "host_end_s": np.float64,  # compute: earliest end the host allows (launch-queue bound); 0
    # comm: 1 where the call's group (in some lane) spans more than one node, so its traffic
    # crosses the network; 0 inside a node and for compute
    "crosses_nodes": np.int8,
}
# columns a graph saved before they existed lacks; loading fills them with 0: no host bound, and
# no traffic-dependent slowdown (such a graph's `slowdown` holds its memory-bound ops' share at
# the link's rated bandwidth, applied as the replay applies it now: from when comm starts)
_ADDED_COLUMNS = ("host_s", "host_end_s", "memory_slowdown_per_Bps", "traffic_bytes")
# ... except these, filled with a value that keeps what such a graph did: every comm node is
# taken to cross nodes (the network regime applied to all communication, as it was)
_ADDED_FILLS = {"crosses_nodes": 1}


@dataclass(frozen=True, kw_only=True, eq=False)
class ClassGraph:
    """One class's nodes (columns of NODE_COLUMNS, one entry per node) and its streams."""

    pp: int
    nodes: dict[str, np.ndarray]
    streams: tuple[str, ...]
    strings: tuple[str, ...]

    def __post_init__(self) -> None:
        missing = set(NODE_COLUMNS) - set(self.nodes)
        if missing:
            raise ValueError(f"class {self.pp}: node columns {sorted(missing)} are missing")
        n = len(self.nodes["kind"])
        wrong = {k: len(v) for k, v in self.nodes.items() if len(v) != n}
        if wrong:
            raise ValueError(f"class {self.pp}: columns {wrong} do not have {n} entries")

    def __len__(self) -> int:
        return len(self.nodes["kind"])

    def __getitem__(self, column: str) -> np.ndarray:
        return self.nodes[column]

    def text(self, column: str) -> list[str]:
        return [self.strings[i] for i in self.nodes[column]]

    def edges(self) -> tuple[np.ndarray, np.ndarray]:
        """In-class predecessors as CSR (offsets, indices): stream order, issue, wait edges."""
        preds = np.stack([self.nodes["prev"], self.nodes["issue"], self.nodes["dep"]], axis=1)
        keep = preds >= 0
        return np.concatenate([[0], np.cumsum(keep.sum(axis=1))]), preds[keep]


def _column(z, p: int, k: str) -> np.ndarray:
    key = f"c{p}_{k}"
    if key not in z and k in (*_ADDED_COLUMNS, *_ADDED_FILLS):
        return np.full(len(z[f"c{p}_kind"]), _ADDED_FILLS.get(k, 0), dtype=NODE_COLUMNS[k])
    return z[key]


@dataclass(frozen=True, kw_only=True, eq=False)
class ExecutionGraph:
    """The job: one ClassGraph per pp index, and the members of every pp-spanning join."""

    world: World
    classes: tuple[ClassGraph, ...]
    join_offsets: np.ndarray  # join id -> slice of join_class / join_node
    join_class: np.ndarray
    join_node: np.ndarray
    lanes: tuple[int, ...] = field(init=False)  # the world's lane shape

    def __post_init__(self) -> None:
        if len(self.classes) != self.world.pp:
            raise ValueError(f"{len(self.classes)} class graphs for pp({self.world.pp}) classes")
        object.__setattr__(self, "lanes", self.world.lane_shape)

    def join_members(self, join: int) -> list[tuple[int, int]]:
        lo, hi = self.join_offsets[join], self.join_offsets[join + 1]
        return list(
            zip(self.join_class[lo:hi].tolist(), self.join_node[lo:hi].tolist(), strict=True)
        )

    @property
    def nodes(self) -> int:
        return sum(len(c) for c in self.classes)

    def save(self, path: str | Path) -> None:
        w = self.world
        arrays = {
            "world_axes": np.array(w.names, dtype=str),
            "world_shape": np.array(w.shape),
            "world": np.array([w.vpp, w.gpus_per_node]),
            "join_offsets": self.join_offsets,
            "join_class": self.join_class,
            "join_node": self.join_node,
        }
        for c in self.classes:
            arrays |= {f"c{c.pp}_{k}": v for k, v in c.nodes.items()}
            arrays[f"c{c.pp}_streams"] = np.array(c.streams, dtype=str)
            arrays[f"c{c.pp}_strings"] = np.array(c.strings, dtype=str)
        np.savez_compressed(path, **arrays)

    @classmethod
    def load(cls, path: str | Path) -> ExecutionGraph:
        with np.load(path, allow_pickle=False) as z:
            vpp, gpn = (int(x) for x in z["world"])
            axes = zip(
                (str(a) for a in z["world_axes"]), (int(s) for s in z["world_shape"]), strict=True
            )
            world = World(axes=tuple(axes), vpp=vpp, gpus_per_node=gpn)
            classes = tuple(
                ClassGraph(
                    pp=p,
                    nodes={k: _column(z, p, k) for k in NODE_COLUMNS},
                    streams=tuple(str(s) for s in z[f"c{p}_streams"]),
                    strings=tuple(str(s) for s in z[f"c{p}_strings"]),
                )
                for p in range(world.pp)
            )
            return cls(
                world=world,
                classes=classes,
                join_offsets=z["join_offsets"],
                join_class=z["join_class"],
                join_node=z["join_node"],
            )
