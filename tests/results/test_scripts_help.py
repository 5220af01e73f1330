"""Every runnable script under results/ answers --help and changes nothing: many take minutes
or a GPU and rewrite committed results, so a user asking how to run one must not run it."""

import json
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


@pytest.fixture(scope="module")
def helps() -> dict[str, dict]:
    """Each script's `--help`: exit code, stdout, stderr and the results/ files it changed, each
    run in its own process forked by tests/results/help_runner.py after the imports they share."""
    # this checkout's packages, not an installed copy: the scripts import them by name
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "tests/results/help_runner.py", *SCRIPTS],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_exits_0_and_writes_nothing(script, helps):
    done = helps[script]
    assert done["returncode"] == 0, done["stderr"]
    assert done["stdout"].startswith("usage: "), done["stdout"]
    assert done["changed"] == []
