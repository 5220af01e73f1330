"""Markdown tables of one `prismbench variability ... --rank-sources --placement K:F --json` run.

    python results/fidelity/variability_tables.py RUN.json

Prints the step-time figures (the allocation split and the K-step bound among them), the noise
sources ranked (with their signatures under them where the run had `--rank-signatures K`, and
the sources left out as provably inert), and the placements where the run had `--placement`,
as variability.md's section "Which signatures drive the variance; placement" shows them; every
figure is the JSON's, formatted as the CLI's tables format it (prismbench.report).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from prismbench.report import _seconds, _signed_seconds, signature_kind

# the fields `tables` reads of a run (`variability --rank-sources --json`)
RUN_FIELDS = (
    "deterministic_s", "mean_s", "std_s", "p50_s", "p95_s", "slowdown_p95", "samples",
    "allocations", "steps_per_allocation", "seed", "preset", "allocation_std_s",
    "within_allocation_std_s", "k_steps", "k_steps_mean_s", "confidence", "k_steps_bound_s",
    "monte_carlo_wall_s", "attribution",
)  # fmt: skip


def tables(run: dict) -> str:
    lines = [
        f"Step time: deterministic {_seconds(run['deterministic_s'])}, mean "
        f"{_seconds(run['mean_s'])}, std {_seconds(run['std_s'])}, p50 {_seconds(run['p50_s'])}, "
        f"p95 {_seconds(run['p95_s'])} ({run['slowdown_p95']:.3f}x deterministic); "
        f"{run['samples']} samples in {run['allocations']} allocations of "
        f"{run['steps_per_allocation']} steps, seed {run['seed']}, preset {run['preset']}. "
        f"Between allocations (std of an allocation's mean step) "
        f"{_seconds(run['allocation_std_s'])}, within one {_seconds(run['within_allocation_std_s'])}; "
        f"{run['k_steps']:,} steps on one allocation: mean {_seconds(run['k_steps_mean_s'])}, "
        f"{100 * run['confidence']:.0f} % bound {_seconds(run['k_steps_bound_s'])}.",
        "",
        "| rank | source | category | std | variance share | mean - deterministic | "
        "p95 - deterministic | p95 share |",
        "|---|---|---|---|---|---|---|---|",
    ]
    attribution = run["attribution"]
    for rank, e in enumerate(attribution["sources"], 1):
        lines.append(_source_row(str(rank), e))
        for sig in e.get("signatures", ()):
            lines.append(_signature_row(sig))
    lines.append(_source_row("-", attribution["total"]))
    skipped = attribution.get("skipped", ())
    if skipped:
        names = ", ".join(s["source"] for s in skipped)
        lines += ["", f"Not run, {len(skipped)} provably inert: {names}."]
    runs = (f"{run['monte_carlo_wall_s']:.1f} s for the all-on run, "
            f"{attribution['monte_carlo_wall_s']:.0f} s for the {len(attribution['sources'])} "
            "source runs")  # fmt: skip
    if attribution.get("signature_runs"):
        runs += (f", {attribution['signature_wall_s']:.0f} s for the "
                 f"{attribution['signature_runs']} signature runs")  # fmt: skip
    placement = run.get("placement")
    if placement is None:
        wall = f"Monte Carlo wall time: {runs} ({run['samples']} samples each)."
        return "\n".join([*lines, "", wall])
    lines += [
        "",
        f"{placement['slow_gpus']} GPUs {placement['factor']}x slower:",
        "",
        "| placement | ranks | deterministic | p50 | p95 | p95 / no slow GPU |",
        "|---|---|---|---|---|---|",
    ]
    for p in (placement["reference"], *placement["placements"]):
        ranks = ", ".join(map(str, p["ranks"])) or "-"
        lines.append(
            f"| {p['placement']} | {ranks} | {_seconds(p['deterministic_s'])} | "
            f"{_seconds(p['p50_s'])} | {_seconds(p['p95_s'])} | {p['p95_ratio']:.4f}x |"
        )
    lines += [
        "",
        f"Monte Carlo wall time: {runs}, {placement['monte_carlo_wall_s']:.0f} s for the "
        f"{len(placement['placements']) + 1} placement runs ({run['samples']} samples each).",
    ]
    return "\n".join(lines)


def _source_row(rank: str, e: dict) -> str:
    return (
        f"| {rank} | {e['source']} | {e['category']} | {_seconds(e['std_s'])} | "
        f"{100 * e['variance_share']:.1f} % | {_signed_seconds(e['mean_shift_s'])} | "
        f"{_signed_seconds(e['p95_excess_s'])} | {100 * e['p95_share']:.1f} % |"
    )


def _signature_row(sig: dict) -> str:
    kind = signature_kind(sig["lumped"], sig["own_run"])
    return (
        f"| | └ {sig['signature']} | {kind} | {_seconds(sig['std_s'])} | "
        f"{100 * sig['variance_share']:.1f} % | {_signed_seconds(sig['mean_shift_s'])} | "
        f"{_signed_seconds(sig['p95_excess_s'])} | {100 * sig['p95_share']:.1f} % |"
    )


def read_run(path: Path) -> dict:
    """The JSON of a `variability --rank-sources` run, or a ValueError saying why it is not."""
    try:
        run = json.loads(path.read_text())
    except OSError as err:
        raise ValueError(f"{path}: cannot be read ({err.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not JSON ({err})") from None
    missing = [key for key in RUN_FIELDS if key not in run] if isinstance(run, dict) else RUN_FIELDS
    if missing:
        raise ValueError(
            f"{path}: no variability run with its sources ranked (no {', '.join(missing)}): give "
            "the output of `prismbench variability JOB.toml --rank-sources --json`"
        )
    return run


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", metavar="RUN.json", help="`prismbench variability ... --json`")
    try:
        run = read_run(Path(parser.parse_args().run))
    except ValueError as err:
        parser.error(str(err))  # exit 2
    print(tables(run))
