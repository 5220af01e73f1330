"""Random draws of a Monte Carlo run, all from one numpy Generator (seeded: reproducible).

- `speed_factors`: the factor of every GPU, per sample: the persistent one (spatial variation,
  one draw per allocation: the samples that stand for steps of one run share it) times the one
  redrawn every step (the model's `step_cv`; with `step_cv_dispersion`, each allocation first
  draws its own step CV: `run_step_cvs`);
- `network_factors`: the regime of the network, one per sample (step);
- `NoisePool`: standard normals for the per-segment and per-collective noise (temporal).

Why a pool: a Monte Carlo run needs one normal per (sample, lane, segment): 1 000 samples of
an 8 192-GPU job with ~1 000 segments per rank is ~1e10 draws, ~100 s at numpy's ~11 ns per
normal on this machine, against ~1 ns per element for the replay's arithmetic. Where a chunk's
draws fit in what a pool would hold (POOL_WINDOWS of the largest window, at least POOL_VALUES),
every window is fresh normals: no dearer than the pool, and every draw independent. Beyond
that, the pool draws that many normals once and gives each window a random offset in it (a
view: no copy). Windows overlap, so a value is reused, at another offset, about
draws / pool-size times; inside one sample that is rare, but across samples it is not: the
samples share values, so their mean varies from seed to seed more than sigma/sqrt(N) says. An
audit measured it (30 seeds x 1 000 samples, temporal noise only, when every graph took the
16-window pool): the seed-to-seed std of the mean was 7.9x sigma/sqrt(N) on one lane of 1 000
segments, 5.1x on 500, 4.9x on tp 8 with 500 segments, 2.4x on a real 22B tp8 job; all of those
draw fresh normals now. The jobs that still take the pool have many lanes, over which a step's
maximum spreads the reuse: on tp 8 x dp 8 (64 lanes) with 500 segments, each pool value used ~4
times, the seed-to-seed std of the mean was 3.8 ms with the pool and 3.1 ms with fresh normals
(sigma/sqrt(N) = 2.6 ms; 20 seeds x 1 000 samples, so each figure is good to ~16 %): within
the noise of the check. Larger jobs reuse each value more (~300 times at 8 192 GPUs), over
more lanes; that was not measured.
"""

from __future__ import annotations

import numpy as np

from emulator.variability.distributions import from_moments
from emulator.variability.model import VariabilityModel
from emulator.variability.summary import allocation_count
from emulator.world.mesh import World

POOL_WINDOWS = 16  # pool size in largest windows (see the module docstring)
# The least a pool holds: 2**23 float64 normals = 64 MiB, ~0.1 s to draw here (per chunk: one
# chunk of a large job is 2**18 values of a lane value, monte_carlo.CHUNK_ELEMENTS, so its pool
# is this one).
POOL_VALUES = 1 << 23


def speed_factors(
    rng: np.random.Generator,
    model: VariabilityModel,
    world: World,
    samples: int,
    steps_per_allocation: int,
):
    """Per-GPU speed factors shaped (samples, *world.shape), or (1, *world.shape) when they do
    not vary between samples; None when every factor is 1. The persistent factors are drawn
    once per allocation, each `steps_per_allocation` consecutive samples in turn (the last
    allocation cut short where `samples` is no multiple)."""
    factors = None
    if model.speed_factors is not None:
        if model.speed_factors.shape != world.shape:
            raise ValueError(
                f"speed_factors shape {model.speed_factors.shape} != mesh {world.names} "
                f"{world.shape}"
            )
        factors = model.speed_factors[None]
    elif model.spatial_cv > 0:
        allocations = allocation_count(samples, steps_per_allocation)
        factors = from_moments(1.0, model.spatial_cv, "lognormal").sample(
            rng, (allocations, *world.shape)
        )
        if steps_per_allocation > 1:
            factors = np.repeat(factors, steps_per_allocation, axis=0)[:samples]
    if model.step_cv > 0:
        shape = (samples, *world.shape)
        if model.step_cv_dispersion > 0:
            cvs = run_step_cvs(rng, model, samples, steps_per_allocation)
            sigma = np.sqrt(np.log1p(cvs**2)).reshape(samples, *(1,) * len(world.shape))
            step = np.exp(sigma * rng.standard_normal(shape) - sigma**2 / 2)  # mean 1, CV cvs
        else:  # one step CV for every run: the draws as before step_cv_dispersion existed
            step = from_moments(1.0, model.step_cv, "lognormal").sample(rng, shape)
        factors = step if factors is None else factors * step
    return factors


def run_step_cvs(
    rng: np.random.Generator, model: VariabilityModel, samples: int, steps_per_allocation: int
) -> np.ndarray:
    """The step CV of each sample, shape (samples,): one lognormal draw per allocation (median
    `step_cv`, log standard deviation `step_cv_dispersion`), shared by its consecutive samples
    as the persistent speed factors are."""
    allocations = allocation_count(samples, steps_per_allocation)
    cvs = model.step_cv * np.exp(model.step_cv_dispersion * rng.standard_normal(allocations))
    return np.repeat(cvs, steps_per_allocation)[:samples]


def network_factors(rng: np.random.Generator, model: VariabilityModel, samples: int) -> np.ndarray:
    """The factor of the network regime of each sample: shape (samples,)."""
    factors = np.array([r.factor for r in model.network])
    if len(factors) == 1:
        return np.full(samples, factors[0])
    probabilities = np.array([r.probability for r in model.network])
    return factors[rng.choice(len(factors), size=samples, p=probabilities / probabilities.sum())]


class NoisePool:
    """Standard normals for windows: fresh ones while a pool would be as large as the draws,
    else windows at random offsets of a pool (module docstring). `draws`: the values all the
    windows of the chunk take together."""

    def __init__(self, rng: np.random.Generator, largest_window: int, draws: int):
        self.rng = rng
        size = max(POOL_WINDOWS * largest_window, POOL_VALUES)
        self.values = None if draws <= size else rng.standard_normal(size)

    def window(self, shape: tuple[int, ...]) -> np.ndarray:
        if self.values is None:
            return self.rng.standard_normal(shape)
        n = int(np.prod(shape))
        start = int(self.rng.integers(0, len(self.values) - n + 1))
        return self.values[start : start + n].reshape(shape)
