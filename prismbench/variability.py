"""`prismbench variability`: the distribution of a job's step time (PRISM, issue 18).

`variability(job)` captures and prices the job as `emulate` does (prismbench.emulate.price_job)
and hands it to `sample_priced`, which builds the execution graph with each compute op's
temporal spread, replays it once without variability (the deterministic prediction) and then N
times with draws of a VariabilityModel (emulator.variability.monte_carlo). `prismbench validate
--variability` calls `sample_priced` on the capture and prices its emulation already made.
On request it also ranks the noise sources by the variance each alone gives
(emulator.variability.attribution), splits the top ones into their signatures (`drill_down`)
and compares placements of k slow GPUs
(emulator.variability.placement).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from emulator.graph.build import build_graph
from emulator.graph.execution_graph import ExecutionGraph
from emulator.graph.replay import replay
from emulator.variability.attribution import (
    SIGNATURES_PER_SOURCE,
    Attribution,
    attribute_variance,
    drill_down,
)
from emulator.variability.model import PRISM_LOW, VariabilityModel
from emulator.variability.monte_carlo import network_regime_nodes, sample_step_times
from emulator.variability.placement import PlacementStudy, compare_placements
from emulator.variability.sources import inert_reason, noise_sources
from emulator.variability.summary import (
    DEFAULT_STEPS_PER_ALLOCATION,
    StepTimeDistribution,
    check_allocations,
    summarize,
)
from prismbench.emulate import PricedJob, price_job
from prismbench.files import write_atomically
from prismbench.network_steps import MeasuredNetwork
from prismbench.pipeline_transfers import MeasuredTransfers, modelled_transfer_s


@dataclass(frozen=True, kw_only=True, eq=False)
class VariabilityResult:
    """A job's step-time distribution and how it was obtained."""

    job: str
    world_size: int
    preset: str
    distribution: StepTimeDistribution
    monte_carlo_wall_s: float  # the N replays alone
    # the network regimes drawn (the preset's, or those measured on a run: `network_measured`)
    network: tuple = ()
    network_measured: MeasuredNetwork | None = None
    # the CV each pipeline transfer drew (the model's pipeline_transfer_cv: the collectives'
    # unless measured on a run's transfers, `transfers_measured`)
    transfer_cv: float | None = None
    transfers_measured: MeasuredTransfers | None = None
    # beside a measured transfer: the emulator's price of one per link its boundaries cross
    # (pipeline_transfers.modelled_transfer_s); None without a measurement
    transfer_modelled_s: dict[str, float] | None = None
    # the `measured` preset's table where it is a file given (`--variability-table`), not the
    # job's GPU's committed one
    variability_table: str | None = None
    # of the samples above p95, the share drawn in a network regime slower than the fastest;
    # None where the model has one regime or it slows no communication of the job. Near 1, the
    # tail is the regimes' probability and factor, restated: assumed ones unless measured.
    tail_slow_network_share: float | None = None
    attribution: Attribution | None = None  # the noise sources ranked, when asked for
    placement: PlacementStudy | None = None  # slow GPUs placed every way, when asked for

    def to_dict(self) -> dict:
        out = {
            "job": self.job,
            "world_size": self.world_size,
            "preset": self.preset,
            "variability_table": self.variability_table,
            **self.distribution.to_dict(),
            "network_regimes": [{"probability": r.probability, "factor": r.factor} for r in self.network],
            "network_measured": None if self.network_measured is None else self.network_measured.to_dict(),
            "transfer_cv": self.transfer_cv,
            "transfers_measured": None if self.transfers_measured is None else self.transfers_measured.to_dict(),
            "transfer_modelled_s": self.transfer_modelled_s,
            "tail_slow_network_share": self.tail_slow_network_share,
            "monte_carlo_wall_s": self.monte_carlo_wall_s,
        }
        if self.attribution is not None:
            out["attribution"] = self.attribution.to_dict()
        if self.placement is not None:
            out["placement"] = self.placement.to_dict()
        return out


def op_names(trace) -> np.ndarray:
    """Each trace row's op name (the costs' vocabulary for compute rows)."""
    return np.asarray(trace.strings, dtype=object)[trace.columns["name"]]


