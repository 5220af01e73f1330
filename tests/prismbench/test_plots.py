"""The harness's figures: a memory timeline PNG from a replayed capture."""

from emulator.memory import replay_memory
from prismbench.plots import plot_memory_timeline
from tests.emulator.memory.test_replay import capture


def test_memory_timeline_is_a_png(tmp_path):
    trace = capture()[0]
    result = replay_memory(trace, gpu="h100-sxm-80g")
    path = plot_memory_timeline(result, tmp_path / "memory.png", title="one rank")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
