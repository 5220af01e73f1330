"""How much a job's durations vary, as PRISM models it: the knobs and their cited defaults.

PRISM (arXiv 2510.15596; reading notes and figures in ../shared/seeds/README.md) separates
- *spatial* variation: a persistent speed factor per GPU (a slow GPU is slow for every kernel
  of the step): GEMM throughput varies 1.64-14 % across 20K+ GPUs;
- *temporal* variation: each kernel's duration varies from one run to the next on one GPU:
  0.98-6.46 % for GEMMs over time on one GPU;
- collectives: one duration per call, shared by all its members (it ends when the slowest
  member is done: the replay starts it at the latest member's ready time);
- the network: one regime per step shared by all communication that crosses the network.
  By default (`network_scope="inter-node"`) the regime applies only to calls whose group
  spans more than one node (the graph's `crosses_nodes`): NVLink traffic inside a node does
  not see the network's congestion. `network_scope="all"` applies it to every call and
  transfer, as the sampler did before (on a single-node tp8 job it made 72 % of the step's
  variance a "network regime" on NVLink all-reduces).

We read the paper's "variation" figures as coefficients of variation (std / mean); the reading
notes do not say whether they are CVs or (max - min) / mean ranges: if ranges, these defaults
overstate the spread. `PRISM_LOW` takes the low end of each range (a healthy fleet), and
`PRISM_HIGH` the high end.

Measured on one GPU (emulator.variability.calibration, results/variability/<gpu>.json): the
temporal CV per noise class (`temporal_cv_by_class`: GEMMs, attention, memory-bound kernels),
a per-kernel jitter floor (`temporal_floor_s`: short kernels vary by a fraction of a
microsecond whatever their length) and `step_cv`, the spread of a per-GPU factor redrawn every
step: iterations on one GPU vary several times more than independent kernel noise explains
(clocks, host), so part of the temporal variation is shared by a step's kernels. That spread
is not one figure per GPU: one job's differs from one run to the next and two jobs' differ in
one run (results/fidelity/variability.md, "Repeated iterations"), so `step_cv_dispersion`
lets each allocation (a run) draw its own step CV around `step_cv` (its median), lognormally.

Numbers the seeds do not give, stated as assumptions (replace them with estimates from
repeated measurements, emulator.variability.regimes; `prismbench variability --network-steps`
does it for the network from a real run's per-step communication times,
prismbench.network_steps, and `--pipeline-transfers` for the transfers from a real run's
send/recv durations, prismbench.pipeline_transfers):
- `collective_cv`: the temporal CV of a kernel, applied to a collective's kernel, and to a
  pipeline transfer unless `transfer_cv` gives one of its own;
- the network regimes: a nominal regime (factor 1) 90 % of steps and a congested one 10 % of
  steps, 1.4x slower. Neither figure is PRISM's: the 1.4x is the "40 % slowdown observed under
  high latency" in the machine-written summary on the paper's abstract page
  (../shared/seeds/prism_abstract.txt, "Key Results"; the same block states results that are
  not the paper's), and the 10 % is our assumption. Wherever communication across nodes is on
  the critical path, this assumed regime sets the tail: p95 then lies in the congested steps
  (on the README's 8 192-GPU example every step above p95 is a congested one, an audit found),
  so such a p95 restates the assumption; `prismbench variability` says when it does (the share
  of the steps above p95 drawn in a slower regime, prismbench.variability).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from emulator.costs.ops import ATTENTION_OPS, GEMM_OPS

# A normal draw of the relative noise must stay well above -1: with the ~1e7 standard normals
# of a run the smallest is about -5.5 sigma, so CVs up to 0.15 keep every duration positive.
MAX_NORMAL_CV = 0.15

# The largest spread of log(step CV) between runs: at 3 a run 3 sigma out has a step CV
# e^9 ~ 8 000 x the median's; anything wider is a mistake, not a measurement.
MAX_STEP_CV_DISPERSION = 3.0

# Which communication the network regime slows (VariabilityModel.network_scope).
NETWORK_SCOPES = ("inter-node", "all")

# Kernels whose temporal spread is modelled alike (measured per class on a GPU).
NOISE_CLASSES = ("gemm", "attention", "memory")


def noise_class(op_name: str) -> str:
    """The noise class of a compute op of emulator/costs/ops.py's vocabulary."""
    if op_name in GEMM_OPS:
        return "gemm"
    if op_name in ATTENTION_OPS:
        return "attention"
    return "memory"


