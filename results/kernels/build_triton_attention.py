"""Build the attention rates of FlashAttention's Triton kernel: results/kernels/triton-attention.csv.

    python results/kernels/build_triton_attention.py   (from the repository root; reads only
                                                       results/kernels/sources/; < 1 s)

The kernel is Tri Dao's `flash_attn/flash_attn_triton.py` (flash-attention, 2022), which
llm-foundry vendors as `llmfoundry/models/layers/flash_attn_triton.py` and runs for
`attn_impl: triton` (workloads.kernels, `attention = "triton"`). It is priced per call from
forward+backward TFLOP/s (emulator.costs.attention_rates); this builds those rates per GPU
architecture, at the points where they were measured (causal or not, head dim 64 and 128,
sequence 512-16k; FLOPs counted as flash-attention's benchmark counts them: forward 4 s^2 d h b,
halved when causal, backward 2.5x the forward).

No published measurement of this kernel was found. Its docstring places it against the CUDA
FlashAttention (v1): "Triton forward is generally faster than CUDA forward, while Triton backward
is generally slower than CUDA backward. Overall Triton forward + backward is slightly slower than
CUDA forward + backward" (tested on the A100 only). So its rates here are FlashAttention v1's
forward+backward bars, as measured in FlashAttention-2's figures on each GPU
(sources/fa_triton_fa1_fwd_bwd.csv): **ampere** the A100 80GB SXM4 figure, **hopper** the H100
80GB SXM5 figure (like v1, the kernel issues no Hopper-only instructions: the pre-MLIR Triton
llm-foundry installs emits Ampere's mma). "Slightly slower" is not quantified: ratio 1.

Not the figures' "FlashAttention Triton" bars: those were measured by the script that reproduces
the figures (flash-attention `benchmarks/benchmark_flash_attention.py`, added at 60499abc eleven
days after them, flash-attention issue #390), which imports `triton.ops.flash_attention`, OpenAI's
kernel (Tillet's tutorial kernel, whose head-dim-128 backward is slow: triton issue #1975), not
Tri Dao's. The build prints how far those bars sit from the ones used.

Each row: arch, causal, head_dim, seqlen, fwd_bwd_tflops, peak_bf16_tflops (the dense bf16 peak
of the GPU measured: the emulator scales a rate by the job's GPU peak over it), source.
"""

from __future__ import annotations

import csv
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the repository root: runs without installing

from emulator.hardware import gpu_preset  # noqa: E402

SOURCES = HERE / "sources"
OUT = HERE / "triton-attention.csv"
COLUMNS = ("arch", "causal", "head_dim", "seqlen", "fwd_bwd_tflops", "peak_bf16_tflops", "source")


def read_bars() -> dict[tuple, float]:
    """(gpu, kernel, causal, head_dim, seqlen) -> forward+backward TFLOP/s of the hand-copied bars."""
    with (SOURCES / "fa_triton_fa1_fwd_bwd.csv").open() as f:
        return {
            (r["gpu"], r["kernel"], r["causal"], int(r["head_dim"]), int(r["seqlen"])): float(
                r["fwd_bwd_tflops"]
            )
            for r in csv.DictReader(f)
        }


def build() -> tuple[list[dict], list[float]]:
    """The rows, and how far the A100 figure's OpenAI Triton bars sit from the ones used (relative,
    at every point)."""
    bars = read_bars()
    # the dense bf16 peaks of the figures' GPUs, as their presets carry them
    peak = {g: gpu_preset(g).peak_tflops("bf16") for g in ("a100-sxm-80g", "h100-sxm-80g")}
    points = sorted({k[2:] for k in bars if k[1] == "flash1" and k[0] == "a100-sxm-80g"})
    rows, gaps = [], []
    for causal, head_dim, seqlen in points:
        point = {"causal": causal, "head_dim": head_dim, "seqlen": seqlen}
        for arch, gpu in (("ampere", "a100-sxm-80g"), ("hopper", "h100-sxm-80g")):
            rows.append(point | {"arch": arch,
                                 "fwd_bwd_tflops": bars[(gpu, "flash1", causal, head_dim, seqlen)],
                                 "peak_bf16_tflops": peak[gpu],
                                 "source": f"fa2-figure:{gpu.split('-')[0]}:flash1"})  # fmt: skip
        a100 = {kernel: bars[("a100-sxm-80g", kernel, causal, head_dim, seqlen)]
                for kernel in ("triton", "flash1")}  # fmt: skip
        gaps.append(a100["triton"] / a100["flash1"] - 1)
    return rows, gaps


def main() -> None:
    rows, gaps = build()
    with OUT.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {OUT.relative_to(HERE.parents[1])}: {len(rows)} rows")
    print(
        "the A100 figure's OpenAI Triton bars (triton.ops.flash_attention) against the "
        f"FlashAttention v1 bars used: median {100 * statistics.median(gaps):+.1f} %, range "
        f"{100 * min(gaps):+.1f} .. {100 * max(gaps):+.1f} %"
    )


if __name__ == "__main__":
    main()
