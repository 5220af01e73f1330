"""Build the attention rates of FlashAttention's Triton kernel: results/kernels/triton-attention.csv.

    python results/kernels/build_triton_attention.py   (from the repository root; reads only
                                                       results/kernels/sources/; < 1 s)

The kernel is Tri Dao's `flash_attn/flash_attn_triton.py` (flash-attention, 2022), which
llm-foundry vendors as `llmfoundry/models/layers/flash_attn_triton.py` and runs for
`attn_impl: triton` (workloads.kernels, `attention = "triton"`). It is priced per call from
forward+backward TFLOP/s (emulator.costs.attention_rates); this builds those rates per GPU
architecture, at the points where they were measured (causal or not, head dim 64 and 128,
sequence 512-16k; FLOPs counted as flash-attention's benchmark counts them: forward 4 s^2 d h b,
halved when causal, backward 2.5x the forward):

- **ampere**: the "FlashAttention Triton" bars of FlashAttention-2's A100 80GB SXM4 figure
  (sources/fa_triton_fa1_fwd_bwd.csv), as measured.
- **hopper**: no published measurement of the kernel on a Hopper GPU was found (its header says
  it "has only been tested on A100"). Transfer rule: the H100 bars of the CUDA FlashAttention
  (v1) in FlashAttention-2's H100 80GB SXM5 figure, times the Triton / FlashAttention ratio of the
  A100 figure at the same point. FlashAttention v1 is the kernel the Triton one was written
  against ("Overall Triton forward + backward is slightly slower than CUDA forward + backward",
  the kernel's docstring) and, like it, uses no Hopper-only instructions. The build prints how
  far the alternative rule (through FlashAttention-2's bars) lands from it.

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
    """(gpu, kernel, causal, head_dim, seqlen) -> forward+backward TFLOP/s, from both source
    files (the FlashAttention-2 A100 bars are `fa2_a100_fwd_bwd.csv`'s, kernel "flash2")."""
    with (SOURCES / "fa_triton_fa1_fwd_bwd.csv").open() as f:
        bars = {
            (r["gpu"], r["kernel"], r["causal"], int(r["head_dim"]), int(r["seqlen"])): float(
                r["fwd_bwd_tflops"]
            )
            for r in csv.DictReader(f)
        }
    with (SOURCES / "fa2_a100_fwd_bwd.csv").open() as f:
        for r in csv.DictReader(f):
            key = ("a100-sxm-80g", "flash2", r["causal"], int(r["head_dim"]), int(r["seqlen"]))
            bars[key] = float(r["fwd_bwd_tflops"])
    return bars


def build() -> tuple[list[dict], list[float]]:
    """The rows, and the relative gap between the two H100 rules at every point."""
    bars = read_bars()
    # the dense bf16 peaks of the figures' GPUs, as their presets carry them
    peak = {g: gpu_preset(g).peak_tflops("bf16") for g in ("a100-sxm-80g", "h100-sxm-80g")}
    points = sorted({k[2:] for k in bars if k[1] == "triton"})
    rows, gaps = [], []
    for causal, head_dim, seqlen in points:
        a100 = {kernel: bars[("a100-sxm-80g", kernel, causal, head_dim, seqlen)]
                for kernel in ("triton", "flash1")}  # fmt: skip
        h100_v1 = bars[("h100-sxm-80g", "flash1", causal, head_dim, seqlen)]
        h100_v2 = bars[("h100-sxm-80g", "flash2", causal, head_dim, seqlen)]
        ratio = a100["triton"] / a100["flash1"]
        hopper = h100_v1 * ratio
        a100_v2 = bars[("a100-sxm-80g", "flash2", causal, head_dim, seqlen)]
        gaps.append(h100_v2 * a100["triton"] / a100_v2 / hopper - 1)
        point = {"causal": causal, "head_dim": head_dim, "seqlen": seqlen}
        rows.append(point | {"arch": "ampere", "fwd_bwd_tflops": a100["triton"],
                             "peak_bf16_tflops": peak["a100-sxm-80g"],
                             "source": "fa2-figure:a100:triton"})  # fmt: skip
        rows.append(point | {"arch": "hopper", "fwd_bwd_tflops": round(hopper, 2),
                             "peak_bf16_tflops": peak["h100-sxm-80g"],
                             "source": f"rule:h100 flash1 {h100_v1:g} x a100 triton/flash1 "
                                       f"{a100['triton']:g}/{a100['flash1']:g}"})  # fmt: skip
    return rows, gaps


def main() -> None:
    rows, gaps = build()
    with OUT.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {OUT.relative_to(HERE.parents[1])}: {len(rows)} rows")
    print(
        "hopper rule through FlashAttention-2 instead (h100 flash2 x a100 triton/flash2) vs the "
        f"rule used: median {100 * statistics.median(gaps):+.1f} %, range "
        f"{100 * min(gaps):+.1f} .. {100 * max(gaps):+.1f} %"
    )


if __name__ == "__main__":
    main()
