"""Figures drawn from emulation results (matplotlib, imported only when a figure is drawn).

`plot_memory_timeline(result, path, title, trace=, event_times_s=)`: a memory replay's allocated
bytes stacked by category and its reserved bytes (PNG), over the iteration's time when the
event times are given (`memory_event_times_s`), else over the alloc/free events; with the trace,
the forward / backward / optimizer phase of each micro-batch is shaded (`phase_bands`); a table
under the plot lists what each category held at the allocated peak.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from emulator.capture.trace import CATEGORIES, PHASES, RankTrace
from emulator.graph.build import segment_rows
from emulator.graph.execution_graph import COLLECTIVE, RECV, SEGMENT, SEND, ClassGraph
from emulator.graph.results import Timeline
from emulator.memory.events import KERNEL_WORKSPACE_CATEGORY, WORKSPACE_CATEGORY
from emulator.memory.replay import MemoryResult
from emulator.units import GiB, MiB
from prismbench.report import format_bytes

_MAX_POINTS = 4000  # timeline points plotted (events are binned beyond this)
# Band shading per phase; recompute runs inside backward and is shaded as backward.
_BAND_COLOURS = {
    "setup": "#e4e4e4",
    "forward": "#d6e8f8",
    "backward": "#fbe3cf",
    "optimizer": "#dcf2d8",
}
_BAND_LEGEND = {
    "setup": "setup (model state)",
    "forward": "forward (F<micro-batch>)",
    "backward": "backward + recompute (B)",
    "optimizer": "optimizer (opt)",
}
_BAND_SHORT = {"setup": "setup", "forward": "F", "backward": "B", "optimizer": "opt"}


@dataclass(frozen=True)
class PhaseBand:
    """Memory events [start, stop) that ran in one phase of one micro-batch."""

    label: str  # "F0" forward of micro-batch 0, "B0" its backward, "opt", "setup"
    phase: str  # "setup" (before the first op), "forward", "backward", "optimizer"
    micro_batch: int  # -1 when the phase is not per micro-batch
    start: int
    stop: int


def phase_bands(trace: RankTrace, rows: np.ndarray) -> list[PhaseBand]:
    """The runs of consecutive memory events (trace `rows`, in replay order) in one phase of one
    micro-batch. Recompute counts as backward (it runs inside it, a layer at a time)."""
    codes = trace.columns["phase"][rows].astype(np.int64)
    codes[codes == PHASES.index("recompute")] = PHASES.index("backward")
    mbs = trace.columns["micro_batch"][rows].astype(np.int64)
    change = np.flatnonzero((np.diff(codes) != 0) | (np.diff(mbs) != 0)) + 1
    starts = np.concatenate([[0], change]) if len(rows) else np.zeros(0, np.int64)
    stops = np.concatenate([change, [len(rows)]]) if len(rows) else starts
    bands = []
    for start, stop in zip(starts.tolist(), stops.tolist(), strict=True):
        code, mb = int(codes[start]), int(mbs[start])
        phase = PHASES[code] if code >= 0 else "setup"
        short = _BAND_SHORT[phase]
        label = f"{short}{mb}" if mb >= 0 and phase in ("forward", "backward") else short
        bands.append(PhaseBand(label=label, phase=phase, micro_batch=mb, start=start, stop=stop))
    return bands


def memory_event_times_s(
    trace: RankTrace, graph: ClassGraph, timeline: Timeline, rows: np.ndarray
) -> np.ndarray:
    """Per memory event (trace `rows`): its time in the replayed iteration (s).

    An alloc/free takes the time of the op issued just before it, once its stream has done it:
    the end of a compute op (the ops of one graph node are spread evenly over the node's span),
    the issue (ready) of an async collective or p2p, the end of a wait. Events before the first
    op (setup: the model state) are at 0. Times never go back: the allocator replays events in
    program order, so an event issued after another is drawn at or after it."""
    done = _op_done_s(trace, graph, timeline)
    timed = np.where(np.isnan(done), -1, np.arange(len(done)))
    before = np.concatenate([[-1], np.maximum.accumulate(timed)[:-1]])[rows]
    times = np.where(before >= 0, done[np.maximum(before, 0)], 0.0)
    return np.maximum.accumulate(times) if len(times) else times


def _op_done_s(trace: RankTrace, g: ClassGraph, t: Timeline) -> np.ndarray:
    """Per trace row: when the issuing stream is past the op of that row (NaN: no op)."""
    c = trace.columns
    done = np.full(len(c["kind"]), np.nan)
    comm = np.isin(g["kind"], (COLLECTIVE, SEND, RECV))
    done[g["first_row"][comm]] = t.ready_s[comm]
    rest = ~comm & (g["kind"] != SEGMENT)  # waits: the stream blocks until the waited end
    done[g["first_row"][rest]] = t.end_s[rest]
    row, node = segment_rows(trace, g)
    count = g["rows"][node]
    k = np.arange(len(node)) - np.searchsorted(node, node)  # position inside its segment
    span = t.end_s[node] - t.start_s[node]
    done[row] = t.start_s[node] + span * (k + 1) / count
    return done


def plot_memory_timeline(
    result: MemoryResult,
    path: str | Path,
    title: str = "",
    *,
    trace: RankTrace | None = None,
    event_times_s: np.ndarray | None = None,
) -> Path:
    """Allocated bytes stacked by category, and reserved, over the iteration (PNG).

    event_times_s (per event of `result.timeline`, e.g. from `memory_event_times_s`): the x
    axis is time (s), else the event index. trace (the replayed one): phase bands, labelled.
    A table under the plot lists the bytes of each category live at the allocated peak."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = result.timeline
    n = len(t.rows)
    if event_times_s is not None and len(event_times_s) != n:
        raise ValueError(f"event_times_s has {len(event_times_s)} entries for {n} events")
    picks = np.unique(np.linspace(0, max(n - 1, 0), min(n, _MAX_POINTS)).astype(np.int64))
    if result.peak is not None:  # binning must not hide the peak
        picks = np.union1d(picks, [result.peak.event_index])
    x = picks if event_times_s is None else np.asarray(event_times_s, float)[picks]
    to_x = (lambda j: j) if event_times_s is None else (lambda j: float(event_times_s[j]))
    categories = {name or "other" for name in np.asarray(t.categories)[np.unique(t.category)]}
    rows_in_table = len(categories | set(result.live_at_peak_by_category)) + 4
    fig, (ax, tab) = plt.subplots(
        2, 1, figsize=(11, 4.8 + 0.24 * rows_in_table), height_ratios=(4.8, 0.24 * rows_in_table)
    )
    unit, scale = ("GiB", GiB) if result.peak_reserved_bytes >= GiB else ("MiB", MiB)
    colours = _draw_curves(ax, result, picks, x, to_x, scale)
    if trace is not None:
        _draw_bands(ax, phase_bands(trace, t.rows), event_times_s)
    ax.set_xlabel("time in the iteration (s)" if event_times_s is not None else "alloc/free event")
    ax.set_ylabel(f"memory ({unit})")
    ax.set_title(title or "memory timeline (allocated by category, reserved)", fontsize=10, pad=16)
    ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=7, framealpha=0.9)
    ax.margins(x=0)
    _draw_table(tab, result, colours)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _draw_curves(ax, result: MemoryResult, picks, x, to_x, scale: int) -> dict[str, str]:
    """The stacked categories, reserved, the peak, and the GPU's capacity where it is on the
    scale of the job (under 2x its peak reserved; the table gives it anyway); category ->
    colour."""
    t = result.timeline
    n = len(t.rows)
    names = np.array([name or "other" for name in t.categories])[t.category]
    labels = sorted(set(names.tolist()))
    stacks = []
    for label in labels:  # "" and "other" are one category
        mine = names == label
        delta = np.zeros(n + 1, np.int64)
        np.add.at(delta, t.alloc_event[mine], t.block_bytes[mine])
        np.add.at(delta, t.free_event[mine], -t.block_bytes[mine])
        stacks.append(np.cumsum(delta[:n])[picks] / scale)
    known = (*CATEGORIES, WORKSPACE_CATEGORY, KERNEL_WORKSPACE_CATEGORY)  # same colours everywhere
    order = [known.index(lab) if lab in known else len(known) + i for i, lab in enumerate(labels)]
    colours = {lab: f"C{k % 10}" for lab, k in zip(labels, order, strict=True)}
    if stacks:  # the table under the plot names the colours
        ax.stackplot(x, *stacks, colors=[colours[lab] for lab in labels], alpha=0.85)
    ax.plot(x, t.reserved[picks] / scale, color="black", lw=1.2, label="reserved")
    if result.peak is not None:
        at = to_x(result.peak.event_index)
        ax.axvline(at, color="red", ls=":", lw=1, label="allocated peak")
    cap = result.gpu_capacity_bytes
    if cap and cap < 2 * result.peak_reserved_bytes:
        ax.axhline(cap / scale, color="gray", ls="--", lw=1, label=f"{result.gpu} capacity")
    return colours


