"""Two-regime splits of measured durations by Otsu's threshold, as PRISM does.

- Pipeline transfers (PRISM's bubble / no-bubble regimes): a measured send/recv lasts the
  transfer alone when the peer is already there (no bubble), or the transfer plus the wait for
  the peer (bubble). `split_pipeline_transfers` separates the two at Otsu's threshold over the
  durations' logarithms: a wait lasts anything from a fraction of the transfer to many times
  it, and in seconds the waits' own spread dominates the between-class variance, so the cut
  falls inside the waits and the shortest of them join the no-bubble regime (80 % of
  transfers of 2 ms +- 2 % and 20 % waiting 5-20 ms more: its CV read 20-60 %, not 2 %); on
  a log scale a transfer that waited is a ratio away from one that did not, and the cut falls
  in that gap. Waits shorter than a few times the transfer itself still join the no-bubble
  regime and widen it. The replay produces the waiting itself (a recv starts at the later of
  the two sides' ready times), so only the no-bubble regime is a transfer's own duration
  distribution; the bubble regime is what a measured recv looks like, and checks the
  replay's waits.
- The network (PRISM's one regime per step for all communication): from per-step factors,
  each step's measured communication time over a reference (its median, or the modelled
  time), `estimate_network_regimes` gives the nominal regime (below the threshold, factor 1)
  and the congested one (above it, its mean factor over the nominal mean), each with the
  fraction of steps it holds.

Otsu's threshold (Otsu 1979, "A threshold selection method from gray-level histograms")
maximises the between-class variance w0 w1 (m0 - m1)^2; here computed exactly over every cut
between sorted values, not over histogram bins.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from emulator.variability.distributions import (
    MIN_SAMPLES,
    DurationDistribution,
    fit_durations,
    from_moments,
)
from emulator.variability.model import NetworkRegime


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
    at or below it are the no-bubble regime."""

    threshold_s: float
    no_bubble: DurationDistribution
    bubble: DurationDistribution | None
    bubble_fraction: float


def _distribution(samples: np.ndarray) -> DurationDistribution:
    if len(samples) >= MIN_SAMPLES:
        return fit_durations(samples)
    return from_moments(float(samples.mean()), float(samples.std()))


def split_pipeline_transfers(durations_s) -> TransferRegimes:
    """Bubble and no-bubble regimes of measured send/recv durations (s), cut at Otsu's threshold
    over their logarithms (module docstring)."""
    x = np.asarray(durations_s, dtype=float)
    if not (x > 0).all():
        raise ValueError("durations_s must be > 0")
    logs = np.log(x)
    cut = otsu_threshold(logs)  # compared in logs: exp(log(x)) need not give x back exactly
    fast, slow = x[logs <= cut], x[logs > cut]
    return TransferRegimes(
        threshold_s=float(np.exp(cut)),
        no_bubble=_distribution(fast),
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
