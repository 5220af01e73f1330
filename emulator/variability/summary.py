"""What a user reads off sampled step times: percentiles, exceedance, K-step bound, slowdown.

A run's K steps share one allocation of GPUs: the same slow GPUs slow every step, so the
steps of one run are positively correlated, and the time of K steps spreads far more than K
independent steps would. The Monte Carlo draws `steps_per_allocation` (S) consecutive samples
on one allocation's persistent per-GPU speed factors (emulator.variability.monte_carlo), so
the samples split into allocations (the last one shorter where S does not divide them) and,
within each, steps. A one-way random-effects analysis of variance separates the two:
within-allocation variance sigma_w^2 = the allocations' pooled sample variance,
between-allocation variance sigma_b^2 = max(var(allocation means) - sigma_w^2 / S, 0) (the
spread of the means less what S steps' noise adds to it). The time of K steps on an
allocation a is then about normal, mean K m_a, variance K sigma_w^2 (the steps' other noise is
drawn independently every step), with m_a the allocation's mean step time. The bound at
`confidence` is the larger of two:
- the quantile of the mixture over allocations of those normals, the m_a taken as the
  observed allocation means pulled towards the grand mean so that their spread is sigma_b (by
  sqrt(sigma_b^2 / var(allocation means))): their shape, skew included, is kept;
- a normal prediction bound that carries the estimators' own uncertainty, by generalized
  pivotal quantities (`pivotal_bound_s`): where sigma_b is small beside sigma_w / sqrt(S)
  its estimate is mostly noise, often cut to 0, and for large K it is sigma_b that sets the
  bound, so the bound allows for the sigma_b the samples cannot rule out.
Measured on synthetic step times with normal noise within an allocation
(results/fidelity/k_steps_coverage.md, which also says how wide each bound is) the bound given
holds for 0.92-0.99 of runs where 0.95 is meant. The default two network regimes make that
noise bimodal, which the bound does not model: with 10 % of steps 4 or 8 within-allocation
stds slower it holds for 0.917 / 0.900 of runs at K = 1, 0.939 / 0.931 at K = 5 and 0.95 at
K = 100, where the sum of K steps is near normal (results/fidelity/k_steps_two_regimes.py). Its
margin over K x mean is a median 0.9-1.6x the true one where sigma_b / sigma_w >= 0.1, and
1.3-6x at 0.01 with K >= 100 (the samples cannot rule out a larger sigma_b). The mixture alone
held for 0.82-0.96, lowest where sigma_b / sigma_w is 0.1 (where a step's own noise dwarfs the
allocation's; the Megatron 39.1B row of results/fidelity/variability.md gave 0.31 while the
network regime slowed its NVLink all-reduces too, 1.45 now that it slows only inter-node
communication; 4.5 on its torchtitan FSDP row). A Student-t bound over
Satterthwaite's degrees of freedom, tried first, covered but could be absurdly wide (for
1 000 steps, margins 1e27 times the right one: its degrees of freedom fall below 1 when K is
many times S and sigma_b is about 0). With no spatial variation the bound is K x mean + z x
sqrt(K) x sigma_w plus what the sigma_b not ruled out adds; with S = 1 (a fresh allocation
every sample) the split cannot be made, and the independent-steps bound is given with the
step's whole std: too tight wherever per-GPU factors persist over a run.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats

# Samples a Monte Carlo draws on one allocation by default: 1 000 samples are then 100
# allocations of 10 steps, enough of each to estimate both variances. The price: where the
# per-GPU factors make most of a step's spread, its percentiles rest on 100 independent
# allocations rather than 1 000: their estimates' std is 1.7x (p95) at sigma_b / sigma_w = 1
# and 2.6x at 3, unchanged up to 0.3 (results/fidelity/k_steps_coverage.md).
DEFAULT_STEPS_PER_ALLOCATION = 10
# Fewest allocations the split is made from: the mixture's bound on many steps is about a high
# quantile of the allocation means, so it cannot pass the largest; with 2-4 allocations it
# held for 0.62-0.80 of runs where 0.95 is meant (a review's simulation at 7d499ab). From 20
# allocations on, the bound given holds for 0.92-0.99 (results/fidelity/k_steps_coverage.md).
MIN_ALLOCATIONS = 20
# Most samples a Monte Carlo draws. At 10^6 the sampling error of p99 is 0.4 % of the step
# time's std (a normal's: sqrt(p (1 - p) / n) / phi(z_p)), below every figure's printed digits,
# and the README example's run takes hours (~30 s per 1 000 on 2 cores, results/perf/
# variability.md); beyond it numpy fails allocating the samples (10^23: "Maximum allowed
# dimension exceeded") rather than saying so.
MAX_SAMPLES = 1_000_000
# Draws of the pivotal bound's quantities: its 95th percentile then moves between seeds by
# 0.3-0.6 % of the bound's margin over K x mean (std over 30 seeds, synthetic step times).
PIVOT_DRAWS = 100_000
PIVOT_STREAM = 1  # the pivots' random stream: default_rng((seed, PIVOT_STREAM))


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
    steps_per_allocation: int  # consecutive samples on one allocation's per-GPU factors
    allocations: int
    # std of an allocation's mean step time over allocations, and of a step within one
    # allocation (module docstring); None with one step per allocation
    allocation_std_s: float | None
    within_allocation_std_s: float | None
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
    steps_per_allocation: int = 1,
) -> StepTimeDistribution:
    """Figures of sampled step times; `threshold_s` defaults to the deterministic prediction.
    `steps_per_allocation`: how many consecutive samples share one allocation (as
    `sample_step_times` drew them)."""
    t = np.asarray(times_s, dtype=float)
    if t.ndim != 1 or not len(t):
        raise ValueError(f"times_s must be a non-empty 1-d array, got shape {t.shape}")
    if not np.isfinite(t).all():
        raise ValueError(f"times_s must be finite: {int((~np.isfinite(t)).sum())} are not")
    if not deterministic_s > 0:
        raise ValueError(f"deterministic_s={deterministic_s!r} must be > 0")
    if not isinstance(k_steps, int) or k_steps < 1:
        raise ValueError(f"k_steps={k_steps!r} must be an int >= 1")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence={confidence!r} must be in (0, 1)")
    check_allocations(len(t), steps_per_allocation)
    threshold = deterministic_s if threshold_s is None else float(threshold_s)
    p5, p50, p95, p99 = np.percentile(t, [5, 50, 95, 99])
    mean, std = float(t.mean()), float(t.std(ddof=1)) if len(t) > 1 else 0.0
    z = float(stats.norm.ppf(confidence))
    k = float(k_steps)  # numpy takes no sqrt of an int beyond int64 (K = 10^21 steps)
    if steps_per_allocation == 1:
        between = within = None
        bound = k * mean + z * np.sqrt(k) * std
    else:
        split = _AllocationSplit.of(t, steps_per_allocation)
        between, within = split.between_std_s, split.within_std_s
        bound = max(split.mixture_bound_s(k, confidence),
                    split.pivotal_bound_s(k, confidence, seed))  # fmt: skip
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
        k_steps_bound_s=float(bound),
        steps_per_allocation=steps_per_allocation,
        allocations=allocation_count(len(t), steps_per_allocation),
        allocation_std_s=between,
        within_allocation_std_s=within,
        slowdown_mean=mean / deterministic_s,
        slowdown_p95=float(p95) / deterministic_s,
        times_s=t,
    )


def allocation_count(samples: int, steps_per_allocation: int) -> int:
    """Allocations `samples` make, `steps_per_allocation` each (the last may be shorter)."""
    return -(-samples // steps_per_allocation)


def check_allocations(
    samples: int,
    steps_per_allocation: int,
    *,
    samples_name: str = "samples",
    steps_name: str = "steps_per_allocation",
) -> None:
    """`samples` split into allocations of `steps_per_allocation`, at least MIN_ALLOCATIONS of
    them when an allocation has more than one step; the error names the two as the caller
    does (a CLI its flags). At most MAX_SAMPLES samples."""
    if samples > MAX_SAMPLES:
        raise ValueError(f"{samples_name}={samples:,}: at most {MAX_SAMPLES:,} samples (p99's "
                         "sampling error there is 0.4 % of the step time's std)")  # fmt: skip
    if not isinstance(steps_per_allocation, int) or steps_per_allocation < 1:
        raise ValueError(f"{steps_name}={steps_per_allocation!r} must be an int >= 1")
    allocations = allocation_count(samples, steps_per_allocation)
    if steps_per_allocation > 1 and allocations < MIN_ALLOCATIONS:
        raise ValueError(
            f"{samples_name}={samples} makes {allocations} allocation(s) of {steps_name}="
            f"{steps_per_allocation}; the K-step bound needs at least {MIN_ALLOCATIONS} "
            # the last allocation may be shorter: one step of the last is enough
            f"({samples_name} >= {(MIN_ALLOCATIONS - 1) * steps_per_allocation + 1}, or fewer "
            f"steps per allocation; 1 takes steps as independent)"
        )


def mixture_bound_s(times_s, steps_per_allocation: int, k_steps: int, confidence: float):
    """The mixture's bound alone on the time of `k_steps` on one allocation (module docstring;
    `summarize` gives the larger of it and the pivotal bound): step times drawn
    `steps_per_allocation` (more than one) to an allocation."""
    t = np.asarray(times_s, dtype=float)
    check_allocations(len(t), steps_per_allocation)
    if steps_per_allocation < 2:
        raise ValueError("mixture_bound_s needs steps_per_allocation >= 2: no split without")
    return _AllocationSplit.of(t, steps_per_allocation).mixture_bound_s(k_steps, confidence)


@dataclass(frozen=True)
class _AllocationSplit:
    """Step times split into allocations (module docstring): the estimators both bounds use.

    With a shorter last allocation the estimators are the unbalanced ones: sigma_w^2 pooled over
    n - allocations degrees of freedom; var(allocation means) expects sigma_b^2 + sigma_w^2 / h,
    h the harmonic mean of the allocations' step counts."""

    means: np.ndarray  # each allocation's mean step time
    harmonic_steps: float  # h
    samples: int
    means_var: float  # var(means), ddof 1
    within_var: float  # sigma_w^2

    @staticmethod
    def of(t: np.ndarray, steps: int) -> _AllocationSplit:
        allocation = np.arange(len(t)) // steps
        counts = np.bincount(allocation)
        means = np.bincount(allocation, weights=t) / counts
        within = float(((t - means[allocation]) ** 2).sum() / (len(t) - len(counts)))
        return _AllocationSplit(means, 1.0 / float((1.0 / counts).mean()), len(t),
                                float(means.var(ddof=1)), within)  # fmt: skip

    @property
    def between_std_s(self) -> float:
        return float(np.sqrt(max(self.means_var - self.within_var / self.harmonic_steps, 0.0)))

    @property
    def within_std_s(self) -> float:
        return float(np.sqrt(self.within_var))

    def mixture_bound_s(self, k: float, confidence: float) -> float:
        """The `confidence` quantile of a mixture over allocations of normals (mean k m_a,
        std sqrt(k) sigma_w), m_a the allocation means pulled to a spread of sigma_b; with
        sigma_w = 0 the k m_a themselves (their `confidence` quantile)."""
        grand = float(self.means.mean())
        pull = self.between_std_s / np.sqrt(self.means_var) if self.means_var > 0 else 0.0
        centres = k * (grand + pull * (self.means - grand))
        width = np.sqrt(k) * self.within_std_s
        if width <= 1e-12 * np.abs(centres).max():  # zero, or a mean's rounding: point masses
            # where the share of them below is `confidence` exactly (100 allocations at 95 %),
            # the middle of the gap to the next, as a mixture of very narrow normals gives
            return float(np.quantile(centres, confidence, method="averaged_inverted_cdf"))

        def excess(b: float) -> float:
            return float(stats.norm.cdf((b - centres) / width).mean()) - confidence

        reach = 10 * width
        return float(optimize.brentq(excess, centres.min() - reach, centres.max() + reach,
                                     xtol=1e-12 * max(1.0, centres.max())))  # fmt: skip

    def pivotal_bound_s(self, k: float, confidence: float, seed: int) -> float:
        """A normal prediction bound on k steps on a new allocation that carries the
        estimators' own uncertainty, by generalized pivotal quantities (Weerahandi 1993;
        Krishnamoorthy and Mathew, "Statistical Tolerance Regions", 2009, ch. 6): draws of
        tau^2 = h var(means) x (allocations - 1) / chi2(allocations - 1), sigma_w^2 x
        (samples - allocations) / chi2(samples - allocations), sigma_b^2 = max((tau^2 -
        sigma_w^2) / h, 0) and the mean (normal, variance tau^2 / (allocations h)); the
        `confidence` quantile of k x mean + sqrt(k^2 sigma_b^2 + k sigma_w^2) x z over them.
        Seeded: the same seed, the same bound; its stream apart from the Monte Carlo's of the
        same seed."""
        rng = np.random.default_rng((seed, PIVOT_STREAM))
        allocations, h = len(self.means), self.harmonic_steps
        n = PIVOT_DRAWS
        tau2 = h * self.means_var * (allocations - 1) / rng.chisquare(allocations - 1, n)
        within_dof = self.samples - allocations
        within = self.within_var * within_dof / rng.chisquare(within_dof, n)
        between = np.maximum(tau2 - within, 0.0) / h
        mean = float(self.means.mean()) + np.sqrt(tau2 / (allocations * h)) * rng.standard_normal(n)
        runs = k * mean + np.sqrt(k * k * between + k * within) * rng.standard_normal(n)
        return float(np.quantile(runs, confidence))
