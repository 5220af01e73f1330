"""List the published rows that miss issue 14's goals, each beside the rows of its own table.

    python results/fidelity/misses.py [--csv results/fidelity/fidelity.csv] [--out misses.md]
                                      [--limit 0.15]

Reads `fidelity.csv` (the last `run_fidelity.py` table) and each row's baseline spec. For every
row whose |error| exceeds `--limit`, its *neighbours* are the rows of the same source, model,
GPU and precision: the same benchmark table, where the model varies only the sequence, batch and
GPU count. The emulator prices those knobs, so if it priced the row's setting right its error
should sit near its neighbours' (`departure` = error - the neighbours' median error). Its
*peers* are the rows of the same source, GPU and precision of other models at a sequence length
within a factor of 2: what the same GPU and software did at that length.

A row reads as *alone* when it departs from neighbours that are close to zero and its peers are
close to zero too: the measured run is slower (or faster) for a reason the job spec does not
carry, or the model misprices that one setting; the report cannot tell which. It reads as a
*pattern* when its peers miss the same way: one cause to look for across those rows.

Measured MFU is the source's own figure (each baseline's `[measured]`), shown so a reader can see
the dip in the table itself without trusting the emulator.
"""

from __future__ import annotations

import argparse
import csv
import statistics
from dataclasses import dataclass
from pathlib import Path

from prismbench.baselines import load_baseline
from prismbench.checkout import git_version

HERE = Path(__file__).resolve().parent
BASELINES = HERE.parent / "baselines"
# A row departs from its table when its error is this far from its neighbours' median and the
# neighbours themselves sit within NEIGHBOURS_CLOSE of zero (median |error|).
DEPARTURE = 0.10
NEIGHBOURS_CLOSE = 0.08
# Peers missing the same way by at least this much (median) make a row part of a pattern.
PATTERN = 0.10
PEER_LENGTH_FACTOR = 2


@dataclass(frozen=True)
class Row:
    baseline: str
    source: str
    model: str
    gpu: str
    precision: str
    seq_len: int
    micro_batch: int
    gpus: int
    layout: str
    recompute: str
    compiled: str
    measured_mfu: float | None
    error: float

    @property
    def table_key(self) -> tuple[str, str, str, str]:
        return (self.source, self.model, self.gpu, self.precision)


def _layout(parallel) -> str:
    parts = [
        f"{k}{getattr(parallel, k)}" for k in ("dp", "tp", "pp", "cp") if getattr(parallel, k) > 1
    ]
    if parallel.zero:
        parts.append(f"zero{parallel.zero}")
    return " ".join(parts) or "1 GPU"


def _compiled(kernels) -> str:
    flags = [name for name in ("compile", "async_tp") if getattr(kernels, name)]
    return " ".join(flags).replace("_", "-")


def load_rows(csv_path: Path, baselines: Path = BASELINES) -> list[Row]:
    rows = []
    with csv_path.open() as f:
        for r in csv.DictReader(f):
            baseline = load_baseline(baselines / f"{r['baseline']}.toml")
            job = baseline.job
            rows.append(
                Row(
                    baseline=r["baseline"],
                    source=r["source"],
                    model=job.model.name,
                    gpu=job.cluster.gpu,
                    precision=job.train.precision,
                    seq_len=job.batch.seq_len,
                    micro_batch=job.batch.micro_batch,
                    gpus=int(r["gpus"]),
                    layout=_layout(job.parallel),
                    recompute=job.train.recompute,
                    compiled=_compiled(job.kernels),
                    measured_mfu=baseline.measured.mfu,
                    error=float(r["error"]),
                )
            )
    return rows


@dataclass(frozen=True)
class Miss:
    row: Row
    neighbours: tuple[Row, ...]
    peers: tuple[Row, ...]

    @property
    def neighbours_median_error(self) -> float | None:
        return statistics.median(n.error for n in self.neighbours) if self.neighbours else None

    @property
    def departure(self) -> float | None:
        median = self.neighbours_median_error
        return None if median is None else self.row.error - median

    @property
    def out_of_trend(self) -> bool:
        if len(self.neighbours) < 2:
            return False
        close = statistics.median(abs(n.error) for n in self.neighbours) <= NEIGHBOURS_CLOSE
        return close and abs(self.departure) >= DEPARTURE

    @property
    def peers_median_error(self) -> float | None:
        return statistics.median(p.error for p in self.peers) if self.peers else None

    @property
    def reads_as(self) -> str:
        peers = self.peers_median_error
        if peers is not None and abs(peers) >= PATTERN and (peers < 0) == (self.row.error < 0):
            return "pattern"
        if self.out_of_trend and (peers is None or abs(peers) <= NEIGHBOURS_CLOSE):
            return "alone"
        return ""


def _peer(a: Row, b: Row) -> bool:
    return (
        a.model != b.model
        and (a.source, a.gpu, a.precision) == (b.source, b.gpu, b.precision)
        and max(a.seq_len, b.seq_len) <= PEER_LENGTH_FACTOR * min(a.seq_len, b.seq_len)
    )


