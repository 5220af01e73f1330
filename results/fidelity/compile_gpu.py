"""A compiled torchtitan block on a GPU: Inductor's kernels timed against the compile rule's price.

    python3 results/fidelity/compile_gpu.py --out DIR             (on a CUDA machine; ~1 min)
    python results/fidelity/compile_gpu.py --compare DIR/compile_gpu.json [--out FILE]   (here)

`compile_vs_inductor.md` compares the compile rule's bytes with what Inductor's scheduler fuses
a compiled block into, counted on a CPU (until 2c3dffc the rule moved 1.5-1.75 x Inductor's
bytes in a block's backward; since, within 16 %). This measures what the kernels cost on the
GPU. For each row in `ROWS` (torchtitan's compiled Llama 3 8B
rows, bf16 and fp8, op-level selective recompute), one TransformerBlock of the row's model, at
the row's micro-batch shape (2 x 8 192 tokens), wrapped in the row's checkpoint policy and
compiled as torchtitan compiles each block, runs forward and backward on random activations;
after WARMUP calls one forward and one backward are profiled (torch.profiler kernel records,
`emulator.costs.kernel_timing.profile_iteration`). Each kernel is Inductor's (a generated
Triton kernel, named `triton_*`) or an extern one (GEMMs, attention, FSDP-free here). DIR/
compile_gpu.json holds, per row and pass, the kernel count and time of each kind and the GPU.

`--compare` (on any machine, the project's torch) captures the same one-block job as
`validate` does (FSDP2 over two ranks), prices it on the GPU's preset with the kernel table,
and sets the rule's memory-bound rows of the block (forward; backward with the
recomputation) beside the measured Triton kernels: count and time.

Whether the block was compiled at all: DIR/compile_gpu.json also records, per row, what
Dynamo made of it (graphs compiled, graph breaks and their reasons), and `--compare` says it.
The first run (an H200, 2026-11-30, at 664c165, before this record) measured an eager block:
its kernels are those of the same block run eagerly (37 forward kernels for bf16, 227 for fp8,
as the eager reprofile's), and its only Triton kernels RoPE's custom op's
(`compile_gpu_h200.md`). The workloads' attention on CUDA with `flash_only` (`kernels.attention
= "flash2"`) asks `is_fake(q)`, a function Dynamo refuses to trace; inside the checkpointed
block that graph break makes Dynamo run the whole block eagerly (on a CPU `q.is_cuda` is false
first, so the CPU checks never saw it). The workloads now ask `on_real_gpu`, which Dynamo
traces (`tests/workloads/test_attention_ops.py` compiles it with `fullgraph=True`), so the
block runs here as the program runs it, `flash_only` on; a row whose `dynamo` record shows a
graph break was not measured compiled.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "results" / "fidelity"))
from compile_vs_inductor import block_memory_rows, checkpointed, one_layer_job  # noqa: E402

ROWS = (
    "torchtitan2024__llama3.1-8b__8g__r034",  # bf16, op-level SAC
    "torchtitan2024__llama3.1-8b__8g__r035",  # fp8, op-level SAC
)
PASSES = ("forward", "backward")
WARMUP = 3


def compiled_block(job, device: str):
    """(a function running `job`'s block, checkpointed and compiled, forward on a fresh random
    micro-batch, a function running that forward's backward and returning the input's
    gradient)."""
    import torch

    from workloads.train import build_training

    state = build_training(one_layer_job(job, fsdp=False), None, device=device)
    block = next(iter(state.parts[0].layers.values()))
    compiled = torch.compile(checkpointed(block, job.train.recompute))
    shape = (job.batch.micro_batch, job.batch.seq_len, job.model.hidden)
    dtype = next(block.parameters()).dtype
    positions = torch.arange(job.batch.seq_len, device=device)
    grad = torch.randn(shape, device=device, dtype=dtype)
    held = {}

    def forward():
        held["x"] = torch.randn(shape, device=device, dtype=dtype, requires_grad=True)
        held["out"] = compiled(held["x"], positions)

    def backward():
        held["out"].backward(grad)
        return held["x"].grad

    return forward, backward


def dynamo_record() -> dict:
    """What Dynamo made of the calls since its counters were last cleared: graphs compiled,
    and each graph break's reason (its first line) with how often it happened."""
    from torch._dynamo.utils import counters

    breaks: dict[str, int] = {}
    for reason, n in counters["graph_break"].items():
        first = reason.strip().splitlines()[0] if reason.strip() else "?"
        breaks[first] = breaks.get(first, 0) + n
    return {"graphs": int(counters["stats"]["unique_graphs"]), "breaks": breaks}


