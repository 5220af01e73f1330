"""What a golden holds for one job, and how it is read back and compared.

`record(job)` emulates the job and returns the `emulate --json` figures (without wall times)
and, per class, the trace normalised event for event (`capture_cases.normalised`) and the
allocator's memory timeline. `save`/`load` keep them as one compressed npz per job.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import numpy as np

from emulator.memory import replay_memory
from prismbench.capture import capture_job, default_cache_dir
from prismbench.emulate import emulate
from tests.prismbench.capture_cases import normalised

DATA = Path(__file__).resolve().parent / "data"
# not predictions: wall times, cache hits, the JSON contract's version
_NOT_PINNED = ("wall_s", "capture_wall_s", "capture_cached", "schema_version")
# The same code gives the same floats to the last bit or two only on the same machine:
# goldens recorded on one machine read 1 ulp off (3 of 11 jobs) on an AVX2-only AMD EPYC with
# the same commit and torch (reductions vectorised per CPU sum in another order).
# Any change of a prediction moves far more than this.
FLOAT_RTOL = 1e-12


def record(job, name: str) -> dict[str, np.ndarray]:
    """The golden arrays of `job`; the emulate figures are one JSON string under "figures"."""
    result = emulate(job, name=name, workers=1)
    figures = {k: v for k, v in result.to_dict().items() if k not in _NOT_PINNED}
    capture = capture_job(job, workers=1, cache_dir=default_cache_dir())
    out = {"figures": np.array(json.dumps(figures, sort_keys=True))}
    for p, trace in sorted(capture.traces.items()):
        rank = capture.world.representative(p)
        for key, column in normalised(trace, capture.world, rank).items():
            out[f"class{p}/trace/{key}"] = _plain(column)
        memory = replay_memory(trace, gpu=job.cluster.gpu, stage=p)
        timeline = asdict(memory.timeline)
        timeline["categories"] = np.array(timeline["categories"], dtype=str)
        for key, column in timeline.items():
            out[f"class{p}/memory/{key}"] = _plain(column)
    return out


def _plain(column) -> np.ndarray:
    """Object columns (decoded strings) as fixed-width unicode, so npz needs no pickle."""
    column = np.asarray(column)
    return column.astype(str) if column.dtype == object else column


def save(name: str, arrays: dict[str, np.ndarray]) -> Path:
    DATA.mkdir(exist_ok=True)
    path = DATA / f"{name}.npz"
    np.savez_compressed(path, **arrays)
    return path


def load(name: str) -> dict[str, np.ndarray]:
    with np.load(DATA / f"{name}.npz") as data:
        return {k: data[k] for k in data.files}


def differences(golden: dict[str, np.ndarray], now: dict[str, np.ndarray]) -> list[str]:
    """Where `now` differs from `golden`: missing or extra arrays, first unequal element.

    Floats are equal within `FLOAT_RTOL`, everything else exactly."""
    problems = [f"missing {k}" for k in golden.keys() - now.keys()]
    problems += [f"new {k}" for k in now.keys() - golden.keys()]
    for key in sorted(golden.keys() & now.keys()):
        a, b = golden[key], now[key]
        if key == "figures":
            problems += _figure_differences(json.loads(str(a)), json.loads(str(b)))
        elif a.shape != b.shape:
            problems.append(f"{key}: shape {a.shape} != {b.shape}")
        elif a.ndim == 0 and not _equal(a, b).all():
            problems.append(f"{key}: {a!r} != {b!r}")
        elif not _equal(a, b).all():
            i = np.flatnonzero(~np.all(_equal(a, b).reshape(len(a), -1), axis=1))[0]
            problems.append(f"{key}[{i}]: {a[i]!r} != {b[i]!r}")
    return problems


def _figure_differences(golden: dict, now: dict, prefix: str = "") -> list[str]:
    if isinstance(golden, dict) and isinstance(now, dict):
        keys = sorted(golden.keys() | now.keys())
        return [
            p for k in keys for p in _figure_differences(golden.get(k), now.get(k), f"{prefix}{k}.")
        ]
    if isinstance(golden, list) and isinstance(now, list) and len(golden) == len(now):
        return [
            p
            for i, (g, n) in enumerate(zip(golden, now, strict=True))
            for p in _figure_differences(g, n, f"{prefix}{i}.")
        ]
    if isinstance(golden, float) and isinstance(now, float):
        same = math.isclose(golden, now, rel_tol=FLOAT_RTOL, abs_tol=0.0)
    else:
        same = golden == now
    return [] if same else [f"figures.{prefix.rstrip('.')}: {golden!r} != {now!r}"]


def _equal(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.issubdtype(a.dtype, np.floating) and np.issubdtype(b.dtype, np.floating):
        return np.isclose(a, b, rtol=FLOAT_RTOL, atol=0.0, equal_nan=True)
    return np.asarray(a == b)
