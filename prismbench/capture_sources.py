"""Which source files shape a captured trace, so the capture cache is keyed by those alone.

A trace is made by `prismbench.capture` (its workers run `prismbench.program`, which runs the
workloads under `emulator.capture`): the files that can change one are every module of
`workloads` (it loads `workloads.train` by name) and the modules those entry points import,
directly or through others, within this project's packages. They are found from the source's
import statements, the ones inside functions included, so an import made only on some jobs'
path counts. Pricing, the execution graph, the memory replay and the harness are outside the
closure: editing them re-prices cached traces instead of recapturing every job
(tests/prismbench/test_capture_sources.py checks the closure against what captures import).
"""

from __future__ import annotations

import ast
import functools
import hashlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROJECT_PACKAGES = ("emulator", "workloads", "prismbench")
CAPTURE_ENTRY_POINTS = ("prismbench.capture",)
WHOLE_PACKAGES = ("workloads",)


class SourceChangedError(RuntimeError):
    """The source that shapes a trace changed while a job was being captured (a spawned
    worker found another `capture_source_hash` than its parent's)."""


def module_file(name: str) -> Path | None:
    """The file of module `name` in this checkout (a package's `__init__.py`), None if there
    is none (the name is an attribute, e.g. `from emulator.world import mesh`'s `mesh` is a
    module but `from emulator.capture.trace import ALLOC`'s `ALLOC` is not)."""
    path = ROOT.joinpath(*name.split("."))
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    if path.with_suffix(".py").is_file():
        return path.with_suffix(".py")
    return None


def _imported_names(path: Path, module: str) -> list[str]:
    """Every name an import statement of `path` may load as a module: `import a.b` gives
    a.b; `from a import b` gives a and a.b (b may be a submodule); relative imports resolved."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            names.append(base)
            names.extend(f"{base}.{alias.name}" for alias in node.names)
    return names


def import_closure(entry_points: tuple[str, ...]) -> dict[str, Path]:
    """Module name -> file of every project module `entry_points` import, transitively, with
    the packages above each (importing a.b.c runs a/__init__ and a/b/__init__ first)."""
    found: dict[str, Path] = {}
    pending = list(entry_points)
    while pending:
        parts = pending.pop().split(".")
        for depth in range(1, len(parts) + 1):
            name = ".".join(parts[:depth])
            if parts[0] not in PROJECT_PACKAGES or name in found:
                continue
            path = module_file(name)
            if path is None:
                continue
            found[name] = path
            pending.extend(_imported_names(path, name))
    return found


def capture_modules() -> dict[str, Path]:
    """Module name -> file of every module that shapes a trace: the whole of WHOLE_PACKAGES and
    the import closure of CAPTURE_ENTRY_POINTS and of those packages' modules."""
    whole = [
        ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for package in WHOLE_PACKAGES
        for path in (ROOT / package).rglob("*.py")
    ]
    return import_closure((*CAPTURE_ENTRY_POINTS, *whole))


def files_hash(paths) -> str:
    """Hash of the files `paths` of this checkout: their paths and contents, in path order."""
    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(path.relative_to(ROOT).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


@functools.cache
def capture_source_hash() -> str:
    """Hash of the files of `capture_modules()`, read once per process."""
    return files_hash(capture_modules().values())
