"""Kernel-table rows from a microbenchmark CSV of kernel-only times (the shared H100 format).

The format (`../shared/data/gpu/<gpu>/microbench-kernels.csv`): `op, dtype, shape, flops, bytes,
kernel_us, repetitions, kernels`, one row per benchmarked call, its time summed over the kernels
it launched (torch.profiler kernel records). Each benchmarked call is replayed here under fake
tensors with the capture's own recorder, so the row says what the emulator will look up (its
aten op, dtype and bytes as the capture counts them, not the benchmark's nominal bytes). Calls
that the capture records as several ops (SiLU*x, cross-entropy, amax of |x|, a foreach AdamW
step) cannot be split into per-op times and are skipped, and so are rows without a time
(fp8 refuses dimensions not divisible by 16: those rows say ERROR).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from emulator.capture.fused_ops import gpu_fused_ops
from emulator.capture.op_recorder import OpRecorder
from emulator.capture.trace import COMPUTE
from emulator.costs.kernel_table import row_fields
from emulator.costs.pricing import op_record

_BF16 = torch.bfloat16


def _norm_call(norm: str, backward: bool) -> Callable:
    def call(rows: int, hidden: int) -> None:
        x = torch.empty(rows, hidden, dtype=_BF16, requires_grad=backward)
        weight = torch.empty(hidden, dtype=_BF16, requires_grad=backward)
        if norm == "layer":
            y = F.layer_norm(
                x, (hidden,), weight, torch.empty(hidden, dtype=_BF16, requires_grad=backward)
            )
        else:
            y = F.rms_norm(x, (hidden,), weight)
        if backward:
            y.backward(torch.empty_like(y))

    return call


def _attention_call(backward: bool) -> Callable:
    def call(batch: int, heads: int, seq: int, head_dim: int) -> None:
        q, k, v = (
            torch.empty(batch, heads, seq, head_dim, dtype=_BF16, requires_grad=backward)
            for _ in range(3)
        )
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if backward:
            out.backward(torch.empty_like(out))

    return call


def _embedding_call(backward: bool) -> Callable:
    def call(tokens: int, vocab: int, hidden: int) -> None:
        weight = torch.empty(vocab, hidden, dtype=_BF16, requires_grad=backward)
        out = F.embedding(torch.zeros(tokens, dtype=torch.long), weight)
        if backward:
            out.backward(torch.empty_like(out))

    return call


def _gemm_call(fp8: bool) -> Callable:
    def call(m: int, n: int, k: int) -> None:
        if fp8:
            a = torch.empty(m, k, dtype=torch.float8_e4m3fn)
            b = torch.empty(n, k, dtype=torch.float8_e4m3fn).t()
            one = torch.ones((), dtype=torch.float32)
            torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=_BF16)
        else:
            torch.empty(m, k, dtype=_BF16) @ torch.empty(k, n, dtype=_BF16)

    return call


# benchmark op -> (the call it timed, taking the shape list; the aten op that call's time is of)
CALLS: dict[str, tuple[Callable, str]] = {
    "mm": (_gemm_call(False), "aten.mm"),
    "scaled_mm": (_gemm_call(True), "aten._scaled_mm"),
    "layer_norm_fwd": (_norm_call("layer", False), "aten.native_layer_norm"),
    "layer_norm_bwd": (_norm_call("layer", True), "aten.native_layer_norm_backward"),
    "rms_norm_fwd": (_norm_call("rms", False), "aten._fused_rms_norm"),
    "rms_norm_bwd": (_norm_call("rms", True), "aten._fused_rms_norm_backward"),
    "gelu_fwd": (lambda r, h: F.gelu(torch.empty(r, h, dtype=_BF16)), "aten.gelu"),
    "add": (
        lambda r, h: torch.empty(r, h, dtype=_BF16) + torch.empty(r, h, dtype=_BF16),
        "aten.add",
    ),
    "cast_bf16_fp32": (lambda r, h: torch.empty(r, h, dtype=_BF16).float(), "aten._to_copy"),
    "cast_bf16_fp8": (
        lambda r, h: torch.empty(r, h, dtype=_BF16).to(torch.float8_e4m3fn),
        "aten._to_copy",
    ),
    "embedding_fwd": (_embedding_call(False), "aten.embedding"),
    "embedding_bwd": (_embedding_call(True), "aten.embedding_dense_backward"),
    "sdpa_fwd": (_attention_call(False), "aten._scaled_dot_product_flash_attention"),
    "sdpa_bwd": (_attention_call(True), "aten._scaled_dot_product_flash_attention_backward"),
}


def recorded_fields(bench_op: str, shape: list[int]) -> dict:
    """The kernel-table fields (op, dtype, aten, shape) of the op that `bench_op` timed, as the
    capture records it."""
    call, aten = CALLS[bench_op]
    recorder = OpRecorder()
    with FakeTensorMode(), gpu_fused_ops(), recorder:
        call(*shape)
    trace = recorder.trace()
    c = trace.columns
    rows = [
        int(r) for r in np.flatnonzero(c["kind"] == COMPUTE) if trace.strings[c["aten"][r]] == aten
    ]
    if len(rows) != 1:
        raise ValueError(
            f"{bench_op}{shape}: the capture recorded {len(rows)} {aten} ops, expected 1"
        )
    return row_fields(op_record(trace, rows[0]))


def microbench_rows(path: str | Path, provenance: dict) -> tuple[list[dict], list[str]]:
    """(kernel-table rows, the skipped benchmark rows with the reason) of a microbenchmark CSV;
    each row's `source` is "<file name>:<line>"."""
    path = Path(path)
    rows, skipped = [], []
    with path.open(newline="") as handle:
        for line, bench in enumerate(csv.DictReader(handle), start=2):
            where = f"{path.name}:{line}"
            if bench["op"] not in CALLS:
                skipped.append(f"{where} {bench['op']}: one call, several captured ops")
                continue
            if not bench["kernel_us"]:
                skipped.append(
                    f"{where} {bench['op']} {bench['shape']}: no time ({bench['kernels']})"
                )
                continue
            fields = recorded_fields(bench["op"], json.loads(bench["shape"]))
            rows.append(
                fields
                | provenance
                | {
                    "time_us": float(bench["kernel_us"]),
                    "repetitions": int(bench["repetitions"]),
                    "spread_us": "",
                    "source": where,
                }
            )
    return rows, skipped
