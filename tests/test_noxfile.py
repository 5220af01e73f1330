"""Tests for noxfile.py: what its sessions run (no session is run, nothing installed)."""

import pytest

import noxfile


class RecordingSession:
    """What a session installs and runs, recorded instead of done."""

    def __init__(self, posargs: list[str]) -> None:
        self.posargs = posargs
        self.runs: list[tuple[str, ...]] = []

    def install(self, *_args, **_kwargs) -> None:
        pass

    def run(self, *args: str, **_kwargs) -> None:
        self.runs.append(args)


@pytest.mark.parametrize("db", [["--db", "other.duckdb"], ["--db=other.duckdb"]])
def test_emulate_validate_draws_the_dashboard_of_the_history_it_wrote(db):
    # the dashboard read the default database whatever --db validate was given
    session = RecordingSession(["--all", *db])
    noxfile.emulate_validate(session)
    assert session.runs[-1] == ("prismbench", "dashboard", "--out", ".prismbench/dashboard", "--db", "other.duckdb")


def test_emulate_validate_without_a_db_draws_the_default_history():
    session = RecordingSession([])
    noxfile.emulate_validate(session)
    assert session.runs == [("prismbench", "validate"), ("prismbench", "dashboard", "--out", ".prismbench/dashboard")]
