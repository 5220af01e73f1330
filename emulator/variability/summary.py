"""What a user reads off sampled step times: percentiles, exceedance, K-step bound, slowdown.

The time of K steps treats steps as independent draws of the sampled distribution: its mean
is K x mean and, by the central limit theorem, its one-sided upper bound at `confidence` is
K x mean + z x sqrt(K) x std. Each sample draws fresh per-GPU speed factors (a fresh
allocation); on one fixed allocation steps are positively correlated (the same slow GPUs
every step), and the bound is then too tight: sample with fixed `speed_factors` for that.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True, kw_only=True, eq=False)
class StepTimeDistribution:
    """Step-time figures (seconds unless named otherwise) from `times_s`, one per sample."""

    samples: int
    seed: int
    deterministic_s: float  # the replay without variability
    mean_s: float
    std_s: float
    p5_s: float
    p50_s: float
    p95_s: float
    p99_s: float
    threshold_s: float
    p_exceeds_threshold: float  # P(step > threshold_s)
    k_steps: int
    confidence: float
    k_steps_mean_s: float
    k_steps_bound_s: float  # upper bound on the time of k_steps at `confidence`
    slowdown_mean: float  # mean / deterministic (ratio)
    slowdown_p95: float  # p95 / deterministic (ratio)
    times_s: np.ndarray

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "times_s"}


def summarize(
    times_s,
    deterministic_s: float,
    *,
    seed: int,
    threshold_s: float | None = None,
    k_steps: int = 1000,
    confidence: float = 0.95,
) -> StepTimeDistribution:
    """Figures of sampled step times; `threshold_s` defaults to the deterministic prediction."""
    t = np.asarray(times_s, dtype=float)
    if t.ndim != 1 or not len(t):
        raise ValueError(f"times_s must be a non-empty 1-d array, got shape {t.shape}")
    if not deterministic_s > 0:
        raise ValueError(f"deterministic_s={deterministic_s!r} must be > 0")
    if not isinstance(k_steps, int) or k_steps < 1:
        raise ValueError(f"k_steps={k_steps!r} must be an int >= 1")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence={confidence!r} must be in (0, 1)")
    threshold = deterministic_s if threshold_s is None else float(threshold_s)
    p5, p50, p95, p99 = np.percentile(t, [5, 50, 95, 99])
    mean, std = float(t.mean()), float(t.std(ddof=1)) if len(t) > 1 else 0.0
    z = float(stats.norm.ppf(confidence))
    return StepTimeDistribution(
        samples=len(t),
        seed=seed,
        deterministic_s=deterministic_s,
        mean_s=mean,
        std_s=std,
        p5_s=float(p5),
        p50_s=float(p50),
        p95_s=float(p95),
        p99_s=float(p99),
        threshold_s=threshold,
        p_exceeds_threshold=float((t > threshold).mean()),
        k_steps=k_steps,
        confidence=confidence,
        k_steps_mean_s=k_steps * mean,
        k_steps_bound_s=float(k_steps * mean + z * np.sqrt(k_steps) * std),
        slowdown_mean=mean / deterministic_s,
        slowdown_p95=float(p95) / deterministic_s,
        times_s=t,
    )
