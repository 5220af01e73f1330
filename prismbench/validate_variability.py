"""`validate --variability`: a case's predicted step-time distribution beside its measured spread.

The distribution is `prismbench.variability.sample_priced` over the capture and prices the
case's emulation made (`prismbench.emulate.price_job`), so nothing is captured twice. A
recorded baseline's repeated iterations give a measured spread: half the range over the
median (`Measured.iteration_time_relative_spread`). Its predicted counterpart is half the
central 90 % over the median, (p95 - p5) / 2 / p50: the range of n draws spans about the
1/(n+1) to n/(n+1) quantiles, so the two are comparable for about 10-20 measured iterations,
and the measured one is the narrower for fewer (docs/METRICS.md defines both).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from emulator.variability.model import MEASURED_PRESET, PRESET_NAMES
from emulator.variability.summary import DEFAULT_STEPS_PER_ALLOCATION, check_allocations
from workloads.config import SpecError

PLOT_NAME = "step_time_distribution.png"  # in the case's artifact folder, logged to MLflow


@dataclass(frozen=True, kw_only=True)
class VariabilitySettings:
    """What `validate --variability PRESET --variability-samples N --variability-seed SEED
    --variability-steps-per-allocation S --variability-table TABLE` asks."""

    preset: str
    samples: int = 1000
    seed: int = 0
    steps_per_allocation: int = DEFAULT_STEPS_PER_ALLOCATION  # as `variability`'s default
    # a measured table of one's own (`prismbench variability-table`) in place of the committed
    # ones: the `measured` preset only, and every selected case on its GPU (`check_gpus`)
    table: str | None = None

    def __post_init__(self) -> None:
        if self.preset not in PRESET_NAMES:
            raise SpecError(
                f"--variability {self.preset!r}: not a preset; known: "
                f"{', '.join(sorted(PRESET_NAMES))}"
            )
        if not isinstance(self.samples, int) or self.samples < 1:
            raise SpecError(f"--variability-samples={self.samples!r} must be an integer >= 1")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise SpecError(f"--variability-seed={self.seed!r} must be an integer >= 0")
        try:
            check_allocations(self.samples, self.steps_per_allocation,
                              samples_name="--variability-samples",
                              steps_name="--variability-steps-per-allocation")  # fmt: skip
        except ValueError as err:
            raise SpecError(str(err)) from None
        if self.table is not None and self.preset != MEASURED_PRESET:
            raise SpecError(
                f"--variability-table {self.table}: holds the {MEASURED_PRESET!r} preset's "
                f"figures, which --variability {self.preset} does not draw; give --variability "
                f"{MEASURED_PRESET}"
            )

    def to_dict(self) -> dict:
        return asdict(self)

    def check_gpus(self, baselines) -> None:
        """`measured` needs a table for every selected case's GPU: refuse the run up front
        rather than fail cases one by one."""
        if self.preset != MEASURED_PRESET:
            return
        from prismbench.variability_calibration import measured_gpus, read_table

        if self.table is not None:
            gpu = read_table(self.table)["gpu"]
            others = sorted({b.job.cluster.gpu for b in baselines} - {gpu})
            if others:
                raise SpecError(
                    f"--variability-table {self.table}: measured on gpu {gpu!r}; selected cases "
                    f"run on {', '.join(others)}: select the cases on {gpu} only"
                )
            return
        lacking = sorted({b.job.cluster.gpu for b in baselines} - set(measured_gpus()))
        if lacking:
            raise SpecError(
                f"--variability {MEASURED_PRESET}: no measured variability for gpu "
                f"{', '.join(lacking)} (results/variability/); select cases on measured GPUs "
                "or use prism-low"
            )


def case_distribution(
    priced,
    settings: VariabilitySettings,
    *,
    name: str,
    world_size: int,
    gpu: str,
    plot_path: Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """The predicted step-time figures of one case (seconds, ratios, a probability), from a
    `PricedJob`; with `plot_path`, its histogram and CDF (PNG) too."""
    from prismbench.variability import plot_distribution, sample_priced
    from prismbench.variability_calibration import resolve_preset

    # one thread: validate already runs its cases in parallel processes
    result = sample_priced(priced, name=name, world_size=world_size,
                           model=resolve_preset(settings.preset, gpu, settings.table),
                           preset=settings.preset,
                           samples=settings.samples, seed=settings.seed, progress=progress,
                           steps_per_allocation=settings.steps_per_allocation,
                           threads=1)  # fmt: skip
    if plot_path is not None:
        plot_distribution(result, plot_path)
    d = result.distribution
    return {
        "preset": settings.preset,
        "samples": d.samples,
        "seed": d.seed,
        "deterministic_s": d.deterministic_s,
        "mean_s": d.mean_s,
        "std_s": d.std_s,
        "p5_s": d.p5_s,
        "p50_s": d.p50_s,
        "p95_s": d.p95_s,
        "p99_s": d.p99_s,
        "threshold_s": d.threshold_s,
        "p_exceeds_threshold": d.p_exceeds_threshold,
        "k_steps": d.k_steps,
        "k_steps_bound_s": d.k_steps_bound_s,
        "steps_per_allocation": d.steps_per_allocation,
        "allocation_std_s": d.allocation_std_s,
        "within_allocation_std_s": d.within_allocation_std_s,
        "slowdown_mean": d.slowdown_mean,
        "slowdown_p95": d.slowdown_p95,
        "tail_slow_network_share": result.tail_slow_network_share,
        "predicted_relative_spread": (d.p95_s - d.p5_s) / 2 / d.p50_s,
        "monte_carlo_wall_s": result.monte_carlo_wall_s,
    }


def measured_spread(baseline) -> dict:
    """The baseline's repeated-run figures (None where it reports one iteration time, or ran on
    a CPU: its spread is the OS's noise, not a GPU's)."""
    m = baseline.measured
    if m.iteration_time_s_min is None or not m.predicted_by_emulator:
        return dict.fromkeys(MEASURED_FIELDS)
    return {
        "measured_iterations": m.iterations,
        "measured_median_s": m.iteration_time_s,
        "measured_min_s": m.iteration_time_s_min,
        "measured_max_s": m.iteration_time_s_max,
        "measured_relative_spread": m.iteration_time_relative_spread,
    }


MEASURED_FIELDS = (
    "measured_iterations",
    "measured_median_s",
    "measured_min_s",
    "measured_max_s",
    "measured_relative_spread",
)
