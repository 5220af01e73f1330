"""Behaviour pinned across refactors: each golden job's figures, traces and memory timelines."""

import json

import numpy as np
import pytest

from tests.goldens.jobs import GOLDEN_JOBS
from tests.goldens.record import differences, load, record


@pytest.mark.parametrize("name", sorted(GOLDEN_JOBS))
def test_golden_job_is_unchanged(name, tmp_path, monkeypatch):
    monkeypatch.setenv("PRISMBENCH_CACHE", str(tmp_path))
    problems = differences(load(name), record(GOLDEN_JOBS[name], name))
    assert problems == [], "\n".join(problems[:20])


def test_a_golden_tolerates_summation_order_but_not_a_changed_prediction():
    golden = {
        "figures": np.array(json.dumps({"iteration_time_s": 0.1 + 0.2, "ranks": 8})),
        "class0/memory/bytes": np.array([1.0, 2.0 / 3.0]),
    }
    reordered = {
        "figures": np.array(json.dumps({"iteration_time_s": 0.2 + 0.1, "ranks": 8})),
        "class0/memory/bytes": np.array([1.0, 2.0 / 3.0 + 1e-16]),
    }
    assert differences(golden, reordered) == []
    changed = {
        "figures": np.array(json.dumps({"iteration_time_s": 0.3 * (1 + 1e-9), "ranks": 8})),
        "class0/memory/bytes": np.array([1.0, 0.7]),
    }
    assert differences(golden, changed) == [
        "class0/memory/bytes[1]: np.float64(0.6666666666666666) != np.float64(0.7)",
        f"figures.iteration_time_s: {0.1 + 0.2!r} != {0.3 * (1 + 1e-9)!r}",
    ]
