"""Emulate a job end to end: capture, price, replay, allocator replay -> one EmulationResult.

`emulate(job)` is what `prismbench emulate` prints. The stages and where they live:
capture (prismbench.capture -> emulator.capture.rank), the execution graph and its replay
(emulator.graph.build, emulator.graph.replay), peak memory per class (emulator.memory). Figures are
defined in docs/METRICS.md; the stages in docs/ARCHITECTURE.md.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from emulator.costs.attention_rates import AttentionRates, load_attention_rates
from emulator.costs.collectives import Topology
from emulator.costs.host_dispatch import HostDispatch, from_figures, kernel_gap_from_figures
from emulator.costs.kernel_table import (
    PRICE_SOURCES,
    KernelTable,
    MeasuredRow,
    read_rows,
    table_from_rows,
)
from emulator.costs.pricing import CostContext, compute_prices, price_source_summary
from emulator.graph.build import build_graph
from emulator.graph.replay import replay
from emulator.graph.results import BREAKDOWN_FIELDS
from emulator.graph.timeline import write_trace
from emulator.hardware import gpu_preset, inter_node_network, intra_node_link
from emulator.memory import replay_memory
from emulator.memory.export import write_snapshot
from prismbench.capture import JobCapture, capture_job
from prismbench.checkout import REPO
from prismbench.emulate_inputs import HOST_DISPATCH, KERNEL_TABLES, RESULT_SCHEMA_VERSION
from prismbench.explain import explain, stage_model_flops_per_gpu
from prismbench.files import write_atomically
from prismbench.plots import memory_event_times_s, plot_memory_timeline
from prismbench.spec import SpecError

# published rates of the attention kernels the tables do not measure, by `[kernels] attention`
ATTENTION_RATES = {
    "triton": KERNEL_TABLES / "triton-attention.csv",
    "flash2": KERNEL_TABLES / "flash2-attention.csv",
}
CRITICAL_PATH_SHOWN = 50
# The dense peak MFU is taken against: the GEMM dtype of the job (fp8 jobs against the fp8
# peak, as MosaicML reports its FP8 rows; fp32 jobs against tf32; torchtitan quotes bf16 peak,
# see METRICS.md).
_PEAK_DTYPE = {"bf16": "bf16", "fp16": "fp16", "fp8": "fp8", "fp32": "tf32"}


@dataclass(frozen=True, kw_only=True)
class ClassFigures:
    """One class of ranks (a pipeline rank): its share of the iteration and its memory."""

    pp: int
    representative_rank: int
    members: int
    # the job's figures for one GPU of this class (docs/METRICS.md): every class ends with
    # the step, so its iteration time and tokens/s are the job's; its model FLOPs are its
    # layers' (and the logits' on the last stage), so TFLOP/s and MFU show stage imbalance
    iteration_time_s: float
    tokens_per_s: float
    tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float
    compute_s: float
    exposed_comm_s: float
    bubble_s: float
    host_wait_s: float
    idle_s: float
    comm_s_by_group: dict[str, float]
    hardware_flops: int
    peak_memory_allocated_bytes: int  # steady-state iteration (emulator.memory.iterations)
    peak_memory_reserved_bytes: int
    first_iteration_peak_memory_allocated_bytes: int
    first_iteration_peak_memory_reserved_bytes: int
    device_total_estimate_bytes: int
    oom: bool
    oom_detail: dict | None
    # torch's num_alloc_retries (requests served only after freeing the cache) in the first and
    # in a steady iteration; steady ones recur every step and are not priced in the time; and
    # over every iteration replayed until the steady one (one-off retries on the way included)
    first_iteration_alloc_retries: int
    steady_alloc_retries: int
    alloc_retries: int
    # steady iterations replayed until the allocator's blocks repeated; not converged: they
    # still changed after emulator.memory.replay.MAX_STEADY_ITERATIONS (the figures are the
    # last one's)
    steady_iterations: int
    steady_converged: bool
    # Per kernel_table.PRICE_SOURCES: compute ops of one iteration of this class it priced
    # and their summed duration (s).
    compute_priced_by: dict[str, dict[str, float]]


@dataclass(frozen=True, kw_only=True)
class EmulationResult:
    """The contract of `prismbench emulate --json` (its version: RESULT_SCHEMA_VERSION)."""

    job: str
    world_size: int
    ranks_executed: int
    iteration_time_s: float
    tokens_per_s: float
    tflops_per_gpu: float  # model FLOPs (no recompute) per GPU per second / 1e12
    hardware_tflops_per_gpu: float  # FLOPs the trace executes, recompute included
    mfu: float  # fraction of the dense peak of the job's GEMM dtype
    peak_tflops: float
    peak_memory_allocated_bytes: int  # steady-state iteration, the largest class
    peak_memory_reserved_bytes: int
    first_iteration_peak_memory_allocated_bytes: int
    first_iteration_peak_memory_reserved_bytes: int
    device_total_estimate_bytes: int
    gpu_capacity_bytes: int
    oom: bool
    # where the program builds its model, `train.model_init` resolved: "device" (the whole fp32
    # model, then cast and sharded: its freed segments stay cached) or "meta" (shards only)
    model_built_on: str
    kernel_table: str  # the measured table that priced compute ("" when none: curves only)
    compute_priced_by: dict[str, dict[str, float]]  # summed over classes
    breakdown: dict[str, float]
    per_class: tuple[ClassFigures, ...]
    critical_path: tuple[dict, ...]  # the first CRITICAL_PATH_SHOWN events
    critical_path_events: int
    wall_s: float
    capture_wall_s: float
    capture_cached: bool

    def to_dict(self) -> dict:
        return {"schema_version": RESULT_SCHEMA_VERSION, **asdict(self)}


def topology_of(job) -> Topology:
    c = job.cluster
    return Topology(
        gpu=gpu_preset(c.gpu),
        gpus_per_node=c.gpus_per_node,
        link=intra_node_link(c.intra_node),
        network=inter_node_network(c.inter_node),
    )


def kernel_table_for(
    gpu: str, *, skip_sources: tuple[str, ...] = (), extra: Sequence[str | Path] = ()
) -> KernelTable | None:
    """The committed measured table of a GPU preset (results/kernels/<gpu>.csv), if any, with
    the rows of the `extra` CSVs (a user's own measurements: `prismbench calibrate --job`,
    `ingest-profile`) merged over it, each refused unless measured on that GPU
    (`check_table_gpu`); a later file's row wins over an earlier one's of the same op and shape
    (`merge_rows`). Less the rows of `skip_sources`, left out of each file before the merge
    (`table_from_rows`). The label names every
    file, the winning one first: "rows.csv over results/kernels/h100-sxm-80g.csv"."""
    path = KERNEL_TABLES / f"{gpu}.csv"
    # named relative to the repository, so results do not depend on where it is checked out
    tables = [(str(path.relative_to(REPO)), read_rows(path))] if path.exists() else []
    for extra_path in extra:
        rows = read_rows(extra_path)
        check_table_gpu(rows, gpu, extra_path)
        tables.append((str(extra_path), rows))
    if not tables:
        return None
    label = " over ".join(name for name, _ in reversed(tables))
    return table_from_rows(*(rows for _, rows in tables), label=label, skip_sources=skip_sources)


def check_table_gpu(rows: list[MeasuredRow], gpu: str, path: str | Path) -> None:
    """Refuse kernel rows measured on another GPU than the preset `gpu`: each row's `gpu`
    column (torch's device name, as `calibrate` and `ingest-profile` record it, or the preset's
    own name, `GpuPreset.is_named`) must name the preset; another GPU's kernels run at another
    speed. Rows that name no GPU (a Chrome trace ingested without `--provenance gpu=...`) are
    taken as the preset's."""
    preset = gpu_preset(gpu)
    foreign = sorted({row.gpu for row in rows if row.gpu and not preset.is_named(row.gpu)})
    if foreign:
        names = ", ".join(repr(n) for n in preset.device_names) or "none listed"
        raise ValueError(
            f"{path}: rows measured on {', '.join(map(repr, foreign))}, not on cluster.gpu="
            f"{gpu!r} (whose device names are {names}): a table prices the GPU it was measured on"
        )


