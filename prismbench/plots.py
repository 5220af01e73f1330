"""Figures drawn from emulation results (matplotlib, imported only when a figure is drawn).

`plot_memory_timeline(result, path, title, trace=, event_times_s=, first_event_times_s=)`: a
memory replay's allocated bytes stacked by category and its reserved bytes (PNG), over the
iteration's time when the event times are given (`memory_event_times_s`), else over the
alloc/free events; with the trace, the forward / backward / optimizer phase of each micro-batch
is shaded (`phase_bands`). The first iteration is drawn too where a reader needs it
(`iterations_drawn`), the usable capacity and the allocator's limit are lines (`limit_lines`),
an OOM is marked and titled (`plot_title`), and a table under the plot (`table_rows`) lists what
each category held at the allocated peak, then the peaks and limits. Colours: `category_colours`.
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
from emulator.memory.replay import MemoryResult, MemoryTimeline
from emulator.units import GiB, MiB
from prismbench.report import format_bytes, micro_batch_of

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
    first_event_times_s: np.ndarray | None = None,
) -> Path:
    """Allocated bytes stacked by category, and reserved, over the iteration (PNG).

    The steady iteration is drawn, and above it the first when it peaks higher or is where the
    OOM happened (`iterations_drawn`). event_times_s / first_event_times_s (per event of
    `result.timeline` / `result.first_timeline`, e.g. from `memory_event_times_s`): the x axis
    is time (s), else the event index. trace (the replayed one): phase bands, labelled. The
    usable capacity and the allocator's limit are drawn where they are on the job's scale, an
    OOM is marked where it happened, and a table under the plot lists the bytes of each
    category live at the steady allocated peak, then the peaks and the limits."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    times = {"first": first_event_times_s, "steady": event_times_s}
    for iteration, timeline in _timelines(result).items():
        got = times[iteration]
        if got is not None and len(got) != len(timeline.rows):
            raise ValueError(
                f"{iteration} iteration: {len(got)} event times for {len(timeline.rows)} events"
            )
    drawn = iterations_drawn(result)
    rows = table_rows(result, _categories(result, drawn))
    colours = category_colours(row.name for row in rows if row.category)
    fig, axes = plt.subplots(
        len(drawn) + 1,
        1,
        figsize=(11, 4.2 * len(drawn) + 0.6 + 0.24 * len(rows)),
        height_ratios=(*(4.2,) * len(drawn), 0.24 * len(rows)),
    )
    peak = max(result.peak_reserved_bytes, result.first_iteration_peak_reserved_bytes)
    unit, scale = ("GiB", GiB) if peak >= GiB else ("MiB", MiB)
    for ax, iteration in zip(axes, drawn, strict=False):
        _draw_iteration(ax, result, iteration, times[iteration], trace, colours, (unit, scale))
    axes[0].set_title(plot_title(result, title), fontsize=10, pad=16)
    _draw_table(axes[-1], rows, colours)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _timelines(result: MemoryResult) -> dict[str, MemoryTimeline]:
    return {"first": result.first_timeline, "steady": result.timeline}


def iterations_drawn(result: MemoryResult) -> tuple[str, ...]:
    """("steady",), with "first" before it when the first iteration peaks higher (allocated or
    reserved) than the steady one or is where the OOM happened: what a reader must see."""
    higher = (
        result.first_iteration_peak_allocated_bytes > result.peak_allocated_bytes
        or result.first_iteration_peak_reserved_bytes > result.peak_reserved_bytes
    )
    oom_first = result.oom is not None and result.oom.iteration == "first"
    return ("first", "steady") if higher or oom_first else ("steady",)


def plot_title(result: MemoryResult, title: str) -> str:
    """The caller's title, under a line saying the OOM (if any): where, and how much was asked."""
    title = title or "memory timeline (allocated by category, reserved)"
    oom = result.oom
    if oom is None:
        return title
    micro_batch = micro_batch_of(oom.at.phase, oom.at.micro_batch)
    where = oom.at.phase + ("" if micro_batch is None else f" of micro-batch {micro_batch}")
    return (
        f"OUT OF MEMORY in the {oom.iteration} iteration ({where}): "
        f"{format_bytes(oom.request_bytes)} requested, {format_bytes(oom.allocated_bytes)} "
        f"allocated (drawn on as if unlimited)\n{title}"
    )


