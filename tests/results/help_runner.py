"""Runs scripts under results/ with --help, each in its own process forked from one that has
already imported the heavy modules they import at the top (torch, numpy, the packages), and
prints one JSON object: per script, its exit code, stdout, stderr and the results/ files it
changed. A fresh interpreter per script paid those imports once per script: most of the 56
scripts' seconds in test_scripts_help.py.

Usage (from the repository root): python tests/results/help_runner.py results/a.py results/b.py
"""

import ast
import importlib
import json
import os
import runpy
import signal
import sys
import tempfile
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# what costs seconds to import; a script's own siblings stay its own to import, in its process
SHARED_PACKAGES = {"torch", "numpy", "scipy", "emulator", "prismbench", "workloads"}
TIMEOUT_S = 60


def results_files() -> dict[str, tuple[int, int]]:
    """(mtime, size) of every file under results/: what a script run by mistake rewrites
    (not `git status`, which other tests running beside this one may change)."""
    return {
        str(p): (p.stat().st_mtime_ns, p.stat().st_size)
        for p in (ROOT / "results").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


def shared_imports(script: Path) -> set[str]:
    """The modules of SHARED_PACKAGES that `script` imports at its top level."""
    names = set()
    for node in ast.parse(script.read_text()).body:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return {name for name in names if name.split(".")[0] in SHARED_PACKAGES}


def preload(scripts: list[Path]) -> None:
    """Import what the scripts share; one that fails is left for the script to import (and
    report) itself."""
    for name in sorted(set().union(*map(shared_imports, scripts))):
        try:
            importlib.import_module(name)
        except Exception:  # the script's own run says what went wrong
            pass


def _exit_code(stop: SystemExit) -> int:
    """The status `python script` exits with on SystemExit (a message goes to stderr, as 1)."""
    if stop.code is None or isinstance(stop.code, int):
        return stop.code or 0
    print(stop.code, file=sys.stderr)
    return 1


def _run_as_main(script: str) -> int:
    """In a forked child: run `script --help` as `python script --help` would."""
    sys.argv = [script, "--help"]
    sys.path[0] = str((ROOT / script).parent)
    signal.alarm(TIMEOUT_S)
    try:
        runpy.run_path(script, run_name="__main__")
        return 0
    except SystemExit as stop:
        return _exit_code(stop)
    except BaseException:  # reported as the script's own traceback
        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def run_help(script: str) -> dict:
    """`script --help` in a child process: exit code, output and the results/ files it changed."""
    before = results_files()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            os._exit(_run_as_main(script))
        returncode = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
    after = results_files()
    changed = sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))
    return {"returncode": returncode, "stdout": stdout, "stderr": stderr, "changed": changed}


def main(scripts: list[str]) -> None:
    os.chdir(ROOT)
    preload([ROOT / script for script in scripts])
    print(json.dumps({script: run_help(script) for script in scripts}))


if __name__ == "__main__":
    main(sys.argv[1:])