# Frameworks whose tensor parallelism is their own autograd functions over plain tensors
# (Megatron-core's ColumnParallelLinear & co.), not DTensor.
_PLAIN_TP_FRAMEWORKS = ("megatron", "nemo")
# Frameworks that issue kernels from C/C++ with no per-op Python or dispatcher: llm.c. Their
# host cost is not measured here, and the eager figures do not apply: none is modelled.
_NATIVE_FRAMEWORKS = ("llm.c",)


def attention_rates_for(job) -> AttentionRates | None:
    """The rates that price `job`'s attention when its framework runs a kernel the kernel
    tables did not measure (`[kernels] attention`, `ATTENTION_RATES`); None for "flash" and
    "unfused"."""
    kernel = job.kernels.attention
    if kernel not in ATTENTION_RATES:
        return None
    gpu = gpu_preset(job.cluster.gpu)
    rates = load_attention_rates(ATTENTION_RATES[kernel], kernel, gpu.arch)
    if rates is None:
        raise SpecError(
            f"kernels.attention={kernel!r}: no published rates of that kernel on {gpu.arch} "
            f'GPUs (cluster.gpu={job.cluster.gpu!r}); use attention = "flash"'
        )
    return rates


def host_framework(job) -> str | None:
    """Which host dispatch figures a job's rank pays: `dtensor` when tensor parallelism makes
    its layers DTensor modules (workloads.parallelize; torchtitan), `aten` for other eager
    PyTorch ranks, None where kernels are issued from C (`[kernels] framework = "llm.c"`)."""
    framework = job.kernels.framework
    if framework in _NATIVE_FRAMEWORKS:
        return None
    if job.parallel.tp > 1 and framework not in _PLAIN_TP_FRAMEWORKS:
        return "dtensor"
    return "aten"


