"""Which published rows miss alone and which miss as a pattern (results/fidelity/misses.py)."""

from dataclasses import replace

import pytest


@pytest.fixture
def row(misses):
    base = misses.Row(
        baseline="src__m__8g__r001", source="src", model="m-1b", gpu="a100-sxm-80g",
        precision="bf16", seq_len=2048, micro_batch=8, gpus=8, layout="dp8 zero3",
        recompute="none", compiled="", measured_mfu=0.5, error=0.0,
    )  # fmt: skip

    def make(rid: str, **fields):
        return replace(base, baseline=f"src__m__8g__{rid}", **fields)

    return make


def test_a_row_far_from_a_table_that_agrees_reads_as_alone(misses, row):
    rows = [
        row("r001", error=-0.25, seq_len=8192),
        row("r002", error=0.02, seq_len=1024),
        row("r003", error=0.03, seq_len=4096),
        row("r004", model="m-7b", error=-0.01, seq_len=8192),  # a peer: another model, same length
    ]
    (miss,) = misses.find_misses(rows, limit=0.15)
    assert miss.row.baseline.endswith("r001")
    assert miss.neighbours_median_error == pytest.approx(0.025)
    assert miss.departure == pytest.approx(-0.275)
    assert miss.reads_as == "alone"


def test_peers_missing_the_same_way_make_a_pattern(misses, row):
    rows = [
        row("r001", error=-0.20, seq_len=512),
        row("r002", error=0.0, seq_len=16384),
        row("r003", error=0.01, seq_len=32768),
        row("r004", model="m-3b", error=-0.18, seq_len=1024),
        row("r005", model="m-7b", error=-0.16, seq_len=512),
        row("r006", model="m-7b", error=0.0, seq_len=4096),  # beyond a factor of 2: not a peer
    ]
    by_row = {m.row.baseline[-4:]: m for m in misses.find_misses(rows, limit=0.15)}
    assert set(by_row) == {"r001", "r004", "r005"}
    assert [p.baseline[-4:] for p in by_row["r001"].peers] == ["r004", "r005"]
    assert all(m.reads_as == "pattern" for m in by_row.values())


def test_a_row_whose_table_misses_too_is_neither(misses, row):
    rows = [row("r001", error=-0.20), row("r002", error=-0.12), row("r003", error=-0.10)]
    (miss,) = misses.find_misses(rows, limit=0.15)
    assert not miss.out_of_trend
    assert miss.reads_as == ""


def test_the_report_lists_each_miss_with_its_table(misses, row, tmp_path):
    rows = [row("r001", error=-0.25), row("r002", error=0.01), row("r003", error=0.02)]
    text = misses.render(misses.find_misses(rows, 0.15), rows, 0.15, tmp_path / "fidelity.csv")
    assert "| r001 | m-1b |" in text and "| -25.0 % |" in text
    assert "**r001 2048 x 8 on 8: 50.0 % MFU, -25.0 %**" in text
    assert "| src | 3 | 1 | 1 | 0 | 1 | 0 |" in text


def test_the_committed_table_loads_with_every_baseline(misses):
    rows = misses.load_rows(misses.HERE / "fidelity.csv")
    assert len(rows) == len({r.baseline for r in rows}) > 100
    assert all(r.gpus >= 1 and r.seq_len >= 1 for r in rows)


def test_the_committed_report_is_the_committed_table_s(misses):
    """misses.md is regenerated with fidelity.csv (`python results/fidelity/misses.py`)."""
    committed = (misses.HERE / "misses.md").read_text()
    made_at = committed.split("misses.py` at ", 1)[1].split(" ", 1)[0]
    csv_path = misses.HERE / "fidelity.csv"
    rows = misses.load_rows(csv_path)
    assert misses.render(misses.find_misses(rows, 0.15), rows, 0.15, csv_path, made_at) == committed
