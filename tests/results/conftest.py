"""The scripts under results/ (scripts, not a package), each loaded once as a module."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_script(path: str):
    """results/<path> as a module named after its file (registered, so its dataclasses and
    pickling find it)."""
    spec = importlib.util.spec_from_file_location(Path(path).stem, ROOT / "results" / path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def build():
    """results/kernels/build_a100.py: the transfer rule and its checks."""
    return load_script("kernels/build_a100.py")


@pytest.fixture(scope="session")
def runner():
    """results/fidelity/oom_pairs_gpu.py: the OOM-pair runner."""
    return load_script("fidelity/oom_pairs_gpu.py")


@pytest.fixture(scope="session")
def split():
    """results/fidelity/attention_split.py: the attention-or-the-rest diagnosis."""
    return load_script("fidelity/attention_split.py")


@pytest.fixture(scope="session")
def repeat():
    """results/fidelity/repeat_gpu.py: repeated real iterations of shared jobs on a GPU."""
    return load_script("fidelity/repeat_gpu.py")


@pytest.fixture(scope="session")
def sac_host():
    """results/calibration/sac_host_gpu.py: selective recompute's host time on a GPU."""
    return load_script("calibration/sac_host_gpu.py")


@pytest.fixture(scope="session")
def sac_kinds():
    """results/calibration/sac_host_kinds.py: SAC's host cost per call kind, CPU or GPU host."""
    return load_script("calibration/sac_host_kinds.py")


@pytest.fixture(scope="session")
def host_per_call():
    """results/calibration/host_per_call.py: host time per launching op against per aten call."""
    return load_script("calibration/host_per_call.py")


@pytest.fixture(scope="session")
def host_tiny():
    """results/calibration/host_tiny_gpu.py: host-bound tiny jobs timed on a GPU's host."""
    return load_script("calibration/host_tiny_gpu.py")


@pytest.fixture(scope="session")
def triton_fit():
    """results/kernels/fit_triton_attention.py: the Triton kernel's ratio over FlashAttention v1."""
    return load_script("kernels/fit_triton_attention.py")


@pytest.fixture(scope="session")
def attention_build():
    """results/kernels/build_attention_rates.py: the published attention rates."""
    return load_script("kernels/build_attention_rates.py")


@pytest.fixture(scope="session")
def fidelity_table():
    """results/fidelity/run_fidelity.py: the fidelity table's writer."""
    return load_script("fidelity/run_fidelity.py")


@pytest.fixture(scope="session")
def reprofile():
    """results/calibration/reprofile_gpu.py: the shared jobs with production kernels."""
    return load_script("calibration/reprofile_gpu.py")


@pytest.fixture(scope="session")
def reprofile_compare():
    """results/calibration/reprofile_compare.py: scores the production-kernel recordings."""
    return load_script("calibration/reprofile_compare.py")


@pytest.fixture(scope="session")
def misses():
    """results/fidelity/misses.py: the rows beyond the goal beside their own tables."""
    return load_script("fidelity/misses.py")


@pytest.fixture(scope="session")
def compile_vs_inductor():
    """results/fidelity/compile_vs_inductor.py: the compile rule against Inductor's scheduler."""
    return load_script("fidelity/compile_vs_inductor.py")


@pytest.fixture(scope="session")
def compile_gpu():
    """results/fidelity/compile_gpu.py: a compiled block's kernels timed on a GPU."""
    return load_script("fidelity/compile_gpu.py")


@pytest.fixture(scope="session")
def fake_pg():
    """results/fidelity/fake_pg_memory.py: one rank of the shared fake-process-group jobs."""
    return load_script("fidelity/fake_pg_memory.py")


@pytest.fixture(scope="session")
def paired_deltas():
    """results/fidelity/paired_deltas.py: published pairs that change one setting."""
    return load_script("fidelity/paired_deltas.py")


@pytest.fixture(scope="session")
def expandable():
    """results/fidelity/expandable_gpu.py: the expandable-segments allocator model on a GPU."""
    return load_script("fidelity/expandable_gpu.py")
