"""Duration distributions of one kernel or collective signature, as PRISM fits them.

PRISM (arXiv 2510.15596; ../shared/seeds/README.md) keeps a pool of measured durations per
signature, fits Normal, Gamma and LogNormal to it and keeps the family with the smallest
Kolmogorov-Smirnov statistic. `fit_durations` does that with scipy.stats (Gamma and LogNormal
with their location fixed at 0: a duration is positive). Where only a mean and a spread were
measured (a kernel table's `time_us` and `spread_us`), `from_moments` gives the family with
those two moments. Every distribution samples reproducibly from a numpy Generator.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

FAMILIES = ("normal", "gamma", "lognormal")
MIN_SAMPLES = 8  # fewer repetitions than this cannot tell the families apart


@dataclass(frozen=True)
class DurationDistribution:
    """One family with its scipy parameters; `ks_statistic` is the fit's (None: moment-matched)."""

    family: str
    params: tuple[float, ...]
    samples: int = 0
    ks_statistic: float | None = None

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"family={self.family!r} must be one of {FAMILIES}")

    @property
    def frozen(self):
        return _SCIPY[self.family](*self.params)

    @property
    def _constant(self) -> bool:  # a normal of zero spread: scipy has no such distribution
        return self.family == "normal" and self.params[1] == 0

    @property
    def mean(self) -> float:
        return float(self.params[0]) if self._constant else float(self.frozen.mean())

    @property
    def std(self) -> float:
        return 0.0 if self._constant else float(self.frozen.std())

    def sample(self, rng: np.random.Generator, size) -> np.ndarray:
        if self._constant:
            return np.full(size, float(self.params[0]))
        return self.frozen.rvs(size=size, random_state=rng)


_SCIPY = {"normal": stats.norm, "gamma": stats.gamma, "lognormal": stats.lognorm}


def _fit(family: str, samples: np.ndarray) -> tuple[float, ...]:
    if family == "normal":
        return tuple(float(p) for p in stats.norm.fit(samples))
    return tuple(float(p) for p in _SCIPY[family].fit(samples, floc=0.0))


def fit_durations(samples) -> DurationDistribution:
    """The family (of FAMILIES) with the smallest KS statistic against `samples` (seconds)."""
    samples = np.asarray(samples, dtype=float)
    if samples.ndim != 1 or len(samples) < MIN_SAMPLES:
        raise ValueError(
            f"fit_durations needs at least {MIN_SAMPLES} durations, got {samples.shape}"
        )
    if not np.all(samples > 0):
        raise ValueError("durations must be > 0")
    if np.ptp(samples) == 0:  # identical repetitions: no spread to fit
        return DurationDistribution("normal", (float(samples[0]), 0.0), len(samples), 0.0)
    fits = []
    for family in FAMILIES:
        params = _fit(family, samples)
        ks = float(stats.kstest(samples, _SCIPY[family](*params).cdf).statistic)
        fits.append(DurationDistribution(family, params, len(samples), ks))
    return min(fits, key=lambda d: d.ks_statistic)


def from_moments(mean: float, std: float, family: str = "lognormal") -> DurationDistribution:
    """The `family` distribution with this mean and standard deviation (seconds)."""
    if not mean > 0 or std < 0:
        raise ValueError(f"mean={mean!r} must be > 0 and std={std!r} >= 0")
    if family == "normal" or std == 0:
        return DurationDistribution("normal", (mean, std))
    cv = std / mean
    if family == "gamma":
        shape = 1.0 / cv**2
        return DurationDistribution("gamma", (shape, 0.0, mean / shape))
    if family == "lognormal":
        sigma = float(np.sqrt(np.log1p(cv**2)))
        return DurationDistribution("lognormal", (sigma, 0.0, mean / np.exp(sigma**2 / 2)))
    raise ValueError(f"family={family!r} must be one of {FAMILIES}")
