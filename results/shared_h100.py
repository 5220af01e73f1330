"""The shared H100 measurements (../shared/data/gpu/h100-sxm-80g): where they are, and the
command line the scripts comparing against them share (--only CASE..., --out FILE)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "gpu" / "h100-sxm-80g"


def cases_from_cli(description: str) -> tuple[list[str], dict, Path | None]:
    """(the cases asked for, summary.json's measurements, the --out path)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--only", action="append", help="case name (repeatable)")
    parser.add_argument("--out", type=Path, help="also write the markdown table here")
    args = parser.parse_args()
    measured = json.loads((SHARED / "summary.json").read_text())
    cases = args.only or list(measured)
    unknown = sorted(set(cases) - set(measured))
    if unknown:
        sys.exit(f"--only: {unknown} not in {SHARED / 'summary.json'}")
    return cases, measured, args.out