def _draw_bands(ax, bands: list[PhaseBand], times) -> None:
    """Shade each band (from its first event to the next band's) and label it above the plot
    where it is wide enough to read."""
    if not bands:
        return
    at = (lambda j: j) if times is None else (lambda j: float(times[j]))
    edges = [at(b.start) for b in bands] + [at(bands[-1].stop - 1)]
    width = max(edges[-1] - edges[0], 1e-12)
    for band, lo, hi in zip(bands, edges, edges[1:], strict=False):
        ax.axvspan(lo, hi, color=_BAND_COLOURS[band.phase], alpha=0.6, lw=0, zorder=0)
        if (hi - lo) / width > 0.02:
            ax.text(
                (lo + hi) / 2,
                1.01,
                band.label,
                transform=ax.get_xaxis_transform(),
                ha="center",
                va="bottom",
                fontsize=7,
            )
    for phase in dict.fromkeys(b.phase for b in bands):
        ax.axvspan(0, 0, color=_BAND_COLOURS[phase], alpha=0.6, lw=0, label=_BAND_LEGEND[phase])


def _draw_table(ax, result: MemoryResult, colours: dict[str, str]) -> None:
    """Each category's bytes live at the allocated peak (those of the plot at 0 included),
    largest first, then the peak allocated and peak reserved figures."""
    ax.axis("off")
    live = dict.fromkeys(colours, 0) | result.live_at_peak_by_category
    peak = result.peak_allocated_bytes
    rows = sorted(live.items(), key=lambda kv: (-kv[1], kv[0]))
    text = [[name, format_bytes(b), f"{100 * b / peak:.1f} %" if peak else "-"] for name, b in rows]
    text += [
        ["peak allocated", format_bytes(peak), ""],
        ["peak reserved", format_bytes(result.peak_reserved_bytes), ""],
    ]
    if result.gpu_capacity_bytes:
        text += [[f"{result.gpu} capacity", format_bytes(result.gpu_capacity_bytes), ""]]
    table = ax.table(
        cellText=text,
        colLabels=["category", "bytes live at the allocated peak", "share of it"],
        colWidths=[0.4, 0.4, 0.2],
        cellLoc="left",
        colLoc="left",
        bbox=[0.2, 0.0, 0.6, 1.0],
    )
    table.auto_set_font_size(False)
    table.set_fontsize(8)
    for i, (name, _) in enumerate(rows, start=1):
        if name in colours:
            table[i, 0].set_facecolor(colours[name])
    for i in range(len(rows) + 1, len(text) + 1):
        for j in range(3):
            table[i, j].get_text().set_fontweight("bold")
