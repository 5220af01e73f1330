"""The dependency direction of STYLE.md, checked by parsing imports.

workloads/ imports only torch, numpy and the standard library; emulator/ imports
neither prismbench nor workloads, nor matplotlib; prismbench/ may import both.
"""

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# matplotlib: the core does not draw; figures live with the harness (prismbench.plots)
FORBIDDEN = {
    "emulator": {"prismbench", "workloads", "matplotlib"},
    "workloads": {"prismbench", "emulator"},
}
WORKLOADS_ALLOWED = {"torch", "numpy", "workloads"} | set(sys.stdlib_module_names)


def imported_top_level_names(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_does_not_import_upwards(package):
    offenders = {
        str(path.relative_to(ROOT)): sorted(imported_top_level_names(path) & FORBIDDEN[package])
        for path in (ROOT / package).rglob("*.py")
    }
    assert {path: names for path, names in offenders.items() if names} == {}


def test_workloads_import_only_torch_numpy_and_stdlib():
    offenders = {
        str(path.relative_to(ROOT)): sorted(imported_top_level_names(path) - WORKLOADS_ALLOWED)
        for path in (ROOT / "workloads").rglob("*.py")
    }
    assert {path: names for path, names in offenders.items() if names} == {}
