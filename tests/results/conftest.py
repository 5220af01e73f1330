"""The kernel-table builder under results/kernels (a script, not a package), loaded once."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def build():
    """results/kernels/build_a100.py as a module: the transfer rule and its checks."""
    spec = importlib.util.spec_from_file_location(
        "build_a100", ROOT / "results/kernels/build_a100.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
