"""Issue 15's FP8 goal as a benchmark: GEMM-dominated jobs on H100s, predicted in FP8 and in bf16.

    python results/fidelity/fp8_vs_bf16.py [--out FILE]      (captures cached; ~2 min cold, 2 cores)

The goal: an FP8 job whose time is GEMM-dominated (hidden >= 4 096 on an H100) is never
predicted slower than the same job in bf16, for the frameworks that run production FP8
(Transformer Engine's fused casts in Megatron, NeMo and llm-foundry; torchao's float8 under
torch.compile in torchtitan). Each job below is emulated twice, `train.precision` "bf16" and
"fp8", everything else equal, and the table gives both iteration times, their ratio and the
share of the bf16 compute that GEMMs take (`emulate --json`'s per-op figures are not needed:
the share is computed from the priced trace).

The jobs (none tuned, none a published row): the job the issue names (NeMo's GPT-3 5B, its
launcher's `conf/training/gpt3/5b.yaml`: 24 layers, hidden 4 096, micro-batch 4, global batch
2 048, sequence 2 048, tp 1, pp 1, distributed optimizer, vocabulary padded to 128, on 64
H100s), a Megatron tensor-parallel job, torchtitan's Llama 3 8B and 70B (FSDP, compile),
llm-foundry's MPT-7B (FSDP), and, apart, the workloads as they ran at 86a4f47 (`prism-86a4f47`:
eager float8 casts, which the goal does not cover; the shared H100 profile measured that
program's FP8 job).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "results"))
from shared_gpu import recorded_job, report  # noqa: E402

H100 = {"gpu": "h100-sxm-80g", "gpus_per_node": 8}
# The production-FP8 jobs: (name, job spec as a dict). Sizes keep every capture under a few
# minutes on two cores (layers cut where the layout allows; a cut keeps each layer's shapes).
JOBS: list[tuple[str, dict]] = [
    ("NeMo GPT-3 5B, 64 H100 (dp 64, distributed optimizer)", {
        "model": {"family": "gpt", "layers": 24, "hidden": 4096,
                  "ffn_hidden": 16384, "heads": 32, "kv_heads": 32, "vocab": 50257,
                  "positions": "learned", "max_seq_len": 2048},
        "parallel": {"dp": 64, "zero": 1},
        "batch": {"seq_len": 2048, "micro_batch": 4, "global_batch": 2048},
        "train": {"recompute": "none"},
        "kernels": {"framework": "nemo", "vocab_multiple": 128},
        "cluster": {**H100, "inter_node": "ib-ndr-8x400"},
    }),
    ("Megatron GPT 22B (48 -> 8 layers), 8 H100 (tp 8, sequence parallel)", {
        "model": {"name": "megatron-gpt-22b", "layers": 8},
        "parallel": {"tp": 8, "sequence_parallel": True},
        "batch": {"seq_len": 2048, "micro_batch": 4, "global_batch": 16},
        "train": {"recompute": "selective"},
        "kernels": {"framework": "megatron"},
        "cluster": H100,
    }),
    ("torchtitan Llama 3 8B, 8 H100 (FSDP, compile)", {
        "model": {"name": "llama3-8b"},
        "parallel": {"dp": 8, "zero": 3},
        "batch": {"seq_len": 8192, "micro_batch": 1, "global_batch": 8},
        "train": {"recompute": "selective"},
        "kernels": {"framework": "torchtitan", "compile": True},
        "cluster": H100,
    }),
    ("torchtitan Llama 3 70B (80 -> 8 layers), 64 H100 (FSDP 8 x tp 8, compile)", {
        "model": {"name": "llama3-70b", "layers": 8},
        "parallel": {"tp": 8, "sequence_parallel": True, "dp": 8, "zero": 3},
        "batch": {"seq_len": 8192, "micro_batch": 1, "global_batch": 8},
        "train": {"recompute": "full"},
        "kernels": {"framework": "torchtitan", "compile": True},
        "cluster": {**H100, "inter_node": "ib-ndr-8x400"},
    }),
    ("llm-foundry MPT-7B, 8 H100 (FSDP)", {
        "model": {"name": "mpt-7b", "positions": "learned", "max_seq_len": 2048},
        "parallel": {"dp": 8, "zero": 3},
        "batch": {"seq_len": 2048, "micro_batch": 8, "global_batch": 64},
        "train": {"recompute": "none"},
        "kernels": {"framework": "llm-foundry"},
        "cluster": H100,
    }),
]
# The program of the shared H100 profiles (eager casts): not held to the goal, shown for what
# the fused casts change.
SHARED_FP8_CASE = "llama3-8b-l4-s8192-mb1-fp8-none"


def with_precision(job, precision: str):
    return dataclasses.replace(job, train=dataclasses.replace(job.train, precision=precision))


def gemm_share(priced) -> float:
    """The share of a priced job's compute (all rank classes) that GEMM ops take."""
    import numpy as np

    from emulator.costs.ops import GEMM_OPS

    gemm = total = 0.0
    for pp, trace in priced.capture.traces.items():
        durations = priced.durations_s[pp]  # one per trace row, 0 where not compute
        is_gemm = np.isin(np.array(trace.text("name")), list(GEMM_OPS))
        total += float(durations.sum())
        gemm += float(durations[is_gemm].sum())
    return gemm / total


def row(name: str, job) -> tuple[str, float]:
    """A table line for `job` (fp8 against bf16) and the fp8 / bf16 ratio."""
    from prismbench.emulate import emulate, price_job

    bf16_job = with_precision(job, "bf16")
    priced = price_job(bf16_job)
    bf16 = emulate(bf16_job, priced=priced).iteration_time_s
    fp8_job = with_precision(job, "fp8")
    fp8 = emulate(fp8_job).iteration_time_s
    casts = fp8_job.kernels.fp8_casts
    return (f"| {name} | {job.kernels.framework} ({casts} casts) | {100 * gemm_share(priced):.0f} % | "
            f"{bf16:.4f} | {fp8:.4f} | {fp8 / bf16:.3f} |"), fp8 / bf16  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    from prismbench.spec import job_spec_from_dict

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    header = ["| job | framework | GEMM share of bf16 compute | bf16 (s) | fp8 (s) | fp8 / bf16 |",
              "|---|---|--:|--:|--:|--:|"]  # fmt: skip
    lines, ratios = list(header), []
    for name, spec in JOBS:
        print(f"emulating {name} ...", file=sys.stderr, flush=True)
        line, ratio = row(name, job_spec_from_dict(spec))
        lines.append(line)
        ratios.append(ratio)
    worst = max(ratios)
    verdict = "met" if worst < 1 else "NOT met"
    lines += ["", f"Goal (fp8 never slower than bf16 on these production-FP8 jobs): {verdict}; "
              f"largest fp8 / bf16 ratio {worst:.3f}.", "",
              "Not held to the goal: the workloads' program at 86a4f47 (eager float8 casts, "
              "what the shared H100 profile of its FP8 job measured):", "", *header]  # fmt: skip
    shared = recorded_job(SHARED_FP8_CASE, "h100-sxm-80g")
    lines.append(row(f"{SHARED_FP8_CASE} (1 H100; measured fp8 0.2693 s, shared summary.json)",
                     shared)[0])  # fmt: skip
    report("python results/fidelity/fp8_vs_bf16.py", lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
