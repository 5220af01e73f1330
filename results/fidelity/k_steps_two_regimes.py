"""Coverage of the K-step bound when the steps of one allocation are bimodal (two regimes).

    python results/fidelity/k_steps_two_regimes.py   (writes k_steps_two_regimes.md; a few
    minutes on 2 shared cores)

k_steps_coverage.py draws normal within-allocation noise; under the default network regimes
(emulator/variability/model.py) 10 % of steps are slower by a fixed amount, so a step within an
allocation is a mixture. Here: 90 % of steps N(0, sigma_w), 10 % the same plus JUMP x sigma_w;
allocation effects normal at sigma_b = 0.3 sigma_w (k_steps_coverage.py's middle setting);
1 000 samples in allocations of 10, 200 data sets per row, each bound scored by the share of
200 000 fresh runs of K steps it covers (0.95 is right).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "results")]
from shared_gpu import command_line, report  # noqa: E402

from emulator.variability.summary import allocation_count, summarize  # noqa: E402

STEP_S, WITHIN_S, RATIO = 1.0, 0.01, 0.3
SAMPLES, STEPS, DATA_SETS, FRESH_RUNS = 1000, 10, 200, 200_000
CONGESTED = 0.1  # share of steps in the slow regime: the default's 10 % (an assumption)


def within_s(rng, shape, jump: float) -> np.ndarray:
    """Within-allocation noise (s): normal, plus jump x sigma_w on a CONGESTED share of steps."""
    slow = rng.random(shape) < CONGESTED
    return WITHIN_S * (rng.standard_normal(shape) + jump * slow)


def coverage(rng, jump: float, k: int) -> float:
    effects_s = RATIO * WITHIN_S * rng.standard_normal(FRESH_RUNS)
    fresh = np.sort(k * (STEP_S + effects_s) + within_s(rng, (FRESH_RUNS, k), jump).sum(axis=1))
    shares = []
    for r in range(DATA_SETS):
        means = STEP_S + RATIO * WITHIN_S * rng.standard_normal(allocation_count(SAMPLES, STEPS))
        times = np.repeat(means, STEPS)[:SAMPLES] + within_s(rng, SAMPLES, jump)
        d = summarize(times, STEP_S, seed=r, k_steps=k, steps_per_allocation=STEPS)
        shares.append(np.searchsorted(fresh, d.k_steps_bound_s, side="right") / FRESH_RUNS)
    return float(np.mean(shares))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).with_suffix(".md"),
                        help="report (default: %(default)s)")  # fmt: skip
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    lines = ["| slow regime's jump (sigma_w) | K | coverage of the 95 % bound |", "|--:|--:|--:|"]
    for jump in (0.0, 4.0, 8.0):
        for k in (1, 5, 100):
            lines.append(f"| {jump:g} | {k} | {coverage(rng, jump, k):.3f} |")
            print(lines[-1], flush=True)
    lines += [
        "",
        f"90 % of steps N(0, sigma_w), {CONGESTED:.0%} the same plus the jump; sigma_b = "
        f"{RATIO} sigma_w; {SAMPLES} samples in allocations of {STEPS}, {DATA_SETS} data sets a "
        f"row, {FRESH_RUNS:,} fresh runs scoring each bound; seed 0. 0.95 is right.",
    ]
    report(command_line("results/fidelity/k_steps_two_regimes.py", argv), lines, args.out)


if __name__ == "__main__":
    main()
