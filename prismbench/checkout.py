"""The checkout this package runs from: its root (`REPO`, where the committed tables under
results/ are read from) and its commit, for the provenance of what it records.

Its own module so that `record` (which runs on GPU machines with little installed) reads it
without importing the harness's storage (`prismbench.validate` needs duckdb).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def git_version() -> tuple[str, bool]:
    """(commit, dirty) of the checkout this package runs from; ("unknown", True) outside git."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                                text=True, check=True).stdout.strip()  # fmt: skip
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                                capture_output=True, text=True, check=True).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown", True
    return commit, bool(status.strip())
