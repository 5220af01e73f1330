"""Measured kernel tables (results/kernels/<gpu>.csv): loading and the three-step lookup.

A row gives one measured kernel (or the kernels one op launched); the table answers "how long
does this GPU take for an op of this shape". `KernelTable.lookup` tries, in order:
1. **exact**: rows of the op's group with the same shape: the mean of their times, each row
   weighted by its `repetitions` (the kernels it averages; 1 where not given), so that two
   kernels measured once do not outweigh the same op measured a hundred times elsewhere;
2. **interpolated**: the achieved rate (FLOP/s for GEMM and attention, bytes/s for memory-bound
   ops) of the `NEIGHBOURS` nearest rows of the group within a factor of 2 on every shape field,
   inverse-distance weighted (power 2) in log-shape space; memory-bound ops whose own aten op
   has no row nearby use the rows of their op class (any aten op) the same way, except that
   the aten ops whose recorded bytes are not their kernels' traffic (`BYTES_NOT_TRAFFIC`)
   price only each other. A GEMM's rate is interpolated per busy tile slot: each row's rate
   over its tile utilisation (padding and wave quantization on the table's GPU, `gemm_tiles`),
   times the op's own, so that a 1 600-wide GEMM priced from 1 536- and 2 048-wide rows pays
   for the 1 664 columns its tiles compute;
3. **extrapolated**: an op larger than the rows (no row within the radius, and rows at or
   below it on every shape field, each measured at `MIN_EXTRAPOLATED_ROW_S` or longer) takes
   the achieved rate of the largest of those rows (within the radius of the nearest one; at most
   `NEIGHBOURS`), weighted as in 2. A kernel's throughput does not fall as it grows, so the rate of a
   smaller measured shape is a floor for a larger one, where the roofline curves' generic
   efficiency is not: on a real H200 the 125M GPT at micro-batch 71 (GEMMs of 145 408 rows,
   8.9x the table's largest of that shape) ran 0.5815 s an iteration; with 88 % of its compute
   priced by the curves it was predicted 0.418 s (-28 %), with those ops extrapolated 0.587 s
   (`results/fidelity/big_batch_h200.md`); and a GEMM of the unaligned variant with no row near
   or below takes the rate of the `NEIGHBOURS` nearest unaligned rows at any distance (those of
   `MIN_EXTRAPOLATED_ROW_S` or longer where there are any), weighted as in 2: the roofline
   curves describe aligned tensor-core kernels, 5-7x faster than cuBLAS's unaligned ones, whose
   rate hardly moves with shape (the H100 table's unaligned rows: 95-153 TFLOP/s from m = 512
   to 32 768; a tensor-parallel rank's 12 565-row vocabulary shard, measured under the fake
   process group, 98-145 TFLOP/s, where the curves priced it at ~690);
4. nothing (None): the caller prices the op with its roofline curves (`costs.compute`): ops
   smaller than every row, or larger on some fields and smaller on others (an unaligned GEMM
   only where its group has no row at all), never below `KernelTable.floor_s` (a smaller op
   measured) nor above `KernelTable.ceiling_s` (a larger op of its group measured).
Each answer also says how many kernels the op launches (`kernels`: the mean over the same
rows, with the same weights, of the rows that state it; 1 where none does), for the time a
stream idles between kernels (`costs.pricing`). Profiles and `prismbench calibrate` state it;
the shared microbenchmarks list kernel names, not launches, so their rows leave it blank.

Groups: (op class, dtype, causal, variant). The variant keeps apart kernels that one op class
covers but that run at very different rates: GEMMs with a dimension not divisible by 8 run
cuBLAS's unaligned kernels (~6x slower on the H100, shared microbenchmarks); attention and
memory-bound classes are keyed by the aten op the capture records (torch's SDPA runs cuDNN's
kernel on an H100, ~2x the flash backend's rate, and a program's own masked-attention op is
neither; a layer norm's backward is not its forward). Attention is also keyed by the head-dim
tile its kernel is built for (`kernel_head_dim`), and its rate is counted in the FLOPs of that
tile: a head dim of 96 runs the 128 kernel, padded.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from emulator.costs.gemm_tiles import gemm_tile_utilisation
from emulator.costs.ops import ATTENTION_OPS, GEMM_OPS, OpRecord, attention_op, gemm_op

SHAPE_FIELDS = ("m", "n", "k", "batch", "heads_q", "heads_kv", "seq_q", "seq_kv", "head_dim", "causal", "nbytes")
PROVENANCE_FIELDS = ("gpu", "driver", "torch", "clocks", "date")
COLUMNS = ("op", "dtype", "aten", *SHAPE_FIELDS, "time_us", "repetitions", "spread_us", "kernels", *PROVENANCE_FIELDS, "source")
# Tables written before kernel counts were recorded are still read (every count then 1).
OPTIONAL_COLUMNS = ("kernels",)
# How a compute op was priced: from the table (exact shape, interpolated or extrapolated to a
# larger shape), from the published rates of an attention kernel the table did not measure
# (`[kernels] attention`, `costs.attention_rates`), or by the curves.
PRICE_SOURCES = ("exact", "interpolated", "extrapolated", "published-rates", "roofline")
# DEFAULT (not fitted): the shortest a row may run to lend its rate to a larger op (lookup step
# 3). Shorter kernels run below their throughput (a few us of ramp and tail, and the 2.2 us a
# stream idles per kernel, `costs.host_dispatch`): carried up by orders of magnitude, their
# rate would price a large op many times too slow.
MIN_EXTRAPOLATED_ROW_S = 20e-6
# Interpolation uses at most this many nearest rows (within the radius): enough to straddle a
# shape on each side in two dimensions, few enough that far rows do not dilute near ones.
NEIGHBOURS = 8
# cuBLAS picks vectorised (aligned) kernels when leading dimensions are multiples of 16 bytes.
GEMM_ALIGN_ELEMENTS = 8
ANY_ATEN = "*"
# The attention kernels of the measured tables (cuDNN's sm90 SDPA kernels, which torch's SDPA
# runs on the H100 and H200) come one per head-dim tile: the shared profiles name a 64-wide
# tile for head dim 64 and a 128-wide one for 96 and 128 ("..._flash_fprop_wgmma_f16_knob_7_
# 64x128x64_..." and "..._64x128x128_..."), and the 760M job's forward (head dim 96) takes the
# time of the 1.3B job's (head dim 128, same batch, heads and sequence) to 0.2 %. Head dims
# above 128 were not measured: taken as padded to a multiple of 64.
ATTENTION_HEAD_DIM_TILES = (64, 128)
# Aten ops whose recorded bytes are not what their CUDA kernels move, so that their rows' rates
# (bytes/s) describe no other op: they price each other only, never the rest of their class
# (lookup step 2's class-level rows). The capture counts nll_loss's inputs and outputs, the
# whole [tokens, vocab] log-probabilities (and, backward, their gradient); ATen's kernels
# (aten/src/ATen/native/cuda/Loss.cu, nll_loss_forward_reduce_cuda_kernel_2d and
# nll_loss_backward_reduce_cuda_kernel_2d) touch the label's entry of each token, the
# backward's zero-fill of the gradient being a kernel of its own (`opmap.ZERO_FILLED_OUTPUT`).
# The tables' rows "run" at 29-750 TB/s (H200 table; HBM gives 4.8): lent to the fused loss's
# backward, which reads the logits and writes their gradient whole, they priced it at 0.02 ms
# where an H200 measured 0.54 (results/calibration/README.md, "The fused loss's two kernels").
BYTES_NOT_TRAFFIC = frozenset({"aten.nll_loss_forward", "aten.nll_loss_backward"})
NOT_TRAFFIC = "bytes not traffic"  # their class-level variant (`lookup_keys`)
# Aten ops of one class whose kernels are different algorithms: each prices from its own rows
# only (no class-level group). The embedding's forward is a gather; its backward sorts the
# token ids and scatter-adds their gradients, 10-20x the time per recorded byte (H100 table,
# the 125M job's profile: 102 MB, 19 us forward, 312 us backward). A forward of 34-50 MB, with
# no own row within a factor 2 nor one of 20 us below it, was extrapolated from the backward's
# rows: 140-212 us on the H100 table where its own rows give about 12 (and 250-500 us on the
# A100 tables; Megatron's GPT 22B on 8 A100s, korthikanti2022 r013, runs one).
OWN_ROWS_ONLY = frozenset({"aten.embedding", "aten.embedding_dense_backward"})


def op_class(name: str) -> str:
    """Ops that run the same kernels share a class: all GEMMs but scaled_mm are "gemm"."""
    if name in GEMM_OPS and name != "scaled_mm":
        return "gemm"
    return name


def kernel_head_dim(head_dim: int) -> int:
    """The head dim of the attention kernel that runs `head_dim` (ATTENTION_HEAD_DIM_TILES)."""
    for tile in ATTENTION_HEAD_DIM_TILES:
        if head_dim <= tile:
            return tile
    return -(-head_dim // 64) * 64


def variant(op: OpRecord) -> str:
    """The part of a group key that the op class alone does not say (see the module docstring)."""
    if op.name in GEMM_OPS:
        aligned = all(d % GEMM_ALIGN_ELEMENTS == 0 for d in (op.m, op.n, op.k))
        return "aligned" if aligned else "unaligned"
    if op.name in ATTENTION_OPS:
        return f"{op.aten or ANY_ATEN} head-dim tile {kernel_head_dim(op.head_dim)}"
    return op.aten or ANY_ATEN


def group_key(op: OpRecord) -> tuple:
    return (op_class(op.name), op.dtype, op.causal if op.name in ATTENTION_OPS else False, variant(op))


def lookup_keys(op: OpRecord) -> list[tuple]:
    """The op's group, then (memory-bound ops keyed by their aten op) its class-level group:
    attention variants do not stand in for each other (their rates differ by 2x and more). The
    aten ops of `BYTES_NOT_TRAFFIC` have a class-level group of their own: their rows price
    each other, never another op of the class; those of `OWN_ROWS_ONLY` have none. A row
    joins the groups its op looks up."""
    key = group_key(op)
    memory_bound = op.name not in GEMM_OPS and op.name not in ATTENTION_OPS
    if not memory_bound or key[3] == ANY_ATEN or op.aten in OWN_ROWS_ONLY:
        return [key]
    return [key, (*key[:3], NOT_TRAFFIC if op.aten in BYTES_NOT_TRAFFIC else ANY_ATEN)]


def _features(op: OpRecord) -> np.ndarray:
    if op.name in GEMM_OPS:
        return np.log2([op.m, op.n, op.k, op.batch])
    if op.name in ATTENTION_OPS:
        return np.log2([op.batch * op.heads_q, op.heads_q / op.heads_kv, op.seq_q, op.seq_kv, op.head_dim])
    return np.log2([max(op.bytes_total, 1.0)])


def _work(op: OpRecord) -> float:
    if op.name in ATTENTION_OPS:  # the padded tile computes too
        return op.flops * kernel_head_dim(op.head_dim) / op.head_dim
    return op.flops if op.name in GEMM_OPS else op.bytes_total


def row_op(row: dict) -> OpRecord:
    """The op a table row measured (shape fields read back as the capture records them)."""
    name, dtype = row["op"], row["dtype"]
    aten = row.get("aten") or ""
    if name in GEMM_OPS:
        op = gemm_op(name, int(row["m"]), int(row["n"]), int(row["k"]), batch=int(row["batch"] or 1), dtype=dtype)
        return replace(op, aten=aten)
    if name in ATTENTION_OPS:
        op = attention_op(
            name, batch=int(row["batch"]), heads_q=int(row["heads_q"]), heads_kv=int(row["heads_kv"]),
            seq_q=int(row["seq_q"]), seq_kv=int(row["seq_kv"]), head_dim=int(row["head_dim"]),
            causal=row["causal"].strip().lower() in ("1", "true"), dtype=dtype,
        )
        return replace(op, aten=aten)
    nbytes = float(row["nbytes"])
    return OpRecord(name=name, dtype=dtype, aten=aten, bytes_read=nbytes / 2, bytes_written=nbytes / 2)


def row_fields(op: OpRecord) -> dict:
    """The table fields that say which op a row measured (`row_op` reads them back)."""
    fields = {"op": op.name, "dtype": op.dtype, "aten": op.aten}
    if op.name in GEMM_OPS:
        return fields | {"m": op.m, "n": op.n, "k": op.k, "batch": op.batch}
    if op.name in ATTENTION_OPS:
        names = ("batch", "heads_q", "heads_kv", "seq_q", "seq_kv", "head_dim")
        return fields | {f: getattr(op, f) for f in names} | {"causal": str(op.causal).lower()}
    return fields | {"nbytes": int(op.bytes_total)}


@dataclass(frozen=True)
class KernelTable:
    """Measured rows grouped by `group_key`: log-shape features, achieved rates, repetitions,
    kernels per call (NaN where a row does not say) and measured seconds."""

    gpus: tuple[str, ...]  # the GPUs its rows say they were measured on (the `gpu` column)
    groups: dict
    label: str = ""  # where it was read from, and which sources were left out
    # the `source` of its rows: whether a profile's own rows price it (`compare`'s in-sample note)
    sources: frozenset[str] = frozenset()

    def lookup(
        self, op: OpRecord, sm_count: int, *, max_log2_distance: float = 1.0
    ) -> tuple[float, str, float] | None:
        """(seconds, "exact" | "interpolated" | "extrapolated", kernels launched) for `op`, or
        None where the table has no row near or below it (an unaligned GEMM: no unaligned row at
        all). `sm_count`: the SMs of the table's GPU (a GEMM's tile utilisation depends on
        them)."""
        own = lookup_keys(op)[0]
        target = _features(op)
        distances = {
            k: np.max(np.abs(self.groups[k][0] - target), axis=1)
            for k in lookup_keys(op)
            if k in self.groups
        }
        for k, distance in distances.items():
            _, rates, repetitions, kernels, _ = self.groups[k]
            if k == own and (distance == 0).any():
                same = distance == 0
                seconds_per_work = np.average(1.0 / rates[same], weights=repetitions[same])
                count = _kernel_count(kernels[same], repetitions[same])
                return _work(op) * float(seconds_per_work), "exact", count
            near = np.flatnonzero(distance <= max_log2_distance)
            if len(near):
                return self._from_rows(op, k, near, distance, sm_count, "interpolated")
        for k, distance in distances.items():
            features, _, _, _, times = self.groups[k]
            below = np.flatnonzero(
                np.all(features <= target, axis=1) & (times >= MIN_EXTRAPOLATED_ROW_S)
            )
            if len(below):
                # the largest shapes only: far smaller rows run below saturation
                largest = below[distance[below] <= distance[below].min() + max_log2_distance]
                return self._from_rows(op, k, largest, distance, sm_count, "extrapolated")
        if own in distances and own[3] == "unaligned":
            # the curves price aligned tensor-core kernels only: any measured unaligned row is
            # nearer the truth (module docstring, step 3)
            times = self.groups[own][4]
            rows = np.flatnonzero(times >= MIN_EXTRAPOLATED_ROW_S)
            rows = rows if len(rows) else np.arange(len(times))
            return self._from_rows(op, own, rows, distances[own], sm_count, "extrapolated")
        return None

    def _from_rows(
        self, op: OpRecord, key: tuple, rows: np.ndarray, distance: np.ndarray, sm_count: int,
        source: str,
    ) -> tuple[float, str, float]:
        """`op` at the inverse-distance weighted rate of the `NEIGHBOURS` nearest of `rows`."""
        features, rates, _, kernels, _ = self.groups[key]
        near = rows[np.argsort(distance[rows], kind="stable")[:NEIGHBOURS]]
        weights = 1.0 / np.maximum(distance[near], 1e-9) ** 2  # class-level rows may sit at 0
        near_rates = rates[near]
        if op.name in GEMM_OPS:
            near_rates = near_rates / _tile_utilisation(features[near], sm_count)
        rate = float(np.exp(np.sum(weights * np.log(near_rates)) / np.sum(weights)))
        if op.name in GEMM_OPS:
            rate *= gemm_tile_utilisation(op.m, op.n, op.batch, sm_count)
        return _work(op) / rate, source, _kernel_count(kernels[near], weights)

    def floor_s(self, op: OpRecord) -> float:
        """The least time an op the lookup leaves to the curves can take, 0 where no row says:
        - the longest measured time of a row of the op's own group (same kernels) at or below
          it on every shape field: it does more of the same work than such a row and takes no
          less time. Rows too short to lend their rate upwards (`MIN_EXTRAPOLATED_ROW_S`) still
          bound it from below: carried up as a rate they would price a large op far too slow,
          but as a time they are what a smaller op of the kind was measured to take, where the
          curves price a kernel at bandwidth alone (a 4 MiB add in under 1.5 us beside a
          measured 1 MiB add at 4 us);
        - the shortest time of a row of its class-level group (any aten op, `lookup_keys`) at
          or below it: no kernel of the class ran faster, however little it moved, and the
          lookup already prices the op from those rows where they are near. Without it, ops
          just past the last such row fell to the curves: an fp32 aten.sub of 1 218 B was
          priced 0.0004 us beside 2.84 us for 1 024 B (interpolated), where the H100 table's
          fastest fp32 elementwise kernel took 1.15 us."""
        target = _features(op)
        floor = 0.0
        for i, key in enumerate(lookup_keys(op)):
            if key not in self.groups:
                continue
            features, _, _, _, times = self.groups[key]
            below = np.all(features <= target, axis=1)
            if below.any():
                floor = max(floor, float(times[below].max() if i == 0 else times[below].min()))
        return floor

    def ceiling_s(self, op: OpRecord) -> float:
        """The most time an op the lookup leaves to the curves can take, inf where no row says:
        the shortest measured time of a row of the op's own group (same kernels) at or above it
        on every shape field: it does no more of the same work than such a row and takes no
        longer. Without it, an op short of every row of its group took the curves' generic price
        however far above those rows' times: the shared Llama 2 job's nll_loss forward (0.52 GB
        of logits, its own profile's row left out) was priced 181 us on the H100 table, where
        the smallest larger one measured took 19.0 us and its own profile 18.1 us."""
        key = lookup_keys(op)[0]
        if key not in self.groups:
            return float("inf")
        features, _, _, _, times = self.groups[key]
        above = np.all(features >= _features(op), axis=1)
        return float(times[above].min()) if above.any() else float("inf")

    def time_s(self, op: OpRecord, sm_count: int, **kwargs) -> float | None:
        found = self.lookup(op, sm_count, **kwargs)
        return None if found is None else found[0]


def _kernel_count(kernels: np.ndarray, weights: np.ndarray) -> float:
    """Weighted mean of the stated kernel counts (NaN: not stated); 1 where none is stated."""
    stated = ~np.isnan(kernels)
    return float(np.average(kernels[stated], weights=weights[stated])) if stated.any() else 1.0


def _tile_utilisation(features: np.ndarray, sm_count: int) -> np.ndarray:
    """`gemm_tile_utilisation` of GEMM rows from their log2 (m, n, k, batch) features."""
    shapes = np.rint(np.exp2(features)).astype(np.int64)
    return np.array([gemm_tile_utilisation(m, n, b, sm_count) for m, n, _, b in shapes])


@dataclass(frozen=True)
class MeasuredRow:
    """One row of a kernel CSV, read and checked (`read_rows`)."""

    op: OpRecord
    time_us: float
    repetitions: float
    kernels: float  # NaN: not stated
    gpu: str  # the provenance column: the GPU it was measured on ("" where not said)
    source: str


def row_key(op: OpRecord) -> tuple:
    """What two rows of the same op and shape share: the op's group and its shape features
    (the rows `KernelTable.lookup` would average as "exact")."""
    return (group_key(op), tuple(_features(op)))


def read_rows(path: str | Path) -> list[MeasuredRow]:
    """The rows of a kernel CSV; refuses missing columns and non-positive times, naming the line."""
    path = Path(path)
    rows = []
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        required = [column for column in COLUMNS if column not in OPTIONAL_COLUMNS]
        missing = [column for column in required if column not in (reader.fieldnames or ())]
        if missing:
            raise ValueError(f"{path}: kernel table lacks columns {missing}")
        for line, row in enumerate(reader, start=2):
            try:
                rows.append(_measured_row(row))
            except ValueError as err:
                raise ValueError(f"{path}:{line}: {err}") from None
    return rows


def _measured_row(row: dict) -> MeasuredRow:
    measured = MeasuredRow(
        op=row_op(row),
        time_us=float(row["time_us"]),
        repetitions=float(row["repetitions"] or 1),
        kernels=float(row.get("kernels") or "nan"),
        gpu=row["gpu"],
        source=row["source"],
    )
    if not measured.time_us > 0:
        raise ValueError(f"time_us={row['time_us']!r} must be > 0")
    if not measured.repetitions > 0:
        raise ValueError(f"repetitions={row['repetitions']!r} must be > 0")
    if not (np.isnan(measured.kernels) or measured.kernels >= 1):
        raise ValueError(f"kernels={row['kernels']!r} must be blank or >= 1")
    return measured


def merge_rows(*row_lists: list[MeasuredRow]) -> list[MeasuredRow]:
    """Several tables' rows as one: a later list's rows replace an earlier list's rows of the
    same op and shape (`row_key`), so a user's own measurement of an op wins over the preset's
    instead of being averaged with it; rows of other shapes are all kept."""
    merged: list[MeasuredRow] = []
    for rows in row_lists:
        replaced = {row_key(row.op) for row in rows}
        merged = [row for row in merged if row_key(row.op) not in replaced] + list(rows)
    return merged


def load_kernel_table(
    path: str | Path, *, skip_sources: tuple[str, ...] = (), label: str | None = None
) -> KernelTable:
    """Read a kernel CSV (`read_rows`) as a table (`table_from_rows`); label: how results name
    the table (default: the path as given)."""
    return table_from_rows(read_rows(path), label=label or str(path), skip_sources=skip_sources)


def table_from_rows(
    *row_lists: list[MeasuredRow], label: str, skip_sources: tuple[str, ...] = ()
) -> KernelTable:
    """The lookup table of the rows of `row_lists`, merged (`merge_rows`: a later list's row
    replaces an earlier one's of the same op and shape), named `label`.

    skip_sources: rows whose `source` starts with one of these are left out (leave-one-out
    scoring: a job's own profile must not price that job), before the lists are merged: a
    left-out row replaces no other list's row (a user's rows ingested from the profile being
    left out would otherwise take the committed table's rows of their shapes with them); a
    prefix that leaves out no row is refused, as a typo would score a job against its own
    profile."""
    rows = [r for rows in row_lists for r in rows]
    unmatched = [p for p in skip_sources if not any(r.source.startswith(p) for r in rows)]
    if unmatched:
        raise ValueError(f"{label}: no row's source starts with {unmatched[0]!r}, the prefix to leave out")
    kept = merge_rows(
        *([r for r in part if not (skip_sources and r.source.startswith(skip_sources))] for part in row_lists)
    )
    if not kept:  # an empty table would price every op by the roofline, unannounced
        left = f" once {', '.join(skip_sources)} are left out" if skip_sources else ""
        raise ValueError(f"{label}: kernel table has no rows{left}")
    grouped: dict[tuple, tuple[list, list, list, list, list]] = {}
    for row in kept:
        for key in lookup_keys(row.op):
            features, rates, weights, counts, times = grouped.setdefault(key, ([], [], [], [], []))
            features.append(_features(row.op))
            rates.append(_work(row.op) / (row.time_us * 1e-6))
            weights.append(row.repetitions)
            counts.append(row.kernels)
            times.append(row.time_us * 1e-6)
    groups = {key: tuple(np.array(column) for column in group) for key, group in grouped.items()}
    label += f" without {', '.join(skip_sources)}" if skip_sources else ""
    gpus = tuple(dict.fromkeys(r.gpu for r in kept if r.gpu))
    sources = frozenset(r.source for r in kept)
    return KernelTable(gpus=gpus, groups=groups, label=label, sources=sources)
