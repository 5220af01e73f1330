"""Temporal variation measured on one GPU: kernel noise per class and the per-step factor.

Inputs are repeated durations, in seconds, gathered by the caller (prismbench reads them from
profiles): *pools*, one per kernel signature (op, input shapes, kernels launched), holding
every occurrence of that signature in a profiled iteration (the same GEMM in each layer and
micro-batch), and per job the measured iteration times (min, median, max of n).

- `fit_signatures`: a DurationDistribution per pool (emulator.variability.distributions, the
  family with the smallest KS statistic), for pools of at least MIN_SAMPLES.
- `estimate_kernel_noise`: the model std = sqrt((cv x d)^2 + floor^2) per noise class
  (emulator.variability.model.NOISE_CLASSES). The floor is the median std of the short pools
  (mean < SHORT_KERNEL_S: their spread is jitter, not a fraction of their length); each
  class's CV is the median over its long pools (mean >= LONG_KERNEL_S) of
  sqrt(std^2 - floor^2) / mean. Medians, so one odd pool does not move the model.
- `range_to_std`: the standard deviation implied by the range of n normal draws, over the
  expected range of n standard normals (d2(n), Tippett 1925; d2(8) = 2.847), which is how a
  min/median/max summary of n iterations gives a spread.
- `step_cv_of`: the per-step CV that, added to independent kernel noise, gives a measured
  iteration spread: sqrt(max(cv_iteration^2 - cv_kernels^2, 0)).
- `step_cv_dispersion_of`: how much that per-step CV varies between runs (jobs and sessions):
  the standard deviation s of log(step CV), lognormal around a given median, that makes the
  jobs' measured ranges most likely (maximum likelihood: a job of kernel CV k whose run drew
  step CV c has iterations of CV sqrt(c^2 + k^2), and the range of its n iterations over that
  is the range of n standard normals, `range_density`). Its sampling error is taken out by
  the likelihood: eight iterations' range alone varies by ~30 % (sd of its log) at any s.

Pools mix the occurrences of one signature across layers and micro-batches of one iteration:
the spread they show is over time on one GPU (PRISM's temporal variation), plus whatever the
position in the step changes (caches, clocks), which the model counts as noise too.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache

import numpy as np
from scipy import integrate, optimize, special, stats

from emulator.variability.distributions import MIN_SAMPLES, DurationDistribution, fit_durations
from emulator.variability.model import NOISE_CLASSES, kernel_spreads_s

SHORT_KERNEL_S = 5e-6  # shorter pools measure the jitter floor
LONG_KERNEL_S = 20e-6  # longer pools measure a class's CV (floor < 1 % of them at ~0.15 us)


@dataclass(frozen=True)
class SignatureFit:
    """One signature's pool of durations (s), its noise class and fitted distribution."""

    signature: tuple
    noise_class: str
    durations_s: np.ndarray
    distribution: DurationDistribution

    def __post_init__(self) -> None:
        if self.noise_class not in NOISE_CLASSES:
            raise ValueError(f"noise_class={self.noise_class!r} must be one of {NOISE_CLASSES}")

    @property
    def mean_s(self) -> float:
        return float(self.durations_s.mean())

    @property
    def std_s(self) -> float:
        return float(self.durations_s.std(ddof=1))


def fit_signatures(
    pools: Mapping[tuple, tuple[str, Iterable[float]]], min_samples: int = MIN_SAMPLES
) -> list[SignatureFit]:
    """A fit per pool {signature: (noise class, durations s)} of at least `min_samples`."""
    if min_samples < MIN_SAMPLES:
        raise ValueError(f"min_samples={min_samples} must be >= {MIN_SAMPLES}")
    fits = []
    for signature, (klass, durations) in pools.items():
        d = np.asarray(list(durations), dtype=float)
        if len(d) >= min_samples and (d > 0).all():
            fits.append(SignatureFit(signature, klass, d, fit_durations(d)))
    return fits


@dataclass(frozen=True)
class KernelNoise:
    """Per-kernel temporal noise estimated from pools (module docstring)."""

    cv_by_class: dict[str, float]
    floor_s: float
    pools_by_class: dict[str, int]  # long pools behind each class's CV
    short_pools: int  # pools behind the floor
    families: dict[str, int]  # how often each family fitted best (all pools)

    def std_s(self, durations_s, classes) -> np.ndarray:
        """The model's standard deviation of kernels of `durations_s` in `classes`."""
        cvs = [self.cv_by_class.get(c, 0.0) for c in classes]
        return kernel_spreads_s(durations_s, cvs, self.floor_s)


def estimate_kernel_noise(fits: list[SignatureFit]) -> KernelNoise:
    """The floor and each class's CV from `fits` (module docstring); a class with no long pool
    is left out (the model's default CV applies to it)."""
    short = [f.std_s for f in fits if f.mean_s < SHORT_KERNEL_S]
    if not short:
        raise ValueError(f"no pool shorter than {SHORT_KERNEL_S * 1e6:g} us to measure the floor")
    floor = float(np.median(short))
    cvs: dict[str, list[float]] = {}
    for f in fits:
        if f.mean_s >= LONG_KERNEL_S:
            own = np.sqrt(max(f.std_s**2 - floor**2, 0.0)) / f.mean_s
            cvs.setdefault(f.noise_class, []).append(own)
    return KernelNoise(
        cv_by_class={c: float(np.median(v)) for c, v in sorted(cvs.items())},
        floor_s=floor,
        pools_by_class={c: len(v) for c, v in sorted(cvs.items())},
        short_pools=len(short),
        families=dict(Counter(f.distribution.family for f in fits)),
    )


