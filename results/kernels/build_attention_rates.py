"""Build the published rates of the attention kernels the kernel tables do not measure.

    python results/kernels/build_attention_rates.py   (from the repository root; reads only
                                                      results/kernels/sources/; < 1 s)

Two files, one per kernel, priced per call from forward+backward TFLOP/s
(emulator.costs.attention_rates) at the points where the rates were measured (causal or not,
head dim 64 and 128, sequence 512-16k; FLOPs counted as flash-attention's benchmark counts them:
forward 4 s^2 d h b, halved when causal, backward 2.5x the forward):

**triton-attention.csv**: Tri Dao's `flash_attn/flash_attn_triton.py` (flash-attention, 2022),
which llm-foundry vendors as `llmfoundry/models/layers/flash_attn_triton.py` and runs for
`attn_impl: triton` (workloads.kernels, `attention = "triton"`).
No published measurement of this kernel was found. Its docstring places it against the CUDA
FlashAttention (v1): "Triton forward is generally faster than CUDA forward, while Triton backward
is generally slower than CUDA backward. Overall Triton forward + backward is slightly slower than
CUDA forward + backward" (tested on the A100 only). So its rates here are FlashAttention v1's
forward+backward bars, as measured in FlashAttention-2's figures on each GPU
(sources/fa_triton_fa1_fwd_bwd.csv): **ampere** the A100 80GB SXM4 figure, **hopper** the H100
80GB SXM5 figure (like v1, the kernel issues no Hopper-only instructions: the pre-MLIR Triton
llm-foundry installs emits Ampere's mma), times one ratio per head dim. The docstring gives no
number for it ("slightly slower" overall; "the backward for d=128 much faster by reducing
register spilling", where v1's head-dim-128 backward is its slow case), so the two ratios are
fitted once, globally, on llm-foundry's published rows (`fit_triton_attention.py`, which writes
`triton-attention-fit.json` with every row's residual and its leave-one-out error).

Not the figures' "FlashAttention Triton" bars: those were measured by the script that reproduces
the figures (flash-attention `benchmarks/benchmark_flash_attention.py`, added at 60499abc eleven
days after them, flash-attention issue #390), which imports `triton.ops.flash_attention`, OpenAI's
kernel (Tillet's tutorial kernel, whose head-dim-128 backward is slow: triton issue #1975), not
Tri Dao's. The build prints how far those bars sit from the ones used.

**flash2-attention.csv**: FlashAttention-2 itself (`attention = "flash2"`): torch's SDPA flash
backend, which torch chose first on Hopper while cuDNN attention was opt-in (pytorch#138522,
Oct 2024, until torch 2.11, whose SDPA the shared profiles show running cuDNN), and
flash-attn 2. Its rates are the
FlashAttention-2 bars of the same figures: **ampere** the A100 figure
(sources/fa2_a100_fwd_bwd.csv), **hopper** the H100 figure (sources/fa_triton_fa1_fwd_bwd.csv,
kernel `flash2`). The kernel tables' Hopper rows are cuDNN's sm90 kernels, about 1.4x faster at
these shapes (results/calibration/README.md), so a job that ran FlashAttention-2 on an H100 is
priced from these bars, not from the table.

Each row: arch, causal, head_dim, seqlen, fwd_bwd_tflops, peak_bf16_tflops (the dense bf16 peak
of the GPU measured: the emulator scales a rate by the job's GPU peak over it), source.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the repository root: runs without installing

from emulator.hardware import gpu_preset  # noqa: E402

SOURCES = HERE / "sources"
TRITON_OUT = HERE / "triton-attention.csv"
TRITON_FIT = HERE / "triton-attention-fit.json"
FLASH2_OUT = HERE / "flash2-attention.csv"
COLUMNS = ("arch", "causal", "head_dim", "seqlen", "fwd_bwd_tflops", "peak_bf16_tflops", "source")
# the GPU of each figure, by the architecture its rates stand for
FIGURE_GPUS = (("ampere", "a100-sxm-80g"), ("hopper", "h100-sxm-80g"))


def read_bars() -> dict[tuple, float]:
    """(gpu, kernel, causal, head_dim, seqlen) -> forward+backward TFLOP/s of the hand-copied bars,
    FlashAttention-2's A100 bars included (kernel `flash2`)."""
    bars = {}
    with (SOURCES / "fa_triton_fa1_fwd_bwd.csv").open() as f:
        for r in csv.DictReader(f):
            key = (r["gpu"], r["kernel"], r["causal"], int(r["head_dim"]), int(r["seqlen"]))
            bars[key] = float(r["fwd_bwd_tflops"])
    with (SOURCES / "fa2_a100_fwd_bwd.csv").open() as f:
        for r in csv.DictReader(f):
            key = ("a100-sxm-80g", "flash2", r["causal"], int(r["head_dim"]), int(r["seqlen"]))
            bars[key] = float(r["fwd_bwd_tflops"])
    return bars


