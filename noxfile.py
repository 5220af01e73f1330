"""Sessions: `tests` (what CI runs), `lint` (ruff), `emulate` (the quick-start job), `explain`,
`emulate-validate` (score baselines, record the run, draw the dashboard), `dashboard`, `bench`."""

import argparse
import os

import nox

nox.options.reuse_venv = "yes"
nox.options.sessions = ["tests"]

# The CPU build of torch 2.13.0 installs from local disk on our machines; a bare
# `torch` requirement could pull a multi-GB CUDA build instead.
TORCH = "torch==2.13.0"
EXAMPLE_JOB = "examples/jobspec.example.toml"


def install_project(session: nox.Session, extras: str = "test") -> None:
    # silent=False: pip's own progress shows, instead of a silent minute on a fresh machine
    session.install(TORCH, silent=False)
    session.install("-e", f".[{extras}]", silent=False)


@nox.session
def tests(session: nox.Session) -> None:
    """The test suite CI runs: everything except `slow` and `gpu` tests, one pytest-xdist
    worker per core (at most 8); a file's tests stay on one worker, so its module fixtures
    (the gloo spawns, the captures) run once (`-- -n 0` runs them in one process)."""
    install_project(session)
    session.run("pytest", "-n", str(_test_workers()), "--dist", "loadfile", *session.posargs)


def _test_workers() -> int:
    """One pytest-xdist worker per usable core, at most 8: each worker imports torch and the gloo
    tests spawn 2-4 ranks, so more would trade memory for no speed."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(cores or 1, 8))


@nox.session
def lint(session: nox.Session) -> None:
    """Ruff lint (`ruff check`); formatting is not checked."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")


@nox.session
def explain(session: nox.Session) -> None:
    """Install and explain the example job (llama3-70b on 8 192 H100s)."""
    install_project(session)
    session.run("prismbench", "explain", *(session.posargs or [EXAMPLE_JOB]))


@nox.session
def emulate(session: nox.Session) -> None:
    """Install and emulate the example job: iteration time, breakdown and peak memory."""
    install_project(session)
    session.run("prismbench", "emulate", *(session.posargs or [EXAMPLE_JOB]))


@nox.session(name="emulate-validate")
def emulate_validate(session: nox.Session) -> None:
    """Validate the default selection of baselines (or `-- ARGS` for `prismbench validate`, e.g.
    `-- --all --gate "iteration_time_s:15%"`), record the run in DuckDB and MLflow, draw the
    dashboard (.prismbench/dashboard/index.html) and print the error summary."""
    install_project(session)
    session.run("prismbench", "validate", *session.posargs)
    session.run("prismbench", "dashboard", "--out", ".prismbench/dashboard", *_db_option(session.posargs))


def _db_option(validate_args: list[str]) -> list[str]:
    """The `--db` among validate's arguments (read as validate's argparse reads it), for the
    dashboard to draw the history that validation wrote, not the default one (another, or none)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--db")
    db = parser.parse_known_args(validate_args)[0].db
    return [] if db is None else ["--db", db]


@nox.session
def dashboard(session: nox.Session) -> None:
    """Draw the fidelity dashboard from the validation history (`-- --db PATH --out DIR`)."""
    install_project(session)
    session.run("prismbench", "dashboard", *(session.posargs or ["--out", ".prismbench/dashboard"]))


@nox.session
def bench(session: nox.Session) -> None:
    """pytest-benchmark of the emulator's own speed (capture, replay, memory replay), saved under
    .benchmarks/ for comparison across commits (`pytest-benchmark compare`)."""
    install_project(session)
    session.run("pytest", "-m", "slow", "-k", "benchmark", "--benchmark-autosave", *session.posargs)