def host_dispatch_for(job, *, skip_profiles=()) -> HostDispatch | None:
    """The measured host dispatch figures (results/kernels/host-dispatch.json) for `job`'s
    framework, less the profiles named in `skip_profiles` (leave-one-out scoring); None where
    no figures apply (`host_framework`)."""
    framework = host_framework(job)
    if framework is None:
        return None
    data = json.loads(HOST_DISPATCH.read_text())
    return from_figures(data, framework, skip_profiles=skip_profiles)


def kernel_gap_for(*, skip_profiles=()) -> float:
    """The measured seconds a stream idles between kernels (results/kernels/host-dispatch.json,
    `kernel_gap_from_figures`), less the profiles named in `skip_profiles` (leave-one-out)."""
    return kernel_gap_from_figures(
        json.loads(HOST_DISPATCH.read_text()), skip_profiles=skip_profiles
    )


def cost_context(
    job,
    kernel_table: KernelTable | None | str = "preset",
    host_dispatch: HostDispatch | None | str = "preset",
    kernel_gap_s: float | str = "preset",
) -> CostContext:
    """What `job`'s ops are priced on: its cluster, and "preset" (the GPU's committed table, if
    any), a loaded table, or None (roofline curves only); the host dispatch figures: "preset"
    (the measured ones, `host_dispatch_for`), given ones, or None (the host binds nothing); the
    idle time between kernels: "preset" (the measured one, `kernel_gap_for`) or seconds."""
    if isinstance(kernel_table, str):
        if kernel_table != "preset":
            raise ValueError(f"kernel_table={kernel_table!r}: give 'preset', a KernelTable or None")
        kernel_table = kernel_table_for(job.cluster.gpu)
    if isinstance(host_dispatch, str):
        if host_dispatch != "preset":
            raise ValueError(
                f"host_dispatch={host_dispatch!r}: give 'preset', a HostDispatch or None"
            )
        host_dispatch = host_dispatch_for(job)
    if isinstance(kernel_gap_s, str):
        if kernel_gap_s != "preset":
            raise ValueError(f"kernel_gap_s={kernel_gap_s!r}: give 'preset' or seconds")
        kernel_gap_s = kernel_gap_for()
    return CostContext(
        topology=topology_of(job),
        table=kernel_table,
        host=host_dispatch,
        async_tp=job.kernels.async_tp,
        tp_grad_overlap=job.kernels.tp_grad_overlap,
        launch_blocking=job.kernels.launch_blocking,
        compiled=job.kernels.compile,
        attention=attention_rates_for(job),
        kernel_gap_s=kernel_gap_s,
    )


