"""results/fidelity/variability_tables.py refuses what is no ranked variability run, naming why."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "results" / "fidelity" / "variability_tables.py"


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (None, "cannot be read"),
        ("{not json", "not JSON"),
        (json.dumps({"mean_s": 1.0}), "sources ranked (no deterministic_s, std_s, p50_s"),
        (json.dumps([1, 2]), "no variability run with its sources ranked"),
    ],
)
def test_what_is_no_ranked_run_exits_2_with_its_reason(tmp_path, content, said):
    run = tmp_path / "run.json"
    if content is not None:
        run.write_text(content)
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(run)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert said in done.stderr and "Traceback" not in done.stderr