def _categories(result: MemoryResult, drawn: tuple[str, ...]) -> set[str]:
    """The categories allocated in the drawn iterations ("" counted as "other")."""
    names = set()
    for iteration in drawn:
        t = _timelines(result)[iteration]
        names |= {name or "other" for name in np.asarray(t.categories)[np.unique(t.category)]}
    return names


def _draw_iteration(ax, result: MemoryResult, iteration: str, times, trace, colours, units):
    """One iteration's panel: curves, limits, its phase bands and, if it happened there, the
    OOM."""
    unit, scale = units
    t = _timelines(result)[iteration]
    n = len(t.rows)
    peak_at = int(np.argmax(t.allocated)) if n else None
    oom_at = result.oom.at.event_index if result.oom and result.oom.iteration == iteration else None
    picks = np.unique(np.linspace(0, max(n - 1, 0), min(n, _MAX_POINTS)).astype(np.int64))
    picks = np.union1d(picks, [j for j in (peak_at, oom_at) if j is not None])  # never binned away
    to_x = (lambda j: j) if times is None else (lambda j: float(times[j]))
    x = picks if times is None else np.asarray(times, float)[picks]
    _draw_curves(ax, t, picks, x, scale, colours)
    if peak_at is not None:
        ax.axvline(to_x(peak_at), color="red", ls=":", lw=1, label="allocated peak")
    for line in limit_lines(result):
        ax.axhline(line.size_bytes / scale, color="dimgray", ls=line.style, lw=1, label=line.label)
    if oom_at is not None:
        _draw_oom(ax, result, to_x(oom_at), scale)
    if trace is not None:
        _draw_bands(ax, phase_bands(trace, t.rows), times)
    ax.set_xlabel(f"time in the {iteration} iteration (s)" if times is not None
                  else f"alloc/free event of the {iteration} iteration")  # fmt: skip
    ax.set_ylabel(f"{iteration} iteration: memory ({unit})")
    ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=7, framealpha=0.9)
    ax.margins(x=0)


def _draw_curves(ax, t: MemoryTimeline, picks, x, scale: int, colours: dict[str, str]) -> None:
    """The categories' live bytes stacked, and reserved."""
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
    if stacks:  # the table under the plot names the colours
        ax.stackplot(x, *stacks, colors=[colours[lab] for lab in labels], alpha=0.85)
    ax.plot(x, t.reserved[picks] / scale, color="black", lw=1.2, label="reserved")


def _draw_oom(ax, result: MemoryResult, at: float, scale: int) -> None:
    """A cross where the refused request would have ended (allocated + request), at its time."""
    oom = result.oom
    top = (oom.allocated_bytes + oom.request_bytes) / scale
    ax.axvline(at, color="magenta", lw=1.2, label="OOM")
    ax.plot([at], [top], marker="X", ms=10, color="magenta", mec="black", ls="none")
    ax.annotate(
        f"OOM: {format_bytes(oom.request_bytes)} requested",
        (at, top),
        xytext=(6, 6),
        textcoords="offset points",
        fontsize=8,
        color="black",
        bbox={"boxstyle": "round", "fc": "white", "ec": "magenta"},
    )


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


@dataclass(frozen=True)
class LimitLine:
    """A horizontal line of the plot: a limit on what the allocator may hold."""

    label: str
    size_bytes: int
    style: str  # matplotlib line style


def limit_lines(result: MemoryResult) -> list[LimitLine]:
    """The GPU's usable capacity and the allocator's limit under it (capacity less what lives
    outside the allocator, where the replay's OOMs happen), when they are on the job's scale
    (under twice its peak reserved; the table gives them anyway). None without a GPU."""
    limit = result.allocator_limit_bytes
    if limit is None:
        return []
    lines = [
        LimitLine(f"{result.gpu} usable capacity", result.gpu_capacity_bytes, "--"),
        LimitLine("allocator limit (capacity - outside the allocator)", limit, "-."),
    ]
    peak = max(result.peak_reserved_bytes, result.first_iteration_peak_reserved_bytes)
    return [line for line in lines if line.size_bytes < 2 * peak]


