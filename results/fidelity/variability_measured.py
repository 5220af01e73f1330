"""Score the measured variability model against the shared H100/H200 measurements, leave-one-out.

    python results/fidelity/variability_measured.py [--record] > results/fidelity/variability_measured.md

For every GPU directory of ../shared/data/gpu/ and every job in it, the model is estimated
from the *other* jobs' profiles and iteration times (prismbench.variability_calibration) and
scored on the held-out job:
1. kernels: each of the job's signatures repeated >= 8 times; the predicted distribution is a
   lognormal with the pool's own mean (the compute model's mean is issue 14's question; this
   scores the spread and shape) and the model's std for that class and length; the KS
   statistic against the pool, beside the best in-sample fit's and the KS statistic expected
   from sampling alone for a pool of that size (scipy's kstwo: an exact model scores that).
2. iterations: the iteration's CV predicted (independent kernel noise on the profile's own op
   durations, plus the per-step factor) against the one measured (range of the timed
   iterations over d2(n)); where the measured range falls in the predicted distribution of
   the range of n iterations (its PIT; a calibrated model gives uniform PITs: their KS
   statistic against the uniform is the step-level score); the expected maximum of n
   iterations over the median, predicted and measured.
`--record` adds a plumbing check: a real two-process CPU run (prismbench.record), its
iteration times fitted (OS noise, not GPU variation).
"""

import argparse
import sys
from pathlib import Path

import numpy as np
from scipy import stats

from emulator.variability.calibration import estimate_kernel_noise, expected_range, step_cv_of
from emulator.variability.distributions import fit_durations, from_moments
from prismbench.variability_calibration import read_jobs

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # results/: shared_gpu
from shared_gpu import SHARED_GPU, commit_label  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RANGE_DRAWS = 200_000
# the two-rank job of tests/prismbench/test_record.py
RECORD_JOB = (
    '[model]\nname = "gpt-debug"\n[parallel]\ndp = 2\n[batch]\nseq_len = 32\nglobal_batch = 2\n'
)


def _leave_one_out(jobs, held):
    others = [j for j in jobs if j is not held]
    noise = estimate_kernel_noise([f for j in others for f in j.fits])
    step = float(np.median([step_cv_of(j.iteration_cv, j.kernel_cv(noise)) for j in others]))
    return noise, step


def _kernel_scores(job, noise):
    rows = []
    for fit in job.fits:
        std = float(noise.std_s([fit.mean_s], [fit.noise_class])[0])
        predicted = from_moments(fit.mean_s, std, "lognormal").frozen
        result = stats.kstest(fit.durations_s, predicted.cdf)
        n = len(fit.durations_s)
        rows.append(
            (result.statistic, fit.distribution.ks_statistic, stats.kstwo.mean(n), n, result.pvalue)
        )
    return np.array(rows)


def _range_pit(measured_cv: float, predicted_cv: float, n: int, rng) -> float:
    ranges = np.ptp(rng.standard_normal((RANGE_DRAWS, n)), axis=1) * predicted_cv
    return float((ranges <= measured_cv * expected_range(n)).mean())


def _expected_max(n: int) -> float:
    """E[max of n standard normals]."""
    x = np.linspace(-8, 8, 20001)
    return float(np.trapezoid(x * n * stats.norm.pdf(x) * stats.norm.cdf(x) ** (n - 1), x))


def score_gpu(gpu_dir: Path, rng) -> list[str]:
    jobs = read_jobs(gpu_dir)
    out = [f"### {gpu_dir.name} ({len(jobs)} jobs)", ""]
    out.append(
        "| held-out job | pools | KS median (model) | KS median (best fit) | KS expected from "
        "n alone | pools not rejected (p > 0.05) | iteration CV measured | predicted | "
        "range PIT | max of n over median: measured | predicted |"
    )
    out.append("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    all_kernels, pits = [], []
    for job in jobs:
        noise, step = _leave_one_out(jobs, job)
        scores = _kernel_scores(job, noise)
        all_kernels.append(scores)
        predicted_cv = float(np.hypot(job.kernel_cv(noise), step))
        pit = _range_pit(job.iteration_cv, predicted_cv, job.iterations, rng)
        pits.append(pit)
        measured_max = job.iteration_s_max / job.iteration_s_median - 1
        predicted_max = _expected_max(job.iterations) * predicted_cv
        out.append(
            f"| {job.job} | {len(scores)} | {np.median(scores[:, 0]):.3f} | "
            f"{np.median(scores[:, 1]):.3f} | {np.median(scores[:, 2]):.3f} | "
            f"{(scores[:, 4] > 0.05).mean():.0%} | {job.iteration_cv:.2%} | {predicted_cv:.2%} | "
            f"{pit:.2f} | {measured_max:+.2%} | {predicted_max:+.2%} |"
        )
    k = np.concatenate(all_kernels)
    big = k[k[:, 3] >= 48]
    pit_ks = stats.kstest(pits, "uniform")
    out += [
        "",
        f"All {len(k)} pools: KS median {np.median(k[:, 0]):.3f} (model), "
        f"{np.median(k[:, 1]):.3f} (best in-sample fit), {np.median(k[:, 2]):.3f} expected from "
        f"the pool sizes alone; {(k[:, 4] > 0.05).mean():.0%} not rejected at 5 %. "
        f"Pools of >= 48 durations ({len(big)}): KS median "
        + (
            f"{np.median(big[:, 0]):.3f} (model), {np.median(big[:, 2]):.3f} expected."
            if len(big)
            else "none."
        )
        + f" Iteration-range PITs: KS against the uniform {pit_ks.statistic:.3f} "
        f"(p = {pit_ks.pvalue:.2f}, {len(pits)} jobs).",
        "",
    ]
    return out


def record_check() -> list[str]:
    import tomllib

    from prismbench.record import record
    from prismbench.spec import job_spec_from_dict

    job = job_spec_from_dict(tomllib.loads(RECORD_JOB))
    times = np.array(record(job, iterations=40, warmup=3).iteration_s)
    fit = fit_durations(times)
    return [
        "### Plumbing: a real CPU run (prismbench.record)",
        "",
        f"`{RECORD_JOB.strip().replace(chr(10), '; ')}` (TOML), 2 processes (gloo), 40 timed iterations after 3 warm-up: "
        f"median {np.median(times) * 1e3:.2f} ms, CV {times.std(ddof=1) / times.mean():.2%}, "
        f"best family {fit.family} (KS {fit.ks_statistic:.3f}). This measures the OS and "
        "gloo on this machine, not a GPU: it shows `record`'s repeated times reach the fit.",
        "",
    ]


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args(argv)
    commit = commit_label()
    rng = np.random.default_rng(0)
    lines = [
        "## Measured temporal variation, scored leave-one-out",
        "",
        f"Generated by `python results/fidelity/variability_measured.py"
        f"{' --record' if args.record else ''}` at commit {commit} (module docstring: method).",
        "",
    ]
    for gpu_dir in sorted(SHARED_GPU.glob("*/")):
        lines += score_gpu(gpu_dir, rng)
    if args.record:
        lines += record_check()
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1:])
