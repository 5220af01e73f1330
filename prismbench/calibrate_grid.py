"""The calibration grid beyond bf16 GEMMs: fp8, fp16 and fp32 GEMMs, unaligned vocabularies,
memory-bound ops, attention.

`calibration_cases(quick)` lists (benchmark op, shape) pairs in the vocabulary of
`prismbench.microbench_rows.CALLS`; `measure_cases` times each on a device with kernel-only
profiler records (`emulator.costs.kernel_timing.time_kernels_us`) and turns it into a
kernel-table row that says which op the capture records for it (`recorded_fields`: aten op,
dtype, the capture's byte count), so the row is found by the lookup that prices that op.
`measure_grid` does both on this machine's GPU; `prismbench calibrate` appends its rows to the
bf16 GEMM grid of `emulator.costs.calibrate`.
Attention runs torch's default SDPA backend, as the workloads do (cuDNN on an H100): causal
and non-causal, with as many key/value heads as query heads and grouped-query (Llama 3's 32
query heads over 8 key/value heads, and a tensor-parallel rank's share of them).
Not in the grid: cross-entropy and softmax, the AdamW foreach step and SiLU (each call records
several captured ops, and a call is timed as one range), masked (ALiBi) attention, non-causal
grouped-query attention (the workloads' one non-causal caller, ring attention, repeats key and
value to every query head first) and attention whose query and key lengths differ (ring
attention's half steps); `calibrate --job` measures those of a job from its profile.
"""

from __future__ import annotations

from collections.abc import Callable

from emulator.costs.calibrate import (
    attention_grid,
    gemm_grid,
    gqa_attention_grid,
    layer_gemms,
    repetitions,
)
from emulator.costs.kernel_timing import time_kernels_us
from prismbench.microbench_rows import CALLS, recorded_fields

# GPT-2's vocabulary (unaligned: cuBLAS's align1 kernels); llm.c and Megatron pad to 50 304.
UNALIGNED_VOCABS = (50257,)
VOCAB_HIDDEN_SIZES = (768, 1600, 4096)
VOCAB_TOKENS = (2048, 8192, 32768)
# fp16 (Megatron's fp16 runs) and fp32 GEMMs (jobs of fp32 precision): a layer's GEMMs at these
# widths (tp 1, 4096 tokens) and GPT-2's output layer at 8192 tokens, a few shapes to anchor
# each dtype's rate, not a sweep (an fp32 GEMM without TF32 runs at a tenth of bf16's rate)
OTHER_DTYPE_GEMMS = ("mm_fp16", "mm_fp32")
OTHER_DTYPE_HIDDEN_SIZES = (1024, 4096, 8192)
# (rows, hidden) of the norms, activations, adds and casts: 768..8192 wide, 8k..32k tokens.
MEMORY_SHAPES = ((8192, 768), (8192, 2048), (8192, 4096), (32768, 4096), (16384, 8192))
MEMORY_OPS = (
    "layer_norm_fwd", "layer_norm_bwd", "rms_norm_fwd", "rms_norm_bwd",
    "gelu_fwd", "add", "cast_bf16_fp32", "cast_bf16_fp8",
)  # fmt: skip
# (tokens, vocab, hidden) of the token embedding
EMBEDDING_SHAPES = ((8192, 50304, 2048), (8192, 50257, 1600), (8192, 128256, 4096))


def output_layer_gemms(vocab: int, tokens: int, hidden: int) -> list[list[int]]:
    """[m, n, k] of the output layer's forward, input gradient and weight gradient."""
    return [[tokens, vocab, hidden], [tokens, hidden, vocab], [vocab, hidden, tokens]]


