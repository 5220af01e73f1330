"""Behaviour pinned across refactors: each golden job's figures, traces and memory timelines."""

import pytest

from tests.goldens.jobs import GOLDEN_JOBS
from tests.goldens.record import differences, load, record


@pytest.mark.parametrize("name", sorted(GOLDEN_JOBS))
def test_golden_job_is_unchanged(name, tmp_path, monkeypatch):
    monkeypatch.setenv("PRISMBENCH_CACHE", str(tmp_path))
    problems = differences(load(name), record(GOLDEN_JOBS[name], name))
    assert problems == [], "\n".join(problems[:20])
