"""The fidelity table written from a stored validate run (results/fidelity/run_fidelity.py
--from-db): the harness's history and the table give the same figures."""

import dataclasses

import pytest

from prismbench import history
from prismbench.validate import CaseResult

ROW = "narayanan2021__megatron-gpt-1.7b__32g__r002"


def result(iteration_time_s: float) -> dict:
    """The keys of an emulation result that the table reads."""
    return {
        "iteration_time_s": iteration_time_s,
        "peak_memory_allocated_bytes": 10,
        "peak_memory_reserved_bytes": 12,
        "device_total_estimate_bytes": 13,
        "oom": False,
        "breakdown": {"compute_s": 1.0, "exposed_comm_s": 0.5, "bubble_s": 0.25},
        "wall_s": 2.0,
    }


def store(db, run_id: str, status: str, cases: list[CaseResult]) -> None:
    history.start_run(db, run_id, commit="abcdef0123", dirty=False, machine="test", settings={})
    for case in cases:
        history.add_case(db, run_id, case)
    history.finish_run(db, run_id, status)


def case(baseline: str, **fields) -> CaseResult:
    return CaseResult(baseline=baseline, source=baseline.split("__")[0], gpu="a100-sxm-80g",
                      world_size=8, wall_s=1.0, **fields)  # fmt: skip


def test_the_latest_complete_run_gives_each_case_its_record_and_failure(fidelity_table, tmp_path):
    db = tmp_path / "h.duckdb"
    measured_s = fidelity_table.measured_iteration_s(
        next(b for b in fidelity_table.comparable_baselines() if b.name == ROW)
    )[0]
    store(db, "old", "complete", [case(ROW, status="ok", result=result(2 * measured_s))])
    store(db, "new", "complete", [
        case(ROW, status="ok", result=result(1.1 * measured_s)),
        case("llmc__gpt2-124m__8g__r228", status="failed", error_message="Boom: it broke"),
        case("not-a-baseline", status="ok", result=result(1.0)),
    ])  # fmt: skip
    store(db, "stopped", "failed", [case(ROW, status="ok", result=result(3 * measured_s))])
    records, failures, label = fidelity_table.from_db(db, None)
    assert [r.baseline for r in records] == [ROW]
    assert records[0].error == pytest.approx(0.1)
    assert records[0].bubble_s == 0.25
    assert failures == [("llmc__gpt2-124m__8g__r228", "Boom: it broke")]
    assert label == "From `prismbench validate` run new at abcdef0."
    records, _, _ = fidelity_table.from_db(db, "old")
    assert records[0].error == pytest.approx(1.0)
    with pytest.raises(SystemExit, match="no complete run stopped"):
        fidelity_table.from_db(db, "stopped")


def test_a_table_emulated_here_names_its_commit_and_where_kept_rows_come_from(
    fidelity_table, tmp_path
):
    readme = tmp_path / "README.md"
    fidelity_table.write_readme(
        "From `prismbench validate` run abc at 1234567.\n\n| table |", readme
    )
    kept = fidelity_table.previous_label(readme)
    assert kept == "From `prismbench validate` run abc at 1234567."
    label = fidelity_table.emulated_label(kept)
    assert label.startswith("Emulated by `run_fidelity.py` at ")
    assert label.endswith("The rows it did not run are the previous table's: " + kept)
    assert fidelity_table.previous_label(tmp_path / "missing.md") is None


def test_a_run_joined_with_the_previous_table_keeps_the_rows_it_did_not_emulate(
    fidelity_table, tmp_path
):
    """A change that moves one source's rows is run for that source only; `--update` keeps the
    table's other rows, and the header says which run they came from."""
    db = tmp_path / "h.duckdb"
    row = next(b for b in fidelity_table.comparable_baselines() if b.name == ROW)
    measured_s = fidelity_table.measured_iteration_s(row)[0]
    store(db, "new", "complete", [case(ROW, status="ok", result=result(1.1 * measured_s))])
    (fresh,), _, _ = fidelity_table.from_db(db, "new")
    other = dataclasses.replace(fresh, baseline="other__row", error=0.3)
    stale = dataclasses.replace(fresh, error=0.5)  # the row as the previous table had it
    table = tmp_path / "fidelity.csv"
    fidelity_table.write_csv([stale, other], table)
    fidelity_table.write_readme(
        "From `prismbench validate` run abc at 1234567.\n", table.with_name("README.md")
    )
    records, _, label = fidelity_table.from_dbs([db], None, update=True, table=table)
    assert {r.baseline: round(r.error, 3) for r in records} == {ROW: 0.1, "other__row": 0.3}
    assert label == (
        "From `prismbench validate` run new at abcdef0. The 1 rows it did not run "
        f"({other.source} 1) are the previous table's, whose header was: "
        "From `prismbench validate` run abc at 1234567."
    )
    # updated again with the same run, the kept row still comes from run abc: not nested
    fidelity_table.write_readme(label + "\n", table.with_name("README.md"))
    fidelity_table.write_csv(records, table)
    assert fidelity_table.from_dbs([db], None, update=True, table=table)[2] == label
    records, _, _ = fidelity_table.from_dbs([db], None, update=False, table=table)
    assert [r.baseline for r in records] == [ROW]
    with pytest.raises(ValueError, match="also in an earlier"):
        fidelity_table.from_dbs([db, db], None, update=False, table=table)