@dataclass(frozen=True)
class TableRow:
    """A row of the table under the plot; a category row has its colour swatch."""

    name: str
    size_bytes: int
    share: str  # of the steady allocated peak, for a category row; "" otherwise
    category: bool


def table_rows(result: MemoryResult, categories: set[str]) -> list[TableRow]:
    """Each category's bytes live at the steady allocated peak (`categories` drawn at 0 B
    included), largest first; then the peaks (the first iteration's when it is drawn), what
    lives outside the allocator, the allocator's limit and the usable capacity; the refused
    request last if there was an OOM."""
    live = dict.fromkeys(categories, 0) | result.live_at_peak_by_category
    peak = result.peak_allocated_bytes
    rows = [
        TableRow(name, b, f"{100 * b / peak:.1f} %" if peak else "-", True)
        for name, b in sorted(live.items(), key=lambda kv: (-kv[1], kv[0]))
    ]
    figures = [("peak allocated", peak), ("peak reserved", result.peak_reserved_bytes)]
    if "first" in iterations_drawn(result):
        figures += [
            ("first iteration: peak allocated", result.first_iteration_peak_allocated_bytes),
            ("first iteration: peak reserved", result.first_iteration_peak_reserved_bytes),
        ]
    if result.allocator_limit_bytes is not None:
        figures += [
            ("outside the allocator (CUDA context, NCCL)", result.outside.total_bytes),
            ("allocator limit (capacity - outside)", result.allocator_limit_bytes),
            (f"{result.gpu} usable capacity", result.gpu_capacity_bytes),
        ]
    if result.oom is not None:
        figures += [(f"OOM: refused request ({result.oom.iteration} iteration)",
                     result.oom.request_bytes)]  # fmt: skip
    return rows + [TableRow(name, b, "", False) for name, b in figures]


# One colour per category the replay knows, in this order, then for any other label
# (matplotlib's tab10, then tab20b's darker hues: tab10 alone gave kernel_workspace parameter's).
_KNOWN_CATEGORIES = (*CATEGORIES, WORKSPACE_CATEGORY, KERNEL_WORKSPACE_CATEGORY)
_PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#e7ba52", "#393b79", "#7b4173", "#637939", "#843c39", "#6b6ecf",
)  # fmt: skip


def category_colours(labels) -> dict[str, str]:
    """label -> colour: a known category always gets the same one, wherever it is drawn; other
    labels take the colours left, in sorted order (distinct for up to len(_PALETTE) labels in
    all, then they repeat)."""
    labels = set(labels)
    colours = {
        lab: _PALETTE[_KNOWN_CATEGORIES.index(lab)] for lab in labels & set(_KNOWN_CATEGORIES)
    }
    spare = _PALETTE[len(_KNOWN_CATEGORIES) :]
    for k, lab in enumerate(sorted(labels - set(_KNOWN_CATEGORIES))):
        colours[lab] = spare[k % len(spare)]
    return colours


def _draw_table(ax, rows: list[TableRow], colours: dict[str, str]) -> None:
    """The rows, a category's name on its colour, the other figures in bold."""
    ax.axis("off")
    table = ax.table(
        cellText=[[r.name, format_bytes(r.size_bytes), r.share] for r in rows],
        colLabels=["category", "live at the steady allocated peak", "share of it"],
        colWidths=[0.5, 0.35, 0.15],
        cellLoc="left",
        colLoc="left",
        bbox=[0.1, 0.0, 0.8, 1.0],
    )
    table.auto_set_font_size(False)
    table.set_fontsize(8)
    for i, row in enumerate(rows, start=1):
        if row.category:
            table[i, 0].set_facecolor(colours[row.name])
        else:
            for j in range(3):
                table[i, j].get_text().set_fontweight("bold")
