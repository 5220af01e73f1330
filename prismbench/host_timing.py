"""Host (CPU) time per GPU op, measured from torch.profiler records of real runs.

The host thread that runs an eager PyTorch program issues one launching op after another; the
time from one launching op's CPU start to the next one's is what the host spends per GPU op
(dispatcher, Python between ops, allocator, the launch itself, and the ops that launch nothing
in between). This module reads those intervals from the shared profiles and sums them up per
op class, for `emulator.costs.host_dispatch`:

- *class* `forward`, `backward` (autograd's engine thread: backward ops and the forward ops that
  activation checkpointing re-runs there), `optimizer` (grad clipping and the optimizer step:
  foreach ops on the main thread);
- *framework* `aten` (plain tensors: the eight shared world-size-1 profiles) or `dtensor`
  (tensor-parallel DTensor ranks: the shared `fake-pg-ranks/*.hostops.jsonl.gz`).

Phases. A `hostops` file lists every CPU event with its inclusive duration, so a launching op is
`backward` when an `autograd::engine::evaluate_function: ...` event encloses it and `optimizer`
when `Optimizer.step#...` does or it is a foreach op (grad clipping). The `ops.jsonl` profiles list
launching ops only; there the phases follow from the op names: `optimizer` from the first
`aten::_foreach_*` op on, `backward` from an op named `*backward*` until the forward starts again
(the iteration's second and third launching ops recur: gradient accumulation). The interval that
crosses from one phase into another (the `.backward()` call starting the engine, zero_grad) is a
*phase entry*, kept apart from the per-op figures.

Profiler overhead: these records were taken under torch.profiler (CPU + CUDA activities,
record_shapes), which adds host time to every recorded event. The figures here are as recorded;
`emulator.costs.host_dispatch` says how the model scales them.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from emulator.costs.host_dispatch import CLASSES
from prismbench.profile_readers import OP_NAME, open_text

QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9, 0.99)
_ENGINE = "autograd::engine::evaluate_function"
_OPTIMIZER = "Optimizer.step#"
_FOREACH = "aten::_foreach_"


@dataclass(frozen=True)
class LaunchGaps:
    """The launching ops of one profiled iteration in host order: name, phase class, CPU start
    (us), kernel time (us), kernels launched; `gap_us[i]` = start[i + 1] - start[i] (the host
    time of op i)."""

    ops: list[str]
    classes: list[str]
    start_us: np.ndarray
    kernel_us: np.ndarray
    kernel_count: np.ndarray

    @property
    def gap_us(self) -> np.ndarray:
        return np.diff(self.start_us)

    def per_op_gaps(self, cls: str) -> np.ndarray:
        """Intervals from an op of `cls` to the next op of the same class."""
        same = np.array(
            [a == b == cls for a, b in zip(self.classes[:-1], self.classes[1:], strict=True)], bool
        )
        return self.gap_us[same] if len(same) else np.zeros(0)

    def entry_gaps(self, cls: str) -> np.ndarray:
        """Intervals that enter `cls` from another class (phase entries)."""
        enter = np.array(
            [a != b == cls for a, b in zip(self.classes[:-1], self.classes[1:], strict=True)], bool
        )
        return self.gap_us[enter] if len(enter) else np.zeros(0)


def _events(path: Path) -> list[dict]:
    with open_text(path) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _is_launch(event: dict) -> bool:
    return bool(event.get("kernels")) and bool(OP_NAME.match(event["op"]))


def _enclosed(events: list[dict], prefix: str, starts: np.ndarray) -> np.ndarray:
    """For each start time, whether an event whose name starts with `prefix` encloses it."""
    spans = sorted(
        (e["cpu_start_us"], e["cpu_start_us"] + e["cpu_us"])
        for e in events
        if e["op"].startswith(prefix)
    )
    if not spans:
        return np.zeros(len(starts), bool)
    begin = [s for s, _ in spans]
    reach = np.maximum.accumulate([e for _, e in spans])
    idx = np.array([bisect.bisect_right(begin, t) - 1 for t in starts.tolist()])
    return (idx >= 0) & (reach[np.maximum(idx, 0)] >= starts)


def _classes_from_markers(events: list[dict], launches: list[dict]) -> list[str]:
    starts = np.array([e["cpu_start_us"] for e in launches], float)
    backward = _enclosed(events, _ENGINE, starts)
    optimizer = _enclosed(events, _OPTIMIZER, starts)
    out = []
    for e, b, o in zip(launches, backward.tolist(), optimizer.tolist(), strict=True):
        out.append(
            "optimizer" if o or e["op"].startswith(_FOREACH) else "backward" if b else "forward"
        )
    return out


def _key(event: dict) -> tuple:
    return event["op"], json.dumps(event.get("shapes"))


def classes_from_names(launches: list[dict]) -> list[str]:
    """Phase classes of launching ops from their names alone (the module docstring's rule)."""
    first_foreach = next(
        (i for i, e in enumerate(launches) if e["op"].startswith(_FOREACH)), len(launches)
    )
    restart = tuple(_key(e) for e in launches[1:3])
    out, phase = [], "forward"
    for i, e in enumerate(launches):
        if i >= first_foreach:
            phase = "optimizer"
        elif phase == "forward" and "backward" in e["op"]:
            phase = "backward"
        elif phase == "backward" and tuple(_key(x) for x in launches[i : i + 2]) == restart:
            phase = "forward"
        out.append(phase)
    return out


def read_launch_gaps(path: str | Path) -> LaunchGaps:
    """The launching ops of a shared profile (`*.ops.jsonl.gz` or `*.hostops.jsonl.gz`) in host
    order, with their phase classes (engine/optimizer markers where the file has them)."""
    path = Path(path)
    events = _events(path)
    launches = sorted((e for e in events if _is_launch(e)), key=lambda e: e["cpu_start_us"])
    if len(launches) < 2:
        raise ValueError(f"{path}: fewer than two launching ops (op events with kernels)")
    has_markers = any(e["op"].startswith(_ENGINE) for e in events) and "cpu_us" in events[0]
    classes = (
        _classes_from_markers(events, launches) if has_markers else classes_from_names(launches)
    )
    return LaunchGaps(
        ops=[e["op"] for e in launches],
        classes=classes,
        start_us=np.array([e["cpu_start_us"] for e in launches], float),
        kernel_us=np.array([sum(us for _, us in e["kernels"]) for e in launches], float),
        kernel_count=np.array([len(e["kernels"]) for e in launches], np.int64),
    )


def summarize(values: np.ndarray) -> dict:
    """count, mean and quantiles (us) of a set of host intervals."""
    values = np.asarray(values, float)
    if not len(values):
        return {"count": 0}
    return {
        "count": int(len(values)),
        "mean_us": round(float(values.mean()), 2),
        **{f"p{round(q * 100)}_us": round(float(np.quantile(values, q)), 2) for q in QUANTILES},
        "sum_us": round(float(values.sum()), 1),
    }


def profile_figures(gaps: LaunchGaps) -> dict:
    """Per class: the per-op intervals and the phase entries, summarized; the whole span."""
    return {
        "launching_ops": len(gaps.ops),
        "host_span_us": round(float(gaps.start_us[-1] - gaps.start_us[0]), 1),
        "kernel_sum_us": round(float(gaps.kernel_us.sum()), 1),
        "kernels": int(gaps.kernel_count.sum()),
        "per_op": {c: summarize(gaps.per_op_gaps(c)) for c in CLASSES},
        "entry": {c: summarize(gaps.entry_gaps(c)) for c in CLASSES},
        "ops_per_class": {c: gaps.classes.count(c) for c in CLASSES},
    }
