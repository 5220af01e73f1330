"""Baselines: a published measurement, the job spec that produced it, and where it comes from.

A baseline is one TOML file under `results/baselines/` (written by
`results/baselines/make_baselines.py` from the published CSV) with three tables:

- `[job]`: a complete job spec, the same sub-tables as a job-spec file (`[job.model]`,
  `[job.parallel]`, `[job.batch]`, `[job.train]`, `[job.kernels]`, `[job.cluster]`).
- `[measured]`: only the figures the source gives. `iteration_time_s`,
  `tokens_per_s_per_gpu`, `tflops_per_gpu` with `tflops_kind` ("model": model FLOPs only;
  "hardware": the recompute pass counted too), `mfu` (a fraction) with `mfu_kind` (the same
  two kinds: which FLOPs the utilisation counts), `peak_mem_bytes` with `peak_mem_kind`
  ("allocator_reserved": PyTorch's caching-allocator reserved bytes; "nvidia_smi": the
  nvidia-smi figure, which adds the CUDA context and anything outside the allocator).
- `[provenance]`: `source` (verbatim from the CSV), `csv_row` (line number in
  `published_baselines.csv`, header = line 1), `model` (as the source names it), `notes`
  (verbatim), `approximate` (the source itself calls a figure approximate), `derived`
  (measured field -> how it was worked out), `assumptions` (spec inputs the row does not
  state, and why the value chosen stands).

Recorded baselines (measured by us, `results/baselines/recorded/`) have `kind = "recorded"`
in `[provenance]` with `machine`, `software`, `commit` and `date` instead of `csv_row`, and
may give the spread of repeated runs in `[measured]`: `iterations`, `iteration_time_s_min`,
`iteration_time_s_max` (`iteration_time_s` is then their median). `measured.device = "cpu"`
marks a run on this machine's CPU (`prismbench record --device cpu`): the emulator predicts the
job's GPU, so `validate` runs such a case but scores none of its figures; the default, "gpu",
means the job's `cluster.gpu`. A GPU recording may also give the caching allocator's other
peaks of its largest rank (`ALLOCATOR_PEAKS`, named as the emulator's figures they are scored
against): the steady state's allocated bytes and the first iteration's reserved and allocated
bytes, beside the steady reserved peak in `peak_mem_bytes`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from prismbench.spec import JobSpec, SpecError, job_spec_from_dict

FLOPS_KINDS = ("model", "hardware")
# allocator_*: PyTorch's caching allocator (reserved, or allocated tensors); nvidia_smi: the
# device total; cpu_max_rss: a CPU run's largest process's resident set (`prismbench record`).
PEAK_MEM_KINDS = ("allocator_reserved", "allocator_allocated", "nvidia_smi", "cpu_max_rss")
PROVENANCE_KINDS = ("published", "recorded")
# Where the figures were measured: "gpu", the job's cluster.gpu (what the emulator predicts);
# "cpu", a CPU run (`prismbench record --device cpu`), which tests the harness, not the emulator.
MEASURED_DEVICES = ("gpu", "cpu")
RECORDED_FIELDS = ("machine", "software", "commit", "date")
FIGURES = ("iteration_time_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu", "peak_mem_bytes")
# A GPU recording's further allocator peaks (bytes, largest rank), each named as the emulate
# figure it is scored against (prismbench.validate.case_metrics)
ALLOCATOR_PEAKS = (
    "peak_memory_allocated_bytes",
    "first_iteration_peak_memory_reserved_bytes",
    "first_iteration_peak_memory_allocated_bytes",
)
# Which predicted figure a measured peak-memory kind is compared with (emulate JSON fields);
# a CPU run's resident set (cpu_max_rss) has none: the emulator predicts GPU memory.
PEAK_MEMORY_FIELD = {
    "allocator_reserved": "peak_memory_reserved_bytes",
    "allocator_allocated": "peak_memory_allocated_bytes",
    "nvidia_smi": "device_total_estimate_bytes",
}
_KIND_OF = {"tflops_per_gpu": "tflops_kind", "mfu": "mfu_kind", "peak_mem_bytes": "peak_mem_kind"}
_KIND_CHOICES = {
    "tflops_kind": FLOPS_KINDS,
    "mfu_kind": FLOPS_KINDS,
    "peak_mem_kind": PEAK_MEM_KINDS,
}
_TABLES = ("job", "measured", "provenance")

__all__ = ["Baseline", "BaselineError", "Measured", "Provenance", "baseline_to_toml",
           "load_baseline", "load_baselines"]  # fmt: skip


class BaselineError(ValueError):
    """An invalid baseline file: the message names the file, the field and the rule."""


def _check_number(name: str, value: Any, *, integer: bool = False) -> None:
    kinds = int if integer else (int, float)
    if (
        isinstance(value, bool)
        or not isinstance(value, kinds)
        or not math.isfinite(value)
        or value <= 0
    ):
        what = "a positive integer" if integer else "a positive number"
        raise BaselineError(f"measured.{name}={value!r} must be {what}")


@dataclass(frozen=True, kw_only=True)
class Measured:
    """The figures a source reports for one run; None where it reports nothing."""

    iteration_time_s: float | None = None
    tokens_per_s_per_gpu: float | None = None
    tflops_per_gpu: float | None = None
    tflops_kind: str | None = None
    mfu: float | None = None
    mfu_kind: str | None = None
    peak_mem_bytes: int | None = None
    peak_mem_kind: str | None = None
    # Repeated runs (recorded baselines): how many timed iterations, and their extremes.
    iterations: int | None = None
    iteration_time_s_min: float | None = None
    iteration_time_s_max: float | None = None
    peak_memory_allocated_bytes: int | None = None
    first_iteration_peak_memory_reserved_bytes: int | None = None
    first_iteration_peak_memory_allocated_bytes: int | None = None
    device: str = "gpu"

    def __post_init__(self) -> None:
        if self.device not in MEASURED_DEVICES:
            raise BaselineError(
                f"measured.device={self.device!r} must be one of {list(MEASURED_DEVICES)}"
            )
        self._check_spread()
        given = [name for name in FIGURES if getattr(self, name) is not None]
        if not given:
            raise BaselineError(
                f"measured: no figure given; at least one of {list(FIGURES)} is needed"
            )
        for name in given:
            _check_number(name, getattr(self, name), integer=name == "peak_mem_bytes")
        peaks = [name for name in ALLOCATOR_PEAKS if getattr(self, name) is not None]
        for name in peaks:
            _check_number(name, getattr(self, name), integer=True)
        twice = PEAK_MEMORY_FIELD.get(self.peak_mem_kind or "")
        if twice in peaks:
            raise BaselineError(
                f"measured.{twice} and measured.peak_mem_bytes with peak_mem_kind="
                f"{self.peak_mem_kind!r} give one figure twice: give it once"
            )
        if peaks and self.device != "gpu":
            raise BaselineError(
                f"measured.{peaks[0]} with measured.device={self.device!r}: the caching "
                "allocator's peaks are a GPU run's figures"
            )
        if self.mfu is not None and self.mfu > 1:
            raise BaselineError(
                f"measured.mfu={self.mfu!r} must be a fraction in (0, 1], not a percentage"
            )
        for figure, kind_name in _KIND_OF.items():
            kind = getattr(self, kind_name)
            if getattr(self, figure) is None:
                if kind is not None:
                    raise BaselineError(
                        f"measured.{kind_name}={kind!r} given without measured.{figure}"
                    )
            elif kind not in _KIND_CHOICES[kind_name]:
                raise BaselineError(
                    f"measured.{kind_name}={kind!r} must be one of {list(_KIND_CHOICES[kind_name])} "
                    f"(measured.{figure} is given)"
                )
        if self.peak_mem_kind and (self.peak_mem_kind == "cpu_max_rss") != (self.device == "cpu"):
            raise BaselineError(
                f"measured.peak_mem_kind={self.peak_mem_kind!r} with measured.device="
                f"{self.device!r}: cpu_max_rss is a CPU run's figure, the others a GPU's (a CPU "
                'recording made before measured.device existed: add device = "cpu")'
            )

    def _check_spread(self) -> None:
        spread = (self.iterations, self.iteration_time_s_min, self.iteration_time_s_max)
        if all(v is None for v in spread):
            return
        if any(v is None for v in spread) or self.iteration_time_s is None:
            raise BaselineError(
                "measured: iterations, iteration_time_s_min and iteration_time_s_max go together, "
                "with iteration_time_s (their median)"
            )
        _check_number("iterations", self.iterations, integer=True)
        _check_number("iteration_time_s_min", self.iteration_time_s_min)
        _check_number("iteration_time_s_max", self.iteration_time_s_max)
        if not self.iteration_time_s_min <= self.iteration_time_s <= self.iteration_time_s_max:
            raise BaselineError(
                f"measured: iteration_time_s_min <= iteration_time_s <= iteration_time_s_max is "
                f"false ({self.iteration_time_s_min}, {self.iteration_time_s}, {self.iteration_time_s_max})"
            )

    @property
    def predicted_by_emulator(self) -> bool:
        """Whether the emulator predicts these figures: measured on the job's GPU, not a CPU."""
        return self.device == "gpu"

    @property
    def iteration_time_relative_range(self) -> tuple[float, float]:
        """How far below and above the median the timed iterations reached, over the median:
        ((median - min) / median, (max - median) / median); (0, 0) where one figure was
        reported."""
        if self.iteration_time_s_min is None:
            return 0.0, 0.0
        median = self.iteration_time_s
        return (median - self.iteration_time_s_min) / median, (
            self.iteration_time_s_max - median
        ) / median

    @property
    def iteration_time_relative_spread(self) -> float:
        """Half the measured range over the median (0 where one figure was reported)."""
        return sum(self.iteration_time_relative_range) / 2

    def to_dict(self) -> dict[str, Any]:
        figures = dataclasses.asdict(self)
        if self.device == "gpu":  # the default, left out of the 230 published files
            del figures["device"]
        return {k: v for k, v in figures.items() if v is not None}


