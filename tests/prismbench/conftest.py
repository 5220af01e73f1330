"""Fixtures shared by the prismbench tests."""

import shutil
from pathlib import Path

import pytest

from emulator.capture.chunk_reuse import ChunkReuse
from emulator.capture.micro_batch_reuse import MicroBatchReuse


def count_calls(monkeypatch, cls, method: str) -> dict:
    """{"n": how many times cls.method was called since now}; the method still runs."""
    calls = {"n": 0}
    original = getattr(cls, method)

    def counted(self, *args):
        calls["n"] += 1
        return original(self, *args)

    monkeypatch.setattr(cls, method, counted)
    return calls


@pytest.fixture
def stub_count(monkeypatch):
    """How many chunks were stubbed (reused) since the test began."""
    return count_calls(monkeypatch, ChunkReuse, "_stub")


@pytest.fixture
def stand_ins(monkeypatch):
    """How many micro-batches were stood in for since the test began."""
    return count_calls(monkeypatch, MicroBatchReuse, "_stand_in_forward")


@pytest.fixture(scope="session")
def empty_mlflow_store(tmp_path_factory) -> Path:
    """An MLflow sqlite store with its tables and no run, made once: MLflow makes a new store's
    tables by running its migrations, 6-8 s on two busy cores, mostly waiting on sqlite's
    writes (test_mlflow_log tests a store's creation)."""
    import mlflow

    path = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    mlflow.MlflowClient(tracking_uri=f"sqlite:///{path}")  # makes the store
    return path


@pytest.fixture
def history_dir(tmp_path, empty_mlflow_store) -> Path:
    """tmp_path/h, a folder for validate's --db, with a copy of the empty MLflow store where
    validate logs by default (mlflow.db beside --db)."""
    folder = tmp_path / "h"
    folder.mkdir()
    shutil.copy(empty_mlflow_store, folder / "mlflow.db")
    return folder
