"""Fixtures shared by the prismbench tests."""

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
