"""The `prismbench` command line: argparse wiring, one small handler per subcommand.

Handlers call a library function and print its result (rich tables, or one JSON object with
`--json`). Exit codes: 0 success, 2 bad input (spec errors, missing or malformed files, usage
errors, no CUDA for `calibrate`); errors are one line `error: <message>` on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from prismbench import __version__, report
from prismbench.explain import explain, explanation_to_dict, flavor_rows
from prismbench.spec import load_job_spec

EXIT_OK = 0
EXIT_BAD_INPUT = 2


def _console() -> Console:
    """Rich console; when piped, wide enough that tables do not wrap (rich assumes 80)."""
    console = Console(highlight=False)
    if not console.is_terminal:
        console.width = 160
    return console


def _print_json(data: object) -> None:
    print(json.dumps(data, indent=2))


def _cmd_workloads(args: argparse.Namespace) -> int:
    rows = flavor_rows()
    if args.json:
        _print_json(rows)
    else:
        report.render_workloads(rows, _console())
    return EXIT_OK


def _cmd_explain(args: argparse.Namespace) -> int:
    explanation = explain(load_job_spec(args.job))
    if args.json:
        _print_json(explanation_to_dict(explanation))
    else:
        report.render_explanation(explanation, _console())
    return EXIT_OK


def _cmd_calibrate(args: argparse.Namespace) -> int:
    import torch

    if not torch.cuda.is_available():
        print("error: calibrate measures kernels on a CUDA GPU; none is available", file=sys.stderr)
        return EXIT_BAD_INPUT
    from emulator.costs.calibrate import run_calibration

    path = run_calibration(
        Path(args.out), quick=args.quick, progress=lambda msg: print(msg, file=sys.stderr)
    )
    print(f"wrote {path}")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="prismbench",
        description="Emulate LLM training jobs and check the predictions against baselines.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    workloads = commands.add_parser("workloads", help="list the registered model flavors")
    workloads.add_argument("--json", action="store_true", help="print one JSON array")
    workloads.set_defaults(handler=_cmd_workloads)

    explain_cmd = commands.add_parser(
        "explain", help="world layout, parameters, FLOPs and model-state memory of a job spec"
    )
    explain_cmd.add_argument("job", metavar="JOB.toml", help="job spec (TOML)")
    explain_cmd.add_argument("--json", action="store_true", help="print one JSON object")
    explain_cmd.set_defaults(handler=_cmd_explain)

    calibrate = commands.add_parser(
        "calibrate", help="measure kernel durations on this machine's GPU (needs CUDA)"
    )
    calibrate.add_argument(
        "--out",
        required=True,
        metavar="CSV",
        help="output table, e.g. results/kernels/h100-sxm-80g.csv",
    )
    calibrate.add_argument("--quick", action="store_true", help="a small sweep, for smoke tests")
    calibrate.set_defaults(handler=_cmd_calibrate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; returns the exit code (argparse's own exits included)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else EXIT_BAD_INPUT
    try:
        return args.handler(args)
    except (ValueError, OSError) as err:  # SpecError is a ValueError
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
