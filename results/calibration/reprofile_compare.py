"""Score the emulator on the shared jobs run with production kernels (reprofile_gpu.py's output).

    python results/calibration/reprofile_compare.py [--gpu h100-sxm-80g|h200-141g]
        [--recordings DIR] [--profiles DIR] [--prefix PREFIX] [--out FILE]

reprofile_gpu.py trains each shared job with its family's production-framework kernels on a
real GPU and writes, per job, a recorded baseline (`<case>.toml`) and rank 0's kernel times
(`<case>.ops.jsonl.gz`). Committed, per GPU (results/shared_gpu.py: FRAMEWORKS_PREFIX,
REPROFILED): the recordings as results/baselines/recorded/<prefix>__<case>.toml
(`h100frameworks`: one H100, 2026-11-28, at 6a9c814; `h200frameworks`: one H200, 2026-11-30, at
664c165) and the profiles under results/gpu_runs/<run>/reprofile/. --gpu picks the run (default
the H100's); --prefix and --profiles override its parts.

For each job, the measured iteration against `prismbench.emulate.emulate` of the recording's
job, priced with its `cluster.gpu`'s committed kernel table two ways. "Whole table": the table
`validate` uses, which holds the rows of the same case's 86a4f47 profile on that GPU (this job's
GEMM and optimizer shapes; not its attention, loss or fp8 kernels); reprofile_h100.md was made
so at 543ec86. "Leave-one-out": less those rows, with the host dispatch figures and the kernels'
idle gap less the case's profile, as gpu_jobs.py scores the shared jobs (what the project's
goals use). Leave-one-out also prices the iteration's kernel time against the profile's
(`prismbench.compare.compare_profile`) with the op classes that miss the most; the measured
kernel time there holds the Triton kernels Inductor launches outside any aten op (the compiled
custom ops, FlexAttention: `profile_readers.INDUCTOR_KERNEL`), which `compare` gives to the
capture's `prism.*` rows that launched them (`prismbench.compiled_calls`), and says how much
of it they are. Then the steady reserved peak, and
the median and max |error| of the iteration over the jobs, both ways. A job whose profile no
longer matches its capture (the workloads' CUDA path changed after the run: `compare`'s coverage
check) is listed with the reason and left out of the medians: the run measured another program.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "results"))
from shared_gpu import (  # noqa: E402
    FRAMEWORKS_PREFIX,
    MEASURED_GPUS,
    RECORDED,
    REPROFILED,
    command_line,
    leave_one_out_table,
    report,
)

TOP = 3  # op classes named per job


def _percent(x: float) -> str:
    return f"{100 * x:+.1f} %"


def triton_kernels_s(profile: Path) -> float:
    """Kernel time of the Triton kernels launched outside any aten op (events named as
    Inductor names its kernels, `profile_readers.INDUCTOR_KERNEL`)."""
    from prismbench.profile_readers import INDUCTOR_KERNEL, read_ops_jsonl

    return 1e-6 * sum(
        op.kernel_us for op in read_ops_jsonl(profile) if INDUCTOR_KERNEL.match(op.op)
    )


def leave_one_out(job, case: str):
    """`job` priced without the case's own profile: table rows, host figures, idle gap."""
    from prismbench.emulate import host_dispatch_for, kernel_gap_for, price_job

    return price_job(
        job,
        kernel_table=leave_one_out_table(case, job.cluster.gpu),
        host_dispatch=host_dispatch_for(job, skip_profiles=(case,)),
        kernel_gap_s=kernel_gap_for(skip_profiles=(case,)),
    )


