"""How often the K-step bound holds: coverage of `summarize`'s bound on synthetic step times.

    python results/fidelity/k_steps_coverage.py [--reps N] [--out FILE]

emulator/variability/summary.py bounds the time of K steps run on one allocation of GPUs at
95 %. A bound that is right holds for 95 % of runs: this script measures how often it does,
where the truth is known. Step times are made as the Monte Carlo makes them: allocation means
m_a drawn from a distribution (normal; or the maximum of 512 lognormal per-GPU factors with a
5 % CV, standardised: a synchronous step waits for its slowest GPU, so the allocation effect
is skewed), each allocation's S steps m_a + N(0, sigma_w). For each setting, `--reps` data
sets of `samples` step times are summarised, and each bound is scored by the share of 200 000
fresh runs (a fresh allocation, K steps: K m + sqrt(K) sigma_w z) that it covers; the table
gives the mean share over the data sets (0.95 is right) and how wide the bound is against the
true 95th percentile (a bound can hold by being absurdly wide: coverage alone would not show
it). Beside it: the independent-steps bound (steps_per_allocation 1 on the same data: what was
given before 7d499ab) and the mixture's bound alone (the larger of it and the pivotal bound
is the one given). A second table gives what sharing allocations costs the estimates of one
step's percentiles.
sigma_w is 1 % of the step; sigma_b / sigma_w is the setting's ratio (under prism-low the two
published rows of results/fidelity/variability.md give 1.45, Megatron 39.1B on 512 GPUs (0.31
while the network regime also slowed its NVLink all-reduces), and 4.5, torchtitan Llama 3.1 8B
FSDP on 128). Writes results/fidelity/k_steps_coverage.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "results"))
from shared_gpu import command_line, report  # noqa: E402

from emulator.variability.summary import allocation_count, mixture_bound_s, summarize  # noqa: E402

FRESH_RUNS = 200_000
STEP_S, WITHIN_CV = 1.0, 0.01
GPUS = 512  # of the skewed allocation effect: the slowest of this many per-GPU factors
GPU_CV = 0.05
SETTINGS = [  # (samples, steps per allocation, K)
    (1000, 10, 1),
    (1000, 10, 100),
    (1000, 10, 1000),
    (1000, 10, 10_000),
    (200, 10, 1000),
    (10_000, 10, 1000),
    (1000, 50, 1000),
]
RATIOS = (0.01, 0.1, 0.3, 1.0, 3.0)


def effect_pool(rng, kind: str) -> np.ndarray:
    """FRESH_RUNS allocation effects of `kind`, mean 0, std 1: the fresh runs' effects, and
    the pool each data set's allocations are drawn from."""
    if kind == "normal":
        return rng.standard_normal(FRESH_RUNS)
    sigma = np.sqrt(np.log1p(GPU_CV**2))
    slowest = np.concatenate([
        rng.lognormal(-sigma**2 / 2, sigma, (10_000, GPUS)).max(axis=1)
        for _ in range(FRESH_RUNS // 10_000)
    ])  # fmt: skip
    return (slowest - slowest.mean()) / slowest.std()


def coverage(rng, effects, ratio: float, samples: int, steps: int, k: int, reps: int):
    """Per bound (on one allocation, as independent steps, the mixture's alone): the mean
    share of fresh runs under it; and the bound given's margin over K x step as a multiple of
    the true 95th percentile's, median and 90th percentile over the data sets."""
    within = WITHIN_CV * STEP_S
    between = ratio * within
    fresh = k * (STEP_S + between * effects) + np.sqrt(k) * within * rng.standard_normal(
        len(effects)
    )
    fresh.sort()
    true_margin = np.quantile(fresh, 0.95) - k * STEP_S
    allocations = allocation_count(samples, steps)
    shares, widths = np.empty((reps, 3)), np.empty(reps)
    for r in range(reps):
        means = STEP_S + between * rng.choice(effects, allocations)
        times = np.repeat(means, steps)[:samples] + within * rng.standard_normal(samples)
        bounds = [
            summarize(times, STEP_S, seed=r, k_steps=k, steps_per_allocation=s).k_steps_bound_s
            for s in (steps, 1)
        ]
        bounds.append(mixture_bound_s(times, steps, k, 0.95))
        shares[r] = np.searchsorted(fresh, bounds, side="right") / len(fresh)
        widths[r] = (bounds[0] - k * STEP_S) / true_margin
    return (*shares.mean(axis=0), *np.percentile(widths, [50, 90]))


def percentile_noise(rng, ratio: float, steps: int, samples: int = 1000, reps: int = 2000):
    """Standard deviations of the p95 and p99 estimates of one step's time from `samples`
    step times drawn `steps` to an allocation (normal allocation effects), over `reps` data
    sets, in units of a step's std: what sharing allocations costs the percentiles."""
    within = WITHIN_CV * STEP_S
    between = ratio * within
    estimates = np.empty((reps, 2))
    for r in range(reps):
        means = STEP_S + between * rng.standard_normal(allocation_count(samples, steps))
        times = np.repeat(means, steps)[:samples] + within * rng.standard_normal(samples)
        estimates[r] = np.percentile(times, [95, 99])
    return estimates.std(axis=0) / np.hypot(between, within)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=200, help="data sets per setting (200)")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_suffix(".md"),
                        help="report (default: %(default)s)")  # fmt: skip
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    started = time.perf_counter()
    lines = [
        "| allocation effect | samples | steps per allocation | K | sigma_b / sigma_w "
        "| coverage | margin / true, median | p90 | coverage, independent steps "
        "| coverage, the mixture's bound alone |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for kind in ("normal", f"slowest of {GPUS}"):
        effects = effect_pool(rng, kind)
        for samples, steps, k in SETTINGS:
            for ratio in RATIOS:
                (given_coverage, independent_coverage, mixture_coverage, margin_median,
                 margin_p90) = coverage(rng, effects, ratio, samples, steps, k, args.reps)
                lines.append(f"| {kind} | {samples} | {steps} | {k} | {ratio:g} "
                             f"| {given_coverage:.3f} | {margin_median:.2f} | {margin_p90:.2f} "
                             f"| {independent_coverage:.3f} | {mixture_coverage:.3f} |")  # fmt: skip
                print(lines[-1], flush=True)
    lines += [
        "",
        "What allocations of 10 cost one step's percentiles: the standard deviation of the p95 "
        "and p99 estimates from 1 000 samples, over 2 000 data sets (normal allocation effects), "
        "in units of a step's std, one step per allocation against 10:",
        "",
        "| sigma_b / sigma_w | p95, 1 | p95, 10 | p99, 1 | p99, 10 |",
        "|--:|--:|--:|--:|--:|",
    ]
    for ratio in RATIOS:
        (p95_one, p99_one), (p95_ten, p99_ten) = (percentile_noise(rng, ratio, s) for s in (1, 10))
        lines.append(f"| {ratio:g} | {p95_one:.3f} | {p95_ten:.3f} | {p99_one:.3f} "
                     f"| {p99_ten:.3f} |")  # fmt: skip
        print(lines[-1], flush=True)
    lines += [
        "",
        f"The bound is meant to hold for 0.95 of runs. Margin / true: the bound's margin over "
        f"K x step as a multiple of the true 95th percentile's (1 is exact; a bound that holds "
        f"more often than it should is wider). {args.reps} data sets per setting (seeded "
        f"0, 1, ... for the pivotal bound's draws), {FRESH_RUNS:,} fresh runs scoring each, "
        f"seed 0; {time.perf_counter() - started:.0f} s.",
    ]
    report(command_line("results/fidelity/k_steps_coverage.py", argv), lines, args.out)


if __name__ == "__main__":
    main()