def kernel_spreads_s(durations_s, cvs, floor_s: float) -> np.ndarray:
    """Standard deviation (s) of kernels of `durations_s` and CVs `cvs` with a jitter floor:
    sqrt((cv x d)^2 + floor^2); 0 for ops of no duration (not compute)."""
    d = np.asarray(durations_s, dtype=float)
    return np.where(d > 0, np.hypot(np.asarray(cvs, dtype=float) * d, floor_s), 0.0)


@dataclass(frozen=True)
class NetworkRegime:
    """One state of the network for a whole step: its probability and the factor on every
    communication duration."""

    probability: float
    factor: float

    def __post_init__(self) -> None:
        if not 0 <= self.probability <= 1:
            raise ValueError(f"probability={self.probability!r} must be in [0, 1]")
        if not self.factor > 0:
            raise ValueError(f"factor={self.factor!r} must be > 0")


def regimes_text(regimes) -> str:
    """Network regimes as a reader sees them: each one's share of steps and its factor."""
    return ", ".join(f"{100 * r.probability:.1f} % at {r.factor:.3f}x" for r in regimes)


@dataclass(frozen=True, kw_only=True, eq=False)
class VariabilityModel:
    """The spread of every duration of a step (see module docstring).

    spatial_cv: CV of the per-GPU speed factor (lognormal, mean 1), drawn once per allocation
    of GPUs (the Monte Carlo's `steps_per_allocation` consecutive samples share it) unless
    `speed_factors` fixes them (an array shaped like the world's mesh, e.g. one known slow
    GPU).
    temporal_cv: CV of one kernel's duration on one GPU; a segment of independent kernels has
    the sum of their variances (emulator.graph.build, `variance_s2`).
    temporal_cv_by_class: the temporal CV of the NOISE_CLASSES it names (the others keep
    temporal_cv).
    temporal_floor_s: a kernel's standard deviation is at least this (s): short kernels'
    jitter does not shrink with their length; std = sqrt((cv x d)^2 + floor^2).
    step_cv: CV of a per-GPU factor (lognormal, mean 1) drawn afresh every step, on top of the
    spatial one: the part of the temporal variation a step's kernels share.
    step_cv_dispersion: the spread of that CV between runs: each allocation draws its step CV
    as step_cv x exp(step_cv_dispersion x Z), Z standard normal (so step_cv is its median and
    this the standard deviation of its log), shared by its GPUs and steps. 0 (the default):
    every run has step_cv, as before the field existed.
    collective_cv: CV of one collective, and of one pipeline transfer where transfer_cv is None.
    transfer_cv: CV of one pipeline transfer (send/recv) in PRISM's no-bubble regime, the
    transfer's own duration (the replay adds the wait for the peer); None: collective_cv.
    network: the regimes of the network, one drawn per step; probabilities sum to 1.
    network_scope: "inter-node" (the regime on comm whose group spans nodes) or "all"."""

    spatial_cv: float
    temporal_cv: float
    collective_cv: float
    temporal_cv_by_class: Mapping[str, float] | None = None
    temporal_floor_s: float = 0.0
    step_cv: float = 0.0
    step_cv_dispersion: float = 0.0
    network: tuple[NetworkRegime, ...] = (NetworkRegime(1.0, 1.0),)
    speed_factors: np.ndarray | None = None
    network_scope: str = "inter-node"
    transfer_cv: float | None = None

    def regime_reaches(self, graph_class) -> np.ndarray:
        """Which of a graph class's nodes the network regime may slow, by `network_scope`: those
        whose call crosses nodes ("inter-node"), or every one ("all")."""
        crosses = np.asarray(graph_class["crosses_nodes"]).astype(bool)
        return crosses if self.network_scope == "inter-node" else np.ones(len(crosses), bool)

    def __post_init__(self) -> None:
        if self.network_scope not in NETWORK_SCOPES:
            raise ValueError(f"network_scope={self.network_scope!r} is not one of {NETWORK_SCOPES}")
        if self.spatial_cv < 0:
            raise ValueError(f"spatial_cv={self.spatial_cv!r} must be >= 0")
        optional = () if self.transfer_cv is None else ("transfer_cv",)
        for name in ("temporal_cv", "collective_cv", *optional):
            value = getattr(self, name)
            if not 0 <= value <= MAX_NORMAL_CV:
                raise ValueError(
                    f"{name}={value!r} must be in [0, {MAX_NORMAL_CV}] (normal noise stays > 0)"
                )
        for name, value in (self.temporal_cv_by_class or {}).items():
            if name not in NOISE_CLASSES:
                raise ValueError(f"temporal_cv_by_class: {name!r} is not one of {NOISE_CLASSES}")
            if not 0 <= value <= MAX_NORMAL_CV:
                raise ValueError(
                    f"temporal_cv_by_class[{name!r}]={value!r} must be in [0, {MAX_NORMAL_CV}]"
                )
        if self.temporal_cv_by_class is not None:
            object.__setattr__(self, "temporal_cv_by_class", dict(self.temporal_cv_by_class))
        for name in ("temporal_floor_s", "step_cv"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name}={getattr(self, name)!r} must be >= 0")
        if not 0 <= self.step_cv_dispersion <= MAX_STEP_CV_DISPERSION:
            raise ValueError(
                f"step_cv_dispersion={self.step_cv_dispersion!r} must be in "
                f"[0, {MAX_STEP_CV_DISPERSION}]"
            )
        if not self.network:
            raise ValueError("network must hold at least one regime")
        total = sum(r.probability for r in self.network)
        if not np.isclose(total, 1.0):
            raise ValueError(f"network regime probabilities sum to {total}, not 1")
        if self.speed_factors is not None:
            factors = np.asarray(self.speed_factors, dtype=float)
            if not (factors > 0).all():
                raise ValueError("speed_factors must all be > 0")
            object.__setattr__(self, "speed_factors", factors)

    @property
    def has_kernel_noise(self) -> bool:
        """Whether any compute op's duration varies (temporal CVs or the floor)."""
        by_class = self.temporal_cv_by_class or {}
        return self.temporal_cv > 0 or any(by_class.values()) or self.temporal_floor_s > 0

    @property
    def pipeline_transfer_cv(self) -> float:
        """The CV a pipeline transfer is drawn with: transfer_cv, or collective_cv where None."""
        return self.collective_cv if self.transfer_cv is None else self.transfer_cv

    def temporal_cv_of(self, noise_class_name: str) -> float:
        return (self.temporal_cv_by_class or {}).get(noise_class_name, self.temporal_cv)

    def temporal_spreads_s(self, durations_s: np.ndarray, op_names=None) -> np.ndarray:
        """Standard deviation (s) of each op's duration; `op_names` (one per op, the costs'
        vocabulary) picks each op's class CV, else every op has `temporal_cv`. Ops of zero
        duration (not compute) have none."""
        d = np.asarray(durations_s, dtype=float)
        if op_names is None:
            cv = np.full(d.shape, self.temporal_cv)
        else:
            names = np.asarray(op_names, dtype=object)
            if names.shape != d.shape:
                raise ValueError(f"op_names shape {names.shape} != durations shape {d.shape}")
            unique, inverse = np.unique(names.astype(str), return_inverse=True)
            cv = np.array([self.temporal_cv_of(noise_class(n)) for n in unique])[inverse]
        return kernel_spreads_s(d, cv, self.temporal_floor_s)

    def with_speed_factors(self, speed_factors) -> VariabilityModel:
        return replace(self, speed_factors=speed_factors)


