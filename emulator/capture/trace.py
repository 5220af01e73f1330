"""RankTrace: everything one rank did in one captured step, as columnar numpy arrays.

Events (compute, comm, wait, alloc, free, marker) are rows in `seq` order; every field is a
column (numpy array, one entry per event), strings are indices into one interned table, and
ragged fields (tensor shapes, coalesced sizes) are flat arrays with offsets. A trace saves to
one `.npz` and loads back without pickle.

`EventSequence` is the counter that orders events across producers: the op recorder and the
virtual backend draw from the same one, so `seq` is a total order of what the rank issued.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, MutableSequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

SCHEMA_VERSION = 3  # 3: the master_weights category
# record / stream_wait: a stream's position recorded as event `tag`, and a stream waiting
# for event `tag` (emulator/capture/streams.py); the row's `stream` is the recording/waiting one.
EVENT_KINDS = ("compute", "comm", "wait", "alloc", "free", "marker", "record", "stream_wait")
COMPUTE, COMM, WAIT, ALLOC, FREE, MARKER, RECORD, STREAM_WAIT = range(len(EVENT_KINDS))
PHASES = ("forward", "backward", "recompute", "optimizer")
# the phases autograd's engine runs (recompute re-runs forward ops inside backward)
BACKWARD_PHASES = (PHASES.index("backward"), PHASES.index("recompute"))
CATEGORIES = (
    "parameter",
    "buffer",
    "gradient",
    "master_weights",  # fp32 copies an optimizer holds from construction
    "optimizer_state",  # what the optimizer's first step creates (moments, step counts)
    "activation",
    "temporary",
    "communication",
    "other",
)

# Column name -> dtype. String columns hold indices into `RankTrace.strings` (0 is "").
COLUMNS = {
    "seq": np.int64,
    "kind": np.int8,
    "stream": np.int16,
    "phase": np.int8,
    "micro_batch": np.int32,
    "module": np.int32,
    "name": np.int32,
    "aten": np.int32,
    "flops": np.int64,
    "read_bytes": np.int64,
    "write_bytes": np.int64,
    "workspace_bytes": np.int64,
    "causal": np.bool_,
    "size_bytes": np.int64,
    "storage": np.int64,
    "category": np.int32,
    "group": np.int32,
    "group_size": np.int32,
    "reduce_op": np.int32,
    "dtype": np.int32,
    "numel": np.int64,
    "async_op": np.bool_,
    "peer": np.int64,
    "root": np.int64,
    "tag": np.int64,
    "comm_seq": np.int64,
}
# Ragged arrays: per-event tensor lists (dims per tensor) and coalesced comm sizes.
RAGGED = {
    "tensor_offsets": np.int64,
    "tensor_dim_offsets": np.int64,
    "tensor_dims": np.int64,
    "tensor_dtype": np.int32,
    "tensor_is_output": np.bool_,
    "sizes_offsets": np.int64,
    "sizes": np.int64,
    "group_names": np.int32,
    "group_rank_offsets": np.int64,
    "group_ranks": np.int64,
}


class EventSequence:
    """Shared, monotonically increasing event counter.

    The backend uses it through `comm_events.Recorder(_counter=sequence)` (it is an
    iterator) or by calling `next_seq()`; the op recorder takes it as `sequence=`.
    """

    def __init__(self, start: int = 0):
        self._counter = itertools.count(start)

    def next_seq(self) -> int:
        return next(self._counter)

    def __iter__(self) -> EventSequence:
        return self

    def __next__(self) -> int:
        return next(self._counter)


class OpEvent(NamedTuple):
    """One non-comm event as the op recorder produces it (columnarized by `build_trace`)."""

    seq: int
    kind: int
    name: str
    aten: str
    stream: int
    module: str
    phase: int
    micro_batch: int
    flops: int = 0
    read_bytes: int = 0
    write_bytes: int = 0
    size_bytes: int = 0
    storage: int = -1
    category: str = ""
    tensors: tuple = ()  # ((shape tuple, dtype name, is_output), ...)
    workspace_bytes: int = 0
    causal: bool = False
    tag: int = 0  # record / stream_wait: the event id
    # compute rows, when the recorder is asked for them (`OpRecorder.record_flows`): the
    # storage id of each of `tensors`, -1 where unknown; capture rules read them
    # (emulator.capture.compile_fusion), the RankTrace does not keep them
    flows: tuple = ()
    # compute rows: storage ids of `flows` the row reads through their transpose, its loop
    # running over its output's order (an fp8 cast folded into the row-major copy of a
    # transposed operand: emulator.capture.fp8_casts); Inductor fuses no such read with a read
    # of the same storage in its own order
    transposed_reads: tuple = ()


# the OpEvent fields of storage ids that only capture rules read (the RankTrace drops them)
CAPTURE_ONLY_FIELDS = ("flows", "transposed_reads")


class EventLog(MutableSequence):
    """The op recorder's events: a list of OpEvents, held as plain tuples.

    Why not a list of OpEvents: Python's cycle collector never stops tracking a NamedTuple
    (CPython untracks only exact tuples whose items are untracked), and a capture collects
    before every micro-batch (emulator.capture.rank.garbage_collected_at_micro_batches), so a
    job of N micro-batches scanned every earlier event N times (`prismbench capture` of
    gpt-debug at 1 024 micro-batches: 99.5 s before, 16.4 s after; results/perf/
    grad_accumulation*.md). A plain tuple of ints, strings
    and tuples of them is untracked by the collections themselves (a level of nesting, at
    worst, per collection). Reads give OpEvents back.
    """

    __slots__ = ("_rows",)

    def __init__(self, events: Iterable[OpEvent] = ()):
        self._rows = [_row(e) for e in events]

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [OpEvent._make(row) for row in self._rows[index]]
        return OpEvent._make(self._rows[index])

    def __setitem__(self, index, value) -> None:
        if isinstance(index, slice):
            self._rows[index] = [_row(e) for e in value]
        else:
            self._rows[index] = _row(value)

    def __delitem__(self, index) -> None:
        del self._rows[index]

    def __iter__(self) -> Iterator[OpEvent]:
        return map(OpEvent._make, self._rows)

    def insert(self, index: int, value: OpEvent) -> None:
        self._rows.insert(index, _row(value))

    def append(self, value: OpEvent) -> None:
        self._rows.append(_row(value))


def _row(event: OpEvent) -> tuple:
    if type(event) is not OpEvent:
        raise TypeError(f"an EventLog holds OpEvents, not {type(event).__name__}")
    return tuple(event)


def renamed_storages(e: OpEvent, rename: Mapping[int, int]) -> OpEvent:
    """`e` with the storage ids of its `CAPTURE_ONLY_FIELDS` renamed (ids not in `rename` kept):
    a rule that gives storages new ids (a reused micro-batch's copies, the CSE's aliases)."""
    return e._replace(**{
        name: tuple(rename.get(u, u) for u in getattr(e, name)) for name in CAPTURE_ONLY_FIELDS
    })  # fmt: skip


class _Strings:
    def __init__(self):
        self.index: dict[str, int] = {"": 0}

    def __call__(self, s: str | None) -> int:
        if s is None:
            return 0
        i = self.index.get(s)
        if i is None:
            i = self.index[s] = len(self.index)
        return i


@dataclass(frozen=True, kw_only=True)
class TraceSummary:
    events: int
    compute_ops: int
    flops: int
    flops_by_phase: dict[str, int]
    comm_bytes_by_kind: dict[str, int]
    comm_bytes_by_group: dict[str, int]
    peak_live_bytes: int
    final_live_bytes: int


@dataclass(frozen=True, kw_only=True, eq=False)
class RankTrace:
    columns: dict[str, np.ndarray]
    ragged: dict[str, np.ndarray]
    strings: tuple[str, ...]

    def __post_init__(self) -> None:
        missing = (set(COLUMNS) - set(self.columns)) | (set(RAGGED) - set(self.ragged))
        if missing:
            raise ValueError(f"trace is missing arrays {sorted(missing)}")
        n = len(self.columns["seq"])
        wrong = {k: len(v) for k, v in self.columns.items() if len(v) != n}
        if wrong:
            raise ValueError(f"columns {wrong} do not have len(seq)={n} entries")
        if n and np.any(np.diff(self.columns["seq"]) <= 0):
            raise ValueError("seq must be strictly increasing")

    def __len__(self) -> int:
        return len(self.columns["seq"])

    def __getitem__(self, column: str) -> np.ndarray:
        return self.columns[column]

    def text(self, column: str) -> list[str]:
        """A string column decoded to Python strings."""
        return [self.strings[i] for i in self.columns[column]]

    def tensors(self, i: int) -> list[tuple[tuple[int, ...], str, bool]]:
        """(shape, dtype name, is_output) of event i's tensors (inputs first)."""
        r = self.ragged
        lo, hi = r["tensor_offsets"][i], r["tensor_offsets"][i + 1]
        dims, off = r["tensor_dims"], r["tensor_dim_offsets"]
        return [
            (
                tuple(int(d) for d in dims[off[t] : off[t + 1]]),
                self.strings[r["tensor_dtype"][t]],
                bool(r["tensor_is_output"][t]),
            )
            for t in range(lo, hi)
        ]

    def groups(self) -> dict[str, np.ndarray]:
        r = self.ragged
        off = r["group_rank_offsets"]
        return {
            self.strings[g]: r["group_ranks"][off[j] : off[j + 1]]
            for j, g in enumerate(r["group_names"])
        }

    def live_bytes(self) -> np.ndarray:
        """Live bytes after each event (allocations minus frees so far)."""
        kind, size = self.columns["kind"], self.columns["size_bytes"]
        delta = np.where(kind == ALLOC, size, 0) - np.where(kind == FREE, size, 0)
        return np.cumsum(delta)

    def summary(self) -> TraceSummary:
        c = self.columns
        compute = c["kind"] == COMPUTE
        comm = c["kind"] == COMM
        live = self.live_bytes()
        return TraceSummary(
            events=len(self),
            compute_ops=int(compute.sum()),
            # summed as Python ints: a rank's FLOPs can pass int64, where numpy's sum wraps
            flops=int(c["flops"][compute].sum(dtype=object)),
            flops_by_phase={
                p: int(c["flops"][compute & (c["phase"] == i)].sum(dtype=object))
                for i, p in enumerate(PHASES)
            },
            comm_bytes_by_kind=_sum_by(self, comm, "name"),
            comm_bytes_by_group=_sum_by(self, comm, "group"),
            peak_live_bytes=int(live.max(initial=0)),
            final_live_bytes=int(live[-1]) if len(live) else 0,
        )

    def save(self, path: str | Path) -> None:
        arrays = {f"c_{k}": v for k, v in self.columns.items()}
        arrays |= {f"r_{k}": v for k, v in self.ragged.items()}
        np.savez_compressed(
            path,
            schema_version=np.array(SCHEMA_VERSION),
            strings=np.array(self.strings, dtype=str),
            **arrays,
        )

    @classmethod
    def load(cls, path: str | Path) -> RankTrace:
        with np.load(path, allow_pickle=False) as z:
            version = int(z["schema_version"]) if "schema_version" in z else None
            if version != SCHEMA_VERSION:
                raise ValueError(
                    f"{path}: RankTrace schema_version={version}, this code reads {SCHEMA_VERSION}; "
                    "capture the trace again"
                )
            return cls(
                columns={k: z[f"c_{k}"] for k in COLUMNS},
                ragged={k: z[f"r_{k}"] for k in RAGGED},
                strings=tuple(str(s) for s in z["strings"]),
            )