def job_row(baseline, profile: Path) -> tuple[str, tuple[float, float] | None]:
    """A table line for one recorded job, and its iteration errors, whole table and
    leave-one-out (None: not comparable)."""
    from prismbench.compare import compare_profile
    from prismbench.emulate import emulate
    from prismbench.profile_ingest import ProfileMismatch

    job, measured = baseline.job, baseline.measured
    case = baseline.name.split("__", 1)[1]
    priced = leave_one_out(job, case)
    try:
        kernels = compare_profile(job, profile, name=baseline.name, kernel_table=priced.cost.table)
    except ProfileMismatch as e:
        reason = str(e).split(": ", 2)[-1]
        return (
            f"| {case} | {job.kernels.framework} | {1e3 * measured.iteration_time_s:.1f} "
            f"| not comparable: {reason} ||||||||",
            None,
        )
    whole = emulate(job).iteration_time_s
    held_out = emulate(job, name=baseline.name, priced=priced)
    errors = (whole / measured.iteration_time_s - 1,
              held_out.iteration_time_s / measured.iteration_time_s - 1)  # fmt: skip
    triton_s = triton_kernels_s(profile)
    measured_kernels_s = kernels.measured_s
    worst = sorted(kernels.classes, key=lambda c: -abs(c.error_s))[:TOP]
    misses = ", ".join(f"{c.aten} {1e3 * c.error_s:+.1f} ms" for c in worst)
    memory_error = held_out.peak_memory_reserved_bytes / measured.peak_mem_bytes - 1
    line = (
        f"| {case} | {job.kernels.framework} | {1e3 * measured.iteration_time_s:.1f} | "
        f"{1e3 * whole:.1f} | {_percent(errors[0])} | "
        f"{1e3 * held_out.iteration_time_s:.1f} | {_percent(errors[1])} | "
        f"{1e3 * measured_kernels_s:.1f} ({1e3 * triton_s:.1f}) | "
        f"{_percent(kernels.predicted_s / measured_kernels_s - 1)} | {misses} | "
        f"{memory_error:+.3%} |"
    )
    return line, errors


def _summary(errors: list[tuple[float, float]], left_out: int) -> list[str]:
    if not errors:
        return ["", f"No job comparable: all {left_out} profiles are of other programs."]
    ways = []
    for i, way in enumerate(("whole table", "leave-one-out")):
        absolute = [abs(e[i]) for e in errors]
        ways.append(f"{way} median {100 * np.median(absolute):.1f} %, "
                    f"max {100 * max(absolute):.1f} %")  # fmt: skip
    return [
        "",
        f"Iteration |error| over {len(errors)} jobs: " + "; ".join(ways)
        + (f" ({left_out} not comparable, above)." if left_out else "."),
    ]  # fmt: skip


HEADER = [
    "| job | framework | measured (ms) | predicted, whole table (ms) | error "
    "| predicted, leave-one-out (ms) | error | kernels measured (ms; of which Triton) "
    f"| kernel time error | largest kernel misses (predicted - measured, top {TOP}) "
    "| reserved peak error |",
    "|---|---|--:|--:|--:|--:|--:|--:|--:|---|--:|",
]


def main(argv: list[str] | None = None) -> int:
    from prismbench.baselines import load_baselines

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="h100-sxm-80g", choices=MEASURED_GPUS)
    parser.add_argument("--recordings", type=Path, default=RECORDED)
    parser.add_argument("--profiles", type=Path, help="default: the GPU's run (REPROFILED)")
    parser.add_argument("--prefix", help="default: the GPU's (FRAMEWORKS_PREFIX)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    prefix = args.prefix or FRAMEWORKS_PREFIX[args.gpu]
    profiles = args.profiles or REPROFILED[args.gpu]
    baselines = [b for b in load_baselines(args.recordings) if b.name.startswith(f"{prefix}__")]
    if not baselines:
        print(f"--recordings {args.recordings}: no {prefix}__*.toml", file=sys.stderr)
        return 2
    lines, errors = list(HEADER), []
    for baseline in baselines:
        case = baseline.name.split("__", 1)[1]
        profile = profiles / f"{case}.ops.jsonl.gz"
        if not profile.is_file():
            print(f"--profiles {profiles}: no {profile.name}", file=sys.stderr)
            return 2
        print(f"scoring {case} ...", file=sys.stderr)
        line, error = job_row(baseline, profile)
        lines.append(line)
        if error is not None:
            errors.append(error)
    lines += _summary(errors, len(baselines) - len(errors))
    report(command_line("results/calibration/reprofile_compare.py", argv), lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
