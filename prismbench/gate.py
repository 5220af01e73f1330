"""The pre-merge performance gate: the same job before and after a change, against thresholds.

`gate(reference, candidate, thresholds)` compares two emulation results (dicts in the emulate
JSON contract) field by field. `read_side(path)` reads one side, a saved `emulate --json` file
or a job spec (TOML), and `check_fields` checks the thresholds against it, both before
anything is emulated; `result_of` then emulates a job spec here (captures cached). A field
crossing its threshold fails the gate (`prismbench gate` exits 1); so does a candidate
predicted to run out of memory, whatever the thresholds (the row `FITS`, always there: a
change that makes a job not fit is the first thing a gate must catch); bad input exits 2.
Sides whose jobs differ in size (GPUs, GPU memory, pipeline stages) are said so, not failed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from emulator.costs.kernel_table import PRICE_SOURCES
from emulator.graph.results import BREAKDOWN_FIELDS
from prismbench.emulate import RESULT_SCHEMA_VERSION, EmulationResult
from prismbench.spec import JobSpec, load_job_spec
from prismbench.thresholds import Threshold, field_value
from workloads.config import SpecError, is_finite_number

FITS = "fits in memory (always checked)"


@dataclass(frozen=True)
class GateRow:
    """One threshold: both values, the relative change, whether it held."""

    threshold: str
    field: str
    reference: float
    candidate: float
    change: float | None  # (candidate - reference) / reference; None when reference is 0
    passed: bool


@dataclass(frozen=True)
class LayoutDifference:
    """A figure of a job's size (named as in the emulate JSON) that differs between the sides."""

    field: str
    reference: float
    candidate: float


@dataclass(frozen=True)
class GateResult:
    reference: str
    candidate: str
    rows: list[GateRow]
    layout_differences: tuple[LayoutDifference, ...] = ()

    @property
    def passed(self) -> bool:
        return all(row.passed for row in self.rows)

    def to_dict(self) -> dict:
        return {
            "reference": self.reference,
            "candidate": self.candidate,
            "passed": self.passed,
            "rows": [_json_row(row) for row in self.rows],
            "layout_differences": [asdict(d) for d in self.layout_differences],
        }


def _json_row(row: GateRow) -> dict:
    """A row for `gate --json`: a figure that is no number (NaN, inf) is null there, as JSON has
    none (json.dumps would write NaN, which strict parsers such as jq refuse)."""
    return {
        key: None if isinstance(value, float) and not math.isfinite(value) else value
        for key, value in asdict(row).items()
    }


# the figures every emulate result has above zero: a saved result with one at or below it (or
# not a number) is no emulation's, and gating it would report a move that never happened
POSITIVE_RESULT_FIELDS = (
    "world_size",
    "iteration_time_s",
    "peak_memory_allocated_bytes",
    "peak_memory_reserved_bytes",
    "first_iteration_peak_memory_reserved_bytes",
    "gpu_capacity_bytes",
)


def read_side(path: str | Path, *, load_job: Callable[[Path], JobSpec] = load_job_spec):
    """One side of the gate, checked without emulating it: a validated JobSpec for a job spec
    (.toml, read by `load_job`: the CLI's also takes a baseline file's [job] table), or the
    emulate-JSON dict of a saved result. Both sides are read before either is emulated, so a
    bad second side is refused before the first one's emulation runs."""
    path = Path(path)
    if path.is_dir():
        raise SpecError(f"{path}: is a directory (give a job spec .toml or an emulate --json file)")
    if not path.is_file():
        raise SpecError(f"{path}: no such file (give a job spec .toml or an emulate --json file)")
    if path.suffix == ".toml":
        return load_job(path)
    try:
        result = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise SpecError(
            f"{path}: not JSON ({err}); give a job spec .toml or an emulate --json file"
        ) from None
    version = result.get("schema_version") if isinstance(result, dict) else None
    if version != RESULT_SCHEMA_VERSION:
        raise SpecError(
            f"{path}: schema_version={version!r}, this prismbench reads emulate results of "
            f"version {RESULT_SCHEMA_VERSION}; emulate the job again"
        )
    if not isinstance(result.get("oom"), bool):  # the row FITS reads it on every gate
        raise SpecError(
            f"{path}: oom={result.get('oom')!r} must be true or false (whether the job runs "
            "out of memory, which the gate always checks); emulate the job again"
        )
    for name in POSITIVE_RESULT_FIELDS:
        value = result.get(name)
        if not is_finite_number(value) or value <= 0:
            raise SpecError(
                f"{path}: {name}={value!r} must be a finite number > 0, as every emulate result's "
                "is (an edited or broken file would be gated as a real move); emulate the job again"
            )
    return result