def variability(
    job,
    *,
    name: str = "job",
    model: VariabilityModel = PRISM_LOW,
    preset: str = "prism-low",
    samples: int = 1000,
    seed: int = 0,
    threshold_s: float | None = None,
    k_steps: int = 1000,
    use_cache: bool = True,
    workers: int | None = None,
    progress: Callable[[str], None] | None = None,
    rank_sources: bool = False,
    rank_signatures: int = 0,
    signatures_per_source: int = SIGNATURES_PER_SOURCE,
    slow_gpus: tuple[int, float] | None = None,
    host_dispatch="preset",
    kernel_table="preset",
    steps_per_allocation: int = DEFAULT_STEPS_PER_ALLOCATION,
    network: MeasuredNetwork | None = None,
    transfers: MeasuredTransfers | None = None,
    variability_table: str | None = None,
) -> VariabilityResult:
    """Sample `job`'s step time `samples` times under `model` (named `preset` in the result).

    workers: capture processes, and the Monte Carlo's threads (None: one per core).
    rank_sources: also run every noise source alone (same seed and samples) and rank them.
    rank_signatures: K > 0: also split the K top-ranked sources of more than one signature
    into their `signatures_per_source` largest signatures and "other", each run alone
    (emulator.variability.attribution.drill_down; implies rank_sources).
    slow_gpus: (k, factor): also place k GPUs `factor` x slower every way they fit.
    host_dispatch: as `emulate`'s ("preset": the measured host time per op; None: none).
    kernel_table: as `emulate`'s ("preset": the GPU's committed table; a loaded one; None).
    steps_per_allocation: consecutive samples on one draw of the per-GPU factors (steps of one
    run; emulator.variability.summary); above 1, `samples` must make at least MIN_ALLOCATIONS
    allocations.
    network: regimes measured on a run (prismbench.network_steps), drawn in place of the
    model's.
    transfers: pipeline transfers measured on a run (prismbench.pipeline_transfers): their
    no-bubble CV is drawn as the model's transfer_cv.
    variability_table: the file `model`'s figures were read from, named in the result."""
    check_allocations(samples, steps_per_allocation)  # before the capture, not after it
    priced = price_job(job, use_cache=use_cache, workers=workers, progress=progress,
                       host_dispatch=host_dispatch, kernel_table=kernel_table)  # fmt: skip
    return sample_priced(priced, name=name, world_size=job.world_size, model=model, preset=preset,
                         samples=samples, seed=seed, threshold_s=threshold_s, k_steps=k_steps,
                         progress=progress, rank_sources=rank_sources,
                         rank_signatures=rank_signatures,
                         signatures_per_source=signatures_per_source, slow_gpus=slow_gpus,
                         steps_per_allocation=steps_per_allocation, threads=workers,
                         network=network, transfers=transfers,
                         variability_table=variability_table)  # fmt: skip


def priced_graph(
    priced: PricedJob, model: VariabilityModel
) -> tuple[ExecutionGraph, dict[int, np.ndarray]]:
    """The execution graph the Monte Carlo replays, and the temporal spread (s) under `model`
    of every compute op it was built with, per class."""
    durations = priced.durations_s
    traces = priced.capture.traces
    spreads = {p: model.temporal_spreads_s(d, op_names(traces[p])) for p, d in durations.items()}
    graph = build_graph(
        traces, priced.capture.world, priced.cost, durations_s=durations, spreads_s=spreads
    )
    return graph, spreads


