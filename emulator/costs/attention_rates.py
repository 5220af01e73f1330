"""Attention priced from a kernel's published forward+backward rates instead of the kernel table.

A job whose framework runs an attention kernel other than the FlashAttention-2-class one the
kernel tables measured (torch's SDPA: cuDNN on an H100, FlashAttention-2 on an A100) has it
priced here: llm-foundry's `attn_impl: triton` runs Tri Dao's FlashAttention Triton kernel,
about half as fast at long sequences, and torch's SDPA ran FlashAttention-2 on an H100 where the
H100 table measured cuDNN's kernels (workloads.kernels `attention`). The rates are
forward+backward TFLOP/s measured at a grid of (causal, head dim, sequence) points
(results/kernels/triton-attention.csv and flash2-attention.csv, built by
results/kernels/build_attention_rates.py from published figures: for the Triton kernel,
FlashAttention v1's times a ratio per head dim fitted on llm-foundry's rows, since no figure of
the kernel exists and its docstring gives no number; for FlashAttention-2, its own),
with FLOPs counted as flash-attention's benchmark and our capture count
them (forward 4 s^2 d h b, halved when causal; backward 2.5x the forward).

Between points: linear in log2(sequence) and linear in head dim; outside the grid the nearest
point's rate (the curves are flat at 8k-16k, and head dims 64 and 128 bracket every model we
price). Forward and backward run at the pair's rate (the figure measures the pair; the kernel's
docstring says its forward is the faster half, so the split is an approximation, the sum is
not). The rate scales with the GPU's dense bf16 peak over the measured GPU's. Like every
kernel, a call also pays the stream's idle time before it (`pricing._price`, one kernel a
call): the figures' shapes are large enough that it is lost in them, a small call's is not.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from emulator.costs.ops import ATTENTION_OPS, OpRecord
from emulator.hardware import GpuPreset


@dataclass(frozen=True)
class AttentionRates:
    """One kernel's measured rates on one GPU architecture (see the module docstring)."""

    kernel: str
    arch: str
    peak_bf16_tflops: float
    # (causal, head_dim) -> (log2 sequence lengths ascending, TFLOP/s)
    curves: dict[tuple[bool, int], tuple[np.ndarray, np.ndarray]]

    def __post_init__(self) -> None:
        if not self.curves:
            raise ValueError(f"{self.kernel} attention rates for {self.arch}: no points")
        for causal in (False, True):
            if not any(c == causal for c, _ in self.curves):
                raise ValueError(
                    f"{self.kernel} attention rates for {self.arch}: no causal={causal} points"
                )

    def tflops(self, *, causal: bool, head_dim: int, seq_len: int) -> float:
        """Forward+backward TFLOP/s on the measured GPU at this point."""
        dims = sorted(d for c, d in self.curves if c == causal)
        lo = max([d for d in dims if d <= head_dim], default=dims[0])
        hi = min([d for d in dims if d >= head_dim], default=dims[-1])
        at_lo, at_hi = (self._along_seq(causal, d, seq_len) for d in (lo, hi))
        if hi == lo:
            return at_lo
        return at_lo + (at_hi - at_lo) * (head_dim - lo) / (hi - lo)

    def _along_seq(self, causal: bool, head_dim: int, seq_len: int) -> float:
        log_seq, rates = self.curves[(causal, head_dim)]
        return float(np.interp(math.log2(seq_len), log_seq, rates))

    def time_s(self, op: OpRecord, gpu: GpuPreset) -> float:
        """Kernel seconds of attention op `op` (forward or backward) on `gpu`."""
        if op.name not in ATTENTION_OPS:
            raise ValueError(f"op {op.name!r} is not attention; these rates price {ATTENTION_OPS}")
        if gpu.arch != self.arch:
            raise ValueError(
                f"{self.kernel} attention rates were built for {self.arch} GPUs, not "
                f"{gpu.name} ({gpu.arch})"
            )
        rate = self.tflops(causal=op.causal, head_dim=op.head_dim, seq_len=op.seq_kv)
        scale = gpu.peak_tflops("bf16") / self.peak_bf16_tflops
        return op.flops / (rate * scale * 1e12)


def load_attention_rates(path: str | Path, kernel: str, arch: str) -> AttentionRates | None:
    """The rates of `kernel` for `arch` from a CSV of build_attention_rates.py's columns; None
    when the file has no row for that architecture."""
    with Path(path).open() as f:
        return attention_rates_from_rows(list(csv.DictReader(f)), kernel, arch, source=str(path))


def attention_rates_from_rows(
    rows: list[dict], kernel: str, arch: str, *, source: str = "rows"
) -> AttentionRates | None:
    """The rates of `kernel` for `arch` from rows with build_attention_rates.py's columns (values
    as the CSV holds them, or numbers); None when no row is of that architecture."""
    points: dict[tuple[bool, int], list[tuple[float, float]]] = {}
    peaks = set()
    for r in rows:
        if r["arch"] != arch:
            continue
        key = (str(r["causal"]).lower() == "true", int(r["head_dim"]))
        points.setdefault(key, []).append((math.log2(int(r["seqlen"])), float(r["fwd_bwd_tflops"])))
        peaks.add(float(r["peak_bf16_tflops"]))
    if not points:
        return None
    if len(peaks) != 1:
        raise ValueError(f"{source}: rows of {arch} name several peaks {sorted(peaks)}")
    curves = {
        key: (np.array([s for s, _ in sorted(pts)]), np.array([t for _, t in sorted(pts)]))
        for key, pts in points.items()
    }
    return AttentionRates(kernel=kernel, arch=arch, peak_bf16_tflops=peaks.pop(), curves=curves)