@dataclass(frozen=True, kw_only=True)
class Provenance:
    """Where a measurement comes from and what in it was worked out rather than read."""

    source: str
    model: str
    csv_row: int | None = None  # published: the line of published_baselines.csv
    kind: str = "published"
    notes: str = ""
    approximate: bool = False
    derived: Mapping[str, str] = field(default_factory=dict)
    assumptions: tuple[str, ...] = ()
    # recorded: where and with what it was measured
    machine: str = ""
    software: str = ""
    commit: str = ""
    date: str = ""

    def __post_init__(self) -> None:
        for name in ("source", "model"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise BaselineError(f"provenance.{name} must be a non-empty string")
        if not isinstance(self.notes, str):
            raise BaselineError(f"provenance.notes={self.notes!r} must be a string")
        if self.kind not in PROVENANCE_KINDS:
            raise BaselineError(f"provenance.kind={self.kind!r} must be one of {list(PROVENANCE_KINDS)}")
        if self.kind == "recorded":
            for name in RECORDED_FIELDS:
                if not isinstance(getattr(self, name), str) or not getattr(self, name):
                    raise BaselineError(f"provenance.{name} must be a non-empty string for a recorded baseline")
        elif isinstance(self.csv_row, bool) or not isinstance(self.csv_row, int) or self.csv_row < 2:
            raise BaselineError(
                f"provenance.csv_row={self.csv_row!r} must be a CSV line number >= 2"
            )
        self._refuse_other_kinds_fields()
        if not isinstance(self.approximate, bool):
            raise BaselineError(f"provenance.approximate={self.approximate!r} must be a boolean")
        if not isinstance(self.derived, Mapping) or not all(
            isinstance(v, str) and v for v in self.derived.values()
        ):
            raise BaselineError(
                "provenance.derived must map measured fields to how each was derived"
            )
        unknown = sorted(set(self.derived) - set(FIGURES))
        if unknown:
            raise BaselineError(
                f"provenance.derived: {unknown} are not measured figures {list(FIGURES)}"
            )
        object.__setattr__(self, "derived", MappingProxyType(dict(self.derived)))
        # a string or a table iterates too (by character, by key): only a list is one
        if not isinstance(self.assumptions, list | tuple) or not all(
            isinstance(a, str) and a for a in self.assumptions
        ):
            raise BaselineError(
                f"provenance.assumptions={self.assumptions!r} must be a list of non-empty strings"
            )
        object.__setattr__(self, "assumptions", tuple(self.assumptions))

    def _refuse_other_kinds_fields(self) -> None:
        """A field of the other kind of baseline would be kept here and dropped by `to_dict`
        (and read by nothing): a recorded baseline has no CSV row and states no approximate
        figure of a source; a published one has no machine, software, commit or date."""
        if self.kind == "recorded":
            given = {"csv_row": self.csv_row is not None, "approximate": self.approximate}
        else:
            given = {name: getattr(self, name) != "" for name in RECORDED_FIELDS}
        stray = [name for name, is_given in given.items() if is_given]
        if stray:
            raise BaselineError(
                f"provenance: {stray} are not fields of a {self.kind} baseline "
                f"(provenance.kind={self.kind!r})"
            )

    def to_dict(self) -> dict[str, Any]:
        if self.kind == "recorded":
            return {
                "kind": self.kind, "source": self.source, "model": self.model, "notes": self.notes,
                **{name: getattr(self, name) for name in RECORDED_FIELDS},
                "derived": dict(self.derived), "assumptions": list(self.assumptions),
            }  # fmt: skip
        return {
            "source": self.source, "csv_row": self.csv_row, "model": self.model, "notes": self.notes,
            "approximate": self.approximate, "derived": dict(self.derived),
            "assumptions": list(self.assumptions),
        }  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Baseline:
    """One published measurement and the job it measured; `name` is the file's stem."""

    name: str
    job: JobSpec
    measured: Measured
    provenance: Provenance

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise BaselineError(f"baseline name={self.name!r} must be a non-empty string")
        for name in self.provenance.derived:
            if getattr(self.measured, name) is None:
                raise BaselineError(
                    f"provenance.derived names {name}, which measured does not give"
                )

    def to_dict(self) -> dict[str, Any]:
        """The baseline as TOML-compatible tables (what its file holds; the name is the file's)."""
        return {
            "job": self.job.to_dict(),
            "measured": self.measured.to_dict(),
            "provenance": self.provenance.to_dict(),
        }


def _refuse_unknown(section: str, table: Any, cls: type) -> None:
    if not isinstance(table, dict):
        raise BaselineError(f"[{section}] must be a table")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(table) - known)
    if unknown:
        raise BaselineError(f"{section}: unknown key(s) {unknown}; known keys are {sorted(known)}")