@dataclass(frozen=True, eq=False)
class PricedJob:
    """A job's capture, what it was priced on, and the prices of its compute rows per class
    ((durations_s, price sources), `compute_prices`): what `emulate` and
    `prismbench.variability` both start from, so a caller that wants both captures once."""

    capture: JobCapture
    cost: CostContext
    prices: dict

    @property
    def durations_s(self) -> dict:
        return {p: durations for p, (durations, _) in self.prices.items()}


def price_job(
    job,
    *,
    use_cache: bool = True,
    workers: int | None = None,
    progress: Callable[[str], None] | None = None,
    kernel_table: KernelTable | None | str = "preset",
    host_dispatch: HostDispatch | None | str = "preset",
    kernel_gap_s: float | str = "preset",
) -> PricedJob:
    """Capture `job` (prismbench.capture, cached) and price every compute op once."""
    say = progress or (lambda _msg: None)
    say(f"capture: {job.parallel.pp} class(es) of {job.world_size:,} ranks")
    capture = capture_job(job, workers=workers, use_cache=use_cache, progress=progress)
    say(f"capture done in {capture.wall_s:.1f} s ({'cache' if capture.cached else 'captured'})")
    cost = cost_context(job, kernel_table, host_dispatch, kernel_gap_s)
    prices = {p: compute_prices(trace, cost) for p, trace in capture.traces.items()}
    return PricedJob(capture, cost, prices)


def _table_label(table: KernelTable | None) -> str:
    return "" if table is None else table.label


