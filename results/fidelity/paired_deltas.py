"""Published pairs that change one setting: the measured speed-up against the predicted one.

    python results/fidelity/paired_deltas.py [--csv results/fidelity/fidelity.csv]
                                             [--out results/fidelity/paired_deltas.md]

A row's error mixes everything the emulator gets wrong about that run; two rows of one source,
model and GPU that differ in one setting cancel most of it, so the ratio b / a of their
iteration times tests the rule for that setting alone (torch.compile, AsyncTP, fp8, context
parallelism, ...). From `fidelity.csv` (the last `run_fidelity.py` table) and each row's
baseline spec, every such pair is listed: measured ratio, predicted ratio, and their quotient
(predicted / measured: below 1 the rule promises more speed-up, or less slow-down, than the
runs saw). A pair differs in one job field, or in one of the field groups of `SETTINGS` that a
source changes together as one setting.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "results"))
from shared_gpu import command_line, report  # noqa: E402

HERE = Path(__file__).resolve().parent
BASELINES = ROOT / "results" / "baselines"
# A ratio within 2 % of 1 moves the time by about what time alone moves it: kernel durations on
# one GPU vary over time by 1.2-1.9 % (results/fidelity/variability.md, item 1), and each row of
# a pair is its own run
FLAT = 0.02

# Job fields that sources change together as one setting -> (the setting's name, the field that
# orders a pair: row a has its smaller value, False before True, bf16 before fp8)
SETTINGS: dict[frozenset[str], tuple[str, str]] = {
    # compile implies the fused fp8 casts Inductor generates (workloads.kernels)
    frozenset({"kernels.compile", "kernels.fp8_casts"}): ("torch.compile", "kernels.compile"),
    frozenset({"parallel.vpp", "parallel.schedule"}): ("interleaved schedule", "parallel.vpp"),
    # the spec's position table follows the sequence for learned positions
    frozenset({"batch.seq_len", "model.max_seq_len"}): ("sequence length", "batch.seq_len"),
    # more data-parallel ranks, the same batch per rank (weak scaling)
    frozenset({"parallel.dp", "batch.global_batch"}): ("data-parallel ranks", "parallel.dp"),
    frozenset({"batch.micro_batch", "batch.global_batch"}): ("micro-batch", "batch.micro_batch"),
    # Korthikanti et al. 2022's "present work" column: both techniques of the paper at once
    frozenset({"parallel.sequence_parallel", "train.recompute"}): (
        "SP + selective recompute",
        "parallel.sequence_parallel",
    ),
    # torchtitan's long-context rows: cp ranks taken from dp, the sequence grown by cp
    frozenset({"parallel.cp", "parallel.dp", "batch.seq_len", "batch.global_batch"}): (
        "context parallelism, tokens per GPU kept",
        "parallel.cp",
    ),
}


@dataclass(frozen=True)
class Row:
    baseline: str
    source: str
    measured_s: float
    predicted_s: float
    job: dict  # the baseline's [job] table, flattened: "parallel.dp" -> 8

    @property
    def rid(self) -> str:
        return self.baseline.rsplit("__", 1)[-1]

    @property
    def group(self) -> tuple[str, str, str]:
        return (self.source, self.job["model.name"], self.job["cluster.gpu"])


@dataclass(frozen=True)
class Pair:
    a: Row
    b: Row
    setting: str
    fields: tuple[str, ...]

    @property
    def measured_ratio(self) -> float:
        return self.b.measured_s / self.a.measured_s

    @property
    def predicted_ratio(self) -> float:
        return self.b.predicted_s / self.a.predicted_s

    @property
    def quotient(self) -> float:
        """Predicted ratio / measured ratio: 1 when the rule moves the time as the runs did."""
        return self.predicted_ratio / self.measured_ratio

    @property
    def same_direction(self) -> bool:
        return direction(self.measured_ratio) == direction(self.predicted_ratio)


def direction(ratio: float) -> str:
    """`faster`, `slower`, or `flat` within FLAT of 1 (what time alone moves a run by)."""
    if abs(ratio - 1) <= FLAT:
        return "flat"
    return "faster" if ratio < 1 else "slower"


def _flat(table: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in table.items():
        if isinstance(value, dict):
            out |= _flat(value, f"{prefix}{key}.")
        else:
            out[prefix + key] = value
    return out


def load_rows(csv_path: Path, baselines: Path = BASELINES) -> list[Row]:
    rows = []
    with csv_path.open() as f:
        for r in csv.DictReader(f):
            with (baselines / f"{r['baseline']}.toml").open("rb") as spec:
                job = _flat(tomllib.load(spec)["job"])
            rows.append(
                Row(
                    baseline=r["baseline"],
                    source=r["source"],
                    measured_s=float(r["measured_iteration_s"]),
                    predicted_s=float(r["predicted_iteration_s"]),
                    job=job,
                )
            )
    return rows


def setting_of(fields: set[str]) -> tuple[str, str] | None:
    """(name, ordering field) of the setting a pair differing in `fields` changes; None when
    they are not one setting."""
    if len(fields) == 1:
        (field,) = fields
        return field, field
    return SETTINGS.get(frozenset(fields))


def find_pairs(rows: list[Row]) -> list[Pair]:
    groups: dict[tuple, list[Row]] = {}
    for row in rows:
        groups.setdefault(row.group, []).append(row)
    pairs = []
    for members in groups.values():
        for a, b in itertools.combinations(members, 2):
            fields = {k for k in a.job.keys() | b.job.keys() if a.job.get(k) != b.job.get(k)}
            setting = setting_of(fields)
            if setting is not None:
                name, order_by = setting
                a, b = sorted((a, b), key=lambda row: (row.job[order_by], row.rid))
                pairs.append(Pair(a, b, name, tuple(sorted(fields))))
    return sorted(pairs, key=lambda p: (p.setting, p.a.group, p.a.rid, p.b.rid))


def _change(pair: Pair) -> str:
    return ", ".join(f"{f} {pair.a.job.get(f)} -> {pair.b.job.get(f)}" for f in pair.fields)


def _directions(pair: Pair) -> str:
    both = f"{direction(pair.measured_ratio)} / {direction(pair.predicted_ratio)}"
    return both if pair.same_direction else f"**{both}**"


def render(pairs: list[Pair], rows: list[Row], csv_path: Path) -> list[str]:
    lines = [
        "# Published pairs that change one setting: measured against predicted ratio",
        "",
        f"From `{csv_path.name}` ({len(rows)} rows; the run its table in README.md names) and "
        f"the baselines: {len(pairs)} pairs of one source, model and GPU that differ in one "
        "setting. Ratio = b / a of the iteration time; quotient = predicted ratio / measured "
        "ratio (below 1: the emulator moves the time down more, or up less, than the runs did); "
        f"a direction is flat within {FLAT:.0%} of 1, in bold where the two differ.",
        "",
        "| setting | a -> b | model | GPU | change | measured a (s) | measured b (s) "
        "| measured ratio | predicted ratio | quotient | direction (measured / predicted) |",
        "|---|---|---|---|---|--:|--:|--:|--:|--:|---|",
    ]
    for p in pairs:
        lines.append(
            f"| {p.setting} | {p.a.rid} -> {p.b.rid} | {p.a.job['model.name']} "
            f"| {p.a.job['cluster.gpu']} | {_change(p)} | {p.a.measured_s:.4g} "
            f"| {p.b.measured_s:.4g} | x{p.measured_ratio:.3f} | x{p.predicted_ratio:.3f} "
            f"| {p.quotient:.3f} | {_directions(p)} |"
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, default=HERE / "fidelity.csv")
    parser.add_argument("--out", type=Path, default=HERE / "paired_deltas.md")
    args = parser.parse_args(argv)
    rows = load_rows(args.csv)
    pairs = find_pairs(rows)
    report(command_line("results/fidelity/paired_deltas.py", argv), render(pairs, rows, args.csv),
           args.out)  # fmt: skip


if __name__ == "__main__":
    main()
