"""Where selective recompute's host time goes in a forward: a GPU check for the 760M job's miss.

    python3 results/calibration/sac_host_gpu.py --out DIR                       (on a CUDA machine)
    python3 results/calibration/sac_host_gpu.py --out DIR --device meta --gpu h100-sxm-80g \\
        --layers 2                                                          (anywhere: plumbing)

The shared profiles show a GPT block's forward issuing its 12 ops at 3-4x the host time under
op-level selective checkpointing that it takes without, and a Llama block at 1.0-1.2x
(`recompute_host_blocks.md`); the model cannot say why, and so misses the 760M job by ~20 %.
This runs CASE (default: the 760M job, from its recorded baseline on this GPU, so no shared data
is needed on the machine) under each recompute mode ("none", "selective", "full") and reports:
- the host seconds of each forward call (perf_counter around `model(tokens)`, no synchronize:
  what the host spends issuing the forward, the forward's time when it is host-bound), median
  over ITERATIONS forwards after WARMUP whole iterations, and per transformer block;
- one forward under selective recompute profiled with Python stacks (torch.profiler,
  `with_stack=True`): the 40 largest self-CPU-time entries grouped by their 5 innermost frames,
  which is where the extra time is spent.
DIR/sac_host.json holds the figures, DIR/sac_host.txt the profile table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "results"))
from shared_gpu import RECORDED_PREFIX, local_gpu_preset, recorded_baseline_path, recorded_job  # noqa: E402

MODES = ("none", "selective", "full")
WARMUP = 3


def job_of(case: str, gpu: str, recompute: str, layers: int | None):
    """CASE's recorded job on `gpu` under `recompute` (and `layers` blocks, when given)."""
    job = recorded_job(case, gpu)
    job = dataclasses.replace(job, train=dataclasses.replace(job.train, recompute=recompute))
    if layers is not None:
        job = dataclasses.replace(job, model=dataclasses.replace(job.model, layers=layers))
    return job


def model_and_tokens(job, device: str):
    """`job`'s (one-stage) model built on `device`, and a micro-batch of token ids for it."""
    import torch

    from workloads.train import build_training

    state = build_training(job, None, device=device, initialize=device != "meta")
    shape = (job.batch.micro_batch, job.batch.seq_len)
    return state.parts[0], torch.zeros(shape, dtype=torch.long, device=device)


def forward_host_s(job, device: str, iterations: int) -> list[float]:
    """Host seconds of `iterations` forward calls of `job`'s model on `device`, each followed by
    its backward (so checkpointing's state is what training leaves), after WARMUP of them."""
    import torch

    model, tokens = model_and_tokens(job, device)
    out_s = []
    for i in range(WARMUP + iterations):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        logits = model(tokens)
        issued = time.perf_counter() - start
        logits.float().sum().backward()
        for p in model.parameters():
            p.grad = None
        if i >= WARMUP:
            out_s.append(issued)
    return out_s


def profiled_forward(job, device: str) -> str:
    """One forward (after a warm-up iteration) under torch.profiler with Python stacks: the
    largest self-CPU-time entries, grouped by their innermost frames."""
    from torch.profiler import ProfilerActivity, profile

    model, tokens = model_and_tokens(job, device)
    model(tokens).float().sum().backward()
    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        logits = model(tokens)
    del logits
    return prof.key_averages(group_by_stack_n=5).table(
        sort_by="self_cpu_time_total", row_limit=40, max_name_column_width=60
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--case", default="gpt3-760m-s2048-mb4-sel")
    parser.add_argument("--device", default="cuda", choices=("cuda", "meta"))
    parser.add_argument("--gpu", choices=sorted(RECORDED_PREFIX), help="default: detected")
    parser.add_argument("--layers", type=int, help="blocks to build (default: the case's)")
    parser.add_argument("--iterations", type=int, default=5)
    args = parser.parse_args(argv)
    if args.iterations < 1:
        parser.error(f"--iterations={args.iterations}: at least 1")
    if args.layers is not None and args.layers < 1:
        parser.error(f"--layers={args.layers}: at least 1")
    gpu = args.gpu or local_gpu_preset()
    if not recorded_baseline_path(args.case, gpu).is_file():
        parser.error(f"--case {args.case!r}: no recorded baseline of it on {gpu}")
    figures = {"case": args.case, "gpu": gpu, "device": args.device, "modes": {}}
    args.out.mkdir(parents=True, exist_ok=True)
    for mode in MODES:
        job = job_of(args.case, gpu, mode, args.layers)
        host_s = forward_host_s(job, args.device, args.iterations)
        median = statistics.median(host_s)
        figures["modes"][mode] = {
            "forward_host_s": host_s,
            "median_s": median,
            "per_block_us": 1e6 * median / job.model.layers,
        }
        # written after every mode: a run cut at its time limit keeps what it measured
        (args.out / "sac_host.json").write_text(json.dumps(figures, indent=1))
        print(f"{mode}: forward host {1e3 * median:.2f} ms, "
              f"{1e6 * median / job.model.layers:.0f} us per block", flush=True)  # fmt: skip
    table = profiled_forward(job_of(args.case, gpu, "selective", args.layers), args.device)
    (args.out / "sac_host.txt").write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