def rows_of(bars: dict[tuple, float], kernel: str) -> list[dict]:
    """One row per (point, architecture) from the `kernel` bars of each figure."""
    # the dense bf16 peaks of the figures' GPUs, as their presets carry them
    peak = {gpu: gpu_preset(gpu).peak_tflops("bf16") for _, gpu in FIGURE_GPUS}
    points = sorted({k[2:] for k in bars if k[1] == kernel})
    return [
        {"arch": arch, "causal": causal, "head_dim": head_dim, "seqlen": seqlen,
         "fwd_bwd_tflops": bars[(gpu, kernel, causal, head_dim, seqlen)],
         "peak_bf16_tflops": peak[gpu], "source": f"fa2-figure:{gpu.split('-')[0]}:{kernel}"}
        for causal, head_dim, seqlen in points
        for arch, gpu in FIGURE_GPUS
    ]  # fmt: skip


def fitted_ratios(path: Path = TRITON_FIT) -> dict[int, float]:
    """Head dim -> the Triton kernel's rate over FlashAttention v1's bars (fit_triton_attention.py)."""
    return {int(hd): float(r) for hd, r in json.loads(path.read_text())["ratios"].items()}


def triton_rows(bars: dict[tuple, float], ratios: dict[int, float]) -> list[dict]:
    """FlashAttention v1's rows, each times the fitted ratio of its head dim."""
    rows = rows_of(bars, "flash1")
    missing = {r["head_dim"] for r in rows} - set(ratios)
    if missing:
        raise ValueError(f"{TRITON_FIT.name}: no fitted ratio for head dims {sorted(missing)}")
    for r in rows:
        ratio = ratios[r["head_dim"]]
        r["fwd_bwd_tflops"] = round(r["fwd_bwd_tflops"] * ratio, 3)
        r["source"] += f" x{ratio:.3f} ({TRITON_FIT.name})"
    return rows


def openai_triton_gaps(bars: dict[tuple, float]) -> list[float]:
    """How far the A100 figure's OpenAI Triton bars sit from the FlashAttention v1 bars used for
    the Triton kernel (relative, at every point)."""
    return [
        bars[("a100-sxm-80g", "triton", *point)] / bars[("a100-sxm-80g", "flash1", *point)] - 1
        for point in sorted({k[2:] for k in bars if k[0] == "a100-sxm-80g" and k[1] == "flash1"})
    ]


def write(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {path.relative_to(HERE.parents[1])}: {len(rows)} rows")


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    bars = read_bars()
    write(TRITON_OUT, triton_rows(bars, fitted_ratios()))
    write(FLASH2_OUT, rows_of(bars, "flash2"))
    gaps = openai_triton_gaps(bars)
    print(
        "the A100 figure's OpenAI Triton bars (triton.ops.flash_attention) against the "
        f"FlashAttention v1 bars used: median {100 * statistics.median(gaps):+.1f} %, range "
        f"{100 * min(gaps):+.1f} .. {100 * max(gaps):+.1f} %"
    )


if __name__ == "__main__":
    main()
