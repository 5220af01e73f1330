"""Every runnable script under results/ answers --help and changes nothing: many take minutes
or a GPU and rewrite committed results, so a user asking how to run one must not run it."""

import os
import subprocess
import sys

import pytest

from tests.results.conftest import ROOT

SCRIPTS = sorted(
    p.relative_to(ROOT).as_posix()
    for p in (ROOT / "results").rglob("*.py")
    if 'if __name__ == "__main__":' in p.read_text()
)


def _results_files() -> dict[str, tuple[int, int]]:
    """(mtime, size) of every file under results/: what a script run by mistake rewrites
    (not `git status`, which other tests running beside this one may change)."""
    return {
        str(p): (p.stat().st_mtime_ns, p.stat().st_size)
        for p in (ROOT / "results").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_exits_0_and_writes_nothing(script):
    before = _results_files()
    # this checkout's packages, not an installed copy: the scripts import them by name
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, script, "--help"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: "), done.stdout
    assert _results_files() == before