@cache
def expected_range(n: int) -> float:
    """d2(n): the expected range of n independent standard normals."""
    if n < 2:
        raise ValueError(f"n={n} must be >= 2 for a range")

    def integrand(x: float) -> float:
        cdf = stats.norm.cdf(x)
        return 1.0 - cdf**n - (1.0 - cdf) ** n

    return float(integrate.quad(integrand, -np.inf, np.inf)[0])


def range_to_std(min_s: float, max_s: float, n: int) -> float:
    """The standard deviation (s) a range of n normal draws implies (module docstring)."""
    if not max_s >= min_s:
        raise ValueError(f"max_s={max_s!r} must be >= min_s={min_s!r}")
    return (max_s - min_s) / expected_range(n)


def iteration_kernel_cv(durations_s, classes, noise: KernelNoise) -> float:
    """CV of an iteration's GPU time if its kernels varied independently: sqrt(sum var) / sum."""
    d = np.asarray(durations_s, dtype=float)
    return float(np.sqrt((noise.std_s(d, classes) ** 2).sum()) / d.sum())


def step_cv_of(iteration_cv: float, kernel_cv: float) -> float:
    """The per-step CV left once independent kernel noise is accounted for."""
    if iteration_cv < 0 or kernel_cv < 0:
        raise ValueError(f"CVs must be >= 0, got {iteration_cv!r}, {kernel_cv!r}")
    return float(np.sqrt(max(iteration_cv**2 - kernel_cv**2, 0.0)))


# Integration grid of `range_density` (standard normal units) and Gauss-Hermite nodes of the
# likelihood's integral over a run's step CV: both give the densities to < 0.1 % here.
_RANGE_GRID = np.linspace(-8.0, 8.0, 1601)
_HERMITE_NODES = 40
# rows of w `range_density` integrates at once (rows x grid floats: ~13 MB)
_RANGE_ROWS = 1024


def range_density(w, n: int) -> np.ndarray:
    """The density at `w` of the range of n independent standard normals:
    n (n - 1) int phi(x) phi(x + w) (Phi(x + w) - Phi(x))^(n - 2) dx."""
    if n < 2:
        raise ValueError(f"n={n} must be >= 2 for a range")
    w = np.atleast_1d(np.asarray(w, dtype=float)).ravel()
    density = np.empty(w.shape)
    for start in range(0, w.size, _RANGE_ROWS):
        shifted = _RANGE_GRID + w[start : start + _RANGE_ROWS, None]
        inner = _GRID_PDF * _normal_pdf(shifted)
        inner *= (special.ndtr(shifted) - _GRID_CDF) ** (n - 2)
        density[start : start + _RANGE_ROWS] = integrate.trapezoid(inner, _RANGE_GRID, axis=1)
    return n * (n - 1) * density


def _normal_pdf(x: np.ndarray) -> np.ndarray:
    # stats.norm.pdf's own formula, without its argument checks (most of its time on these arrays)
    return np.exp(-0.5 * x * x) / np.sqrt(2.0 * np.pi)


_GRID_PDF = _normal_pdf(_RANGE_GRID)
_GRID_CDF = special.ndtr(_RANGE_GRID)


def _range_log_likelihood(dispersion, step_cv, ranges, iterations, kernel_cvs) -> float:
    nodes, weights = np.polynomial.hermite_e.hermegauss(_HERMITE_NODES)
    weights = weights / weights.sum()
    # jobs x nodes: each job's iteration CV at each node of its step CV
    cvs = np.hypot(step_cv * np.exp(dispersion * nodes), kernel_cvs[:, None])
    densities = np.empty(cvs.shape)
    for n in np.unique(iterations):  # one integral per iteration count, over all its jobs
        jobs = iterations == n
        job_cvs = cvs[jobs]
        densities[jobs] = range_density(ranges[jobs, None] / job_cvs, n).reshape(job_cvs.shape)
    return float(np.sum(np.log(np.sum(weights * densities / cvs, axis=1) + 1e-300)))


def step_cv_dispersion_of(
    relative_ranges, iterations, kernel_cvs, step_cv: float, largest: float = 3.0
) -> float:
    """The spread between runs of the per-step CV (module docstring): the s in [0, `largest`]
    that maximises the likelihood of each job's measured iteration range over its median
    (`relative_ranges`) of `iterations` iterations, given its kernel CV (`kernel_cvs`), when
    each run draws its step CV as step_cv x exp(s Z). 0 where `step_cv` is 0."""
    ranges = np.asarray(relative_ranges, dtype=float)
    counts = np.asarray(iterations, dtype=int)
    kernels = np.asarray(kernel_cvs, dtype=float)
    if not ranges.shape == counts.shape == kernels.shape or ranges.ndim != 1:
        raise ValueError(f"one range, count and kernel CV per job: {ranges.shape}, "
                         f"{counts.shape}, {kernels.shape}")  # fmt: skip
    if (ranges < 0).any() or (kernels < 0).any() or step_cv < 0:
        raise ValueError("ranges, kernel CVs and step_cv must be >= 0")
    if step_cv == 0:
        return 0.0
    fit = optimize.minimize_scalar(
        lambda s: -_range_log_likelihood(s, step_cv, ranges, counts, kernels),
        bounds=(0.0, largest),
        method="bounded",
        options={"xatol": 1e-4},
    )
    return float(fit.x)
