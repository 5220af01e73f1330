"""Sessions: `tests` (what CI runs), `lint` (ruff), `emulate` (the quick-start job), `explain`,
`emulate-validate` (score baselines, record the run)."""

import nox

nox.options.reuse_venv = "yes"
nox.options.sessions = ["tests"]

# The CPU build of torch 2.13.0 installs from local disk on our machines; a bare
# `torch` requirement could pull a multi-GB CUDA build instead.
TORCH = "torch==2.13.0"
EXAMPLE_JOB = "examples/jobspec.example.toml"


def install_project(session: nox.Session, extras: str = "test") -> None:
    session.install(TORCH)
    session.install("-e", f".[{extras}]")


@nox.session
def tests(session: nox.Session) -> None:
    """The test suite CI runs: everything except `slow` and `gpu` tests."""
    install_project(session)
    session.run("pytest", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """Ruff lint and format check."""
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


# Baselines quick enough to validate on every change (their captures take seconds on 2 cores):
# llm.c's four GPT-2 runs and Korthikanti et al.'s two 22B runs.
QUICK_BASELINES = ("--select", "llmc__*", "--select", "korthikanti2022__megatron-gpt-22b*")


@nox.session(name="emulate-validate")
def emulate_validate(session: nox.Session) -> None:
    """Validate the quick baselines (or `-- ARGS` for `prismbench validate`, e.g.
    `-- --all --gate "iteration_time_s:15%"`): errors per source, history in DuckDB/MLflow."""
    install_project(session)
    session.run("prismbench", "validate", *(session.posargs or QUICK_BASELINES))