def emulate(
    job,
    *,
    name: str = "job",
    use_cache: bool = True,
    workers: int | None = None,
    alloc_conf: str = "",
    trace_path: Path | None = None,
    trace_ranks: list[int] | None = None,
    memory_dir: Path | None = None,
    progress: Callable[[str], None] | None = None,
    kernel_table: KernelTable | None | str = "preset",
    host_dispatch: HostDispatch | None | str = "preset",
    priced: PricedJob | None = None,
) -> EmulationResult:
    """Emulate one iteration of `job` (a validated JobSpec).

    trace_path: write a Perfetto timeline of `trace_ranks` (default one rank per class), its
    missing directories made.
    memory_dir: write, per class, a memory timeline PNG and a snapshot that PyTorch's
    memory visualizer (pytorch.org/memory_viz) opens.
    kernel_table: "preset" (the GPU's committed table, if any), a loaded table, or None
    (roofline curves only).
    host_dispatch: "preset" (the measured host time per op, `host_dispatch_for`), given
    figures, or None (the host binds nothing: kernels run back to back).
    priced: `price_job(job, ...)` already done (its kernel table and host figures are then the
    ones used).
    """
    started = time.perf_counter()
    say = progress or (lambda _msg: None)
    if priced is None:
        priced = price_job(job, use_cache=use_cache, workers=workers, progress=progress,
                           kernel_table=kernel_table, host_dispatch=host_dispatch)  # fmt: skip
    # priced once: the graph takes the durations, the result says how they were priced
    capture, cost, prices = priced.capture, priced.cost, priced.prices
    graph = build_graph(capture.traces, capture.world, cost, durations_s=priced.durations_s)
    say(f"graph: {sum(len(c) for c in graph.classes):,} nodes; replaying")
    timing = replay(graph, ranks=trace_ranks or ())
    if trace_path is not None:  # its missing directories made, as memory_dir's are
        write_atomically(trace_path, lambda tmp: write_trace(tmp, graph, timing, ranks=trace_ranks))
        say(f"wrote timeline {trace_path}")
    gpu = gpu_preset(job.cluster.gpu)
    say("memory: replaying the caching allocator per class")
    memory = {
        p: replay_memory(trace, gpu=gpu, alloc_conf=alloc_conf, stage=p)
        for p, trace in capture.traces.items()
    }
    if memory_dir is not None:
        named = job_title(name, job.model.name)
        label = f"{named}: {job.world_size:,} x {gpu.name}, {_layout(job)}"
        _export_memory(
            memory_dir,
            capture.traces,
            memory,
            gpu,
            alloc_conf,
            graph=graph,
            timing=timing,
            job=label,
        )
        say(f"wrote memory timelines and snapshots to {memory_dir}")
    priced_by = {p: price_source_summary(*prices[p]) for p in capture.traces}
    explanation = explain(job)
    rates = _Rates(
        timing.iteration_time_s,
        job.tokens_per_iteration,
        explanation.flops.model_flops_per_iteration,
        stage_model_flops_per_gpu(explanation),
        gpu.peak_tflops(_PEAK_DTYPE[job.train.precision]),
    )
    per_class = tuple(
        _class_figures(capture.world, b, memory[b.pp], priced_by[b.pp], rates)
        for b in timing.per_class
    )
    return _result(
        job, name, capture, timing, per_class, rates, gpu, started, _table_label(cost.table)
    )


def _export_memory(
    directory: Path, traces, memory, gpu, alloc_conf: str, *, graph, timing, job: str
) -> None:
    """Per class: the memory timeline PNG over the representative rank's replayed time, and
    the allocator snapshot."""
    directory.mkdir(parents=True, exist_ok=True)
    world = graph.world
    for p, trace in traces.items():
        rank = world.representative(p)
        times = {  # the first iteration's events are drawn over the same replayed step
            which: memory_event_times_s(trace, graph.classes[p], timing.timelines[rank], t.rows)
            for which, t in (("steady", memory[p].timeline), ("first", memory[p].first_timeline))
        }
        plot_memory_timeline(
            memory[p],
            directory / f"memory_class_{p:04d}.png",
            title=f"{job}\npipeline rank {p} of {world.pp} (rank {rank}): memory",
            trace=trace,
            event_times_s=times["steady"],
            first_event_times_s=times["first"],
        )
        write_snapshot(
            trace, directory / f"snapshot_class_{p:04d}.pickle", gpu=gpu, alloc_conf=alloc_conf
        )


def job_title(name: str, model: str) -> str:
    """The job's name, and its model's when that says more: "llama2-7b", "run3 (llama2-7b)"."""
    return name if name == model else f"{name} ({model})"


def _layout(job) -> str:
    """The job's layout in a few words: "tp2 pp2 dp2 zero1, micro-batch 1 x 64 tokens"."""
    par = job.parallel
    sizes = [(a, getattr(par, a)) for a in ("tp", "cp", "pp", "vpp", "dp", "zero")]
    axes = " ".join(f"{a}{n}" for a, n in sizes if n > 1 or (a == "zero" and n)) or "one rank"
    return f"{axes}, micro-batch {job.batch.micro_batch} x {job.batch.seq_len} tokens"


@dataclass(frozen=True)
class _Rates:
    """What the throughput figures of the job and of each class are computed from."""

    iteration_time_s: float
    tokens_per_iteration: int
    model_flops_per_iteration: int
    model_flops_per_gpu_by_stage: tuple[float, ...]
    peak_tflops: float