def baseline_from_dict(name: str, tables: Mapping[str, Any]) -> Baseline:
    """Build and validate a Baseline from parsed tables; unknown tables and keys are refused."""
    unknown = sorted(set(tables) - set(_TABLES))
    if unknown:
        raise BaselineError(
            f"baseline: unknown table(s) {unknown}; known tables are {list(_TABLES)}"
        )
    missing = [t for t in _TABLES if t not in tables]
    if missing:
        raise BaselineError(f"baseline: table(s) {missing} are missing")
    if not isinstance(tables["job"], dict):
        raise BaselineError("[job] must be a table")
    try:
        job = job_spec_from_dict(tables["job"])
    except SpecError as err:
        raise BaselineError(f"job: {err}") from None
    _refuse_unknown("measured", tables["measured"], Measured)
    _refuse_unknown("provenance", tables["provenance"], Provenance)
    try:
        return Baseline(
            name=name,
            job=job,
            measured=Measured(**tables["measured"]),
            provenance=Provenance(**tables["provenance"]),
        )
    except TypeError as err:  # a required provenance key is missing
        raise BaselineError(f"provenance: {err}") from None


def is_baseline_file(path: str | Path) -> bool:
    """Whether `path` is a TOML file with a baseline's `[job]` and `[measured]` tables (False
    for anything unreadable: the job spec reader then says what is wrong with it)."""
    try:
        tables = tomllib.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False
    return isinstance(tables.get("job"), dict) and "measured" in tables


