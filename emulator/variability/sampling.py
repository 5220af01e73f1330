"""Random draws of a Monte Carlo run, all from one numpy Generator (seeded: reproducible).

- `speed_factors`: the factor of every GPU, per sample: the persistent one (spatial variation,
  one draw per allocation: the samples that stand for steps of one run share it) times the one
  redrawn every step (the model's `step_cv`);
- `network_factors`: the regime of the network, one per sample (step);
- `NoisePool`: standard normals for the per-segment and per-collective noise (temporal).

Why a pool: a Monte Carlo run needs one normal per (sample, lane, segment): 1 000 samples of
an 8 192-GPU job with ~1 000 segments per rank is ~1e10 draws, ~100 s at numpy's ~11 ns per
normal on this machine, against ~1 ns per element for the replay's arithmetic. The pool draws
16 windows' worth of normals once and gives each segment a window at a random offset (a view:
no copy). Windows overlap, so two segments can reuse a value, at positions shifted by the
offsets' difference; the same value lands in the same sample for a shift under one sample's
lanes, about 1 / (8 x samples per chunk) of segment pairs: the correlation this leaves between
a sample's segments is negligible against the noise itself.
"""

from __future__ import annotations

import numpy as np

from emulator.variability.distributions import from_moments
from emulator.variability.model import VariabilityModel
from emulator.variability.summary import allocation_count
from emulator.world.mesh import World

POOL_WINDOWS = 16  # pool size in largest windows (see the module docstring)


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
        step = from_moments(1.0, model.step_cv, "lognormal").sample(rng, (samples, *world.shape))
        factors = step if factors is None else factors * step
    return factors


def network_factors(rng: np.random.Generator, model: VariabilityModel, samples: int) -> np.ndarray:
    """The factor of the network regime of each sample: shape (samples,)."""
    factors = np.array([r.factor for r in model.network])
    if len(factors) == 1:
        return np.full(samples, factors[0])
    probabilities = np.array([r.probability for r in model.network])
    return factors[rng.choice(len(factors), size=samples, p=probabilities / probabilities.sum())]


class NoisePool:
    """Standard normals handed out as windows at random offsets (module docstring)."""

    def __init__(self, rng: np.random.Generator, largest_window: int):
        self.rng = rng
        self.values = rng.standard_normal(POOL_WINDOWS * largest_window)

    def window(self, shape: tuple[int, ...]) -> np.ndarray:
        n = int(np.prod(shape))
        start = int(self.rng.integers(0, len(self.values) - n + 1))
        return self.values[start : start + n].reshape(shape)
