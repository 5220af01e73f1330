"""How well `--pipeline-transfers` reads a transfer's own CV back from synthetic send/recv runs.

    python results/fidelity/pipeline_transfer_split.py   (writes pipeline_transfer_split.md;
    a minute or two on 2 shared cores)

Each synthetic run: n durations of one transfer (mean 2 ms; normal or lognormal, of true CV
0.5, 2 or 5 %), a `bubble` share of which also waited for the peer, the wait drawn uniform over
0..k transfers (k = 0.5, 2, 10) or exponential of mean one transfer. The run goes through
emulator.variability.regimes' `split_pipeline_transfers`, as prismbench/pipeline_transfers.py
does, and the CV it reads (the no-bubble regime's std over its mean) is divided by the true
one. Per row, the two families times SEEDS seeds: the median, 10th and 90th percentile of
that ratio, the median bubble fraction read (true: the row's; a wait far below the transfer's
own spread cannot be told from none) and the share of runs read as one regime (right where
none waited). A last line per n sums the rows up.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "results")]
from shared_gpu import command_line, report  # noqa: E402

from emulator.variability.regimes import split_pipeline_transfers  # noqa: E402

TRANSFER_S = 2e-3
CVS = (0.005, 0.02, 0.05)
SIZES = (40, 200, 1000)
BUBBLES = (0.1, 0.3, 0.5, 0.7, 0.9)
WAITS = ("uniform 0..0.5x", "uniform 0..2x", "uniform 0..10x", "exponential 1x")
FAMILIES = ("normal", "lognormal")
SEEDS = 50


def transfers_s(rng, family: str, cv: float, n: int) -> np.ndarray:
    """n durations of the transfer alone, mean TRANSFER_S and CV `cv`."""
    if family == "normal":
        return TRANSFER_S * (1 + cv * rng.standard_normal(n))
    sigma = np.sqrt(np.log1p(cv**2))
    return TRANSFER_S * np.exp(sigma * rng.standard_normal(n) - sigma**2 / 2)


def waits_s(rng, shape: str, n: int) -> np.ndarray:
    """n waits for the peer, of the `shape` WAITS names (in transfers)."""
    if shape.startswith("exponential"):
        return rng.exponential(TRANSFER_S, n)
    k = float(shape.split("..")[1].rstrip("x"))
    return rng.uniform(0, k * TRANSFER_S, n)


@dataclass
class Reads:
    """What one cell's runs read: CV over the true one, bubble fraction, one regime or not."""

    ratios: list[float] = field(default_factory=list)
    bubbles: list[float] = field(default_factory=list)
    one_regime: list[bool] = field(default_factory=list)

    def cells(self) -> list[str]:
        p10, median, p90 = np.quantile(self.ratios, [0.1, 0.5, 0.9])
        return [f"{median:.2f} ({p10:.2f}-{p90:.2f})", f"{np.median(self.bubbles):.2f}",
                f"{np.mean(self.one_regime):.0%}"]  # fmt: skip


def case(rng, cv: float, n: int, bubble: float, shape: str | None) -> Reads:
    """Runs of n transfers of CV `cv`, `bubble` of them waiting `shape` waits (None: none)."""
    reads = Reads()
    for family in FAMILIES:
        for _ in range(SEEDS):
            durations = transfers_s(rng, family, cv, n)
            waited = rng.random(n) < bubble
            if shape is not None:
                durations += np.where(waited, waits_s(rng, shape, n), 0.0)
            regimes = split_pipeline_transfers(durations)
            reads.ratios.append(regimes.no_bubble.std / regimes.no_bubble.mean / cv)
            reads.bubbles.append(regimes.bubble_fraction)
            reads.one_regime.append(regimes.bubble is None)
    return reads


def summary(n: int, cells: list[tuple[str, Reads]]) -> str:
    """One line over every row of n transfers: the range of the median ratios, the largest p90
    and smallest p10, and how many runs without waits were split."""
    medians = [np.median(r.ratios) for _, r in cells]
    p90 = max(np.quantile(r.ratios, 0.9) for _, r in cells)
    p10 = min(np.quantile(r.ratios, 0.1) for _, r in cells)
    unsplit = [one for label, r in cells if label == "none" for one in r.one_regime]
    return (f"- n={n}: median CV read / true {min(medians):.2f}-{max(medians):.2f} over the rows, "
            f"p90 at most {p90:.2f}, p10 at least {p10:.2f}; runs without waits split in two: "
            f"{len(unsplit) - sum(unsplit)} of {len(unsplit)}.")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).with_suffix(".md"),
                        help="report (default: %(default)s)")  # fmt: skip
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    head = "| waits | bubble | true CV |"
    rule = "|---|--:|--:|"
    for n in SIZES:
        head += f" n={n}: CV read / true, median (p10-p90) | bubble read | one regime |"
        rule += "--:|--:|--:|"
    lines = [head, rule]
    by_size: dict[int, list[tuple[str, Reads]]] = {n: [] for n in SIZES}
    rows = [("none", 0.0, None)] + [(w, b, w) for w in WAITS for b in BUBBLES]
    for label, bubble, shape in rows:
        for cv in CVS:
            cells = []
            for n in SIZES:
                reads = case(rng, cv, n, bubble, shape)
                by_size[n].append((label, reads))
                cells += reads.cells()
            lines.append(f"| {label} | {bubble:.0%} | {cv:.1%} | " + " | ".join(cells) + " |")
            print(lines[-1], flush=True)
    lines += [
        "",
        f"Transfers of mean {TRANSFER_S * 1e3:g} ms, {' and '.join(FAMILIES)}; waits in transfers "
        f"(k x {TRANSFER_S * 1e3:g} ms); {len(FAMILIES)} x {SEEDS} runs a cell; seed 0. "
        '"one regime": the share of runs split into no bubble at all (100 % is right only '
        "where none waited).",
        "",
        *(summary(n, by_size[n]) for n in SIZES),
    ]
    report(command_line("results/fidelity/pipeline_transfer_split.py", argv), lines, args.out)


if __name__ == "__main__":
    main()
