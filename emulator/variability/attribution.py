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

`drill_down` then splits the top sources into their signatures (emulator.variability.
signatures: op class and input shapes; kind, group, members and bytes) and runs each alone
with the same seed and samples, ranked under its source.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import numpy as np

from emulator.capture.trace import RankTrace
from emulator.graph.execution_graph import ExecutionGraph
from emulator.graph.replay import replay
from emulator.variability.model import VariabilityModel
from emulator.variability.monte_carlo import NoiseMask, sample_step_times
from emulator.variability.signatures import (
    Signature,
    critical_nodes,
    source_signatures,
    split_source,
)
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
    signatures: tuple[SignatureEffect, ...] = ()  # after drill_down, where split or named


@dataclass(frozen=True, kw_only=True)
class SignatureEffect:
    """The step time with one signature of a source alone (SourceEffect's figures), or with
    the `lumped` signatures of its "other" entry together."""

    signature: str  # emulator.variability.signatures' name
    lumped: int  # signatures it stands for: 1, or how many "other" holds
    nodes: int  # graph nodes its noise is applied on, over all classes
    prerank_variance_s2: float  # signatures' pre-rank: along the critical path
    prerank_off_path_variance_s2: float  # the same off it (breaks ties)
    own_run: bool  # False: its source's only signature, whose run stands for it
    std_s: float
    variance_share: float
    mean_shift_s: float
    p95_excess_s: float
    p95_share: float


@dataclass(frozen=True, kw_only=True)
class SkippedSource:
    """A source not run: it provably applies no noise (sources.inert_reason)."""

    source: str
    category: str
    reason: str


@dataclass(frozen=True, kw_only=True, eq=False)
class Attribution:
    """The all-on run and every source alone, ranked by variance (largest first); the sources
    left out unrun; after `drill_down`, the top sources' signatures (SourceEffect.signatures)."""

    samples: int
    seed: int
    deterministic_s: float
    total: SourceEffect
    sources: tuple[SourceEffect, ...]
    monte_carlo_wall_s: float  # all the runs together
    skipped: tuple[SkippedSource, ...] = ()
    steps_per_allocation: int = 1
    signature_runs: int = 0  # Monte Carlo runs the drill-down made
    signature_wall_s: float = 0.0  # their time (not in monte_carlo_wall_s)

    def to_dict(self) -> dict:
        return {
            "samples": self.samples,
            "seed": self.seed,
            "deterministic_s": self.deterministic_s,
            "total": asdict(self.total),
            "sources": [asdict(s) for s in self.sources],
            "skipped": [asdict(s) for s in self.skipped],
            "monte_carlo_wall_s": self.monte_carlo_wall_s,
            "signature_runs": self.signature_runs,
            "signature_wall_s": self.signature_wall_s,
        }


_FIGURES = ("std_s", "variance_share", "mean_shift_s", "p95_excess_s", "p95_share")


def _figures(times, deterministic, total_var, total_p95) -> dict:
    """SourceEffect's figures of one run's step times against the all-on run's."""
    var = float(times.var(ddof=1)) if len(times) > 1 else 0.0
    p95 = float(np.percentile(times, 95)) - deterministic
    return dict(
        std_s=float(np.sqrt(var)),
        variance_share=var / total_var if total_var > 0 else 0.0,
        mean_shift_s=float(times.mean()) - deterministic,
        p95_excess_s=p95,
        p95_share=p95 / total_p95 if total_p95 > 0 else 0.0,
    )


def _effect(name, category, times, deterministic, total_var, total_p95) -> SourceEffect:
    figures = _figures(times, deterministic, total_var, total_p95)
    return SourceEffect(source=name, category=category, **figures)


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
        steps_per_allocation=steps_per_allocation,
    )


# Signatures a split source runs beside its "other" entry (`drill_down`'s per_source).
SIGNATURES_PER_SOURCE = 4


def drill_down(
    graph: ExecutionGraph,
    model: VariabilityModel,
    attribution: Attribution,
    sources: tuple[NoiseSource, ...],
    traces: dict[int, RankTrace],
    spreads_s: dict[int, np.ndarray],
    *,
    top: int,
    per_source: int = SIGNATURES_PER_SOURCE,
    threads: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> Attribution:
    """`attribution` with its `top` highest-ranked sources that hold more than one signature
    (emulator.variability.signatures) split: their `per_source` largest signatures by the
    pre-rank and one "other" entry for the rest, each run alone with the attribution's seed,
    samples and steps per allocation (common random numbers; at most top x (per_source + 1)
    runs), ranked by std under their source. A ranked source of exactly one signature gets it
    named, with the source's figures (no run). `sources`, `traces` and `spreads_s` are those
    the attribution and the graph were made from. Shares are of the all-on run's."""
    if top < 1:
        raise ValueError(f"top={top!r} must be >= 1")
    say = progress or (lambda _msg: None)
    by_name = {s.name: s for s in sources}
    totals = (attribution.deterministic_s, attribution.total.std_s**2,
              attribution.total.p95_excess_s)  # fmt: skip
    draws = dict(samples=attribution.samples, seed=attribution.seed, threads=threads,
                 steps_per_allocation=attribution.steps_per_allocation)  # fmt: skip
    started, plans, split = time.perf_counter(), {}, 0
    critical = critical_nodes(graph)
    for effect in attribution.sources:
        source = by_name[effect.source]
        found = source_signatures(source, graph, model, traces, spreads_s, critical)
        if len(found) == 1:
            plans[effect.source] = found
        elif len(found) > 1 and split < top:
            plans[effect.source] = split_source(source, found, per_source)
            split += 1
    runs = [(name, s) for name, plan in plans.items() if len(plan) > 1 for s in plan]
    figures: dict[int, dict] = {}
    for i, (name, signature) in enumerate(runs, start=1):
        times = sample_step_times(graph, model, mask=signature.mask, **draws)
        figures[id(signature)] = _figures(times, *totals)
        say(f"signature {i}/{len(runs)} alone: {name}: {signature.name}")
    effects = []
    for effect in attribution.sources:
        plan = plans.get(effect.source, ())
        if len(plan) == 1:  # the source's own run is its only signature's
            entries = [_signature(plan[0], False, {k: getattr(effect, k) for k in _FIGURES})]
        else:
            entries = [_signature(s, True, figures[id(s)]) for s in plan]
        entries.sort(key=lambda e: (-e.std_s, -e.p95_excess_s, e.signature))
        effects.append(replace(effect, signatures=tuple(entries)))
    return replace(attribution, sources=tuple(effects), signature_runs=len(runs),
                   signature_wall_s=time.perf_counter() - started)  # fmt: skip


def _signature(signature: Signature, own_run: bool, figures: dict) -> SignatureEffect:
    return SignatureEffect(signature=signature.name, lumped=signature.lumped,
                           nodes=signature.nodes,
                           prerank_variance_s2=signature.prerank_variance_s2,
                           prerank_off_path_variance_s2=signature.prerank_off_path_variance_s2,
                           own_run=own_run,
                           **figures)  # fmt: skip
