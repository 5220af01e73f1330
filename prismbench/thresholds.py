"""One threshold grammar for `prismbench gate --fail` and `validate --gate`.

A threshold list is comma-separated `FIELD:BOUND` items; FIELD is a numeric field of the
emulate JSON (`prismbench emulate --json`; nested fields with dots: `breakdown.compute_s`);
BOUND is a percentage of the reference value (gate: the reference run; validate: the
measurement):

- `FIELD:+X%` fails when the value rose by more than X % (candidate - reference > X % of it);
- `FIELD:-X%` fails when it fell by more than X %;
- `FIELD:X%`  fails when it moved by more than X % either way (an absolute error).

Examples: `iteration_time_s:+2%` (a merge may not slow the step by more than 2 %),
`peak_memory_reserved_bytes:+1%,tokens_per_s:-2%`, `iteration_time_s:5%` (a prediction
within 5 % of the measurement).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from workloads.config import SpecError

_ITEM = re.compile(r"^(?P<field>[A-Za-z_][\w.]*):(?P<sign>[+-]?)(?P<pct>\d+(?:\.\d+)?)%$")


@dataclass(frozen=True)
class Threshold:
    """A bound on the relative change of one field; `sign` is "+", "-" or "" (either way)."""

    field: str
    sign: str
    percent: float

    def crossed(self, change: float, *, slack_below: float = 0.0, slack_above: float = 0.0) -> bool:
        """Whether a relative change (0.03 = +3 %) breaks this bound, its upward limit widened
        by `slack_above` and its downward one by `slack_below` (validate: how far the
        measurement's own iterations reached above and below their median); a change that is
        no number (a NaN figure on either side) breaks every bound."""
        if not math.isfinite(change):
            return True
        rise = self.sign != "-" and change > self.percent / 100 + slack_above
        fall = self.sign != "+" and change < -(self.percent / 100 + slack_below)
        return rise or fall

    def __str__(self) -> str:
        return f"{self.field}:{self.sign}{self.percent:g}%"


def parse_thresholds(text: str, *, option: str = "--fail") -> list[Threshold]:
    """`FIELD:+X%,FIELD:X%,...` -> thresholds; a malformed item is a SpecError naming it."""
    items = [item.strip() for item in text.split(",")]
    if not any(items):
        raise SpecError(f"{option}={text!r}: give at least one FIELD:+X% or FIELD:X% item")
    if not all(items):
        raise SpecError(f"{option}={text!r}: an empty item between commas; drop the extra comma")
    out = []
    for item in items:
        match = _ITEM.match(item)
        if match is None:
            raise SpecError(
                f"{option}: {item!r} must be FIELD:+X% (bounds a rise), FIELD:-X% (a fall) or "
                "FIELD:X% (either way), e.g. iteration_time_s:+2%"
            )
        out.append(Threshold(match["field"], match["sign"], float(match["pct"])))
    return out


def field_value(result: dict, field: str, *, where: str) -> float:
    """The numeric value of a dotted `field` of an emulate-JSON dict; a SpecError names the
    field and the fields that exist when it is absent or not a number."""
    value = result
    for part in field.split("."):
        if not isinstance(value, dict) or part not in value:
            known = sorted(numeric_fields(result))
            raise SpecError(f"{where}: no numeric field {field!r}; known: {', '.join(known)}")
        value = value[part]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(f"{where}: field {field!r} is {type(value).__name__}, not a number")
    return float(value)


def numeric_fields(result: dict, prefix: str = "") -> list[str]:
    """Dotted names of the numeric fields of a dict (nested dicts followed, lists not)."""
    names = []
    for key, value in result.items():
        if isinstance(value, dict):
            names += numeric_fields(value, f"{prefix}{key}.")
        elif isinstance(value, int | float) and not isinstance(value, bool):
            names.append(f"{prefix}{key}")
    return names
