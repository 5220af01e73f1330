"""Profiles for the tests: what a GPU run of a tiny job would have recorded, made from its
capture so that ingestion, comparison and calibration run in seconds on CPU."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np

from emulator.capture.opmap import READS_NO_INPUT
from emulator.capture.trace import COMPUTE
from prismbench.profile_readers import ProfiledOp

FIXTURE = Path(__file__).parent / "data" / "chrome_trace_small.json"
TINY = {"model": {"name": "gpt-debug"}, "batch": {"seq_len": 64, "global_batch": 2}}
TINY_TOML = '[model]\nname = "gpt-debug"\n[batch]\nseq_len = 64\nglobal_batch = 2\n'


def compute_rows(trace) -> list[int]:
    return [int(r) for r in np.flatnonzero(trace.columns["kind"] == COMPUTE)]


def profiled(trace, row: int, us: float) -> ProfiledOp:
    """What the profiler records for a trace row: aten::op, input shapes (the output where
    inputs are scalars or absent, or only name a dtype, as a GPU zeros or new_zeros records its
    fill_'s destination), a kernel."""
    aten = trace.strings[trace.columns["aten"][row]]
    tensors = trace.tensors(row)
    inputs = [s for s, _, out in tensors if not out and s and aten not in READS_NO_INPUT]
    shapes = inputs or [s for s, _, out in tensors if out]
    return ProfiledOp(aten.replace(".", "::", 1), tuple(shapes), (("k", us),), 0.0)


def synthetic_profile(trace) -> list[ProfiledOp]:
    return [profiled(trace, r, 1.0 + i % 3) for i, r in enumerate(compute_rows(trace))]


def write_jsonl(path: Path, ops: list[ProfiledOp]) -> Path:
    with gzip.open(path, "wt") as handle:
        for op in ops:
            event = {"op": op.op, "shapes": op.shapes, "self_cuda_us": op.kernel_us}
            handle.write(json.dumps(event | {"kernels": op.kernels, "cpu_start_us": 0.0}) + "\n")
    return path