def _sum_by(trace: RankTrace, mask: np.ndarray, column: str) -> dict[str, int]:
    keys = trace.columns[column][mask]
    sizes = trace.columns["size_bytes"][mask]
    return {trace.strings[k]: int(sizes[keys == k].sum()) for k in np.unique(keys)}


def _comm_columns(events, intern: _Strings) -> dict[str, list]:
    """Column values of comm_events.CommEvent / WaitEvent objects (duck-typed)."""
    cols = {
        k: []
        for k in (
            "kind",
            "name",
            "group",
            "group_size",
            "reduce_op",
            "dtype",
            "numel",
            "size_bytes",
            "async_op",
            "peer",
            "root",
            "tag",
            "comm_seq",
            "stream",
        )
    }
    for e in events:
        is_wait = hasattr(e, "comm_seq")
        values = (
            (WAIT, 0, 0, 0, 0, 0, 0, 0, False, -1, -1, 0, e.comm_seq, e.stream)
            if is_wait
            else (
                COMM,
                intern(e.kind),
                intern(e.group_id),
                e.group_size,
                intern(e.op),
                intern(e.dtype),
                e.numel,
                e.nbytes,
                e.async_op,
                -1 if e.peer is None else e.peer,
                -1 if e.root is None else e.root,
                e.tag,
                -1,
                e.stream,
            )
        )
        for column, value in zip(cols.values(), values, strict=True):
            column.append(value)
    return cols


