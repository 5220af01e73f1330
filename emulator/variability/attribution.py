"""Which noise sources drive a job's step-time variance: an ablation, ranked (PRISM's insight).

For every source (emulator.variability.sources) the Monte Carlo runs with that source's noise
alone, with the seed of the run with all of it: both runs make the same draws (common random
numbers, emulator.variability.monte_carlo's NoiseMask), so a source's figures differ from the
all-on run's only by the noise switched off. Per source: the standard deviation of the step
time, its variance as a share of the all-on variance, and p95 - deterministic as a share of
the all-on one. Sources are ranked by variance, largest first.

The shares need not add to 100 %: the replay composes durations by sums along chains and
maxima at joins (max-plus), so sources interact. At a join the step follows whichever member is
late: noise on a path that another source's lateness takes off the critical path no longer
counts in the all-on run (the shares then add to more than 100 %); and a maximum is not
additive in its members' spreads, so the all-on variance is not the sum of the sources' alone
in general, in either direction.

A source that provably applies no noise to the graph (sources.inert_reason: e.g. the network
regime on tp calls that never leave a node) is not run: its run would be the deterministic
step in every sample. It is listed in `skipped` with the reason.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from emulator.graph.execution_graph import ExecutionGraph
from emulator.graph.replay import replay
from emulator.variability.model import VariabilityModel
from emulator.variability.monte_carlo import NoiseMask, sample_step_times
from emulator.variability.sources import NoiseSource, inert_reason

ALL_SOURCES = "all sources"


@dataclass(frozen=True, kw_only=True)
class SourceEffect:
    """The step time with one source's noise alone (or all of it): seconds and shares."""

    source: str
    category: str  # sources.CATEGORIES, or "all" for the all-on run
    std_s: float
    variance_share: float  # variance / the all-on run's variance (0 when that is 0)
    mean_shift_s: float  # mean - deterministic
    p95_excess_s: float  # p95 - deterministic
    p95_share: float  # p95_excess_s / the all-on run's (0 when that is 0)


@dataclass(frozen=True, kw_only=True)
class SkippedSource:
    """A source not run: it provably applies no noise (sources.inert_reason)."""

    source: str
    category: str
    reason: str


@dataclass(frozen=True, kw_only=True, eq=False)
class Attribution:
    """The all-on run and every source alone, ranked by variance (largest first), and the
    sources left out unrun."""

    samples: int
    seed: int
    deterministic_s: float
    total: SourceEffect
    sources: tuple[SourceEffect, ...]
    monte_carlo_wall_s: float  # all the runs together
    skipped: tuple[SkippedSource, ...] = ()

    def to_dict(self) -> dict:
        return {
            "samples": self.samples,
            "seed": self.seed,
            "deterministic_s": self.deterministic_s,
            "total": asdict(self.total),
            "sources": [asdict(s) for s in self.sources],
            "skipped": [asdict(s) for s in self.skipped],
            "monte_carlo_wall_s": self.monte_carlo_wall_s,
        }


def _effect(name, category, times, deterministic, total_var, total_p95) -> SourceEffect:
    var = float(times.var(ddof=1)) if len(times) > 1 else 0.0
    p95 = float(np.percentile(times, 95)) - deterministic
    return SourceEffect(
        source=name,
        category=category,
        std_s=float(np.sqrt(var)),
        variance_share=var / total_var if total_var > 0 else 0.0,
        mean_shift_s=float(times.mean()) - deterministic,
        p95_excess_s=p95,
        p95_share=p95 / total_p95 if total_p95 > 0 else 0.0,
    )


def attribute_variance(
    graph: ExecutionGraph,
    model: VariabilityModel,
    sources: tuple[NoiseSource, ...],
    *,
    samples: int = 1000,
    seed: int = 0,
    steps_per_allocation: int = 1,
    threads: int | None = None,
    progress: Callable[[str], None] | None = None,
    everything: np.ndarray | None = None,
) -> Attribution:
    """Every source of `sources` alone against all of `model`'s noise (module docstring);
    `steps_per_allocation` as the run it explains drew its samples (the same draws, then);
    `threads` as `sample_step_times`'. `progress` hears each source's name as its run ends:
    every run takes as long as the Monte Carlo it explains (minutes on thousands of GPUs).
    `everything`: that run's step times, where the caller has them (every source on, these
    draws), so that they are not sampled again."""
    say = progress or (lambda _msg: None)
    deterministic = replay(graph).iteration_time_s
    started = time.perf_counter()
    draws = dict(samples=samples, seed=seed, steps_per_allocation=steps_per_allocation,
                 threads=threads)  # fmt: skip
    if everything is None:
        everything = sample_step_times(graph, model, mask=NoiseMask(), **draws)
    total_var = float(everything.var(ddof=1)) if samples > 1 else 0.0
    total_p95 = float(np.percentile(everything, 95)) - deterministic
    reasons = {s.name: inert_reason(s, graph, model) for s in sources}
    skipped = tuple(SkippedSource(source=s.name, category=s.category, reason=reasons[s.name])
                    for s in sources if reasons[s.name] is not None)  # fmt: skip
    running = [s for s in sources if reasons[s.name] is None]
    effects = []
    for i, s in enumerate(running, start=1):
        times = sample_step_times(graph, model, mask=s.mask, **draws)
        effects.append(_effect(s.name, s.category, times, deterministic, total_var, total_p95))
        say(f"noise source {i}/{len(running)} alone: {s.name}")
    effects.sort(key=lambda e: (-e.std_s, -e.p95_excess_s, e.source))
    return Attribution(
        samples=samples,
        seed=seed,
        deterministic_s=deterministic,
        total=_effect(ALL_SOURCES, "all", everything, deterministic, total_var, total_p95),
        sources=tuple(effects),
        monte_carlo_wall_s=time.perf_counter() - started,
        skipped=skipped,
    )