def gemm_cases(quick: bool = False, *, fp8: bool = True) -> list[tuple[str, list[int]]]:
    """fp8 GEMMs of the bf16 grid's shapes, bf16 GEMMs of unaligned vocabularies, and a few
    fp16 and fp32 GEMMs."""
    cases: list[tuple[str, list[int]]] = []
    if fp8:  # torch._scaled_mm takes dimensions divisible by 16 only
        cases += [
            ("scaled_mm", [m, n, k])
            for m, n, k in gemm_grid(quick)
            if m % 16 == n % 16 == k % 16 == 0
        ]
    tokens = VOCAB_TOKENS[1:2] if quick else VOCAB_TOKENS
    hiddens = VOCAB_HIDDEN_SIZES[:1] if quick else VOCAB_HIDDEN_SIZES
    for vocab in UNALIGNED_VOCABS:
        for t in tokens:
            for h in hiddens:
                cases += [("mm", shape) for shape in output_layer_gemms(vocab, t, h)]
    widths = OTHER_DTYPE_HIDDEN_SIZES[1:2] if quick else OTHER_DTYPE_HIDDEN_SIZES
    layers = sorted(set().union(*(layer_gemms(h, 1, 4096) for h in widths)))
    vocab = output_layer_gemms(UNALIGNED_VOCABS[0], VOCAB_TOKENS[1], VOCAB_HIDDEN_SIZES[0])
    for op in OTHER_DTYPE_GEMMS:
        cases += [(op, list(shape)) for shape in layers] + [(op, shape) for shape in vocab]
    return cases


def attention_cases(quick: bool = False) -> list[tuple[str, list[int]]]:
    """Forward and backward of causal and non-causal attention, and of causal grouped-query
    attention (heads_kv, the fifth shape field, below the query heads)."""
    ops = ("sdpa_fwd", "sdpa_bwd", "sdpa_noncausal_fwd", "sdpa_noncausal_bwd")
    cases = [(op, list(shape)) for shape in attention_grid(quick) for op in ops]
    return cases + [
        (op, list(shape)) for shape in gqa_attention_grid(quick) for op in ("sdpa_fwd", "sdpa_bwd")
    ]


def calibration_cases(quick: bool = False, *, fp8: bool = True) -> list[tuple[str, list[int]]]:
    """Every (benchmark op, shape) the grid measures besides the bf16 GEMMs."""
    cases = gemm_cases(quick, fp8=fp8)
    shapes = MEMORY_SHAPES[:2] if quick else MEMORY_SHAPES
    cases += [(op, list(shape)) for op in MEMORY_OPS for shape in shapes]
    for shape in EMBEDDING_SHAPES[:1] if quick else EMBEDDING_SHAPES:
        cases += [("embedding_fwd", list(shape)), ("embedding_bwd", list(shape))]
    return cases + attention_cases(quick)


def measure_cases(
    cases: list[tuple[str, list[int]]],
    *,
    time_fn: Callable,
    device: str = "cuda",
    repetitions: int = 20,
    warmup: int = 5,
    progress: Callable[[str], None] | None = None,
) -> tuple[list[dict], list[str]]:
    """(kernel-table rows, the cases that could not run with why) for `cases` on `device`;
    `time_fn(fn, repetitions, warmup) -> (median us, spread us, kernels a call)` times a
    callable (`time_kernels_us`)."""
    import torch

    rows, skipped = [], []
    for i, (op, shape) in enumerate(cases, 1):
        try:
            fn = CALLS[op][0](*shape, device=device)
            median_us, spread_us, kernels = time_fn(fn, repetitions, warmup)
        except (RuntimeError, torch.OutOfMemoryError) as err:  # a shape this GPU cannot run
            skipped.append(f"{op} {shape}: {str(err).splitlines()[0]}")
            continue
        finally:
            fn = None
            if device == "cuda":
                torch.cuda.empty_cache()
        rows.append(
            recorded_fields(op, shape)
            | {
                "time_us": median_us,
                "repetitions": repetitions,
                "spread_us": spread_us,
                "kernels": kernels,
            }
        )
        if progress:
            progress(f"[{i}/{len(cases)}] {op} {shape}: {median_us:.1f} us")
    return rows, skipped


def measure_grid(
    quick: bool = False, *, progress: Callable[[str], None] | None = None
) -> list[dict]:
    """The rows of every case of the grid on this machine's CUDA GPU, timed as the bf16 grid is
    (`emulator.costs.calibrate.repetitions`), fp8 GEMMs where the GPU has them; the cases that
    could not run are reported through `progress`."""
    import torch

    fp8 = torch.cuda.get_device_capability() >= (8, 9)  # float8 GEMMs: Ada, Hopper and later
    reps, warm = repetitions(quick)
    rows, skipped = measure_cases(
        calibration_cases(quick, fp8=fp8), time_fn=time_kernels_us,
        repetitions=reps, warmup=warm, progress=progress,
    )  # fmt: skip
    if progress:
        for line in skipped:
            progress(f"skipped {line}")
    return rows
