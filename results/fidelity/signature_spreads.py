"""Per-signature spreads against one CV per noise class: what a profile's pools would add.

    python results/fidelity/signature_spreads.py [--gpu h100-sxm-80g|h200-141g] [--out FILE]

The `measured` preset draws every compute op with its noise class's CV and the jitter floor
(emulator.variability.calibration: medians over the pools of a GPU's shared profiles). PRISM
fits a distribution per signature; the pools to do it with are the occurrences of one
signature (op, input shapes, kernels) in one profiled iteration, so their spread is over
positions in the step as well as over time. Per job: the share of its kernel time whose
signature repeats at least MIN_SAMPLES times; the CV of its iteration's kernel time if the
kernels varied independently, with the class model and with each such pool's own standard
deviation (the class model for the rest); the iteration CV measured (range of n iterations over
d2(n)); and the pool that adds the most variance, with its CV, its robust CV (1.4826 x the
median absolute deviation over the median: what most positions show) and its min/median/max.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "results"))
from shared_gpu import MEASURED_GPUS, command_line, report, shared_dir  # noqa: E402

MAD_TO_SIGMA = 1.4826  # a normal's standard deviation over its median absolute deviation


def robust_cv(durations: np.ndarray) -> float:
    median = float(np.median(durations))
    return MAD_TO_SIGMA * float(np.median(np.abs(durations - median))) / median


def job_row(gpu_dir: Path, job, noise) -> str:
    from emulator.variability.distributions import MIN_SAMPLES
    from prismbench.profile_readers import read_profile
    from prismbench.variability_calibration import (
        job_profile,
        op_signature,
        profile_durations,
        profile_pools,
    )

    ops = read_profile(job_profile(gpu_dir, job.job))
    durations, classes = profile_durations(ops)
    class_std = noise.std_s(durations, classes)
    pools = profile_pools(ops)
    own_std = class_std.copy()
    for i, op in enumerate(ops):
        _, pool = pools[op_signature(op)]
        if len(pool) >= MIN_SAMPLES:
            pool = np.asarray(pool)
            own_std[i] = pool.std(ddof=1) / pool.mean() * durations[i]
    covered = own_std != class_std
    total = durations.sum()
    excess = []
    for (op_name, _, _), (klass, pool) in pools.items():
        pool = np.asarray(pool)
        if len(pool) >= MIN_SAMPLES:
            model_var = float((noise.std_s(pool, [klass] * len(pool)) ** 2).sum())
            excess.append((len(pool) * pool.var(ddof=1) - model_var, op_name, pool))
    _, op_name, pool = max(excess, key=lambda e: e[0])
    us = pool * 1e6
    return (
        f"| {job.job} | {100 * durations[covered].sum() / total:.0f} % | "
        f"{100 * np.sqrt((class_std**2).sum()) / total:.3f} % | "
        f"{100 * np.sqrt((own_std**2).sum()) / total:.3f} % | {100 * job.iteration_cv:.3f} % | "
        f"{op_name}, n = {len(pool)}: CV {100 * pool.std(ddof=1) / pool.mean():.2f} %, robust "
        f"{100 * robust_cv(pool):.2f} %; {us.min():.1f} / {np.median(us):.1f} / {us.max():.1f} us |"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", choices=MEASURED_GPUS, action="append",
                        help="a GPU of ../shared/data/gpu (repeatable; default: both)")  # fmt: skip
    parser.add_argument("--out", type=Path, help="also write the report here")
    args = parser.parse_args(argv)
    from prismbench.variability_calibration import calibrate_jobs, read_jobs

    lines = []
    for gpu in args.gpu or MEASURED_GPUS:
        jobs = read_jobs(shared_dir(gpu))
        noise = calibrate_jobs(jobs).noise
        lines += [
            f"**{gpu}** (class CVs {', '.join(f'{k} {100 * v:.2f} %' for k, v in noise.cv_by_class.items())}; "
            f"floor {noise.floor_s * 1e6:.3f} us)",
            "",
            "| job | kernel time in pools of >= 8 | iteration kernel CV: class model | "
            "own pools' std | iteration CV measured | pool adding the most variance: "
            "CV, robust CV; min / median / max |",
            "|---|--:|--:|--:|--:|---|",
            *(job_row(shared_dir(gpu), job, noise) for job in jobs),
            "",
        ]
    report(command_line("results/fidelity/signature_spreads.py", argv), lines, args.out)


if __name__ == "__main__":
    main()
