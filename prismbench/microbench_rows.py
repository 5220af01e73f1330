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

# A "prepare" builds an op's inputs on a device (and runs the forward a backward needs) and
# returns the callable whose kernels are the op: calibration times that callable on a GPU;
# `recorded_fields` runs it under the capture to learn which op it is. GEMM, attention and
# embedding inputs are random, as a model's are: a fresh CUDA allocation often reads as zeros,
# and tensor cores multiplying zeros draw less power and can run faster than on real data.


def _backward(out: torch.Tensor, inputs: list[torch.Tensor]) -> Callable:
    grad = torch.ones_like(out)
    return lambda: torch.autograd.grad(out, inputs, grad, retain_graph=True)


def _norm(norm: str, backward: bool) -> Callable:
    def prepare(rows: int, hidden: int, device: str = "cpu") -> Callable:
        def empty(*shape):
            return torch.empty(*shape, dtype=_BF16, device=device, requires_grad=backward)

        x, weight, bias = empty(rows, hidden), empty(hidden), empty(hidden)
        if norm == "layer":
            forward = lambda: F.layer_norm(x, (hidden,), weight, bias)  # noqa: E731
        else:
            forward = lambda: F.rms_norm(x, (hidden,), weight)  # noqa: E731
        if not backward:
            return forward
        return _backward(forward(), [x, weight] + ([bias] if norm == "layer" else []))

    return prepare


def _attention(backward: bool, causal: bool = True) -> Callable:
    def prepare(
        batch: int,
        heads: int,
        seq: int,
        head_dim: int,
        heads_kv: int | None = None,
        device: str = "cpu",
    ) -> Callable:
        """`heads_kv` below `heads`: grouped-query attention, called as the workloads call it
        (SDPA's `enable_gqa`, key and value not repeated to every query head)."""
        heads_kv = heads_kv or heads

        def randn(count: int) -> torch.Tensor:  # [batch, count heads, seq, head_dim]
            shape = (batch, count, seq, head_dim)
            return torch.randn(*shape, dtype=_BF16, device=device, requires_grad=backward)

        q, k, v = randn(heads), randn(heads_kv), randn(heads_kv)
        gqa = heads_kv != heads
        forward = lambda: F.scaled_dot_product_attention(  # noqa: E731
            q, k, v, is_causal=causal, enable_gqa=gqa
        )
        return _backward(forward(), [q, k, v]) if backward else forward

    return prepare


def _embedding(backward: bool) -> Callable:
    def prepare(tokens: int, vocab: int, hidden: int, device: str = "cpu") -> Callable:
        weight = torch.randn(vocab, hidden, dtype=_BF16, device=device, requires_grad=backward)
        # tokens spread over the vocabulary, as text's are: one repeated index would make the
        # backward scatter-add every gradient into one row
        index = torch.randint(vocab, (tokens,), device=device)
        forward = lambda: F.embedding(index, weight)  # noqa: E731
        return _backward(forward(), [weight]) if backward else forward

    return prepare


def _gemm(dtype: torch.dtype) -> Callable:
    def prepare(m: int, n: int, k: int, device: str = "cpu") -> Callable:
        if dtype == torch.float8_e4m3fn:
            a = torch.randn(m, k, device=device).to(dtype)
            b = torch.randn(n, k, device=device).to(dtype).t()
            one = torch.ones((), dtype=torch.float32, device=device)
            return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=_BF16)
        a, b = (
            torch.randn(m, k, dtype=dtype, device=device),
            torch.randn(k, n, dtype=dtype, device=device),
        )
        return lambda: a @ b

    return prepare


def _pointwise(fn: Callable, inputs: int = 1) -> Callable:
    def prepare(rows: int, hidden: int, device: str = "cpu") -> Callable:
        xs = [torch.empty(rows, hidden, dtype=_BF16, device=device) for _ in range(inputs)]
        return lambda: fn(*xs)

    return prepare


# benchmark op -> (prepare(*shape, device) -> the callable timed; the aten op that time is of).
# Shapes: [m, n, k] of a GEMM; [rows, hidden] of a norm, activation, add or cast; [tokens,
# vocab, hidden] of the embedding; [batch, heads, seq, head_dim] of attention, with heads_kv
# after them for grouped-query attention. The fp32 GEMM runs as torch runs a job's fp32
# matmuls by default: without TF32.
CALLS: dict[str, tuple[Callable, str]] = {
    "mm": (_gemm(_BF16), "aten.mm"),
    "mm_fp16": (_gemm(torch.float16), "aten.mm"),
    "mm_fp32": (_gemm(torch.float32), "aten.mm"),
    "scaled_mm": (_gemm(torch.float8_e4m3fn), "aten._scaled_mm"),
    "layer_norm_fwd": (_norm("layer", False), "aten.native_layer_norm"),
    "layer_norm_bwd": (_norm("layer", True), "aten.native_layer_norm_backward"),
    "rms_norm_fwd": (_norm("rms", False), "aten._fused_rms_norm"),
    "rms_norm_bwd": (_norm("rms", True), "aten._fused_rms_norm_backward"),
    "gelu_fwd": (_pointwise(F.gelu), "aten.gelu"),
    "add": (_pointwise(torch.add, inputs=2), "aten.add"),
    "cast_bf16_fp32": (_pointwise(lambda x: x.float()), "aten._to_copy"),
    "cast_bf16_fp8": (_pointwise(lambda x: x.to(torch.float8_e4m3fn)), "aten._to_copy"),
    "embedding_fwd": (_embedding(False), "aten.embedding"),
    "embedding_bwd": (_embedding(True), "aten.embedding_dense_backward"),
    "sdpa_fwd": (_attention(False), "aten._scaled_dot_product_flash_attention"),
    "sdpa_bwd": (_attention(True), "aten._scaled_dot_product_flash_attention_backward"),
    "sdpa_noncausal_fwd": (
        _attention(False, causal=False),
        "aten._scaled_dot_product_flash_attention",
    ),
    "sdpa_noncausal_bwd": (
        _attention(True, causal=False),
        "aten._scaled_dot_product_flash_attention_backward",
    ),
}


def recorded_fields(bench_op: str, shape: list[int]) -> dict:
    """The kernel-table fields (op, dtype, aten, shape) of the op that `bench_op` timed, as the
    capture records it."""
    prepare, aten = CALLS[bench_op]
    recorder = OpRecorder()
    with FakeTensorMode(), gpu_fused_ops(), recorder:
        prepare(*shape)()
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
