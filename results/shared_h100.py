"""The shared H100 measurements (../shared/data/gpu/h100-sxm-80g): where they are, the
command line the scripts comparing against them share (--only CASE..., --out FILE), and the
leave-one-out kernel table they score with."""

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


def leave_one_out_table(case: str):
    """The committed H100 kernel table without the rows of `case`'s own profile."""
    from emulator.costs.kernel_table import load_kernel_table
    from prismbench.emulate import KERNEL_TABLES

    return load_kernel_table(KERNEL_TABLES / "h100-sxm-80g.csv", skip_sources=(f"profile:{case}",))
