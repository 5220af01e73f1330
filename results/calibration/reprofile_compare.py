"""Score the emulator on the shared jobs run with production kernels (reprofile_gpu.py's output).

    python results/calibration/reprofile_compare.py [--recordings DIR] [--profiles DIR]
        [--prefix PREFIX] [--out FILE]

reprofile_gpu.py trains each shared job with its family's production-framework kernels on a
real GPU and writes, per job, a recorded baseline (`<case>.toml`) and rank 0's kernel times
(`<case>.ops.jsonl.gz`). Committed: the recordings as results/baselines/recorded/
<PREFIX>__<case>.toml (default prefix h100frameworks, the H100 run of 2026-11-28) and the
profiles under results/gpu_runs/h100-2026-11-28/reprofile/. For each job this prints what
`prismbench validate` and `prismbench compare` give: the measured iteration against
`prismbench.emulate.emulate` of the recording's job, the steady reserved peak likewise, and
the iteration's kernel time predicted against the profile's (`prismbench.compare.
compare_profile`, priced with the GPU's committed kernel table: none of these runs' kernels is
in it), with the op classes whose predicted time misses the measured one by the most. Then the
median and max |error| of the iteration over the jobs. A job whose profile no longer matches
its capture (the workloads' CUDA path changed after the run: `compare`'s coverage check) is
listed with the reason and left out of the median: the run measured another program.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "results"))
from shared_gpu import command_line, report  # noqa: E402

RECORDINGS = ROOT / "results" / "baselines" / "recorded"
PROFILES = ROOT / "results" / "gpu_runs" / "h100-2026-11-28" / "reprofile"
PREFIX = "h100frameworks"
TOP = 3  # op classes named per job


def _percent(x: float) -> str:
    return f"{100 * x:+.1f} %"


def job_row(baseline, profile: Path) -> tuple[str, float | None]:
    """A table line for one recorded job, and its iteration error (None: not comparable)."""
    from prismbench.compare import compare_profile
    from prismbench.emulate import emulate
    from prismbench.profile_ingest import ProfileMismatch

    job, measured = baseline.job, baseline.measured
    case = baseline.name.split("__", 1)[1]
    try:
        kernels = compare_profile(job, profile, name=baseline.name)
    except ProfileMismatch as e:
        reason = str(e).split(": ", 2)[-1]
        return (
            f"| {case} | {job.kernels.framework} | {1e3 * measured.iteration_time_s:.1f} | not comparable: {reason} |||||",
            None,
        )
    result = emulate(job)
    time_error = result.iteration_time_s / measured.iteration_time_s - 1
    memory_error = result.peak_memory_reserved_bytes / measured.peak_mem_bytes - 1
    kernel_error = kernels.predicted_s / kernels.measured_s - 1
    worst = sorted(kernels.classes, key=lambda c: -abs(c.error_s))[:TOP]
    misses = ", ".join(f"{c.aten} {1e3 * c.error_s:+.1f} ms" for c in worst)
    line = (
        f"| {case} | {job.kernels.framework} | {1e3 * measured.iteration_time_s:.1f} | "
        f"{1e3 * result.iteration_time_s:.1f} | {_percent(time_error)} | "
        f"{_percent(kernel_error)} | {misses} | {memory_error:+.3%} |"
    )
    return line, time_error


def main(argv: list[str] | None = None) -> int:
    from prismbench.baselines import load_baselines

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recordings", type=Path, default=RECORDINGS)
    parser.add_argument("--profiles", type=Path, default=PROFILES)
    parser.add_argument("--prefix", default=PREFIX)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    baselines = [
        b for b in load_baselines(args.recordings) if b.name.startswith(f"{args.prefix}__")
    ]
    if not baselines:
        print(f"--recordings {args.recordings}: no {args.prefix}__*.toml", file=sys.stderr)
        return 2
    lines = [
        "| job | framework | measured (ms) | predicted (ms) | iteration error | kernel time error "
        f"| largest kernel misses (predicted - measured, top {TOP}) | reserved peak error |",
        "|---|---|--:|--:|--:|--:|---|--:|",
    ]
    errors = []
    for baseline in baselines:
        case = baseline.name.split("__", 1)[1]
        profile = args.profiles / f"{case}.ops.jsonl.gz"
        if not profile.is_file():
            print(f"--profiles {args.profiles}: no {profile.name}", file=sys.stderr)
            return 2
        print(f"scoring {case} ...", file=sys.stderr)
        line, error = job_row(baseline, profile)
        lines.append(line)
        if error is not None:
            errors.append(abs(error))
    left_out = len(baselines) - len(errors)
    if not errors:
        lines += ["", f"No job comparable: all {left_out} profiles are of other programs."]
    else:
        lines += [
            "",
            f"Iteration |error| over {len(errors)} jobs: median {100 * np.median(errors):.1f} %, "
            f"max {100 * max(errors):.1f} %"
            + (f" ({left_out} not comparable, above)." if left_out else "."),
        ]
    report(command_line("results/calibration/reprofile_compare.py", argv), lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