# GEMM variation across GPUs 1.64-14 %, over time on one GPU 0.98-6.46 % (PRISM, seeds README).
SPATIAL_CV_RANGE = (0.0164, 0.14)
TEMPORAL_CV_RANGE = (0.0098, 0.0646)
# Assumption (module docstring): 90 % nominal steps, 10 % congested at 1.4x.
DEFAULT_NETWORK = (NetworkRegime(0.9, 1.0), NetworkRegime(0.1, 1.4))

PRISM_LOW = VariabilityModel(
    spatial_cv=SPATIAL_CV_RANGE[0],
    temporal_cv=TEMPORAL_CV_RANGE[0],
    collective_cv=TEMPORAL_CV_RANGE[0],
    network=DEFAULT_NETWORK,
)
PRISM_HIGH = VariabilityModel(
    spatial_cv=SPATIAL_CV_RANGE[1],
    temporal_cv=TEMPORAL_CV_RANGE[1],
    collective_cv=TEMPORAL_CV_RANGE[1],
    network=DEFAULT_NETWORK,
)
NO_VARIABILITY = VariabilityModel(spatial_cv=0.0, temporal_cv=0.0, collective_cv=0.0)
PRESETS = {"prism-low": PRISM_LOW, "prism-high": PRISM_HIGH, "none": NO_VARIABILITY}
# The temporal figures measured on the job's GPU (prismbench.variability_calibration resolves it
# per GPU from results/variability/<gpu>.json).
MEASURED_PRESET = "measured"
PRESET_NAMES = (*PRESETS, MEASURED_PRESET)
