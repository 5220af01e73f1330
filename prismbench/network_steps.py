"""Network regimes measured on a real run, in place of the assumed ones (issue 18).

PRISM draws one network regime per step for all the communication that crosses the network.
Without measurements the model assumes two (emulator.variability.model.DEFAULT_NETWORK: 90 % of
steps nominal, 10 % 1.4x slower; neither figure is PRISM's), and wherever inter-node
communication is on the critical path that assumption sets the tail. A user who timed that
communication in every step of a real run on their cluster (Megatron-LM's
`--timing-log-level` timers such as `params-all-gather` and `grads-reduce-scatter`, NCCL's
profiler plugin, or CUDA events around the step's collectives) gives those times here, one
step per line; each step's time over the median of all is its network factor, and
`emulator.variability.regimes.estimate_network_regimes` splits the factors at Otsu's threshold
into a nominal regime (factor 1: the emulator's modelled communication) and a congested one
(its mean over the nominal mean, with the share of steps it holds).

Otsu's threshold separates any spread that is not one value, so a run without congestion
still gives two regimes: the upper part of its ordinary spread, which is what the model then
draws (its magnitude, as a two-point distribution). Measure over at least MIN_NETWORK_STEPS
steps, from the steady state (warm-up steps left out: their first-call setup is no regime).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from emulator.variability.model import NetworkRegime, regimes_text
from emulator.variability.regimes import estimate_network_regimes, otsu_threshold
from prismbench.seconds_file import read_seconds

# At 20 steps a regime of 10 % of them holds 2; fewer say too little to split.
MIN_NETWORK_STEPS = 20


@dataclass(frozen=True)
class MeasuredNetwork:
    """The regimes of one measured run: where they come from, and the split."""

    source: str  # the file
    steps: int
    median_s: float  # the median step's communication time, the factors' reference
    threshold_factor: float  # Otsu's cut between the regimes (factors at or below: nominal)
    regimes: tuple[NetworkRegime, ...]

    def describe(self) -> str:
        return (
            f"{regimes_text(self.regimes)}; measured in {self.source} ({self.steps} steps, "
            f"median {self.median_s:.4g} s)"
        )

    def to_dict(self) -> dict:
        return {
            "source": self.source,
            "steps": self.steps,
            "median_s": self.median_s,
            "threshold_factor": self.threshold_factor,
        }


def read_step_times(path: str | Path, *, option: str = "--network-steps") -> np.ndarray:
    """Per-step communication times (s), one per line (prismbench.seconds_file)."""
    return read_seconds(path, option=option, item="step", minimum=MIN_NETWORK_STEPS,
                        each="one steady-state step's communication time")  # fmt: skip


def measured_network(path: str | Path, *, option: str = "--network-steps") -> MeasuredNetwork:
    """The network regimes of the run whose per-step communication times `path` holds."""
    times = read_step_times(path, option=option)
    median = float(np.median(times))
    factors = times / median
    return MeasuredNetwork(
        source=str(path),
        steps=len(times),
        median_s=median,
        threshold_factor=otsu_threshold(factors),
        regimes=estimate_network_regimes(factors),
    )
