"""Parametrized cases of which CI runs some: the others are marked `slow`.

CI's suite has a 10-minute budget on two cores, so a test swept over many jobs keeps in CI the
cases that each exercise something the others do not, and says why the rest are covered. A
module whose cases share one multi-process spawn (a module fixture) spawns only the selected
ones, so `-k NAME` runs one case and `-m slow` the others.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest


def case_params(names: Iterable[str], slow: set[str], **marks_by_name) -> list:
    """`names` as parameters, `slow` marked so; `marks_by_name` adds a name's other marks."""
    params = []
    for name in names:
        marks = [pytest.mark.slow] if name in slow else []
        marks += marks_by_name.get(name, [])
        params.append(pytest.param(name, marks=marks))
    return params


def selected_cases(session: pytest.Session, module_file: str, cases: Iterable[str]) -> list[str]:
    """The cases, in their order, that a selected test of `module_file` takes as `name`."""
    names = set()
    for item in session.items:
        callspec = getattr(item, "callspec", None)
        if item.path == Path(module_file) and callspec is not None and "name" in callspec.params:
            names.add(callspec.params["name"])
    return [name for name in cases if name in names]
