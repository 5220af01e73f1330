"""The dependency direction of STYLE.md, checked by parsing imports.

workloads/ imports only torch (torchao for float8), numpy and the standard library; emulator/ imports
neither prismbench nor workloads, nor matplotlib; prismbench/ may import both. And at the
level of attributes: the workloads read nothing of the job that only the harness's JobSpec
has (its cluster), and the emulator reads no attribute of the workloads' job types that it
does not define on its own types, nor any `section.field` path of the job (it is handed
traces and worlds, never a job).
"""

import ast
import dataclasses
import sys
import typing
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# matplotlib: the core does not draw; figures live with the harness (prismbench.plots)
FORBIDDEN = {
    "emulator": {"prismbench", "workloads", "matplotlib"},
    "workloads": {"prismbench", "emulator"},
}
WORKLOADS_ALLOWED = {"torch", "torchao", "numpy", "workloads"} | set(sys.stdlib_module_names)


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


def _attributes_read(package: str) -> dict[str, set[str]]:
    """Attribute name -> files of `package` that read it (`x.name`)."""
    found: dict[str, set[str]] = {}
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Attribute):
                found.setdefault(node.attr, set()).add(str(path.relative_to(ROOT)))
    return found


def _names_defined_by_classes(package: str) -> set[str]:
    """Field, property and method names of the classes `package` defines itself."""
    names = set()
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        names.add(item.target.id)
                    elif isinstance(item, ast.FunctionDef):
                        names.add(item.name)
    return names


def _job_names(*classes) -> set[str]:
    return {
        name
        for cls in classes
        for name in {f.name for f in dataclasses.fields(cls)}
        | {n for n, v in vars(cls).items() if isinstance(v, property)}
    }


def test_workloads_read_no_attribute_only_the_harness_job_has():
    from prismbench.spec import JobSpec
    from workloads.job import TrainingJob

    harness_only = _job_names(JobSpec) - _job_names(TrainingJob)
    assert harness_only, "JobSpec adds nothing to TrainingJob: update this test"
    read = _attributes_read("workloads")
    assert {name: sorted(read[name]) for name in harness_only & read.keys()} == {}


def test_emulator_reads_no_attribute_of_the_workloads_job():
    from workloads.config import ModelSpec
    from workloads.job import BatchSpec, ParallelSpec, TrainingJob, TrainSpec

    job_names = _job_names(TrainingJob, ModelSpec, ParallelSpec, BatchSpec, TrainSpec)
    # torch.profiler's FunctionEvent.kernels, read by emulator/costs/kernel_timing.py, shares
    # a name with the job's [kernels] section; the section-path test below still guards it
    foreign = job_names - _names_defined_by_classes("emulator") - {"kernels"}
    read = _attributes_read("emulator")
    assert {name: sorted(read[name]) for name in foreign & read.keys()} == {}


def _attribute_paths_read(package: str) -> dict[tuple[str, str], set[str]]:
    """(outer, inner) attribute pair -> files of `package` that read `x.outer.inner`."""
    found: dict[tuple[str, str], set[str]] = {}
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute):
                pair = (node.value.attr, node.attr)
                found.setdefault(pair, set()).add(str(path.relative_to(ROOT)))
    return found


def test_emulator_reads_no_section_field_path_of_the_workloads_job():
    """Names the emulator's own classes also define (batch, micro_batch, tp) pass the test
    above; `job.batch.micro_batch` is still caught by the section it is read through."""
    from workloads.job import TrainingJob

    sections = typing.get_type_hints(TrainingJob)
    job_paths = {
        (section, name)
        for section in (f.name for f in dataclasses.fields(TrainingJob))
        for name in _job_names(sections[section])
    }
    read = _attribute_paths_read("emulator")
    assert {".".join(pair): sorted(read[pair]) for pair in job_paths & read.keys()} == {}


def test_the_workloads_mesh_has_the_emulators_axes_in_its_order():
    """workloads may not import the emulator, so its mesh names its dims itself: the same."""
    from emulator.world.mesh import JOB_AXES
    from workloads.train import MESH_DIMS

    assert MESH_DIMS == JOB_AXES


def test_the_world_stage_imports_no_later_stage():
    """The virtual world is the emulator's first stage: capture, costs, graph and memory build
    on it, never the other way round."""
    later = {"capture", "costs", "graph", "memory"}
    offenders = {}
    for path in (ROOT / "emulator" / "world").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("emulator."):
                stage = node.module.split(".")[1]
                if stage in later:
                    offenders.setdefault(str(path.relative_to(ROOT)), []).append(node.module)
    assert offenders == {}
