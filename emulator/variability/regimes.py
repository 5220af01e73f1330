"""Two-regime splits of measured durations, as PRISM does.

- Pipeline transfers (PRISM's bubble / no-bubble regimes): a measured send/recv lasts the
  transfer alone when the peer is already there (no bubble), or the transfer plus the wait for
  the peer (bubble). The replay produces the waiting itself (a recv starts at the later of the
  two sides' ready times), so only the no-bubble regime is a transfer's own duration
  distribution; the bubble regime is what a measured recv looks like, and checks the replay's
  waits. `split_pipeline_transfers` reads the no-bubble regime robustly, because a wait lasts
  anything from nothing to many transfers and a cut alone cannot separate the short waits:
  1. start from the durations at or below Otsu's threshold over their logarithms (on a log
     scale a transfer that waited long is a ratio away from one that did not; in seconds the
     cut fell among the waits);
  2. trim to the durations within TRIM_SIGMAS spreads of their median, the spread being the
     root-mean-square distance below the median (divided by what a normal cut at TRIM_SIGMAS
     keeps of it), until the set no longer changes: a wait only lengthens a call, so the calls
     faster than the median are the transfer alone, while those just above it mix transfers
     with waits shorter than the transfer's own spread, which no cut can tell apart;
  3. that median and spread are the no-bubble regime's mean and standard deviation; the calls
     more than BUBBLE_SIGMAS above the median waited for their peer (none: one regime).
  On synthetic runs (results/fidelity/pipeline_transfer_split.md) the median CV read is
  0.90-1.09x the truth in every mix where at most half the calls waited, 0.87-1.50x where 70 %
  did (short waits the worst) and 1.2-66x where 90 % did: the trimmed median then lies among
  the waits, and nothing here can tell (a CV read above MAX_NORMAL_CV is refused downstream);
  the std of Otsu's lower class, before, read 0.6x it with no waits and up to 44x with short
  ones (pipeline_transfer_split_baseline.md, bubbles up to 50 %).
  A symmetric robust spread (1.4826 x the median absolute deviation, or a truncated std)
  trimmed the same way stays too wide where many waits are shorter than the transfer's
  spread: they lie inside any window about the median. The spread read below the median
  assumes the transfer's own durations as spread above it as below: a longer right tail of
  its own reads as waits.
- The network (PRISM's one regime per step for all communication): from per-step factors,
  each step's measured communication time over a reference (its median, or the modelled
  time), `estimate_network_regimes` gives the nominal regime (below Otsu's threshold, factor
  1) and the congested one (above it, its mean factor over the nominal mean), each with the
  fraction of steps it holds.

Otsu's threshold (Otsu 1979, "A threshold selection method from gray-level histograms")
maximises the between-class variance w0 w1 (m0 - m1)^2; here computed exactly over every cut
between sorted values, not over histogram bins.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

from emulator.variability.distributions import (
    MIN_SAMPLES,
    DurationDistribution,
    fit_durations,
    from_moments,
)
from emulator.variability.model import NetworkRegime

# The trim keeps durations within 3 spreads of the median: a normal transfer loses 0.3 % of its
# calls to it, and a wait longer than that is outside.
TRIM_SIGMAS = 3.0
# The share of a normal's spread that its part within TRIM_SIGMAS keeps (the std of a normal
# truncated at +-TRIM_SIGMAS over the untruncated one's): the trimmed spread is divided by it.
_TRIMMED_STD_RATIO = float(
    np.sqrt(
        1 - 2 * TRIM_SIGMAS * stats.norm.pdf(TRIM_SIGMAS) / (2 * stats.norm.cdf(TRIM_SIGMAS) - 1)
    )
)
# A call more than 5 spreads above the no-bubble median waited for its peer: a normal transfer
# lands there once in 3.5 million calls, so a run that never waited splits only where the
# spread read is too low (pipeline_transfer_split.md: 14 of 300 runs of 40 transfers, 1 of 300
# of 200 and of 1000). A wait shorter than that stays in the no-bubble regime's count, not in
# its spread.
BUBBLE_SIGMAS = 5.0


def otsu_threshold(values) -> float:
    """The cut maximising the between-class variance; a value of the lower class is <= it.

    Returns the largest value when all are equal (one class)."""
    x = np.sort(np.asarray(values, dtype=float))
    if x.ndim != 1 or len(x) < 2:
        raise ValueError(f"otsu_threshold needs at least 2 values, got {x.shape}")
    n = len(x)
    below = np.arange(1, n)  # cut after the k-th smallest value, k = 1 .. n-1
    sums = np.cumsum(x)[:-1]
    m0 = sums / below
    m1 = (x.sum() - sums) / (n - below)
    between = below * (n - below) * (m0 - m1) ** 2
    between[x[1:] == x[:-1]] = -1.0  # a cut between equal values separates nothing
    if between.max() <= 0:
        return float(x[-1])
    k = int(np.argmax(between))
    return float((x[k] + x[k + 1]) / 2)


@dataclass(frozen=True)
class TransferRegimes:
    """A pool of pipeline transfer durations split at `threshold_s` (module docstring): those
    at or below it are the no-bubble regime, whose distribution is the normal of the trimmed
    median and spread (`samples`: the calls at or below the threshold)."""

    threshold_s: float
    no_bubble: DurationDistribution
    bubble: DurationDistribution | None
    bubble_fraction: float


def _distribution(samples: np.ndarray) -> DurationDistribution:
    if len(samples) >= MIN_SAMPLES:
        return fit_durations(samples)
    return from_moments(float(samples.mean()), float(samples.std()))


def _spread_below(x: np.ndarray, median: float) -> float:
    """The root-mean-square distance below `median` of the durations `x` (a trimmed set)."""
    below = x[x < median]
    return float(np.sqrt(np.mean((median - below) ** 2))) / _TRIMMED_STD_RATIO if len(below) else 0.0


def trimmed_transfer(x: np.ndarray, start: np.ndarray) -> tuple[float, float]:
    """The median and spread of the transfer alone (step 2 of the module docstring), trimming
    from the durations `start` (a part of `x`) until the set kept no longer changes."""
    kept = start
    for _ in range(len(x)):  # each pass changes the set; a bound, should it cycle
        median = float(np.median(kept))
        spread = _spread_below(kept, median)
        trimmed = x[np.abs(x - median) <= TRIM_SIGMAS * spread]
        if np.array_equal(trimmed, kept):
            break
        kept = trimmed
    return median, spread


def split_pipeline_transfers(durations_s) -> TransferRegimes:
    """Bubble and no-bubble regimes of measured send/recv durations (s): the no-bubble median
    and spread trimmed from Otsu's lower class over their logarithms, and the calls more than
    BUBBLE_SIGMAS above that median split off as waits (module docstring)."""
    x = np.asarray(durations_s, dtype=float)
    if not (x > 0).all():
        raise ValueError("durations_s must be > 0")
    logs = np.log(x)
    cut = otsu_threshold(logs)  # compared in logs: exp(log(x)) need not give x back exactly
    median, spread = trimmed_transfer(x, x[logs <= cut])
    threshold = median + BUBBLE_SIGMAS * spread
    slow = x[x > threshold]
    return TransferRegimes(
        threshold_s=threshold,
        no_bubble=DurationDistribution("normal", (median, spread), samples=len(x) - len(slow)),
        bubble=_distribution(slow) if len(slow) else None,
        bubble_fraction=len(slow) / len(x),
    )


def estimate_network_regimes(step_factors) -> tuple[NetworkRegime, ...]:
    """Nominal and congested regimes from per-step communication factors (module docstring)."""
    x = np.asarray(step_factors, dtype=float)
    if not (x > 0).all():
        raise ValueError("step_factors must be > 0")
    cut = otsu_threshold(x)
    nominal, congested = x[x <= cut], x[x > cut]
    if not len(congested):
        return (NetworkRegime(1.0, 1.0),)
    p = len(congested) / len(x)
    return (
        NetworkRegime(1.0 - p, 1.0),
        NetworkRegime(p, float(congested.mean() / nominal.mean())),
    )
