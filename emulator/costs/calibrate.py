"""Measure a kernel table on a real CUDA GPU: the bf16 GEMM grid and an HBM copy sweep.

`run_calibration` times each kernel after warm-up by the profiler's kernel records (never CUDA
events around a Python call, which count launch time: emulator.costs.kernel_timing), repeats
it, and writes results/kernels/<gpu>.csv (columns: kernel_table.COLUMNS) with provenance. The
other ops (fp8, fp16 and fp32 GEMMs, unaligned vocabularies, norms, activations, casts,
embedding, causal and non-causal attention with torch's default backend, grouped-query
attention) are measured by `prismbench.calibrate_grid`, which knows which op the capture
records for each and passes them in as `extra`; `layer_gemms`, `attention_grid` and
`gqa_attention_grid` give some of their shapes. The grids and the CSV writer are plain
functions, tested without a GPU.
"""

from __future__ import annotations

import csv
import datetime as dt
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path

from emulator.costs.kernel_table import COLUMNS
from emulator.costs.kernel_timing import time_kernels_us
from emulator.units import GiB

HIDDEN_SIZES = (1024, 2048, 4096, 8192, 12288, 16384, 25600)
TP_DEGREES = (1, 2, 4, 8)
TOKENS = (1024, 4096, 16384, 65536)
ATTN_HEAD_DIMS = (64, 128)
ATTN_SEQ_LENS = (2048, 4096, 8192, 16384, 32768, 65536, 131072)
ATTN_TOKENS_PER_BATCH = 131072  # batch * seq kept constant so long sequences stay in memory
# Grouped-query attention: Llama 3 8B's query and key/value heads at head dim 128 (Meta's
# params.json: dim 4096, n_heads 32, n_kv_heads 8)
GQA_HEADS = (32, 8)
GQA_HEAD_DIM = 128
HBM_SWEEP_BYTES = tuple(2**p for p in range(20, 33))  # 1 MiB .. 4 GiB
MAX_GEMM_OPERAND_BYTES = 8 * GiB