_DEFAULTS = {
    "phase": -1,
    "micro_batch": -1,
    "storage": -1,
    "group_size": 0,
    "peer": -1,
    "root": -1,
    "comm_seq": -1,
}
_STRING_FIELDS = ("name", "aten", "module")


def build_trace(op_events=(), comm_events=(), groups=None, categories=None) -> RankTrace:
    """Merge recorder events (`OpEvent`) and backend events (CommEvent / WaitEvent) by `seq`.

    Each source must already be in `seq` order. Comm and wait rows inherit module, phase and
    micro-batch from the recorder event just before them; their stream is the one they were
    issued (comm) or waited (wait) from; the collective itself runs on its group's stream.
    `categories` (storage id -> category) overrides the category recorded at allocation
    time (the recorder refines categories as it learns more).
    """
    op_events, comm_events = list(op_events), list(comm_events)
    intern, categories = _Strings(), categories or {}
    n_op, n = len(op_events), len(op_events) + len(comm_events)
    op_seq = np.fromiter((e.seq for e in op_events), np.int64, n_op)
    comm_seq = np.fromiter((e.seq for e in comm_events), np.int64, len(comm_events))
    pos = np.empty(n, np.int64)
    pos[np.argsort(np.concatenate([op_seq, comm_seq]), kind="stable")] = np.arange(n)
    op_pos, comm_pos = pos[:n_op], pos[n_op:]
    cols = {k: np.full(n, _DEFAULTS.get(k, 0), dtype=dt) for k, dt in COLUMNS.items()}
    tensor_counts, tensors = _fill_op_rows(cols, op_events, op_pos, intern, categories, n)
    size_counts = np.zeros(n, np.int64)
    sizes = []
    if comm_events:
        for key, values in _comm_columns(comm_events, intern).items():
            cols[key][comm_pos] = values
        before = np.searchsorted(op_seq, comm_seq) - 1
        has_ctx = before >= 0
        for key in ("module", "phase", "micro_batch"):
            cols[key][comm_pos[has_ctx]] = cols[key][op_pos[before[has_ctx]]]
        size_counts[comm_pos] = [len(getattr(e, "sizes", None) or ()) for e in comm_events]
        for e in comm_events:
            sizes.extend(getattr(e, "sizes", None) or ())
    cols["seq"][op_pos], cols["seq"][comm_pos] = op_seq, comm_seq
    group_items = list((groups or {}).items())
    ragged = {
        "tensor_offsets": _offsets(tensor_counts),
        "tensor_dim_offsets": _offsets(tensors["dim_counts"]),
        "tensor_dims": tensors["dims"],
        "tensor_dtype": tensors["dtype"],
        "tensor_is_output": tensors["is_output"],
        "sizes_offsets": _offsets(size_counts),
        "sizes": sizes,
        "group_names": [intern(g) for g, _ in group_items],
        "group_rank_offsets": _offsets([len(r) for _, r in group_items]),
        "group_ranks": np.concatenate([np.asarray(r) for _, r in group_items])
        if group_items
        else [],
    }
    ragged = {k: np.asarray(v, dtype=RAGGED[k]) for k, v in ragged.items()}
    return RankTrace(columns=cols, ragged=ragged, strings=tuple(intern.index))


