"""The torch.compile rule against Inductor's own scheduler, block by block (issue 14: why torchtitan's compiled rows miss).

    python results/fidelity/compile_vs_inductor.py [--out results/fidelity/compile_vs_inductor.md]
    python results/fidelity/compile_vs_inductor.py --listing r035 1024 backward

`--listing` prints one graph of one row's layer kernel by kernel, the rule's rows and
Inductor's scheduler nodes with the buffers each reads and writes (`TORCH_LOGS=fusion` in the
environment adds Inductor's reason for every fusion it refused).

Needs `triton` beside the CPU torch (`pip install triton==3.5.0` in a virtual environment made
with `--system-site-packages`; about 10 minutes on 2 cores). It is not a project dependency:
only the Inductor step of this report needs it (tests and `compile_gpu.py` use the rest).

`emulator.capture.compile_fusion` models what Inductor does to a compiled TransformerBlock by a
rule over the eager trace (docs/MODELS.md, "torch.compile"). This script asks Inductor itself.
For each compiled torchtitan row below, the row's job is cut to one layer and one sequence of
`SEQ_LENS` tokens and:
- **Inductor**: the block, wrapped in torchtitan's checkpoint policy as the row runs it
  (`workloads.recompute`'s op-level policy for "selective", the whole block for "full"), is
  compiled with `torch.compile` and run forward and backward on CPU with
  `torch._inductor.config.cpu_backend = "triton"`, so the GPU backend's scheduler
  (`TritonScheduling`) fuses the nodes, and Inductor's questions whether a node is on a CPU
  are answered no, so its lowering and scheduler take their GPU heuristics (a CPU realises
  reused values of exp/sigmoid-like ops and never reorders loops to fuse). After fusion,
  each kernel's bytes are what Inductor itself counts
  (`BaseSchedulerNode.get_read_write_buffers_sizes`: each buffer once, the smaller of its
  accesses and its size). No kernel is compiled or run (there is no Triton
  driver for a CPU): the generated kernels are replaced by no-ops, so the values are garbage
  and only the graphs and their fusion count. The forward graph and the backward graph (which
  holds the checkpoint's recomputation: AOTAutograd partitions it there) are reported apart.
- **The rule**: the same one-layer job captured as `validate` captures it (FSDP2 over two
  ranks, as the row), its memory-bound rows inside the block after `fuse_compiled_regions`,
  FSDP2's own copies left out (they run eagerly around the compiled block).
Memory-bound kernels only (Inductor's generated kernels and the RoPE custom op on one side,
the rule's elementwise/norm/softmax/reduction/copy rows on the other); GEMMs and attention are
the same extern kernels on both. Two sequence lengths give each side's bytes as a part per
token plus a part per layer that does not grow with tokens (the float8 weight casts). The
excess at the row's own shape is the rule's bytes less Inductor's, over all layers, for one
micro-batch of one rank, and the time it takes at the preset's HBM bandwidth times its
`[efficiency] hbm` (a rough price: the rule's kernels are priced by the kernel table).

Caveat: Inductor here is torch 2.13's; the rows ran torch of December 2024 (1963fc8), whose
partitioner and scheduler were older.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from emulator.costs.ops import GEMM_OPS  # noqa: E402

ROWS = (
    "torchtitan2024__llama3.1-8b__8g__r034",  # bf16, op-level SAC
    "torchtitan2024__llama3.1-8b__8g__r035",  # fp8, op-level SAC
    "torchtitan2024__llama3.1-8b__8g__r036",  # fp8, full AC, 32k tokens
)
SEQ_LENS = (1024, 2048)
GROUPS = ("forward", "backward")


def one_layer_job(job, *, fsdp: bool, seq_len: int | None = None, micro_batch: int | None = None):
    """`job` cut to one layer at `seq_len` x `micro_batch` (the row's own unless given): FSDP2
    over two ranks, as `validate` captures it, or one process with recompute "none" (the
    caller wraps the block itself: `Checkpointed`)."""
    parallel = dataclasses.replace(
        job.parallel, dp=2 if fsdp else 1, zero=3 if fsdp else 0, tp=1, cp=1, pp=1,
        sequence_parallel=False,
    )  # fmt: skip
    micro_batch = micro_batch or job.batch.micro_batch
    batch = dataclasses.replace(
        job.batch,
        seq_len=seq_len or job.batch.seq_len,
        micro_batch=micro_batch,
        global_batch=micro_batch * parallel.dp,
    )
    train = job.train if fsdp else dataclasses.replace(job.train, recompute="none")
    return dataclasses.replace(
        job,
        model=dataclasses.replace(job.model, layers=1),
        parallel=parallel,
        batch=batch,
        train=train,
    )


# ---- Inductor's side (run in a child process: it patches Inductor for good) ---------------


def _patch_inductor(graphs: list) -> None:
    """Make Inductor schedule for Triton on a CPU, record each graph's kernels after fusion,
    and compile none of them."""
    import torch._inductor.config as config
    import torch.utils._triton as torch_triton
    from torch._inductor import async_compile, ir, scheduler

    config.cpu_backend = "triton"
    config.compile_threads = 1
    config.fx_graph_cache = False  # a cache hit skips the scheduler

    class _NoKernel:
        def __getattr__(self, name):
            return lambda *args, **kwargs: None

    # Inductor's heuristics ask whether a buffer lives on a CPU (realising reused values of
    # heavy ops, opcount and read thresholds; no loop reordering to fuse): answer as on a GPU
    ir.is_cpu = lambda node: False
    scheduler.BaseSchedulerNode.is_cpu = lambda self: False
    torch_triton.triton_hash_with_backend = lambda: "no-triton-driver"
    async_compile.AsyncCompile.triton = lambda self, *args, **kwargs: _NoKernel()
    original_init = scheduler.Scheduler._init

    def recording_init(self, nodes):
        original_init(self, nodes)
        kernels = []
        for node in self.nodes:
            kind = type(node).__name__
            if kind == "NopKernelSchedulerNode":
                continue
            name = ""
            if kind == "ExternKernelSchedulerNode":
                ir_node = node.node
                name = str(getattr(ir_node, "op_overload", "") or "") or str(
                    getattr(ir_node, "python_kernel_name", "") or ""
                )
            kernels.append(
                (kind, name, int(node.get_read_write_buffers_sizes()),
                 _buffers(node.read_writes.reads), _buffers(node.read_writes.writes))
            )  # fmt: skip
        graphs.append(kernels)

    scheduler.Scheduler._init = recording_init


def _buffers(deps) -> list[str]:
    """Each buffer a scheduler node reads (or writes) as "name:MB", for the listing."""
    from torch._inductor.virtualized import V

    named = []
    for dep in sorted(deps, key=lambda d: d.name):
        try:
            size = int(dep.get_numel()) * V.graph.get_dtype(dep.name).itemsize
        except (AttributeError, KeyError, TypeError, NotImplementedError):
            size = 0  # a dependence without a size (a StarDep, a mutation)
        named.append(f"{dep.name}:{size / 1e6:.2f}")
    return named


def checkpoint_context():
    """torchtitan's op-level policy as the `context_fn` of `torch.utils.checkpoint`: a module
    level function, the form Dynamo accepts."""
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    from workloads.recompute import _op_policy

    return create_selective_checkpoint_contexts(_op_policy())


def checkpointed(block, recompute: str):
    """`block` wrapped as torchtitan wraps it for `recompute` ("none"; "selective": the op-level
    policy; "full"), in the form Dynamo traces: compile the result."""
    import torch
    from torch.utils.checkpoint import checkpoint

    class Checkpointed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.block = block

        def forward(self, *args):
            if recompute == "none":
                return self.block(*args)
            context = {"context_fn": checkpoint_context} if recompute == "selective" else {}
            return checkpoint(self.block, *args, use_reentrant=False, **context)

    return Checkpointed()


def inductor_kernels(baseline: Path, seq_len: int) -> list[list[tuple[str, str, int]]]:
    """[forward kernels, backward kernels] of the one-layer job's compiled block."""
    graphs: list = []
    _patch_inductor(graphs)
    import torch

    from prismbench.baselines import load_baseline
    from workloads.train import build_training, micro_batch_backward, micro_batch_forward

    row = load_baseline(baseline).job
    job = one_layer_job(row, fsdp=False, seq_len=seq_len, micro_batch=1)
    state = build_training(job, None, device="cpu")
    model = state.parts[0]
    for key, block in list(model.layers.items()):
        model.layers[key] = torch.compile(checkpointed(block, row.train.recompute))
    tokens = torch.randint(0, job.model.vocab, (1, seq_len))
    micro_batch_backward(micro_batch_forward(model, state.loss_fn, tokens, tokens), 1)
    if len(graphs) != 2:
        raise RuntimeError(f"expected a forward and a backward graph, Inductor built {len(graphs)}")
    return graphs


# Inductor's extern kernels that are not memory-bound: GEMMs, attention, and the rng-state
# wrappers torch.utils.checkpoint puts around attention under full checkpointing (SDPA is a
# random op: `run_and_save_rng_state` in the forward graph, `run_with_rng_state` for its
# recomputation in the backward; a Llama block has no other random op)
EXTERN_COMPUTE = (*GEMM_OPS, "attention", "run_and_save_rng_state", "run_with_rng_state")


def inductor_bytes(graphs) -> dict[str, tuple[int, int]]:
    """{group: (memory-bound kernels, bytes)}: generated kernels and memory-bound custom ops."""
    totals = {}
    for group, kernels in zip(GROUPS, graphs, strict=True):
        count = moved = 0
        for kind, name, nbytes, *_ in kernels:
            extern = kind == "ExternKernelSchedulerNode"
            if extern and (nbytes == 0 or any(k in name for k in EXTERN_COMPUTE)):
                continue  # GEMMs, attention, and the views of a multi-output op
            count, moved = count + 1, moved + nbytes
        totals[group] = (count, moved)
    return totals


def _inductor_graphs_in_child(baseline: Path, seq_len: int) -> list:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "graphs.json"
        subprocess.run(
            [sys.executable, __file__, "--inductor", str(baseline), str(seq_len), str(out)],
            check=True,
        )
        return json.loads(out.read_text())


def _inductor_in_child(baseline: Path, seq_len: int) -> dict[str, tuple[int, int]]:
    return inductor_bytes(_inductor_graphs_in_child(baseline, seq_len))


# ---- the rule's side -----------------------------------------------------------------------


def block_memory_rows(trace) -> list[tuple[int, str]]:
    """(row, "forward" | "backward") of each memory-bound compute row of a captured block,
    the recomputation counted with the backward; FSDP2's copy-in / copy-out left out (they run
    eagerly around the compiled block)."""
    import numpy as np

    from emulator.capture.compile_fusion import block_region
    from emulator.capture.inductor_scheduler import FUSIBLE
    from emulator.capture.trace import COMPUTE, PHASES

    columns = trace.columns
    names, atens, modules = trace.text("name"), trace.text("aten"), trace.text("module")
    in_block = block_region("layers")
    rows = []
    for row in np.flatnonzero(columns["kind"] == COMPUTE):
        if names[row] not in FUSIBLE or not in_block(modules[row]):
            continue
        if atens[row].startswith(("fsdp.", "aten._foreach")):
            continue
        rows.append(
            (int(row), "forward" if PHASES[columns["phase"][row]] == "forward" else "backward")
        )
    return rows


def rule_rows(baseline: Path, seq_len: int) -> dict[str, list[tuple[int, int, str, str, str]]]:
    """{group: [(read bytes, written bytes, phase, aten op, module), ...]} of the block's
    memory-bound rows in the one-layer job's capture, in trace order."""
    from emulator.capture.trace import PHASES
    from prismbench.baselines import load_baseline
    from prismbench.capture import capture_job

    job = one_layer_job(load_baseline(baseline).job, fsdp=True, seq_len=seq_len, micro_batch=1)
    trace = next(iter(capture_job(job).traces.values()))
    columns = trace.columns
    atens, modules = trace.text("aten"), trace.text("module")
    rows = {group: [] for group in GROUPS}
    for row, group in block_memory_rows(trace):
        rows[group].append((
            int(columns["read_bytes"][row]), int(columns["write_bytes"][row]),
            PHASES[columns["phase"][row]], atens[row], modules[row],
        ))  # fmt: skip
    return rows


def rule_bytes(baseline: Path, seq_len: int) -> dict[str, tuple[int, int]]:
    """{group: (memory-bound rows, bytes)} of the block in the one-layer job's capture."""
    return {
        group: (len(rows), sum(read + written for read, written, *_ in rows))
        for group, rows in rule_rows(baseline, seq_len).items()
    }


def listing(rule: list[tuple], inductor: list[list]) -> str:
    """One graph kernel by kernel: the rule's memory-bound rows (`rule_rows`, one group), then
    Inductor's scheduler nodes after fusion (one graph of `inductor_kernels`) with the buffers
    each reads and writes; MB = 1e6 bytes."""
    lines = ["The rule (memory-bound rows; MB moved, read, written; phase, op, module):"]
    for read, written, phase, aten, module in rule:
        lines.append(
            f"  {(read + written) / 1e6:9.2f}  r {read / 1e6:.2f}  w {written / 1e6:.2f}  "
            f"{phase}  {aten}  {module}"
        )
    lines.append(f"  total {sum(r[0] + r[1] for r in rule) / 1e6:.2f} MB in {len(rule)} rows")
    lines.append("Inductor (scheduler nodes after fusion; MB moved; reads -> writes):")
    for kind, name, nbytes, reads, writes in inductor:
        tag = f"extern {name}" if kind == "ExternKernelSchedulerNode" else "generated"
        lines.append(f"  {nbytes / 1e6:9.2f}  {tag}: {' '.join(reads)} -> {' '.join(writes)}")
    return "\n".join(lines)


# ---- the report ----------------------------------------------------------------------------


def per_token_and_layer(points: dict[int, int]) -> tuple[float, float]:
    """(bytes a token, bytes a layer that do not grow with tokens) from two sequence lengths."""
    (s1, b1), (s2, b2) = sorted(points.items())
    per_token = (b2 - b1) / (s2 - s1)
    return per_token, b1 - per_token * s1


def _fidelity_row(name: str) -> dict:
    with open(ROOT / "results" / "fidelity" / "fidelity.csv") as f:
        return next(r for r in csv.DictReader(f) if r["baseline"] == name)


def report(progress=print) -> str:
    from emulator.hardware.presets import gpu_preset
    from prismbench.baselines import load_baseline
    from prismbench.checkout import git_version

    commit, dirty = git_version()
    lines = [
        "# The torch.compile rule against Inductor's scheduler",
        "",
        f"Generated by `python results/fidelity/compile_vs_inductor.py` at {commit}"
        f"{' (uncommitted changes)' if dirty else ''} (Inductor of torch "
        f"{__import__('torch').__version__}, scheduling for Triton on a CPU; the script's "
        "docstring says how). One layer of each row's job; MB = 1e6 bytes of memory-bound "
        "kernels; per token and per layer from sequences of "
        f"{' and '.join(str(s) for s in SEQ_LENS)} tokens.",
        "",
        "| row | graph | rule kernels | Inductor kernels | rule MB / 1k tokens | Inductor "
        "| rule MB a layer, fixed | Inductor | rule / Inductor at the row's tokens |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    excess_lines = []
    for name in ROWS:
        path = ROOT / "results" / "baselines" / f"{name}.toml"
        job = load_baseline(path).job
        rule, inductor = {}, {}
        for seq_len in SEQ_LENS:
            progress(f"{name}: seq {seq_len}: the rule's capture")
            rule[seq_len] = rule_bytes(path, seq_len)
            progress(f"{name}: seq {seq_len}: Inductor")
            inductor[seq_len] = _inductor_in_child(path, seq_len)
        tokens = job.batch.seq_len * job.batch.micro_batch // job.parallel.cp
        excess = 0.0
        for group in GROUPS:
            r_tok, r_fixed = per_token_and_layer({s: rule[s][group][1] for s in SEQ_LENS})
            i_tok, i_fixed = per_token_and_layer({s: inductor[s][group][1] for s in SEQ_LENS})
            r_at, i_at = r_tok * tokens + r_fixed, i_tok * tokens + i_fixed
            excess += (r_at - i_at) * job.model.layers
            s = SEQ_LENS[-1]
            lines.append(
                f"| {name.split('__')[-1]} | {group} | {rule[s][group][0]} | "
                f"{inductor[s][group][0]} | {r_tok * 1e3 / 1e6:.1f} | {i_tok * 1e3 / 1e6:.1f} | "
                f"{r_fixed / 1e6:.0f} | {i_fixed / 1e6:.0f} | {r_at / i_at:.2f} |"
            )
        gpu = gpu_preset(job.cluster.gpu)
        seconds = excess / (gpu.hbm_bandwidth_GBps * 1e9 * gpu.hbm_efficiency)
        fidelity = _fidelity_row(name)
        predicted = float(fidelity["predicted_iteration_s"])
        measured = float(fidelity["measured_iteration_s"])
        excess_lines.append(
            f"- {name.split('__')[-1]} ({job.train.precision}, recompute {job.train.recompute}, "
            f"{tokens} tokens a micro-batch, {job.model.layers} layers): the rule moves "
            f"{excess / 1e9:.1f} GB more than Inductor a micro-batch ({job.num_microbatches} a rank), {seconds * 1e3:.0f} ms at "
            f"{gpu.hbm_bandwidth_GBps * gpu.hbm_efficiency:.0f} GB/s; the row: predicted "
            f"{predicted:.3f} s, measured {measured:.3f} s, error "
            f"{float(fidelity['error']) * 100:+.1f} %; with that time taken off, "
            f"{(predicted - seconds * job.num_microbatches) / measured * 100 - 100:+.1f} %."
        )
    return "\n".join([*lines, "", *excess_lines, ""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the report here (default: print it)")
    parser.add_argument("--inductor", nargs=3, metavar=("BASELINE", "SEQ", "JSON"),
                        help=argparse.SUPPRESS)  # fmt: skip
    parser.add_argument(
        "--listing", nargs=3, metavar=("ROW", "SEQ", "GRAPH"),
        help="print one row's one-layer graph (forward or backward) kernel by kernel, the "
        "rule's and Inductor's, e.g. r035 1024 backward",
    )  # fmt: skip
    args = parser.parse_args()
    if args.listing:
        row, seq_len, graph = args.listing
        if graph not in GROUPS:
            parser.exit(2, f"--listing: GRAPH must be one of {', '.join(GROUPS)}, not {graph!r}\n")
        matches = [name for name in ROWS if name.endswith(f"__{row}")]
        if not matches:
            rows = ", ".join(name.split("__")[-1] for name in ROWS)
            parser.exit(2, f"--listing: ROW must be one of {rows}, not {row!r}\n")
        path = ROOT / "results" / "baselines" / f"{matches[0]}.toml"
        rule = rule_rows(path, int(seq_len))[graph]
        inductor = _inductor_graphs_in_child(path, int(seq_len))[GROUPS.index(graph)]
        print(listing(rule, inductor))
        return
    if args.inductor:
        baseline, seq_len, out = args.inductor
        Path(out).write_text(json.dumps(inductor_kernels(Path(baseline), int(seq_len))))
        return
    text = report(progress=lambda m: print(m, file=sys.stderr, flush=True))
    if args.out:
        args.out.write_text(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