def layer_gemms(hidden: int, tp: int, tokens: int) -> set[tuple[int, int, int]]:
    """(m, n, k) of a transformer layer's GEMMs: QKV, attention out, MLP up and down, each
    tp-sharded, for the forward (m = tokens) and the weight gradient (k = tokens)."""
    shapes = set()
    for n_out, k_in in ((3 * hidden // tp, hidden), (hidden, hidden // tp), (4 * hidden // tp, hidden), (hidden, 4 * hidden // tp)):
        shapes |= {(tokens, n_out, k_in), (k_in, n_out, tokens)}
    return shapes


def gemm_grid(quick: bool = False) -> list[tuple[int, int, int]]:
    """`layer_gemms` over widths, tensor-parallel degrees and token counts, those whose bf16
    operands fit MAX_GEMM_OPERAND_BYTES."""
    hidden = HIDDEN_SIZES[::3] if quick else HIDDEN_SIZES
    tps = (1, 8) if quick else TP_DEGREES
    tokens = (4096,) if quick else TOKENS
    shapes: set[tuple[int, int, int]] = set()
    for h in hidden:
        for tp in tps:
            for t in tokens:
                shapes |= {(m, n, k) for m, n, k in layer_gemms(h, tp, t)
                           if 2 * (m * k + k * n + m * n) <= MAX_GEMM_OPERAND_BYTES}
    return sorted(shapes)


def attention_grid(quick: bool = False) -> list[tuple[int, int, int, int]]:
    """(batch, heads, seq, head_dim) for attention at 4096 model width: a layer's heads
    over a batch of ATTN_TOKENS_PER_BATCH tokens, and one tensor-parallel rank's heads at batch
    1: fewer heads than a whole layer runs, below every row of the measured tables, where the
    curves' one published efficiency prices the kernel (results/calibration/README.md, the tp 8
    fake-process-group rank)."""
    seqs = ATTN_SEQ_LENS[:2] if quick else ATTN_SEQ_LENS
    tps = TP_DEGREES[-1:] if quick else TP_DEGREES[1:]
    layers = [(max(1, ATTN_TOKENS_PER_BATCH // s), 4096 // d, s, d) for d in ATTN_HEAD_DIMS for s in seqs]
    ranks = [(1, 4096 // d // tp, s, d) for d in ATTN_HEAD_DIMS for s in seqs for tp in tps]
    return layers + ranks


def gqa_attention_grid(quick: bool = False) -> list[tuple[int, int, int, int, int]]:
    """(batch, heads_q, seq, head_dim, heads_kv) for causal grouped-query attention (GQA_HEADS)
    at `attention_grid`'s sequences: the layer over ATTN_TOKENS_PER_BATCH tokens, and one
    tensor-parallel rank's heads at batch 1 (tp 8: 4 query heads sharing 1 key/value head)."""
    seqs = ATTN_SEQ_LENS[:2] if quick else ATTN_SEQ_LENS
    tps = TP_DEGREES[-1:] if quick else TP_DEGREES[1:]
    heads_q, heads_kv = GQA_HEADS
    layers = [(max(1, ATTN_TOKENS_PER_BATCH // s), heads_q, s, GQA_HEAD_DIM, heads_kv) for s in seqs]
    ranks = [(1, heads_q // tp, s, GQA_HEAD_DIM, heads_kv // tp) for s in seqs for tp in tps]
    return layers + ranks


def write_kernel_csv(rows: Iterable[dict], path: str | Path, provenance: dict) -> Path:
    """Write measured rows (op, dtype, shape fields, time_us, repetitions, spread_us) + provenance."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows:
            full = {column: "" for column in COLUMNS} | provenance | row
            unknown = set(full) - set(COLUMNS)
            if unknown:
                raise ValueError(f"kernel row has unknown fields {sorted(unknown)}")
            writer.writerow(full)
    return path


def gpu_provenance() -> dict:
    """gpu, driver, torch, clocks, date of this machine's CUDA GPU (nvidia-smi where it answers)."""
    import torch

    try:
        query = "driver_version,clocks.max.sm,clocks.max.mem"
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout.splitlines()[0]
        driver, sm_clock, mem_clock = (part.strip() for part in out.split(","))
        clocks = f"sm_max={sm_clock};mem_max={mem_clock}"
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        driver, clocks = "unknown", "unknown"
    return {"gpu": torch.cuda.get_device_name(), "driver": driver, "torch": torch.__version__,
            "clocks": clocks, "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}


def _measure(quick: bool, progress: Callable[[str], None] | None) -> list[dict]:
    import torch

    reps, warm = repetitions(quick)
    rows, dev, bf16 = [], "cuda", torch.bfloat16
    for m, n, k in gemm_grid(quick):
        a, b = torch.randn(m, k, device=dev, dtype=bf16), torch.randn(k, n, device=dev, dtype=bf16)
        t, s, kernels = time_kernels_us(lambda a=a, b=b: a @ b, reps, warm)
        rows.append({"op": "mm", "dtype": "bf16", "aten": "aten.mm", "m": m, "n": n, "k": k, "batch": 1,
                     "time_us": t, "repetitions": reps, "spread_us": s, "kernels": kernels})
        del a, b
        if progress:
            progress(f"mm {m}x{n}x{k}: {t:.1f} us")
    for nbytes in HBM_SWEEP_BYTES[:4] if quick else HBM_SWEEP_BYTES:
        src, dst = torch.empty(nbytes, dtype=torch.uint8, device=dev), torch.empty(nbytes, dtype=torch.uint8, device=dev)
        t, s, kernels = time_kernels_us(lambda dst=dst, src=src: dst.copy_(src), reps, warm)
        rows.append({"op": "copy", "dtype": "bf16", "aten": "aten.copy_", "nbytes": 2 * nbytes, "time_us": t,
                     "repetitions": reps, "spread_us": s, "kernels": kernels})
        del src, dst
    return rows


def repetitions(quick: bool) -> tuple[int, int]:
    """(timed repetitions, warm-up calls) of every grid kernel."""
    return (5, 2) if quick else (20, 5)


def run_calibration(out_path: str | Path, *, quick: bool = False,
                    progress: Callable[[str], None] | None = None,
                    extra: Callable[[], list[dict]] | None = None) -> Path:
    """Measure the kernel grid on the current CUDA GPU and write the table to `out_path`;
    `extra()` measures more rows (the caller's grid of other ops) to write with it."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError(
            "calibration needs a CUDA GPU: torch.cuda.is_available() is False on this machine "
            f"(torch {torch.__version__}); run it on the GPU you want a kernel table for"
        )
    provenance = gpu_provenance() | {"source": "prismbench calibrate" + (" --quick" if quick else "")}
    rows = _measure(quick, progress) + (extra() if extra is not None else [])
    return write_kernel_csv(rows, out_path, provenance)
