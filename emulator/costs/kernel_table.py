"""Measured kernel tables (results/kernels/<gpu>.csv): loading and shape interpolation.

A row gives one measured kernel; the table answers "how fast does this GPU run a kernel of
roughly this shape". Interpolation is on the achieved rate (FLOP/s for GEMM and attention,
bytes/s for memory-bound ops), inverse-distance weighted in log-shape space over rows of the
same op class and dtype within `max_log2_distance` (default: a factor of 2 on every shape
field); outside that radius the table has no answer and the caller falls back to its curves.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from emulator.costs.ops import ATTENTION_OPS, GEMM_OPS, OpRecord, attention_op, gemm_op

SHAPE_FIELDS = ("m", "n", "k", "batch", "heads_q", "heads_kv", "seq_q", "seq_kv", "head_dim", "causal", "nbytes")
PROVENANCE_FIELDS = ("gpu", "driver", "torch", "clocks", "date")
COLUMNS = ("op", "dtype", *SHAPE_FIELDS, "time_us", "repetitions", "spread_us", *PROVENANCE_FIELDS)


def op_class(name: str) -> str:
    """Ops that run the same kernels share a class: all GEMMs but scaled_mm are "gemm"."""
    if name in GEMM_OPS and name != "scaled_mm":
        return "gemm"
    return name


def _features(op: OpRecord) -> np.ndarray:
    if op.name in GEMM_OPS:
        return np.log2([op.m, op.n, op.k, op.batch])
    if op.name in ATTENTION_OPS:
        return np.log2([op.batch * op.heads_q, op.heads_q / op.heads_kv, op.seq_q, op.seq_kv, op.head_dim])
    return np.log2([max(op.bytes_total, 1.0)])


def _work(op: OpRecord) -> float:
    return op.flops if (op.name in GEMM_OPS or op.name in ATTENTION_OPS) else op.bytes_total


def _row_op(row: dict) -> OpRecord:
    name, dtype = row["op"], row["dtype"]
    if name in GEMM_OPS:
        return gemm_op(name, int(row["m"]), int(row["n"]), int(row["k"]), batch=int(row["batch"] or 1), dtype=dtype)
    if name in ATTENTION_OPS:
        return attention_op(
            name, batch=int(row["batch"]), heads_q=int(row["heads_q"]), heads_kv=int(row["heads_kv"]),
            seq_q=int(row["seq_q"]), seq_kv=int(row["seq_kv"]), head_dim=int(row["head_dim"]),
            causal=row["causal"].strip().lower() in ("1", "true"), dtype=dtype,
        )
    nbytes = float(row["nbytes"])
    return OpRecord(name=name, dtype=dtype, bytes_read=nbytes / 2, bytes_written=nbytes / 2)


@dataclass(frozen=True)
class KernelTable:
    """Measured rows grouped by (op class, dtype, causal): log-shape features and achieved rates."""

    gpu: str
    groups: dict

    def rate(self, op: OpRecord, *, max_log2_distance: float = 1.0) -> float | None:
        """Achieved work per second for `op`'s shape, or None where the table has no nearby row."""
        key = (op_class(op.name), op.dtype, op.causal if op.name in ATTENTION_OPS else False)
        if key not in self.groups:
            return None
        features, rates = self.groups[key]
        distance = np.max(np.abs(features - _features(op)), axis=1)
        near = distance <= max_log2_distance
        if not near.any():
            return None
        if (distance[near] == 0).any():
            return float(np.mean(rates[near][distance[near] == 0]))
        weights = 1.0 / distance[near] ** 2
        return float(np.exp(np.sum(weights * np.log(rates[near])) / np.sum(weights)))

    def time_s(self, op: OpRecord, **kwargs) -> float | None:
        rate = self.rate(op, **kwargs)
        return None if rate is None else _work(op) / rate


def load_kernel_table(path: str | Path) -> KernelTable:
    """Read a kernel CSV; refuses missing columns and non-positive times, naming the line."""
    path = Path(path)
    grouped: dict[tuple, tuple[list, list]] = {}
    gpu = ""
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [column for column in COLUMNS if column not in (reader.fieldnames or ())]
        if missing:
            raise ValueError(f"{path}: kernel table lacks columns {missing}")
        for line, row in enumerate(reader, start=2):
            time_us = float(row["time_us"])
            if not time_us > 0:
                raise ValueError(f"{path}:{line}: time_us={row['time_us']!r} must be > 0")
            op = _row_op(row)
            gpu = row["gpu"]
            key = (op_class(op.name), op.dtype, op.causal if op.name in ATTENTION_OPS else False)
            features, rates = grouped.setdefault(key, ([], []))
            features.append(_features(op))
            rates.append(_work(op) / (time_us * 1e-6))
    groups = {key: (np.array(f), np.array(r)) for key, (f, r) in grouped.items()}
    return KernelTable(gpu=gpu, groups=groups)
