"""Host dispatch: the CPU time an eager program spends issuing each op, and which ops it binds.

An eager PyTorch rank has one host thread issuing GPU work in program order: every op costs
host time (Python, the dispatcher, DTensor's sharding propagation, the allocator, the launch)
before its kernels are queued; the GPU runs a kernel once it is queued *and* the one before it
on its stream has ended. Where kernels are shorter than their dispatch the stream waits for the
host (launch-bound); where they are longer the host runs ahead and its cost is hidden. The host
never waits for the GPU in this model (no synchronising call inside an iteration: the
iteration's `loss.item()` is its end), so its clock is a prefix sum over the trace's rows,
independent of every GPU clock (`dispatch_times_s`); `emulator.graph.build` turns it into the
earliest start and end of each node, and the replay takes the later of those and the stream's
own times.

Backward ops are issued by autograd's engine thread (one per device) while the main thread
waits in `.backward()`, so one host clock still serves the whole iteration; the engine's ops
and the ops activation checkpointing re-runs there (phase "recompute") take the `backward`
figure, forward ops the `forward` one, the optimizer and grad clipping (foreach ops on the main
thread) the `optimizer` one. The first op of a phase run pays that class's *entry* cost instead
(starting the engine in `.backward()`, zero_grad before the step). A collective or p2p call pays
the figure of its phase (the call goes through the dispatcher like any op; NCCL's own launch is
not separated).

The figures are measured (`results/kernels/host-dispatch.json`, built from torch.profiler
records of real runs by `results/kernels/build_host_dispatch.py`); `from_figures` reads them:
per framework (`aten`: plain tensors; `dtensor`: tensor-parallel DTensor ranks) and class,
the median over profiles of each profile's mean host interval per launching op, divided by the
profiler's measured inflation of host time (the profiles were taken under torch.profiler).

Compiled code is not dispatched op by op: a torch.compile'd graph (torchtitan compiles each
block) runs Inductor's generated wrapper, which launches each of its kernels from Python
without the dispatcher or DTensor's sharding propagation. A row inside a compiled region
(`compiled_region` given: its module is in one, and it is not an FSDP custom op, which runs
eagerly around the block) pays `COMPILED_KERNEL_S`, and the first of a run of such rows (a
graph's call) `COMPILED_GRAPH_S` instead of the per-op and entry figures. Both are published
measurements of Inductor's launch path (meta-pytorch/tritonbench#1017, 2026-04, a GB200 host:
`nop_inductor_per_kernel` 9.1 us with 19 arguments, `CachingAutotuner.run` per kernel; the
whole call of a one-kernel graph, guards and `CompiledFxGraph` included, 42.4 us, of which the
graph's share is 42.4 - 9.1 = 33.3 us); not measured here, and the runs of December 2024 had an
older, slower Triton launcher.

The GPU side of the launch path: even when the host runs ahead, a stream does not start a
kernel the moment the one before it ends. In the shared world-size-1 profiles whose GPU waits
for no host (the unprofiled iteration within 1.2 x the profile's kernel sum), the unprofiled
iteration exceeds the profile's summed kernel times by 1.8-3.9 us per kernel launched
(`kernel_gap_from_figures`: the median over those profiles, 2.18 us). The pricing adds it to every
kernel an op launches (`costs.pricing`), on every GPU: only the H100 node measured it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from emulator.capture.compile_fusion import EXTERN_NAMESPACES
from emulator.capture.trace import COMM, COMPUTE, PHASES, RankTrace

CLASSES = ("forward", "backward", "optimizer")
COMPILED_KERNEL_S = 9.1e-6  # per kernel a compiled graph launches (tritonbench#1017)
COMPILED_GRAPH_S = 33.3e-6  # per call of a compiled graph (tritonbench#1017: 42.4 - 9.1 us)
FRAMEWORKS = ("aten", "dtensor")
# trace phase -> dispatch class (recompute runs on autograd's engine thread, as backward does)
CLASS_OF_PHASE = {"forward": "forward", "backward": "backward", "recompute": "backward",
                  "optimizer": "optimizer"}  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class HostDispatch:
    """Host seconds per op of each class, and per entry into a class; where they come from."""

    per_op_s: dict[str, float]
    entry_s: dict[str, float]
    framework: str = "aten"
    source: str = ""

    def __post_init__(self) -> None:
        for table in ("per_op_s", "entry_s"):
            values = getattr(self, table)
            if set(values) != set(CLASSES):
                raise ValueError(f"host dispatch {table}: classes {sorted(values)} != {CLASSES}")
            for cls, v in values.items():
                if not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
                    raise ValueError(f"host dispatch {table}[{cls}]={v!r} must be a finite >= 0 s")
        if self.framework not in FRAMEWORKS:
            raise ValueError(f"host dispatch framework={self.framework!r}: one of {FRAMEWORKS}")


def _median(values: list[float]) -> float:
    return float(np.median(values)) if values else 0.0


def _stat(summary: dict, key: str) -> float | None:
    return summary.get(key) if summary.get("count", 0) else None


def from_figures(data: dict, framework: str, *, skip_profiles=()) -> HostDispatch:
    """The model's figures from the measured file's content (`host-dispatch.json`): per class,
    the median over the framework's profiles (less `skip_profiles`) of the per-op mean interval
    and of the entry mean, each divided by the profiler inflation (the geometric mean of the
    host-bound runs' ratios, less the skipped ones)."""
    if framework not in FRAMEWORKS:
        raise ValueError(f"host dispatch framework={framework!r}: one of {FRAMEWORKS}")
    profiles = {
        name: p
        for name, p in data["profiles"].items()
        if p["framework"] == framework and name not in skip_profiles
    }
    if not profiles:
        raise ValueError(
            f"host dispatch: no {framework} profile left (skipped {list(skip_profiles)})"
        )
    ratios = [
        r["ratio"] for name, r in data["profiler_inflation"].items() if name not in skip_profiles
    ]
    if not ratios:
        raise ValueError("host dispatch: no profiler-inflation measurement left")
    inflation = float(np.exp(np.mean(np.log(ratios))))
    per_op, entry = {}, {}
    for cls in CLASSES:
        means = [_stat(p["per_op"][cls], "mean_us") for p in profiles.values()]
        entries = [_stat(p["entry"][cls], "mean_us") for p in profiles.values()]
        per_op[cls] = _median([m for m in means if m is not None]) * 1e-6 / inflation
        entry[cls] = _median([m for m in entries if m is not None]) * 1e-6 / inflation
    label = f"{framework}: {len(profiles)} profile(s), profiler inflation {inflation:.3f}"
    return HostDispatch(per_op_s=per_op, entry_s=entry, framework=framework, source=label)


def kernel_gap_from_figures(data: dict, *, skip_profiles=()) -> float:
    """Seconds a stream idles between two back-to-back kernels: the median over the measured
    file's GPU-bound profiles (less `skip_profiles`) of (unprofiled iteration - kernel sum) /
    kernels launched (`host-dispatch.json`, "kernel_gap")."""
    gaps = [
        p["gap_us_per_kernel"]
        for name, p in data["kernel_gap"]["profiles"].items()
        if p["gpu_bound"] and name not in skip_profiles
    ]
    if not gaps:
        raise ValueError(f"kernel gap: no GPU-bound profile left (skipped {list(skip_profiles)})")
    return float(np.median(gaps)) * 1e-6


def dispatch_times_s(
    trace: RankTrace, host: HostDispatch, compiled_region: Callable[[str], str] | None = None
) -> np.ndarray:
    """Host seconds spent issuing each trace row (compute and comm rows; 0 elsewhere): its
    class's per-op figure, or the class's entry figure for the first row of a phase run; with
    `compiled_region` (module -> its compiled region, "" outside), rows of a compiled graph
    pay the compiled figures (module docstring)."""
    c = trace.columns
    issued = np.flatnonzero((c["kind"] == COMPUTE) | (c["kind"] == COMM))
    out = np.zeros(len(trace))
    if not len(issued):
        return out
    names = [CLASS_OF_PHASE.get(PHASES[p], "forward") if p >= 0 else "forward"
             for p in c["phase"][issued].tolist()]  # fmt: skip
    per_op = np.array([host.per_op_s[n] for n in names])
    entry = np.array([host.entry_s[n] for n in names])
    starts = np.ones(len(names), bool)
    starts[1:] = np.array(names[1:]) != np.array(names[:-1])
    starts[0] = False  # the iteration's first op pays the per-op figure
    out[issued] = np.where(starts, entry, per_op)
    if compiled_region is not None:
        graphs = _compiled_graphs(trace, issued, names, compiled_region)
        compiled = graphs != ""
        first = compiled.copy()
        first[1:] &= graphs[1:] != graphs[:-1]
        out[issued[compiled]] = COMPILED_KERNEL_S
        out[issued[first]] = COMPILED_GRAPH_S
    return out


def _compiled_graphs(
    trace: RankTrace, issued: np.ndarray, names: list[str], region_of: Callable[[str], str]
) -> np.ndarray:
    """Per issued row: "<region> <class>" of the compiled graph it runs in, "" for eager rows
    (outside every compiled region, or an FSDP custom op)."""
    modules = trace.columns["module"][issued]
    atens = trace.columns["aten"][issued]
    region = {m: region_of(trace.strings[m]) for m in np.unique(modules).tolist()}
    eager = {
        a for a in np.unique(atens).tolist()
        if trace.strings[a].split(".", 1)[0] in EXTERN_NAMESPACES
    }  # fmt: skip
    return np.array(
        [
            f"{region[m]} {n}" if region[m] and a not in eager else ""
            for m, a, n in zip(modules.tolist(), atens.tolist(), names, strict=True)
        ]
    )
