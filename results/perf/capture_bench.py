"""Capture and end-to-end emulation time of the Llama 3 paper's 405B job; writes capture.md.

    python results/perf/capture_bench.py [--growth-only]

1. The Llama 3.1 405B job of the Llama 3 paper (8 192 H100, tp 8, pp 16, dp 64, seq 8 192,
   micro-batch 1, global batch 2 048, i.e. 32 micro-batches per iteration): every class
   captured from a cold cache with both cores, then graph build, replay, and allocator
   replay timed separately, and the whole `emulate` call once more from a warm cache.
2. How one class's capture time grows with layers per stage and with micro-batches
   (llama3.1-405b dims, tp 8, the first pipeline rank), each point captured cold, with
   chunks reused (the default) and with every chunk run.
Figures are wall-clock seconds on this machine (recorded in the output with its cores);
they replace the generated block of capture.md, the hand-written sections stay.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from emulator.capture.rank import capture_rank
from emulator.costs.pricing import CostContext
from emulator.graph.build import build_graph
from emulator.graph.replay import replay
from emulator.memory import replay_memory
from prismbench.capture import capture_job
from prismbench.emulate import emulate, topology_of
from prismbench.program import rank_program
from prismbench.spec import job_spec_from_dict

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from shared_gpu import commit_label  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # results/perf/: machine
from machine import machine_line  # noqa: E402

OUT = Path(__file__).resolve().parent / "capture.md"


def llama3_405b(**parallel) -> object:
    table = {
        "model": {"name": "llama3.1-405b"},
        "parallel": {"tp": 8, "pp": 16, "dp": 64, "zero": 1} | parallel,
        "batch": {"seq_len": 8192, "micro_batch": 1, "global_batch": 2048},
        "train": {"precision": "bf16", "recompute": "none"},
        "cluster": {"gpu": "h100-sxm-80g", "intra_node": "nvlink4", "inter_node": "ib-ndr-8x400"},
    }
    return job_spec_from_dict(table)


def timed(fn):
    started = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - started


def full_job(cache: Path) -> list[str]:
    job = llama3_405b()
    capture, capture_s = timed(lambda: capture_job(job, cache_dir=cache, use_cache=False))
    cost = CostContext(topology=topology_of(job))
    graph, graph_s = timed(lambda: build_graph(capture.traces, capture.world, cost))
    result, replay_s = timed(lambda: replay(graph))
    _, memory_s = timed(
        lambda: [replay_memory(t, gpu="h100-sxm-80g") for t in capture.traces.values()]
    )
    os.environ["PRISMBENCH_CACHE"] = str(cache.parent)
    warm, warm_s = timed(lambda: emulate(job))
    events = sum(len(t) for t in capture.traces.values())
    return [
        "## Llama 3.1 405B, 8 192 H100 (tp 8, pp 16, dp 64, 32 micro-batches)",
        "",
        "| stage | wall time |",
        "|---|--:|",
        f"| capture, 16 classes, cold, 2 workers | {capture_s:.1f} s |",
        f"| graph build ({events:,} trace events -> {sum(len(c) for c in graph.classes):,} nodes) | {graph_s:.2f} s |",
        f"| replay (8 192 ranks, uniform lanes) | {replay_s:.3f} s |",
        f"| allocator replay, 16 classes | {memory_s:.2f} s |",
        f"| capture + graph + replay + memory | {capture_s + graph_s + replay_s + memory_s:.1f} s |",
        f"| `emulate` again, warm capture cache | {warm_s:.1f} s |",
        "",
        f"Predicted iteration time {result.iteration_time_s:.2f} s (warm run: {warm.iteration_time_s:.2f} s).",
        "",
    ]


def growth() -> list[str]:
    lines = [
        "## One class's capture time vs layers and micro-batches",
        "",
        "llama3.1-405b dims, tp 8, first pipeline rank of pp 2, seq 8 192, cold, one process;",
        "with a stage's first forward and backward reused for its other micro-batches (the",
        "default, `emulator/capture/chunk_reuse.py`) and with every chunk run.",
        "",
        "| layers on the rank | micro-batches | capture, chunks reused | capture, every chunk run |",
        "|--:|--:|--:|--:|",
    ]
    points = ((2, 2), (2, 2), (4, 2), (8, 2), (4, 4), (4, 8), (4, 16), (4, 32), (8, 32))
    for point, (layers, microbatches) in enumerate(points):
        job = job_spec_from_dict(
            {
                "model": {"name": "llama3.1-405b", "layers": layers * 2},
                "parallel": {"tp": 8, "pp": 2, "dp": 64, "zero": 1},
                "batch": {"seq_len": 8192, "micro_batch": 1, "global_batch": 64 * microbatches},
            }
        )
        seconds = [
            timed(
                lambda job=job, reuse=reuse: capture_rank(
                    0, job.world_size, rank_program(job), reuse_chunks=reuse
                )
            )[1]
            for reuse in (True, False)
        ]
        if point:  # the first point only warms the process up (imports, torch's caches)
            lines.append(f"| {layers} | {microbatches} | {seconds[0]:.1f} s | {seconds[1]:.1f} s |")
    return lines + [""]


BEGIN, END = "<!-- BEGIN GENERATED -->", "<!-- END GENERATED -->"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--growth-only", action="store_true")
    args = parser.parse_args()
    header = [
        f"Measured by `results/perf/capture_bench.py` at commit {commit_label()}, "
        f"{time.strftime('%Y-%m-%d')}. {machine_line()}",
        "",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "captures"
        body = growth() if args.growth_only else full_job(cache) + growth()
    block = "\n".join(header + body).rstrip("\n")
    text = OUT.read_text() if OUT.exists() else f"# Capture and emulation speed\n\n{BEGIN}\n{END}\n"
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    OUT.write_text(f"{head}{BEGIN}\n{block}\n{END}{tail}")
    print(block)


if __name__ == "__main__":
    main()
