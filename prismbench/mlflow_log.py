"""A validation run in MLflow: one parent run, a child run per case (params, metrics, result JSON).

With `validate --variability` a case's step-time figures are metrics named
`variability_<figure>` (e.g. `variability_p95_s`; the measured spread where the baseline has
one) and its histogram and CDF PNG is among the case's artifacts.

The tracking store defaults to a sqlite file beside the DuckDB history (`default_tracking_uri`);
any MLflow tracking URI works. The experiment is "prismbench-validate". A sqlite store is
opened under a lock on a file beside it (`<store>.lock`), so validations started at once can
share a store that does not exist yet (`_store_lock`).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
from collections.abc import Iterator
from pathlib import Path

EXPERIMENT = "prismbench-validate"


def default_tracking_uri(db_path: Path) -> str:
    return f"sqlite:///{(Path(db_path).parent / 'mlflow.db').resolve()}"


def open_experiment(tracking_uri: str, artifact_dir: Path | None = None) -> None:
    """Point MLflow at `tracking_uri` and make the experiment current, creating it (its
    artifacts in `artifact_dir`, default MLflow's own choice) if it is new. `validate` calls
    it before emulating anything, so a store MLflow cannot open fails first, not last."""
    import mlflow

    # MLflow says at INFO, on stderr, that it creates a new store's tables (two dated lines among
    # validate's own); a failure still reaches the caller as an exception
    for logger in ("mlflow.store", "alembic"):
        logging.getLogger(logger).setLevel(logging.WARNING)
    mlflow.set_tracking_uri(tracking_uri)
    with _store_lock(tracking_uri):  # MLflow creates the store on its first use, in here
        if mlflow.get_experiment_by_name(EXPERIMENT) is None:
            location = Path(artifact_dir).resolve().as_uri() if artifact_dir else None
            mlflow.create_experiment(EXPERIMENT, artifact_location=location)
    mlflow.set_experiment(EXPERIMENT)


@contextlib.contextmanager
def _store_lock(tracking_uri: str) -> Iterator[None]:
    """Hold an exclusive lock on `<store>.lock` while the block runs, for a sqlite store.

    MLflow makes a new sqlite store's tables by running its migrations when a process first
    opens it; two processes migrating one new file at once fail, and can leave it half made
    (tables without their version, `_alembic_tmp_*` tables) so that every later open fails
    too. The experiment's creation races the same way. Other stores need no lock."""
    path = _sqlite_file(tracking_uri)
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)  # as MLflow would, creating the store
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        yield


def _sqlite_file(tracking_uri: str) -> Path | None:
    """The database file of a sqlite URI; None for another store or an in-memory one."""
    if not tracking_uri.startswith("sqlite:"):
        return None
    from sqlalchemy.engine import make_url

    database = make_url(tracking_uri).database
    return Path(database) if database not in (None, "", ":memory:") else None


def log_run(run, settings: dict, *, tracking_uri: str, artifact_dir: Path | None = None) -> None:
    """Log a `validate.ValidationRun` (its cases and their metrics) to MLflow (`open_experiment`)."""
    import mlflow

    open_experiment(tracking_uri, artifact_dir)
    with mlflow.start_run(run_name=f"validate {run.run_id}"):
        mlflow.set_tags({"prismbench.run_id": run.run_id, "commit": settings.get("commit", "")})
        mlflow.log_params({"workers": settings["workers"], "cases": len(run.cases),
                           "dirty": settings.get("dirty")})  # fmt: skip
        if "variability" in settings:
            mlflow.log_params({f"variability_{k}": v for k, v in settings["variability"].items()})
        for case in run.cases:
            with mlflow.start_run(run_name=case.baseline, nested=True):
                mlflow.log_params({"baseline": case.baseline, "source": case.source,
                                   "gpu": case.gpu, "world_size": case.world_size,
                                   "status": case.status})  # fmt: skip
                artifacts = Path(run.db_path).parent / "artifacts" / run.run_id / case.baseline
                if artifacts.is_dir():  # timeline and memory plots (validate --artifacts)
                    mlflow.log_artifacts(str(artifacts))
                if case.result is not None:
                    figures = {k: float(v) for k, v in case.result.items()
                               if isinstance(v, int | float) and not isinstance(v, bool)}  # fmt: skip
                    mlflow.log_metrics({f"predicted.{k}": v for k, v in figures.items()})
                    mlflow.log_dict(case.result, "result.json")
                for m in case.metrics:
                    mlflow.log_metrics(
                        {f"measured.{m.metric}": m.measured, f"error.{m.metric}": m.error}
                    )
                if case.variability is not None:
                    mlflow.log_param("variability_preset", case.variability["preset"])
                    mlflow.log_metrics(_variability_metrics(case.variability))


def _variability_metrics(figures: dict) -> dict[str, float]:
    """The numeric step-time figures as MLflow metrics (missing measured ones left out)."""
    return {f"variability_{k}": float(v) for k, v in figures.items()
            if isinstance(v, int | float) and not isinstance(v, bool)}  # fmt: skip
