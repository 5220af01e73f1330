"""Fidelity: emulate baselines and compare with what was measured.

`compare(baseline, result)` turns one emulation into a `FidelityRecord`; `summarize`
gives per-source error statistics. Error is (predicted - measured) / measured
(docs/METRICS.md). The measured iteration time is the baseline's, or, for sources that
report only TFLOP/s counted with Narayanan et al. 2021's eq. 3 (recompute included),
the time that eq. 3 FLOPs at the reported TFLOP/s per GPU imply: exact arithmetic on
stated numbers, marked `measured_from = "tflops_eq3"`.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

from prismbench.explain import explain

MEDIAN_GOAL = 0.05  # issue 5: median |error| <= 5 % per source with >= 5 rows
MAX_GOAL = 0.15
MIN_ROWS_FOR_MEDIAN_GOAL = 5


@dataclass(frozen=True, kw_only=True)
class FidelityRecord:
    baseline: str
    source: str
    model: str
    gpus: int
    measured_iteration_s: float
    measured_from: str  # "iteration_time" | "derived:<how>" | "tflops_eq3"
    predicted_iteration_s: float
    error: float
    measured_peak_mem_bytes: int | None
    measured_peak_mem_kind: str | None
    predicted_peak_allocated_bytes: int
    predicted_peak_reserved_bytes: int
    predicted_device_total_bytes: int
    predicted_oom: bool
    compute_s: float
    exposed_comm_s: float
    bubble_s: float
    emulation_wall_s: float

    def to_dict(self) -> dict:
        return asdict(self)


def measured_iteration_s(baseline) -> tuple[float, str] | None:
    m = baseline.measured
    if m.iteration_time_s is not None:
        how = baseline.provenance.derived.get("iteration_time_s")
        return m.iteration_time_s, f"derived: {how}" if how else "iteration_time"
    if m.tflops_per_gpu is not None and m.tflops_kind == "hardware":
        eq3 = explain(baseline.job).flops.narayanan_eq3_flops_per_iteration
        return eq3 / (m.tflops_per_gpu * 1e12 * baseline.job.world_size), "tflops_eq3"
    return None


def compare(baseline, result) -> FidelityRecord:
    measured = measured_iteration_s(baseline)
    if measured is None:
        raise ValueError(f"baseline {baseline.name}: no iteration time or eq.3 TFLOP/s to compare with")
    measured_s, how = measured
    return FidelityRecord(
        baseline=baseline.name,
        source=baseline.name.split("__")[0],
        model=baseline.provenance.model,
        gpus=baseline.job.world_size,
        measured_iteration_s=measured_s,
        measured_from=how,
        predicted_iteration_s=result.iteration_time_s,
        error=(result.iteration_time_s - measured_s) / measured_s,
        measured_peak_mem_bytes=baseline.measured.peak_mem_bytes,
        measured_peak_mem_kind=baseline.measured.peak_mem_kind,
        predicted_peak_allocated_bytes=result.peak_memory_allocated_bytes,
        predicted_peak_reserved_bytes=result.peak_memory_reserved_bytes,
        predicted_device_total_bytes=result.device_total_estimate_bytes,
        predicted_oom=result.oom,
        compute_s=result.breakdown["compute_s"],
        exposed_comm_s=result.breakdown["exposed_comm_s"],
        bubble_s=result.breakdown["bubble_s"],
        emulation_wall_s=result.wall_s,
    )


@dataclass(frozen=True, kw_only=True)
class SourceSummary:
    source: str
    rows: int
    mean_error: float  # signed: > 0 means the emulator predicts slower than measured
    mean_abs_error: float
    median_abs_error: float
    max_abs_error: float
    goal_met: bool | None  # None: fewer rows than the median goal asks for


def summarize(records: list[FidelityRecord]) -> list[SourceSummary]:
    by_source: dict[str, list[float]] = {}
    for r in records:
        by_source.setdefault(r.source, []).append(r.error)
    out = []
    for source, errors in sorted(by_source.items()):
        absolute = [abs(e) for e in errors]
        median, worst = statistics.median(absolute), max(absolute)
        enough = len(errors) >= MIN_ROWS_FOR_MEDIAN_GOAL
        out.append(
            SourceSummary(
                source=source,
                rows=len(errors),
                mean_error=statistics.fmean(errors),
                mean_abs_error=statistics.fmean(absolute),
                median_abs_error=median,
                max_abs_error=worst,
                goal_met=(median <= MEDIAN_GOAL and worst <= MAX_GOAL) if enough else None,
            )
        )
    return out