def find_misses(rows: list[Row], limit: float) -> list[Miss]:
    """Rows beyond `limit` |error|, largest first, each with the rows of its own table."""
    misses = [
        Miss(
            r,
            neighbours=tuple(n for n in rows if n.table_key == r.table_key and n is not r),
            peers=tuple(p for p in rows if _peer(r, p)),
        )
        for r in rows
        if abs(r.error) > limit
    ]
    return sorted(misses, key=lambda m: -abs(m.row.error))


def _pct(x: float | None, signed: bool = True) -> str:
    if x is None:
        return ""
    return f"{x * 100:+.1f} %" if signed else f"{x * 100:.1f} %"


def _mfu(x: float | None) -> str:
    return "" if x is None else f"{x * 100:.1f} %"


def _row_id(r: Row) -> str:
    return r.baseline.rsplit("__", 1)[-1]


def _entry(r: Row, *, bold: bool) -> str:
    mfu = "" if r.measured_mfu is None else f"{_mfu(r.measured_mfu)} MFU, "
    text = f"{_row_id(r)} {r.seq_len} x {r.micro_batch} on {r.gpus}: {mfu}{_pct(r.error)}"
    return f"**{text}**" if bold else text


def render(
    misses: list[Miss], rows: list[Row], limit: float, csv_path: Path, made_at: str = ""
) -> str:
    at = f" at {made_at}" if made_at else ""
    out = [
        "# Published rows beyond the goal, beside their own tables",
        "",
        f"Generated by `python results/fidelity/misses.py`{at} from `{csv_path.name}` "
        f"({len(rows)} rows; the runs it was written from head README.md's table); limit |error| > {limit * 100:.0f} %. A row's neighbours are the "
        "rows of the same source, model, GPU and precision; departure = its error minus their "
        f"median error; *out of trend*: |departure| >= {DEPARTURE * 100:.0f} points while the "
        f"neighbours' median |error| is <= {NEIGHBOURS_CLOSE * 100:.0f} % (two neighbours at least). "
        "Peers: the same source, GPU and precision, other models, sequence length within a factor "
        f"of {PEER_LENGTH_FACTOR}. Reads as *alone*: out of trend, and the peers' median |error| "
        f"<= {NEIGHBOURS_CLOSE * 100:.0f} % (or no peers); *pattern*: the peers' median error "
        f"misses the same way by >= {PATTERN * 100:.0f} %. MFU is the source's own figure.",
        "",
        "| row | model | GPU | prec | seq | mb | layout | recompute | compiled | measured MFU | error "
        "| neighbours | their median error | departure | peers | their median error | reads as |",
        "|---|---|---|---|--:|--:|---|---|---|--:|--:|--:|--:|--:|--:|--:|---|",
    ]
    for m in misses:
        r = m.row
        out.append(
            f"| {_row_id(r)} | {r.model} | {r.gpu} | {r.precision} | {r.seq_len} "
            f"| {r.micro_batch} | {r.layout} | {r.recompute} | {r.compiled} | {_mfu(r.measured_mfu)} "
            f"| {_pct(r.error)} | {len(m.neighbours)} | {_pct(m.neighbours_median_error)} "
            f"| {_pct(m.departure)} | {len(m.peers)} | {_pct(m.peers_median_error)} | {m.reads_as} |"
        )
    by_source: dict[str, list[Miss]] = {}
    for m in misses:
        by_source.setdefault(m.row.source, []).append(m)
    out += ["", "| source | rows | beyond the limit | alone | pattern | too fast | too slow |",
            "|---|--:|--:|--:|--:|--:|--:|"]  # fmt: skip
    for source in sorted({r.source for r in rows}):
        ms = by_source.get(source, [])
        out.append(
            f"| {source} | {sum(r.source == source for r in rows)} | {len(ms)} "
            f"| {sum(m.reads_as == 'alone' for m in ms)} | {sum(m.reads_as == 'pattern' for m in ms)} "
            f"| {sum(m.row.error < 0 for m in ms)} "
            f"| {sum(m.row.error > 0 for m in ms)} |"
        )
    out += ["", "Each row's table, as (sequence x micro-batch on GPUs: measured MFU, error); the "
            "row itself in bold:", ""]  # fmt: skip
    for m in misses:
        table = sorted((*m.neighbours, m.row), key=lambda n: (n.seq_len, n.micro_batch, n.gpus))
        out.append(f"- {m.row.baseline}: " + "; ".join(_entry(n, bold=n is m.row) for n in table))
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, default=HERE / "fidelity.csv")
    parser.add_argument("--out", type=Path, default=HERE / "misses.md")
    parser.add_argument(
        "--limit", type=float, default=0.15, help="|error| above which a row is listed (fraction)"
    )
    args = parser.parse_args(argv)
    if not 0 < args.limit < 10:
        parser.error(f"--limit: a fraction between 0 and 10, got {args.limit}")
    rows = load_rows(args.csv)
    misses = find_misses(rows, args.limit)
    made_at = git_version()[0][:7]
    args.out.write_text(render(misses, rows, args.limit, args.csv, made_at))
    print(f"{len(misses)} of {len(rows)} rows beyond {args.limit * 100:.0f} %: wrote {args.out}")


if __name__ == "__main__":
    main()
