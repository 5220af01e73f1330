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


def _status() -> str:
    return subprocess.run(
        ["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS)
def test_help_exits_0_and_writes_nothing(script):
    before = _status()
    # this checkout's packages, not an installed copy: the scripts import them by name
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, script, "--help"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: "), done.stdout
    assert _status() == before
