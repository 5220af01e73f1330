"""Pipeline transfers measured on a real run: the CV of a transfer's own duration (issue 18).

Without a measurement the model draws a pipeline send/recv with `collective_cv`, an assumed
figure (emulator.variability.model). A user who profiled a pipelined run of the job gives the
durations of its pipeline send/recv calls, one per line: the NCCL SendRecv kernels of one
pipeline boundary in the steady-state steps, so that they are one activation size over one
link (transfers of another size or over another link would read as waits). A call lasts the
transfer alone when the peer was already there, or the transfer plus the wait for the peer:
PRISM's no-bubble and bubble regimes, which emulator.variability.regimes'
`split_pipeline_transfers` separates. A wait only lengthens a call, and may be anything from
nothing to many transfers, so no cut alone separates the short waits: the no-bubble regime's
median and spread are trimmed from the durations at or below Otsu's threshold (over their
logarithms), the spread read from the calls faster than the median, which no wait reaches, and
the calls more than regimes.BUBBLE_SIGMAS spreads above the median are the ones that waited.
The replay produces the waits itself (a recv starts at the later of the two sides), so only the
no-bubble regime is drawn: its CV, the spread over the median, becomes the model's
`transfer_cv`. Its mean (the median) is not drawn: the emulator prices each transfer from the
job's activations and links; `modelled_transfer_s` gives that price (the median of the
execution graph's sends over the boundaries of each link) for the report to set beside it.

On synthetic runs (results/fidelity/pipeline_transfer_split.md) the CV read is within 0.90-1.09x
the truth in the median of every mix where at most half the calls waited, its 90th percentile
at most 1.44x at 40 transfers and 1.17x at 1000; 0.87-1.50x where 70 % waited; 1.2-66x where
90 % did (the trimmed median lies among the waits: give the transfers of steady-state steps,
not of a schedule that is mostly bubble); a run where no call waited reads as one regime in
all but 5 % of runs of 40 transfers (under 1 % from 200). Otsu's split with the lower class's std, before,
read 0.6x the CV with no waits and up to 44x with short ones
(pipeline_transfer_split_baseline.md). The spread is read below the median: a transfer whose own
durations have a longer right tail than left reads a CV too low, and its tail as waits. Fewer
than distributions.MIN_SAMPLES calls that did not wait are refused. Durations all equal are
one regime of CV 0. Durations rounded coarser than the transfers' spread (half of the calls
at one value) read a spread of 0 below the median and every longer call as a wait: give the
kernels' own times (us or ns), as profilers record them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from emulator.graph.execution_graph import SEND, ExecutionGraph
from emulator.variability.distributions import MIN_SAMPLES
from emulator.variability.model import MAX_NORMAL_CV
from emulator.variability.regimes import BUBBLE_SIGMAS, split_pipeline_transfers
from prismbench.seconds_file import read_seconds
from workloads.config import SpecError

# At 40 transfers a no-bubble regime of a fifth of them still holds MIN_SAMPLES (8), the fewest
# its spread is read from (half of them, those below the median); fewer, and its CV rests on a
# handful of calls.
MIN_PIPELINE_TRANSFERS = 5 * MIN_SAMPLES


@dataclass(frozen=True)
class MeasuredTransfers:
    """The split of one run's pipeline transfers: where they come from, and the no-bubble CV."""

    source: str  # the file
    transfers: int
    # the no-bubble median plus regimes.BUBBLE_SIGMAS spreads (durations at or below: no bubble)
    threshold_s: float
    bubble_fraction: float  # the share above it: calls that waited for their peer
    no_bubble_mean_s: float  # the trimmed median of the calls that did not wait
    no_bubble_cv: float  # their spread over that median; drawn as the model's transfer_cv

    def describe(self) -> str:
        split = (
            f"{100 * self.bubble_fraction:.1f} % above {self.threshold_s:.4g} s, "
            f"{BUBBLE_SIGMAS:g} spreads above the median (waited for the peer)"
            if self.bubble_fraction
            else f"one regime (none {BUBBLE_SIGMAS:g} spreads above the median: no wait seen)"
        )
        return (
            f"{100 * self.no_bubble_cv:.2f} % (no-bubble median {self.no_bubble_mean_s:.4g} s); "
            f"measured in {self.source}: {self.transfers} transfers, {split}"
        )

    def to_dict(self) -> dict:
        return {
            "source": self.source,
            "transfers": self.transfers,
            "threshold_s": self.threshold_s,
            "bubble_fraction": self.bubble_fraction,
            "no_bubble_mean_s": self.no_bubble_mean_s,
            "no_bubble_cv": self.no_bubble_cv,
        }


def measured_transfers(
    path: str | Path, *, option: str = "--pipeline-transfers"
) -> MeasuredTransfers:
    """The no-bubble regime of the pipeline send/recv durations (s) `path` holds, one per line;
    one of fewer than MIN_SAMPLES calls, or of a CV the Monte Carlo cannot draw (above
    MAX_NORMAL_CV), is refused (SpecError)."""
    durations = read_seconds(path, option=option, item="transfer", minimum=MIN_PIPELINE_TRANSFERS,
                             each="one pipeline send/recv's duration")  # fmt: skip
    # split in units of the median: the CV has none, and no square of a spread then over- or
    # underflows (calls of 1e300 s read a NaN CV, of 1e-300 s a CV of 0 with most calls waits)
    scale = float(np.median(durations))
    regimes = split_pipeline_transfers(durations / scale)
    no_bubble = regimes.no_bubble
    if no_bubble.samples < MIN_SAMPLES:
        raise SpecError(
            f"{option} {path}: {no_bubble.samples} of the {len(durations)} calls did not wait for "
            f"the peer, too few to read a transfer's spread from (at least {MIN_SAMPLES}): give "
            "more steady-state steps"
        )
    cv = no_bubble.std / no_bubble.mean
    if cv > MAX_NORMAL_CV:
        raise SpecError(
            f"{option} {path}: the no-bubble regime's CV is {100 * cv:.1f} %, above the "
            f"{100 * MAX_NORMAL_CV:.0f} % a normal draw keeps positive: transfers of other sizes "
            "or links are likely mixed into it (give one pipeline boundary's SendRecv kernels "
            "of the steady-state steps)"
        )
    return MeasuredTransfers(
        source=str(path),
        transfers=len(durations),
        threshold_s=regimes.threshold_s * scale,
        bubble_fraction=regimes.bubble_fraction,
        no_bubble_mean_s=no_bubble.mean * scale,
        no_bubble_cv=cv,
    )


# the links a pipeline boundary may cross, as `modelled_transfer_s` keys them, with the graph's
# `crosses_nodes` value of each
TRANSFER_LINKS = {"within_node": 0, "across_nodes": 1}


def modelled_transfer_s(graph: ExecutionGraph) -> dict[str, float]:
    """The emulator's price of one pipeline transfer, per link its boundaries cross
    (TRANSFER_LINKS: the graph's `crosses_nodes`): the median duration (s) of the sends with a
    duration over those boundaries. A measurement is of one boundary, so it is set beside the
    price of its own link: where stages sit on NVLink and on the network both, one median over
    every boundary would compare it with a mix. Empty where the job has none (pp = 1)."""
    out = {}
    for link, crosses in TRANSFER_LINKS.items():
        durations = np.concatenate([
            g["duration_s"][(g["kind"] == SEND) & (g["crosses_nodes"] == crosses)] for g in graph.classes
        ])  # fmt: skip
        durations = durations[durations > 0]
        if len(durations):
            out[link] = float(np.median(durations))
    return out