def sample_priced(
    priced: PricedJob,
    *,
    name: str,
    world_size: int,
    model: VariabilityModel = PRISM_LOW,
    preset: str = "prism-low",
    samples: int = 1000,
    seed: int = 0,
    threshold_s: float | None = None,
    k_steps: int = 1000,
    progress: Callable[[str], None] | None = None,
    rank_sources: bool = False,
    rank_signatures: int = 0,
    signatures_per_source: int = SIGNATURES_PER_SOURCE,
    slow_gpus: tuple[int, float] | None = None,
    steps_per_allocation: int = DEFAULT_STEPS_PER_ALLOCATION,
    threads: int | None = None,
    network: MeasuredNetwork | None = None,
    transfers: MeasuredTransfers | None = None,
    variability_table: str | None = None,
) -> VariabilityResult:
    """The step-time distribution of a job already captured and priced (`price_job`), on
    `threads` threads (None: one per core; emulator.variability.monte_carlo); with `network`,
    its regimes in place of the model's, with `transfers`, their no-bubble CV as its
    transfer_cv; `variability_table`, `rank_signatures` and `signatures_per_source` as
    `variability`'s."""
    say = progress or (lambda _msg: None)
    if network is not None:
        model = replace(model, network=network.regimes)
    if transfers is not None:
        model = replace(model, transfer_cv=transfers.no_bubble_cv)
    graph, spreads = priced_graph(priced, model)
    deterministic = replay(graph).iteration_time_s
    say(f"graph: {graph.nodes:,} nodes; {samples} samples")
    started = time.perf_counter()
    regime_factors = np.empty(samples)
    times = sample_step_times(graph, model, samples=samples, seed=seed,
                              steps_per_allocation=steps_per_allocation, threads=threads,
                              progress=lambda done: say(f"sampled {done}/{samples}"),
                              network_out=regime_factors)  # fmt: skip
    wall = time.perf_counter() - started
    distribution = summarize(times, deterministic, seed=seed, threshold_s=threshold_s,
                             k_steps=k_steps, steps_per_allocation=steps_per_allocation)  # fmt: skip
    attribution = placement = None
    if rank_sources or rank_signatures:
        traces = priced.capture.traces
        sources = noise_sources(graph, model, traces, spreads)
        inert = sum(inert_reason(s, graph, model) is not None for s in sources)
        say(f"ranking {len(sources) - inert} noise sources ({inert} more provably add none): "
            f"{samples} samples each")
        attribution = attribute_variance(graph, model, sources, samples=samples, seed=seed,
                                         steps_per_allocation=steps_per_allocation,
                                         threads=threads, progress=say,
                                         everything=times)  # fmt: skip
        if rank_signatures:
            say(f"splitting the top {rank_signatures} sources into signatures")
            attribution = drill_down(graph, model, attribution, sources, traces, spreads,
                                     top=rank_signatures, per_source=signatures_per_source,
                                     threads=threads, progress=say)  # fmt: skip
    if slow_gpus is not None:
        say(f"placing {slow_gpus[0]} GPUs {slow_gpus[1]}x slower: {samples} samples each")
        placement = compare_placements(graph, model, *slow_gpus, samples=samples, seed=seed,
                                       threads=threads, progress=say)  # fmt: skip
    return VariabilityResult(
        job=name,
        world_size=world_size,
        preset=preset,
        variability_table=variability_table,
        distribution=distribution,
        network=model.network,
        network_measured=network,
        transfer_cv=model.pipeline_transfer_cv,
        transfers_measured=transfers,
        transfer_modelled_s=None if transfers is None else modelled_transfer_s(graph),
        tail_slow_network_share=tail_slow_network_share(
            times, regime_factors, distribution.p95_s, model, network_regime_nodes(graph, model)
        ),
        monte_carlo_wall_s=wall,
        attribution=attribution,
        placement=placement,
    )


def tail_slow_network_share(
    times: np.ndarray, network: np.ndarray, p95_s: float, model: VariabilityModel,
    regime_nodes: int,
) -> float | None:  # fmt: skip
    """Of the samples above `p95_s`, the share whose network regime factor (`network`, one per
    sample) is above the model's fastest regime's; None where the model has one regime, or its
    regime slows none of the job's communication (`regime_nodes`: monte_carlo's
    network_regime_nodes), or no sample lies above p95."""
    tail = times > p95_s
    if len(model.network) < 2 or regime_nodes == 0 or not tail.any():
        return None
    fastest = min(regime.factor for regime in model.network)
    return float(np.mean(network[tail] > fastest))


def plot_distribution(result: VariabilityResult, path) -> None:
    """Histogram and empirical CDF of the sampled step times (PNG), the deterministic
    prediction and the p95 marked; missing directories of `path` are made."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = result.distribution
    t = np.sort(d.times_s)
    fig, (hist, cdf) = plt.subplots(1, 2, figsize=(11, 4))
    hist.hist(t, bins=min(60, max(10, len(t) // 20)), color="#4c72b0")
    hist.set_xlabel("step time (s)")
    hist.set_ylabel("samples")
    cdf.plot(t, np.arange(1, len(t) + 1) / len(t), color="#4c72b0")
    cdf.set_xlabel("step time (s)")
    cdf.set_ylabel("P(step <= t)")
    for ax in (hist, cdf):
        ax.axvline(d.deterministic_s, color="k", linestyle="--", label="deterministic")
        ax.axvline(d.p95_s, color="#c44e52", linestyle=":", label="p95")
        ax.legend()
    fig.suptitle(
        f"{result.job}: {result.world_size:,} GPUs, {d.samples} samples ({result.preset}, "
        f"seed {d.seed})"
    )
    fig.tight_layout()
    # the temporary file's name says nothing of the format: the path's suffix does
    kind = Path(path).suffix[1:] or "png"
    write_atomically(path, lambda tmp: fig.savefig(tmp, dpi=110, format=kind))
    plt.close(fig)