def dynamo_lines(measured: dict) -> list[str]:
    """Per row, whether the block ran compiled: Dynamo's record, or that the JSON has none."""
    lines = []
    for name, row in measured["rows"].items():
        label = name.split("__")[-1]
        record = row.get("dynamo")
        if record is None:
            lines.append(
                f"- {label}: the JSON does not record what Dynamo compiled (written before "
                "compile_gpu.py kept it): the Inductor kernels above are the only evidence."
            )
        elif record["graphs"] == 0 or record["breaks"]:
            reasons = "; ".join(f"{r} ({n}x)" for r, n in record["breaks"].items())
            lines.append(
                f"- {label}: **not one compiled block**: {record['graphs']} graph(s) compiled, "
                f"graph breaks: {reasons or 'none'}."
            )
        else:
            lines.append(f"- {label}: {record['graphs']} graph(s) compiled, no graph break.")
    return lines


def kernel_kinds(records: list[dict]) -> dict[str, dict[str, float]]:
    """{"inductor" | "extern": {"kernels": count, "us": time}} of a profile's op records."""
    kinds = {kind: {"kernels": 0, "us": 0.0} for kind in ("inductor", "extern")}
    for record in records:
        for name, us in record["kernels"]:
            kind = kinds["inductor" if name.startswith("triton_") else "extern"]
            kind["kernels"] += 1
            kind["us"] += us
    return kinds


def measure(out: Path) -> Path:
    import torch
    from torch._dynamo.utils import counters

    from emulator.costs.kernel_timing import profile_iteration
    from prismbench.baselines import load_baseline

    sys.path.insert(0, str(ROOT / "results"))
    from shared_gpu import local_gpu_preset

    figures = {"gpu": local_gpu_preset(), "device": torch.cuda.get_device_name(), "rows": {}}
    figures["torch"] = torch.__version__
    for name in ROWS:
        job = load_baseline(ROOT / "results" / "baselines" / f"{name}.toml").job
        torch._dynamo.reset()
        counters.clear()
        forward, backward = compiled_block(job, "cuda")
        for _ in range(WARMUP):
            forward()
            backward()
        forward_records = profile_iteration(forward, warmup=0)
        backward_records = profile_iteration(backward, warmup=0)
        figures["rows"][name] = {
            "forward": kernel_kinds(forward_records),
            "backward": kernel_kinds(backward_records),
            "dynamo": dynamo_record(),
        }
        print(name, json.dumps(figures["rows"][name]), flush=True)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "compile_gpu.json"
    path.write_text(json.dumps(figures, indent=1))
    return path


def rule_prices(name: str, gpu: str) -> dict[str, dict[str, float]]:
    """{pass: {"kernels", "us"}} of the rule's memory-bound rows in the row's block, priced on
    `gpu` as `validate` prices them (the kernel table, the stream's idle time per kernel)."""
    from emulator.costs.pricing import compute_durations_s
    from prismbench.baselines import load_baseline
    from prismbench.capture import capture_job
    from prismbench.emulate import cost_context

    job = load_baseline(ROOT / "results" / "baselines" / f"{name}.toml").job
    job = one_layer_job(job, fsdp=True)
    job = dataclasses.replace(job, cluster=dataclasses.replace(job.cluster, gpu=gpu))
    trace = next(iter(capture_job(job).traces.values()))
    seconds = compute_durations_s(trace, cost_context(job))
    totals = {p: {"kernels": 0, "us": 0.0} for p in PASSES}
    for row, group in block_memory_rows(trace):
        totals[group]["kernels"] += 1
        totals[group]["us"] += float(seconds[row]) * 1e6
    return totals


def compare(measured: dict) -> str:
    lines = [
        "| row | pass | measured Inductor kernels | time | the rule's kernels | priced | rule / "
        "measured | extern kernels measured (GEMMs, attention) |",
        "|---|---|--:|--:|--:|--:|--:|--:|",
    ]
    for name, passes in measured["rows"].items():
        rule = rule_prices(name, measured["gpu"])
        for p in PASSES:
            got, priced = passes[p]["inductor"], rule[p]
            lines.append(
                f"| {name.split('__')[-1]} | {p} | {got['kernels']} | {got['us'] / 1e3:.2f} ms | "
                f"{priced['kernels']} | {priced['us'] / 1e3:.2f} ms | "
                f"{priced['us'] / got['us']:.2f} | {passes[p]['extern']['us'] / 1e3:.2f} ms |"
            )
    head = (
        f"A compiled block on {measured['device']} (torch {measured['torch']}) against the rule "
        f"priced on the `{measured['gpu']}` preset."
    )
    return "\n".join([head, "", *lines, "", *dynamo_lines(measured), ""])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="measure: the folder; --compare: the report")
    parser.add_argument("--compare", type=Path, help="a compile_gpu.json to score here")
    args = parser.parse_args(argv)
    if args.compare:
        sys.path.insert(0, str(ROOT / "results"))
        from shared_gpu import command_line, report

        lines = compare(json.loads(args.compare.read_text())).splitlines()
        report(command_line("results/fidelity/compile_gpu.py", argv), lines, args.out)
        return
    if args.out is None:
        parser.error("--out DIR is needed to measure")
    print(measure(args.out))


if __name__ == "__main__":
    main()