def _class_figures(world, breakdown, mem, priced_by, rates: _Rates) -> ClassFigures:
    iteration = rates.iteration_time_s
    tflops = rates.model_flops_per_gpu_by_stage[breakdown.pp] / iteration / 1e12
    return ClassFigures(
        pp=breakdown.pp,
        representative_rank=world.representative(breakdown.pp),
        members=world.classes()[breakdown.pp].members,
        iteration_time_s=iteration,
        tokens_per_s=rates.tokens_per_iteration / iteration,
        tflops_per_gpu=tflops,
        hardware_tflops_per_gpu=breakdown.flops / iteration / 1e12,
        mfu=tflops / rates.peak_tflops,
        **{name: getattr(breakdown, name) for name in BREAKDOWN_FIELDS},
        comm_s_by_group=breakdown.comm_s_by_group,
        hardware_flops=breakdown.flops,
        peak_memory_allocated_bytes=mem.peak_allocated_bytes,
        peak_memory_reserved_bytes=mem.peak_reserved_bytes,
        first_iteration_peak_memory_allocated_bytes=mem.first_iteration_peak_allocated_bytes,
        first_iteration_peak_memory_reserved_bytes=mem.first_iteration_peak_reserved_bytes,
        device_total_estimate_bytes=mem.device_total_estimate_bytes,
        oom=mem.oom is not None,
        oom_detail=asdict(mem.oom) if mem.oom is not None else None,
        first_iteration_alloc_retries=mem.first_iteration_alloc_retries,
        steady_alloc_retries=mem.steady_alloc_retries,
        alloc_retries=mem.alloc_retries,
        steady_iterations=mem.steady_iterations,
        steady_converged=mem.steady_converged,
        compute_priced_by=priced_by,
    )


def _result(
    job, name, capture, timing, per_class, rates, gpu, started, table_label
) -> EmulationResult:
    iteration = timing.iteration_time_s
    world = job.world_size
    hardware_flops = sum(c.hardware_flops * c.members for c in per_class)
    # the classes' mean (every class has world / pp members), computed as it always was: a
    # mean of per-stage quotients differs in the last bit where world / pp is no power of 2
    tflops = rates.model_flops_per_iteration / iteration / world / 1e12
    n = len(per_class)
    return EmulationResult(
        job=name,
        world_size=world,
        ranks_executed=len(capture.traces),
        iteration_time_s=iteration,
        tokens_per_s=rates.tokens_per_iteration / iteration,
        tflops_per_gpu=tflops,
        hardware_tflops_per_gpu=hardware_flops / iteration / world / 1e12,
        mfu=tflops / rates.peak_tflops,
        peak_tflops=rates.peak_tflops,
        peak_memory_allocated_bytes=max(c.peak_memory_allocated_bytes for c in per_class),
        peak_memory_reserved_bytes=max(c.peak_memory_reserved_bytes for c in per_class),
        first_iteration_peak_memory_allocated_bytes=max(
            c.first_iteration_peak_memory_allocated_bytes for c in per_class
        ),
        first_iteration_peak_memory_reserved_bytes=max(
            c.first_iteration_peak_memory_reserved_bytes for c in per_class
        ),
        device_total_estimate_bytes=max(c.device_total_estimate_bytes for c in per_class),
        gpu_capacity_bytes=gpu.usable_capacity_bytes,
        oom=any(c.oom for c in per_class),
        model_built_on=job.model_built_on,
        kernel_table=table_label,
        compute_priced_by={
            source: {
                field: sum(c.compute_priced_by[source][field] for c in per_class)
                for field in ("ops", "time_s")
            }
            for source in PRICE_SOURCES
        },
        breakdown={name: sum(getattr(c, name) for c in per_class) / n for name in BREAKDOWN_FIELDS},
        per_class=per_class,
        critical_path=tuple(asdict(e) for e in timing.critical_path[:CRITICAL_PATH_SHOWN]),
        critical_path_events=len(timing.critical_path),
        wall_s=time.perf_counter() - started,
        capture_wall_s=capture.wall_s,
        capture_cached=capture.cached,
    )
