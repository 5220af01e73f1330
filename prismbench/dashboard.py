"""A static fidelity dashboard from the validation history: index.html and PNGs, no server.

`write_dashboard(db_path, out_dir)` reads the DuckDB history (`prismbench.history`): one
complete run's metric results (the latest complete one to start, or the one `run_id` names:
a later run of one case would otherwise take the full run's page) for the scatter (predicted
vs measured per source, with the y = x line), the error distribution and the worst cases;
every complete run for the trend of each case's error (the nightly history). Runs that did
not complete are left out and counted. Figures are matplotlib PNGs; the page links nothing outside its folder.
"""

from __future__ import annotations

import html
import json
import os
import tempfile
from pathlib import Path

from emulator.graph.results import BREAKDOWN_FIELDS
from prismbench import history
from prismbench.report import breakdown_label, format_field

WORST_SHOWN = 15
# The predicted iteration's parts shown beside each worst case (emulate JSON `breakdown`).
BREAKDOWN = {name: breakdown_label(name) for name in BREAKDOWN_FIELDS}
TREND_CASES = 12


def _breakdown_cells(result_json: str | None) -> str:
    breakdown = json.loads(result_json)["breakdown"] if result_json else {}
    return "".join(
        f"<td>{breakdown[k]:.4g}</td>" if k in breakdown else "<td>-</td>" for k in BREAKDOWN
    )


def _complete_runs(db: Path) -> list[dict]:
    return history.read(
        db,
        "SELECT run_id, commit, dirty, started_at FROM runs WHERE status = 'complete' ORDER BY started_at",
    )


def _nothing_scored(counts: dict) -> str:
    """Why the page has no figure: its run has no metric result (every case failed, or
    measured nothing the emulator predicts, such as a CPU recording's figures); `counts` is
    the run's {"cases", "failed"}."""
    return (
        f"<p>This run scored no case: of its {counts['cases']} case(s), "
        f"{counts['failed']} failed to emulate and the rest measured no figure the emulator predicts "
        "(a CPU recording's, for one). Validate a baseline measured on a GPU to draw the figures.</p>"
    )


def _scatter(rows: list[dict], metric: str, path: Path) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    # bytes in GiB: tick labels of a few digits (raw bytes, "2.25e+10", ran into each other
    # where the values span less than a decade and matplotlib labels the minor ticks)
    unit, scale = ("GiB", 2**30) if metric.endswith("_bytes") else ("s", 1.0)
    fig, ax = plt.subplots(figsize=(6, 5.5))
    sources = sorted({r["source"] for r in rows})
    for source in sources:
        pts = [r for r in rows if r["source"] == source]
        ax.scatter([r["measured"] / scale for r in pts], [r["predicted"] / scale for r in pts],
                   label=source, s=18)  # fmt: skip
    values = [v / scale for r in rows for v in (r["measured"], r["predicted"])]
    lo, hi = min(values), max(values)
    if hi <= lo * 1.01:  # one point (or all alike): a line through it, not a dot
        lo, hi = lo / 1.5, hi * 1.5
    ax.plot([lo, hi], [lo, hi], color="black", linewidth=0.8, label="y = x")
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (
        ax.xaxis,
        ax.yaxis,
    ):  # plain numbers; minor ticks unlabelled so labels do not collide
        axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(f"measured {metric} ({unit})")
    ax.set_ylabel(f"predicted {metric} ({unit})")
    ax.legend(fontsize=7)
    ax.set_title(f"Predicted vs measured: {metric}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _histogram(rows: list[dict], metric: str, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.hist([100 * r["error"] for r in rows], bins=30, color="tab:blue")
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_xlabel(f"error of {metric} (%), (predicted - measured) / measured")
    ax.set_ylabel("cases")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _trend(trend: list[dict], runs: list[dict], cases: list[str], metric: str, path: Path) -> None:
    import matplotlib.pyplot as plt

    order = {r["run_id"]: i for i, r in enumerate(runs)}
    fig, ax = plt.subplots(figsize=(10, 4))
    for case in cases:
        pts = sorted((order[r["run_id"]], 100 * r["error"]) for r in trend if r["baseline"] == case)
        ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", markersize=3, label=case)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(runs)), [r["commit"][:7] + ("*" if r["dirty"] else "") for r in runs],
                  rotation=45, fontsize=7)  # fmt: skip
    ax.set_xlabel("validation run (commit; * = uncommitted changes)")
    ax.set_ylabel(f"error of {metric} (%)")
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1))  # outside: hides no point
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_dashboard(db_path: str | Path, out_dir: str | Path, run_id: str | None = None) -> Path:
    """Write index.html and its PNGs into `out_dir` for the complete run `run_id` (default the
    latest complete one to start); returns the page's path. They are drawn in a staging folder
    beside it and moved in once all are drawn: a drawing that fails or is interrupted leaves
    `out_dir` as it was, not a page without its figures or beside stale ones."""
    import matplotlib

    matplotlib.use("Agg")
    db, out = Path(db_path), Path(out_dir)
    if not db.is_file():
        raise FileNotFoundError(f"{db}: no validation history (run prismbench validate first)")
    runs = _complete_runs(db)
    if not runs:
        raise ValueError(f"{db}: no complete validation run yet")
    shown = runs[-1] if run_id is None else _complete_run(db, runs, run_id)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as staging:
        _draw(db, runs, shown, Path(staging))
        _move_into(Path(staging), out)
    return out / "index.html"


