"""Predicted vs measured compute, op class by op class: where the emulator's time goes wrong.

`compare_profile(job, profile)` captures the job, prices every compute row as `emulate` does
(kernel table, then roofline; `emulator.costs.pricing`) but without the time a stream idles
between kernels, which a profile's kernel records do not hold either, aligns the rows with a torch.profiler
record of a real run of the same program (`prismbench.profile_ingest.align_profile`) and sums,
per op class (normalized op and the aten op the capture records), the predicted and the
measured GPU time. The kernels of a custom op's compiled code (Inductor's `triton_*` kernels,
which the profiler lists under no aten op) count for that op (`prismbench.compiled_calls`).
Ops on one side only are kept, not dropped: measured kernels with no captured op (a GPU-only
kernel; an Inductor kernel no custom op launched is of class "triton") and captured ops with
no measured kernel (work a GPU never launches) count in their class's totals, so the totals
are the whole iteration's compute on each side. Classes are listed largest absolute error
first.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

from emulator.costs.kernel_table import PRICE_SOURCES, KernelTable
from emulator.costs.pricing import compute_prices
from prismbench.profile_readers import read_profile_iterations


@dataclass(frozen=True)
class ClassComparison:
    """One op class: counts, predicted and measured seconds, and how its ops were priced."""

    op: str
    aten: str
    trace_ops: int
    profile_ops: int
    matched: int
    predicted_s: float
    measured_s: float
    priced_by: dict[str, int]

    @property
    def error_s(self) -> float:
        return self.predicted_s - self.measured_s


@dataclass(frozen=True)
class Comparison:
    """The whole iteration's compute, per class and in total (seconds)."""

    job: str
    profile: str
    kernel_table: str
    classes: list[ClassComparison]
    # the table holds rows of this very profile (their `source`, `profile_source`): its ops
    # are priced by their own measurement, so the error says little about other jobs
    in_sample_source: str | None = None
    # the iterations the profile holds; its first is the one compared (one predicted iteration)
    profile_iterations: int = 1

    @property
    def predicted_s(self) -> float:
        return sum(c.predicted_s for c in self.classes)

    @property
    def measured_s(self) -> float:
        return sum(c.measured_s for c in self.classes)

    @property
    def error(self) -> float | None:
        """(predicted - measured) / measured compute (docs/METRICS.md); None where nothing
        was measured."""
        return (self.predicted_s - self.measured_s) / self.measured_s if self.measured_s else None

    def to_dict(self) -> dict:
        return {
            "job": self.job,
            "profile": self.profile,
            "kernel_table": self.kernel_table,
            "in_sample_source": self.in_sample_source,
            "predicted_compute_s": self.predicted_s,
            "measured_kernel_s": self.measured_s,
            "error": self.error,
            "classes": [asdict(c) | {"error_s": c.error_s} for c in self.classes],
            "profile_iterations": self.profile_iterations,
        }


def compare_ops(ops, trace, cost, aligned=None) -> list[ClassComparison]:
    """Per-class totals over one trace and one profile's ops (the work of `compare_profile`;
    `aligned`: their `align_profile`, where the caller has it)."""
    from prismbench.profile_ingest import align_profile, aten_packet

    aligned = aligned or align_profile(ops, trace)
    durations, sources = compute_prices(trace, cost)
    c = trace.columns
    matched_ops, matched_rows = aligned.matched_ops, aligned.matched_rows
    acc: dict[tuple[str, str], dict] = defaultdict(
        lambda: {
            "trace_ops": 0,
            "profile_ops": 0,
            "matched": 0,
            "predicted_s": 0.0,
            "measured_s": 0.0,
            "priced_by": dict.fromkeys(PRICE_SOURCES, 0),
        }  # fmt: skip
    )
    row_class = {}
    for j, row in enumerate(aligned.compute_rows):
        key = (trace.strings[c["name"][row]], trace.strings[c["aten"][row]])
        row_class[j] = key
        entry = acc[key]
        entry["trace_ops"] += 1
        entry["predicted_s"] += float(durations[row])
        entry["priced_by"][PRICE_SOURCES[sources[row]]] += 1
        entry["matched"] += j in matched_rows
    owner = {i: row_class[j] for i, j in aligned.pairs}
    for i, op in enumerate(aligned.ops):
        if i in matched_ops:
            key = owner[i]
        else:
            key = (aligned.keys[i][0], aten_packet(op.op))
        acc[key]["profile_ops"] += 1
        acc[key]["measured_s"] += op.kernel_us * 1e-6
    classes = [ClassComparison(op=k[0], aten=k[1], **v) for k, v in acc.items()]
    return sorted(classes, key=lambda x: -abs(x.error_s))


def compare_profile(
    job,
    profile_path: str | Path,
    *,
    name: str = "job",
    kernel_table: KernelTable | None | str = "preset",
) -> Comparison:
    """Capture `job` (class 0's trace: the profiled rank is one of it), price it, and compare
    with the profile, per op class. kernel_table as in `prismbench.emulate.emulate`. A profile
    that is not one of the job, or was measured on another GPU, is refused
    (`prismbench.profile_ingest.check_profile_of_job`); a table holding the
    profile's own rows is said (`Comparison.in_sample_source`)."""
    from prismbench.emulate import cost_context
    from prismbench.profile_ingest import check_profile_of_job, profile_source

    cost = cost_context(job, kernel_table, kernel_gap_s=0.0)
    iterations = read_profile_iterations(profile_path)
    ops = iterations[0]
    trace, aligned = check_profile_of_job(profile_path, ops, job, f"the job {name}")
    source = profile_source(profile_path)
    return Comparison(
        job=name,
        profile=str(profile_path),
        kernel_table="" if cost.table is None else cost.table.label,
        classes=compare_ops(ops, trace, cost, aligned),
        in_sample_source=source if cost.table is not None and source in cost.table.sources else None,
        profile_iterations=len(iterations),
    )
