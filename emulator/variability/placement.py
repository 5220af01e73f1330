"""Where k slow GPUs hurt the step: the same slow GPUs placed differently (PRISM's insight).

Placements, each a set of k global ranks run at `factor` x their compute time, the rest at 1:
- `tp-group`: one tensor-parallel group (of the first DP replica's first stage), tp ranks
  0 .. k-1;
- `stage`: one pipeline stage of one DP replica: its first k in-stage ranks (over cp x tp);
  the same ranks as `tp-group` when cp = 1, and then reported as one row;
- `stage-across-replicas`: the first stage of k DP replicas, one GPU each (in-stage rank 0);
- `spread`: one per DP replica, replica i at stage i mod pp and in-stage rank i mod the
  in-stage size (different stages and tp ranks).
Axes: pp is the pipeline axis; data-parallel axes are those named dp... (dp, dp_replicate,
dp_shard); the others (cp, tp) are in-stage. A placement that k does not fit is left out.

Each placement replaces the model's per-GPU factors by the fixed ones (one allocation, the
same every step: no spatial noise) and keeps the temporal, collective and network noise; the
reference is the same model with every factor 1. No factor is drawn, so every run makes the
same draws (the seed's): a sample with slow GPUs differs from the same sample without them
only by the slow GPUs, and as the replay is monotone in its durations (sums and maxima) no
sample gets faster.

What the replay's rules say without noise: a blocking tp collective every layer starts when
the group's slowest member is ready, so k slow GPUs in one TP group cost what one does; the dp
gradient sync waits for the slowest replica, so one slow GPU at the same stage of k replicas
costs what one does too; `spread` costs the worst of its stages' single slow GPUs. With
noise, concentrated slow GPUs share every layer's maximum while spread ones meet only at the
gradient sync, so the placements differ by the noise as well (sum of maxima against maximum
of sums).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from emulator.graph.execution_graph import ExecutionGraph
from emulator.graph.replay import replay
from emulator.variability.model import VariabilityModel
from emulator.variability.monte_carlo import sample_step_times
from emulator.world.mesh import PIPELINE_AXIS, World

NO_SLOW_GPUS = "none"


def _roles(world: World) -> tuple[list[str], list[str]]:
    """(data-parallel axes, in-stage axes) in mesh order (module docstring)."""
    dp = [a for a in world.names if a.startswith("dp")]
    inner = [a for a in world.names if a != PIPELINE_AXIS and a not in dp]
    return dp, inner


def _ranks(world: World, coords: list[dict[str, int]]) -> np.ndarray:
    return np.array(sorted(world.rank_of(**c) for c in coords), dtype=np.int64)


def _grid_point(axes: list[str], world: World, i: int) -> dict[str, int]:
    """The i-th point (row-major) of the grid over `axes`."""
    shape = tuple(world.size(a) for a in axes)
    return dict(zip(axes, (int(x) for x in np.unravel_index(i, shape)), strict=True))


def placement_ranks(world: World, slow_gpus: int) -> dict[str, np.ndarray]:
    """Global ranks of every placement that `slow_gpus` fits (module docstring); placements
    holding the same ranks are one entry named "a = b"."""
    dp_axes, inner = _roles(world)
    replicas = int(np.prod([world.size(a) for a in dp_axes]))
    in_stage = int(np.prod([world.size(a) for a in inner]))
    k, pp = slow_gpus, world.pp
    found: dict[str, np.ndarray] = {}
    if "tp" in world.names and k <= world.size("tp"):
        found["tp-group"] = _ranks(world, [{"tp": i} for i in range(k)])
    if k <= in_stage:
        found["stage"] = _ranks(world, [_grid_point(inner, world, i) for i in range(k)])
    if k <= replicas:
        found["stage-across-replicas"] = _ranks(
            world, [_grid_point(dp_axes, world, i) for i in range(k)]
        )
        spread = [
            _grid_point(dp_axes, world, i)
            | _grid_point(inner, world, i % in_stage)
            | ({PIPELINE_AXIS: i % pp} if PIPELINE_AXIS in world.names else {})
            for i in range(k)
        ]
        found["spread"] = _ranks(world, spread)
    merged: dict[str, np.ndarray] = {}
    for name, ranks in found.items():
        same = next((n for n, r in merged.items() if np.array_equal(r, ranks)), None)
        if same is None:
            merged[name] = ranks
        else:
            merged[f"{same} = {name}"] = merged.pop(same)
    return merged


def slow_gpu_factors(world: World, ranks, factor: float) -> np.ndarray:
    """Speed factors shaped like the mesh: `factor` at `ranks`, 1 elsewhere."""
    factors = np.ones(world.world_size)
    factors[np.asarray(ranks, dtype=np.int64)] = factor
    return factors.reshape(world.shape)


@dataclass(frozen=True, kw_only=True)
class PlacementEffect:
    """The step time with the slow GPUs at one placement (seconds, ratio)."""

    placement: str
    ranks: tuple[int, ...]
    deterministic_s: float  # the replay with these speed factors, no noise
    mean_s: float
    p50_s: float
    p95_s: float
    p95_ratio: float  # p95 / the no-slow-GPU run's p95


@dataclass(frozen=True, kw_only=True, eq=False)
class PlacementStudy:
    """k slow GPUs at `factor`, placed every way they fit, against no slow GPU."""

    slow_gpus: int
    factor: float
    samples: int
    seed: int
    reference: PlacementEffect
    placements: tuple[PlacementEffect, ...]
    monte_carlo_wall_s: float

    def to_dict(self) -> dict:
        return {
            "slow_gpus": self.slow_gpus,
            "factor": self.factor,
            "samples": self.samples,
            "seed": self.seed,
            "reference": asdict(self.reference),
            "placements": [asdict(p) for p in self.placements],
            "monte_carlo_wall_s": self.monte_carlo_wall_s,
        }


def _run(
    graph, model, name, ranks, factors, samples, seed, reference_p95, threads
) -> PlacementEffect:
    times = sample_step_times(graph, model.with_speed_factors(factors), samples=samples, seed=seed,
                              threads=threads)  # fmt: skip
    p50, p95 = (float(x) for x in np.percentile(times, [50, 95]))
    return PlacementEffect(
        placement=name,
        ranks=tuple(int(r) for r in ranks),
        deterministic_s=replay(graph, speed_factors=factors).iteration_time_s,
        mean_s=float(times.mean()),
        p50_s=p50,
        p95_s=p95,
        p95_ratio=p95 / (reference_p95 or p95),
    )


def compare_placements(
    graph: ExecutionGraph,
    model: VariabilityModel,
    slow_gpus: int,
    factor: float,
    *,
    samples: int = 1000,
    seed: int = 0,
    threads: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> PlacementStudy:
    """`slow_gpus` GPUs `factor` x slower at every placement they fit (module docstring);
    `threads` as `sample_step_times`'. `progress` hears each placement's name as its run
    ends: every run takes as long as a whole Monte Carlo (minutes on thousands of GPUs)."""
    say = progress or (lambda _msg: None)
    world = graph.world
    if not isinstance(slow_gpus, int) or slow_gpus < 1:
        raise ValueError(f"slow_gpus={slow_gpus!r} must be an int >= 1")
    if not factor > 0:
        raise ValueError(f"factor={factor!r} must be > 0")
    placements = placement_ranks(world, slow_gpus)
    if not placements:
        raise ValueError(
            f"slow_gpus={slow_gpus} fits no placement of mesh {world.names} {world.shape}"
        )
    started = time.perf_counter()
    ones = np.ones(world.shape)
    runs = len(placements) + 1  # the reference, without slow GPUs, first
    reference = _run(graph, model, NO_SLOW_GPUS, (), ones, samples, seed, None, threads)
    say(f"placement 1/{runs}: {NO_SLOW_GPUS}")
    effects = []
    for i, (name, ranks) in enumerate(placements.items(), start=2):
        factors = slow_gpu_factors(world, ranks, factor)
        effects.append(_run(graph, model, name, ranks, factors, samples, seed, reference.p95_s,
                            threads))  # fmt: skip
        say(f"placement {i}/{runs}: {name}")
    return PlacementStudy(
        slow_gpus=slow_gpus,
        factor=factor,
        samples=samples,
        seed=seed,
        reference=reference,
        placements=tuple(effects),
        monte_carlo_wall_s=time.perf_counter() - started,
    )