def _move_into(staging: Path, out: Path) -> None:
    """Move the drawn files into `out`, index.html last: the page never names a missing figure."""
    out.mkdir(exist_ok=True)
    for path in sorted(staging.iterdir(), key=lambda p: p.name == "index.html"):
        os.replace(path, out / path.name)


def _complete_run(db: Path, runs: list[dict], run_id: str) -> dict:
    """The complete run `run_id` of `runs`, or why it cannot be drawn."""
    for run in runs:
        if run["run_id"] == run_id:
            return run
    found = history.read(db, "SELECT status FROM runs WHERE run_id = ?", [run_id])
    if found:
        raise ValueError(f"run_id={run_id!r}: that run is {found[0]['status']!r}, not complete")
    latest = ", ".join(r["run_id"] for r in runs[-5:])
    raise ValueError(f"run_id={run_id!r}: no such run in {db} (its latest complete: {latest})")


def _draw(db: Path, runs: list[dict], shown: dict, out: Path) -> None:
    """index.html and its PNGs of the complete run `shown`, with the trend over the history's
    complete `runs` (oldest first), into `out`."""
    incomplete = history.read(db, "SELECT count(*) AS n FROM runs WHERE status != 'complete'")[0][
        "n"
    ]
    run_id = shown["run_id"]
    (counts,) = history.read(
        db,
        "SELECT count(*) AS cases, count(*) FILTER (WHERE status != 'ok') AS failed FROM cases "
        "WHERE run_id = ?",
        [run_id],
    )
    results = history.read(
        db,
        "SELECT m.baseline, c.source, c.gpu, c.result, m.metric, m.predicted, m.measured, m.error "
        "FROM metric_results m JOIN cases c USING (run_id, baseline) WHERE m.run_id = ?",
        [run_id],
    )
    sections = []
    for metric in sorted({r["metric"] for r in results}):
        rows = [r for r in results if r["metric"] == metric]
        _scatter(rows, metric, out / f"scatter_{metric}.png")
        _histogram(rows, metric, out / f"errors_{metric}.png")
        worst = sorted(rows, key=lambda r: -abs(r["error"]))[:WORST_SHOWN]
        trend = history.read(
            db,
            "SELECT m.run_id, m.baseline, m.error FROM metric_results m JOIN runs r USING (run_id) "
            "WHERE r.status = 'complete' AND m.metric = ?",
            [metric],
        )
        trend_cases = [r["baseline"] for r in worst[:TREND_CASES]]
        _trend(trend, runs, trend_cases, metric, out / f"trend_{metric}.png")
        timed = metric.endswith("_s")  # the iteration's parts only beside a time
        table = "".join(
            f"<tr><td>{html.escape(r['baseline'])}</td><td>{html.escape(r['gpu'])}</td>"
            f"<td>{format_field(metric, r['predicted'])}</td>"
            f"<td>{format_field(metric, r['measured'])}</td><td>{100 * r['error']:+.1f} %</td>"
            f"{_breakdown_cells(r['result']) if timed else ''}</tr>"
            for r in worst
        )
        sections.append(
            f"<h2>{html.escape(metric)}</h2>"
            f'<img src="scatter_{metric}.png" alt="predicted vs measured"> '
            f'<img src="errors_{metric}.png" alt="error distribution">'
            f"<h3>Worst cases (this run)</h3><table><tr><th>baseline</th><th>GPU</th>"
            f"<th>predicted</th><th>measured</th><th>error</th>"
            + ("".join(f"<th>{label} (s)</th>" for label in BREAKDOWN.values()) if timed else "")
            + f"</tr>{table}</table>"
            f"<h3>Error across runs (the {len(trend_cases)} worst cases)</h3>"
            f'<img src="trend_{metric}.png" alt="error across runs">'
        )
    page = out / "index.html"
    if not sections:
        sections.append(_nothing_scored(counts))
    page.write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>PrismBench fidelity</title>"
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}</style></head><body>"
        f"<h1>PrismBench fidelity</h1>"
        f"<p>{'Latest complete run' if run_id == runs[-1]['run_id'] else 'Run'} "
        f"{html.escape(run_id)} at commit {html.escape(shown['commit'][:12])}"
        f"{' (uncommitted changes)' if shown['dirty'] else ''}, {counts['cases']} case(s); "
        f"{len(runs)} complete run(s) in the history, {incomplete} not complete (left out). "
        "Error = (predicted - measured) / measured.</p>" + "".join(sections) + "</body></html>"
    )
