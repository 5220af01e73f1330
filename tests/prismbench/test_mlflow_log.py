"""Tests for prismbench/mlflow_log.py."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout: the children import prismbench from it

# Opens the store given as argv[1] once told to on stdin, MLflow already imported: the two
# processes then race on the store's creation alone.
_OPENER = """
import sys
import mlflow
from prismbench.mlflow_log import open_experiment

print("ready", flush=True)
sys.stdin.readline()
open_experiment(sys.argv[1])
"""


def test_two_processes_can_create_one_new_sqlite_store_at_once(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    openers = [
        subprocess.Popen([sys.executable, "-c", _OPENER, uri], cwd=ROOT, text=True,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(2)
    ]  # fmt: skip
    assert [opener.stdout.readline() for opener in openers] == ["ready\n"] * 2
    for opener in openers:
        opener.stdin.write("go\n")
        opener.stdin.flush()
    errors = [opener.communicate(timeout=120)[1] for opener in openers]
    assert [opener.returncode for opener in openers] == [0, 0], errors
    assert errors == ["", ""]  # MLflow's INFO lines on making the store are not shown