def result_of(side, path: str | Path, *, progress=None) -> dict:
    """`read_side`'s answer as an emulate-JSON dict: a job spec emulated here (captures cached)."""
    if isinstance(side, dict):
        return side
    from prismbench.emulate import emulate

    return emulate(side, name=Path(path).stem, progress=progress).to_dict()


def check_fields(side, path: str | Path, thresholds: list[Threshold]) -> None:
    """Refuse, before any emulation, a threshold field `side` cannot have: on a saved result
    the field itself, on a job spec (not emulated yet) a numeric field of the emulate JSON
    contract (`numeric_result_fields`)."""
    if isinstance(side, dict):
        for t in thresholds:
            field_value(side, t.field, where=str(path))
        return
    known = numeric_result_fields()
    for t in thresholds:
        if t.field not in known:
            raise SpecError(
                f"{path}: an emulate result has no field {t.field!r} that is a number; its "
                f"numeric fields: {', '.join(known)}"
            )


def numeric_result_fields() -> list[str]:
    """The numeric fields every emulate result has, dotted, known before any emulation: its int
    and float fields (EmulationResult's annotations), the breakdown's categories, and the ops
    and time of each pricing source. A job spec's field is checked against them, not after
    both sides' emulations (minutes each for a large job)."""
    scalars = [f.name for f in fields(EmulationResult) if f.type in ("int", "float")]
    return [
        "schema_version",
        *scalars,
        *(f"breakdown.{name}" for name in BREAKDOWN_FIELDS),
        *(f"compute_priced_by.{source}.{kind}" for source in PRICE_SOURCES for kind in ("ops", "time_s")),
    ]


def gate(reference: dict, candidate: dict, thresholds: list[Threshold], *,
         names: tuple[str, str] = ("reference", "candidate")) -> GateResult:  # fmt: skip
    """Compare `candidate` with `reference` on each threshold's field."""
    rows = []
    for t in thresholds:
        ref = field_value(reference, t.field, where=names[0])
        cand = field_value(candidate, t.field, where=names[1])
        if ref == 0:
            change, passed = None, _holds_from_zero(t, cand)
        else:
            change = (cand - ref) / abs(ref)
            passed = not t.crossed(change)
        rows.append(GateRow(str(t), t.field, ref, cand, change, passed))
    ref_oom, cand_oom = bool(reference["oom"]), bool(candidate["oom"])
    rows.append(GateRow(FITS, "oom", float(ref_oom), float(cand_oom), None, not cand_oom))
    return GateResult(names[0], names[1], rows, layout_differences(reference, candidate))


def layout_differences(reference: dict, candidate: dict) -> tuple[LayoutDifference, ...]:
    """Where the two results' jobs differ in size: the GPUs, each GPU's memory, the pipeline
    stages (a class each). A result names its job after its file, so these are what tells one
    job gated across a change from two unrelated results; said, not failed, as two layouts of
    one model are also gated on purpose."""
    sizes = {
        "world_size": lambda r: r["world_size"],
        "gpu_capacity_bytes": lambda r: r["gpu_capacity_bytes"],
        "pipeline_stages": lambda r: len(r["per_class"]) if "per_class" in r else None,
    }
    differences = []
    for field, size in sizes.items():
        before, after = size(reference), size(candidate)
        if None not in (before, after) and before != after:
            differences.append(LayoutDifference(field, before, after))
    return tuple(differences)


def _holds_from_zero(threshold: Threshold, candidate: float) -> bool:
    """Whether a move from a reference of 0 keeps within `threshold`: it has no relative size,
    only a direction, so any rise breaks a bound on rises (+X %, X %) and any fall one on falls
    (-X %, X %); no move (0) keeps every bound and a NaN none."""
    if candidate > 0:
        return threshold.sign == "-"
    if candidate < 0:
        return threshold.sign == "+"
    return candidate == 0
