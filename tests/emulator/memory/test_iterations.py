"""First and steady iterations of a memory replay (emulator.memory.iterations, replay.py)."""

import numpy as np

from emulator.capture.trace import ALLOC, COMPUTE, FREE, PHASES, OpEvent, build_trace
from emulator.memory import replay_memory
from emulator.units import MiB

FORWARD, BACKWARD, OPTIMIZER = (PHASES.index(p) for p in ("forward", "backward", "optimizer"))


def program_trace():
    """A step whose declared state is 20 MiB of parameters, 40 MiB of fp32 master weights and
    80 MiB of optimizer moments; forward keeps 60 MiB of activations that backward frees; a
    12 MiB buffer is made on first use and never freed; the optimizer step runs last."""
    events, seq = [], iter(range(10**6))

    def row(kind, phase, **kw):
        events.append(OpEvent(next(seq), kind, "mm" if kind == COMPUTE else "", "", 0, "m",
                              phase, 0, **kw))  # fmt: skip

    for uid, (size, category) in enumerate(
        [
            (20 * MiB, "parameter"),
            (40 * MiB, "master_weights"),
            (40 * MiB, "optimizer_state"),
            (40 * MiB, "optimizer_state"),
        ]  # fmt: skip
    ):
        row(ALLOC, -1, size_bytes=size, storage=uid, category=category)
    row(COMPUTE, FORWARD)
    for uid in (10, 11, 12):
        row(ALLOC, FORWARD, size_bytes=20 * MiB, storage=uid, category="activation")
    row(ALLOC, FORWARD, size_bytes=12 * MiB, storage=20, category="buffer")
    row(COMPUTE, BACKWARD)
    for uid in (10, 11, 12):
        row(FREE, BACKWARD, size_bytes=20 * MiB, storage=uid)
    row(COMPUTE, OPTIMIZER)
    return build_trace(events)


def test_the_first_iteration_creates_optimizer_state_at_its_step_and_steady_ones_reuse_it():
    r = replay_memory(program_trace(), workspaces=False)
    # first: 20 + 40 + 60 activations + 12 buffer = 132 MiB before the step; then the
    # activations are gone and the 80 MiB of moments arrive: 20 + 40 + 12 + 80 = 152 MiB
    assert r.first_iteration_peak_allocated_bytes == 152 * MiB
    # steady: the moments are there from the start, the activations come on top
    assert r.peak_allocated_bytes == (20 + 40 + 80 + 12 + 60) * MiB
    assert r.steady_converged and r.steady_iterations == 1
    # the buffer made on first use is allocated once: carried into the steady iteration
    t = r.timeline
    assert t.carried_allocations == 5
    assert sorted(t.block_bytes[: t.carried_allocations] // MiB) == [12, 20, 40, 40, 40]
    assert r.live_at_peak_by_category == {
        "parameter": 20 * MiB,
        "master_weights": 40 * MiB,
        "optimizer_state": 80 * MiB,
        "buffer": 12 * MiB,
        "activation": 60 * MiB,
    }
    assert r.unmatched_frees == 0


def test_steady_reserved_keeps_the_segments_the_first_iteration_left():
    r = replay_memory(program_trace(), workspaces=False)
    # the first iteration's activation segments (3 x 20 MiB) are cached when the moments
    # (2 x 40 MiB) need new ones; the steady iteration then reuses everything
    assert r.peak_reserved_bytes >= r.first_iteration_peak_reserved_bytes
    assert r.peak_reserved_bytes == r.timeline.reserved[-1]
    assert np.all(r.timeline.reserved == r.timeline.reserved[0])  # no segment made or freed


def test_an_uncategorised_storage_is_added_to_other_not_written_over_it():
    events, seq = [], iter(range(100))
    for uid, category in enumerate(["other", ""]):
        events.append(OpEvent(next(seq), ALLOC, "", "", 0, "m", -1, 0, size_bytes=4 * MiB,
                              storage=uid, category=category))  # fmt: skip
    events.append(OpEvent(next(seq), COMPUTE, "mm", "", 0, "m", FORWARD, 0))
    events.append(OpEvent(next(seq), ALLOC, "", "", 0, "m", FORWARD, 0, size_bytes=2 * MiB,
                          storage=9, category="activation"))  # fmt: skip
    events.append(OpEvent(next(seq), FREE, "", "", 0, "m", BACKWARD, 0, size_bytes=2 * MiB,
                          storage=9))  # fmt: skip
    r = replay_memory(build_trace(events), workspaces=False)
    assert r.live_at_peak_by_category == {"other": 8 * MiB, "activation": 2 * MiB}