def load_baseline(path: str | Path) -> Baseline:
    """Read one baseline file; every error names the path."""
    path = Path(path)
    try:
        tables = tomllib.loads(path.read_text())
        return baseline_from_dict(path.stem, tables)
    except FileNotFoundError:
        raise BaselineError(f"baseline {str(path)!r}: no such file") from None
    except tomllib.TOMLDecodeError as err:
        raise BaselineError(f"baseline {str(path)!r}: invalid TOML: {err}") from None
    except UnicodeDecodeError as err:  # TOML is UTF-8 text: a binary or Latin-1 file is not
        raise BaselineError(f"baseline {str(path)!r}: not UTF-8 text ({err})") from None
    except BaselineError as err:
        raise BaselineError(f"baseline {str(path)!r}: {err}") from None


def load_baselines(directory: str | Path) -> tuple[Baseline, ...]:
    """Every `*.toml` baseline in `directory`, sorted by name."""
    return tuple(load_baseline(path) for path in sorted(Path(directory).glob("*.toml")))


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        if isinstance(value, float) and not math.isfinite(value):
            raise BaselineError(f"cannot write the non-finite number {value!r} to TOML")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # JSON escapes are valid TOML basic strings
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise BaselineError(f"cannot write {type(value).__name__} {value!r} to TOML")


def _toml_table(prefix: str, table: Mapping[str, Any], lines: list[str]) -> None:
    lines.append(f"[{prefix}]")
    nested = {k: v for k, v in table.items() if isinstance(v, Mapping)}
    for key, value in table.items():
        if key in nested:
            continue
        if isinstance(value, list | tuple) and len(value) > 1:  # one item a line, for diffs
            lines += [f"{key} = [", *(f"    {_toml_value(v)}," for v in value), "]"]
        else:
            lines.append(f"{key} = {_toml_value(value)}")
    lines.append("")
    for key, value in nested.items():
        _toml_table(f"{prefix}.{key}", value, lines)


def baseline_to_toml(baseline: Baseline, header: str = "") -> str:
    """The baseline's file text (deterministic: key order as in `to_dict`)."""
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    if lines:
        lines.append("")
    for name, table in baseline.to_dict().items():
        _toml_table(name, table, lines)
    return "\n".join(lines).rstrip("\n") + "\n"
