"""Fixtures shared by the prismbench tests."""

import pytest

from emulator.capture.chunk_reuse import ChunkReuse


@pytest.fixture
def stub_count(monkeypatch):
    """How many chunks were stubbed (reused) since the test began."""
    calls = {"n": 0}
    original = ChunkReuse._stub

    def counted(self, *args):
        calls["n"] += 1
        return original(self, *args)

    monkeypatch.setattr(ChunkReuse, "_stub", counted)
    return calls
