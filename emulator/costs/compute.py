"""Compute cost model: duration of one normalized op (`ops.OpRecord`) on a GPU preset.

GEMM: roofline max(flops / (peak_dtype * eff), bytes / (hbm * hbm_eff)) with eff = the GPU's
measured large-GEMM fraction times a wave-quantization factor over SMs (`gemm_tiles`). Flash
attention: causal-aware FLOPs over peak times a head-dim dependent efficiency. Memory-bound ops:
bytes over the achieved HBM bandwidth. Where a measured kernel table covers the shape, its
interpolated rate replaces the curves. These are kernel times: the time a stream idles between
kernels is the pricing's (`costs.pricing`, measured in `costs.host_dispatch`), per kernel the
op launches (the table says how many; one where the curves price it). Constants and sources:
docs/MODELS.md.
"""

from __future__ import annotations

import dataclasses

from emulator.costs.gemm_tiles import GEMM_TILE, gemm_wave_efficiency
from emulator.costs.kernel_table import KernelTable
from emulator.costs.ops import ATTENTION_OPS, GEMM_OPS, OpRecord
from emulator.hardware import GpuPreset

# DEFAULT head-dim scale of flash-attention efficiency: eff(d) = e_max * d / (d + 32), anchored on
# each GPU's one published point (preset `attention`, `attention_head_dim`). FlashAttention-2
# (Dao 2023) reports higher utilisation at head_dim 128 than 64; the 32 is not fitted.
ATTN_HEAD_DIM_SCALE = 32.0
# DEFAULT: backward attention kernels reach this fraction of the forward efficiency (FlashAttention-2
# reports its backward pass below its forward in TFLOP/s; the figure is not fitted).
ATTN_BWD_EFFICIENCY_RATIO = 0.8


def gemm_efficiency(op: OpRecord, gpu: GpuPreset) -> float:
    return gpu.gemm_efficiency * gemm_wave_efficiency(op.m, op.n, op.batch, gpu.sm_count)


def _gemm_flops_s(op: OpRecord, gpu: GpuPreset, peak: float) -> float:
    """A GEMM's compute time on the curves: its FLOPs at the wave-quantized rate, and never
    less than the same GEMM cut back to the last whole tile in m, in n or in both.

    The wave factor counts idle SMs, not the last tile's padding (`gemm_tiles`), so alone it
    prices m = 129 at about half of m = 128 (two tiles per column fill twice the SMs of one);
    the kernel computes a superset of the smaller one's output and cannot take less time. Time
    grows with m and n within a tile and, at whole tiles, with the waves, so the largest of the
    four is the least time that never falls as the GEMM grows: one wave of whole tiles takes one
    tile's time, as a kernel that computes them whole does. Below one tile nothing changes (a
    GEMV is not priced as a 128-row tile)."""

    def busy(m: int, n: int) -> float:
        rows = dict(m=m, n=n, flops=op.flops * m * n / (op.m * op.n))
        efficiency = gemm_efficiency(dataclasses.replace(op, **rows), gpu)
        return rows["flops"] / (peak * efficiency)

    ms = {op.m, GEMM_TILE * ((op.m - 1) // GEMM_TILE)} - {0}
    ns = {op.n, GEMM_TILE * ((op.n - 1) // GEMM_TILE)} - {0}
    return max(busy(m, n) for m in ms for n in ns)


def attention_efficiency(op: OpRecord, gpu: GpuPreset) -> float:
    ref = gpu.attention_head_dim / (gpu.attention_head_dim + ATTN_HEAD_DIM_SCALE)
    eff = gpu.attention_efficiency / ref * op.head_dim / (op.head_dim + ATTN_HEAD_DIM_SCALE)
    if op.name == "flash_attn_bwd":
        eff *= ATTN_BWD_EFFICIENCY_RATIO
    return min(eff, 1.0)


def _memory_s(op: OpRecord, gpu: GpuPreset) -> float:
    return op.bytes_total / (gpu.hbm_bandwidth_GBps * 1e9 * gpu.hbm_efficiency)


def curve_time_s(op: OpRecord, gpu: GpuPreset) -> float:
    """Kernel time from the analytic curves alone (no kernel table)."""
    if op.name in GEMM_OPS:
        peak = gpu.peak_tflops(op.dtype) * 1e12
        busy = max(_gemm_flops_s(op, gpu, peak), _memory_s(op, gpu))
    elif op.name in ATTENTION_OPS:
        peak = gpu.peak_tflops(op.dtype) * 1e12
        busy = max(op.flops / (peak * attention_efficiency(op, gpu)), _memory_s(op, gpu))
    else:
        busy = _memory_s(op, gpu)
    return busy


def op_price(
    op: OpRecord, gpu: GpuPreset, *, table: KernelTable | None = None
) -> tuple[float, str, float]:
    """(kernel seconds, how it was priced, kernels launched) of `op` on `gpu`: the kernel
    table's exact or interpolated row where it has one (`kernel_table.PRICE_SOURCES`), the
    roofline curves elsewhere (one kernel), never below a measured smaller op of its kind
    (`KernelTable.floor_s`) nor above a measured larger one (`KernelTable.ceiling_s`)."""
    if op.name in GEMM_OPS or op.name in ATTENTION_OPS:
        gpu.peak_tflops(op.dtype)  # refuse a dtype the GPU lacks even when a table would answer
    if table is not None:
        found = table.lookup(op, gpu.sm_count)
        if found is not None:
            return found
        curve_s = min(curve_time_s(op, gpu), table.ceiling_s(op))
        return max(curve_s, table.floor_s(op)), "roofline", 1.0
    return curve_time_s(op, gpu), "roofline", 1.0


def op_time_s(op: OpRecord, gpu: GpuPreset, *, table: KernelTable | None = None) -> float:
    """Kernel seconds of `op` on `gpu` (`op_price`'s first figure)."""
    return op_price(op, gpu, table=table)[0]
