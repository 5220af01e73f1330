"""Helpers shared by the capture tests: small debug jobs, the comm rows of a trace, a normaliser.

`comm_rows` turns a RankTrace's COMM rows into named tuples whose group is given by the mesh
axes it spans (seen from the capturing rank) and whose p2p peer is its mesh offset, so tests
count collectives by (kind, axes, phase, micro-batch) without knowing group ids.
`normalised` rewrites every column of a trace so that two members of one class compare equal.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from emulator.capture.trace import COMM, PHASES, RankTrace
from emulator.world.mesh import World, group_axes
from prismbench.capture import capture_job
from prismbench.spec import job_spec_from_dict


def debug_job(
    parallel=None,
    *,
    model="llama-debug",
    seq_len=32,
    global_batch=None,
    train=None,
    kernels=None,
    **dims,
):
    """A small job: `model` flavor (dims override it), micro-batch 1, pp micro-batches per dp
    rank; `kernels`: the `[kernels]` table (default: the default framework's)."""
    parallel = dict(parallel or {})
    if global_batch is None:
        global_batch = parallel.get("dp", 1) * max(2, parallel.get("pp", 1))
    return job_spec_from_dict(
        {
            "model": {"name": model, **dims},
            "parallel": parallel,
            "batch": {"seq_len": seq_len, "micro_batch": 1, "global_batch": global_batch},
            "train": dict(train or {}),
            "kernels": dict(kernels or {}),
        }
    )


def capture(job, cache_dir=None):
    """All classes of `job`, captured in this process, or read from `cache_dir` (default: the
    suite's cache, tests/conftest.py, shared by the tests that capture the same job). A test
    that watches the capture itself (a spy on what it calls) passes a folder of its own."""
    return capture_job(job, workers=1, cache_dir=cache_dir)


class CommRow(NamedTuple):
    index: int  # row of the trace
    kind: str  # all_gather, reduce_scatter, all_reduce, send, recv, ...
    axes: tuple[str, ...] | None  # mesh axes of the group; None: no mesh group
    phase: str  # "" when no phase was set yet
    micro_batch: int
    module: str
    size_bytes: int
    peer: tuple[int, ...] | None  # p2p: mesh offset (dp, pp, cp, tp) of the peer


def comm_rows(trace: RankTrace, world: World, rank: int) -> list[CommRow]:
    c = trace.columns
    groups = trace.groups()
    axes_of = {g: group_axes(world, rank, np.asarray(r)) for g, r in groups.items()}
    me = world.coords(rank)[0]
    rows = []
    for i in np.flatnonzero(c["kind"] == COMM):
        peer = int(c["peer"][i])
        phase = int(c["phase"][i])
        rows.append(
            CommRow(
                index=int(i),
                kind=trace.strings[c["name"][i]],
                axes=axes_of[trace.strings[c["group"][i]]],
                phase=PHASES[phase] if phase >= 0 else "",
                micro_batch=int(c["micro_batch"][i]),
                module=trace.strings[c["module"][i]],
                size_bytes=int(c["size_bytes"][i]),
                peer=tuple((world.coords(peer)[0] - me).tolist()) if peer >= 0 else None,
            )
        )
    return rows


def count(rows: list[CommRow], **where) -> int:
    """How many rows have every field equal to `where`'s value."""
    return sum(all(getattr(r, k) == v for k, v in where.items()) for r in rows)


def last_backward_row(trace: RankTrace) -> int:
    return int(np.flatnonzero(trace["phase"] == PHASES.index("backward")).max())


# Columns that carry no rank identity: compared as they are (strings decoded).
_PLAIN = (
    "kind",
    "stream",
    "phase",
    "micro_batch",
    "flops",
    "read_bytes",
    "write_bytes",
    "workspace_bytes",
    "causal",
    "size_bytes",
    "group_size",
    "numel",
    "async_op",
    "tag",
)
_STRINGS = ("name", "aten", "module", "category", "reduce_op", "dtype")


def normalised(trace: RankTrace, world: World, rank: int) -> dict[str, np.ndarray]:
    """Every column of `trace` with rank identities replaced by position-free ones.

    group id -> the axes it spans ("tp", "dp+cp"; "" for none); p2p peer -> its mesh offset
    from `rank` ("0,1,0,0": next pipeline stage); root -> its index in the group; a wait's
    comm_seq -> how many events back its collective was; a storage id -> the order of its
    first appearance (which free ends which allocation is kept, not the counter's values).
    Ragged tensor shapes and sizes are kept."""
    c = trace.columns
    strings = np.asarray(trace.strings, dtype=object)
    out = {k: c[k] for k in _PLAIN}
    out |= {k: strings[c[k]] for k in _STRINGS}
    groups = trace.groups()
    axes = {g: _axes_text(group_axes(world, rank, np.asarray(r))) for g, r in groups.items()}
    out["group"] = np.array([axes.get(g, "") for g in strings[c["group"]]], dtype=object)
    peer = c["peer"]
    offsets = np.zeros((len(peer), len(world.shape)), np.int64)
    has_peer = peer >= 0
    offsets[has_peer] = world.coords(peer[has_peer]) - world.coords(rank)[0]
    out["peer"] = np.where(has_peer[:, None], offsets, -(10**9))
    root = np.full(len(peer), -1)
    for i in np.flatnonzero(c["root"] >= 0):
        root[i] = int(np.flatnonzero(groups[trace.strings[c["group"][i]]] == c["root"][i])[0])
    out["root"] = root
    out["comm_seq"] = np.where(c["comm_seq"] >= 0, c["seq"] - c["comm_seq"], -1)
    storage = c["storage"]
    used = storage >= 0
    first_seen = np.unique(storage[used], return_index=True)
    order = np.empty(len(first_seen[0]), np.int64)
    order[np.argsort(first_seen[1])] = np.arange(len(order))
    out["storage"] = np.full(len(storage), -1)
    out["storage"][used] = order[np.searchsorted(first_seen[0], storage[used])]
    out |= {f"ragged_{k}": v for k, v in trace.ragged.items() if not k.startswith("group")}
    out["ragged_tensor_dtype"] = strings[trace.ragged["tensor_dtype"]]
    return out


def _axes_text(axes: tuple[str, ...] | None) -> str:
    return "?" if axes is None else "+".join(axes) or "self"


def first_difference(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> str | None:
    """None when the normalised traces are equal, else where they first differ."""
    if a.keys() != b.keys():
        return f"columns differ: {sorted(a.keys() ^ b.keys())}"
    for key in a:
        x, y = a[key], b[key]
        if x.shape != y.shape:
            return f"{key}: shape {x.shape} != {y.shape}"
        unequal = np.flatnonzero(np.any((x != y).reshape(len(x), -1), axis=1)) if len(x) else []
        if len(unequal):
            i = unequal[0]
            return f"{key}[{i}]: {x[i]!r} != {y[i]!r}"
    return None