def _fill_op_rows(cols, op_events, op_pos, intern, categories, n) -> tuple[np.ndarray, dict]:
    """Write the recorder events' columns at their rows; their tensors as ragged lists."""
    tensor_counts = np.zeros(n, np.int64)
    tensors = {"dims": [], "dim_counts": [], "dtype": [], "is_output": []}
    if not op_events:
        return tensor_counts, tensors
    fields = dict(zip(OpEvent._fields, zip(*op_events, strict=True), strict=True))
    for key, values in fields.items():
        if key in _STRING_FIELDS:
            cols[key][op_pos] = [intern(v) for v in values]
        elif key == "category":
            cols[key][op_pos] = [
                intern(categories.get(s, c)) for s, c in zip(fields["storage"], values, strict=True)
            ]
        elif key != "tensors" and key not in CAPTURE_ONLY_FIELDS:
            cols[key][op_pos] = values
    tensor_counts[op_pos] = [len(ts) for ts in fields["tensors"]]
    for ts in fields["tensors"]:
        for shape, dtype, is_out in ts:
            tensors["dims"].extend(shape)
            tensors["dim_counts"].append(len(shape))
            tensors["dtype"].append(intern(dtype))
            tensors["is_output"].append(is_out)
    return tensor_counts, tensors


def _offsets(counts) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(np.asarray(counts, dtype=np.int64))])
