"""The capture cache key's sources: the modules that shape a trace, and only those."""

from __future__ import annotations

import sys

import pytest

from prismbench import capture_sources
from prismbench.capture import _capture_class
from prismbench.capture_sources import ROOT, capture_modules, import_closure
from tests.prismbench.capture_cases import debug_job


def test_pricing_the_graph_the_memory_replay_and_the_harness_do_not_key_a_capture():
    files = set(capture_modules().values())
    for kept_out in (
        "emulator/costs/pricing.py",
        "emulator/hardware/presets.py",  # GPU and network presets price a trace only
        "emulator/graph/build.py",
        "emulator/memory/allocator.py",
        "prismbench/emulate.py",
        "prismbench/validate.py",
    ):
        assert ROOT / kept_out not in files, kept_out
    for kept_in in (
        "emulator/capture/rank.py",
        "emulator/capture/compile_fusion.py",
        "emulator/world/virtual_pg.py",
        "prismbench/program.py",
        "workloads/train.py",
        "emulator/costs/ops.py",
        "emulator/costs/__init__.py",
    ):
        assert ROOT / kept_in in files, kept_in


def test_imports_inside_functions_relative_ones_and_the_packages_above_count(tmp_path, monkeypatch):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "entry.py").write_text("def run():\n    from .sub import lazy\n")
    (package / "sub" / "lazy.py").write_text("from pkg.sub.deep import NAME\nimport json\n")
    (package / "sub" / "deep.py").write_text("NAME = 1\n")
    (package / "unused.py").write_text("")
    monkeypatch.setattr(capture_sources, "ROOT", tmp_path)
    monkeypatch.setattr(capture_sources, "PROJECT_PACKAGES", ("pkg",))
    assert sorted(import_closure(("pkg.entry",))) == [
        "pkg",
        "pkg.entry",
        "pkg.sub",
        "pkg.sub.deep",
        "pkg.sub.lazy",
    ]


def _executed_project_files(run) -> set:
    """The project's source files with a function that ran during `run()`."""
    executed = set()

    def profile(frame, event, arg):
        if event == "call":
            executed.add(frame.f_code.co_filename)

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(previous)
    packages = [str(ROOT / package) + "/" for package in capture_sources.PROJECT_PACKAGES]
    return {path for path in executed if path.startswith(tuple(packages))}


@pytest.mark.parametrize(
    "parallel, train, kernels",
    [
        ({"pp": 2, "tp": 2}, {"precision": "fp8"}, {"framework": "torchtitan", "compile": True}),
        (
            {"dp": 2, "pp": 2, "zero": 1},
            {"precision": "fp8"},
            {"framework": "megatron", "fp8_casts": "transformer-engine"},
        ),
        ({"cp": 2, "dp": 2, "zero": 3}, {}, {"framework": "torchtitan"}),
    ],
    ids=["torchtitan-fp8-compile-pp-tp", "megatron-te-fp8-pp-zero1", "torchtitan-cp-fsdp"],
)
def test_every_project_function_a_capture_runs_is_in_a_keyed_file(
    tmp_path, parallel, train, kernels
):
    """Run under a profiler, a capture calls functions of keyed files only; a file outside
    the key that a capture ran would let an edit to it leave stale traces in the cache."""
    job = debug_job(parallel, train=train, kernels=kernels)
    ran = _executed_project_files(lambda: _capture_class(job, 0, str(tmp_path / "c.npz")))
    keyed = {str(path) for path in capture_modules().values()}
    assert ran and ran <= keyed, sorted(ran - keyed)
