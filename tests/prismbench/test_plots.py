"""The harness's figures: a memory timeline PNG from a replayed capture, and the functions
that give it its x axis (phase bands, event times)."""

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from emulator.capture.op_recorder import OpRecorder
from emulator.capture.trace import COMPUTE
from emulator.graph.build import build_graph
from emulator.graph.replay import replay
from emulator.memory import replay_memory
from emulator.world.mesh import World
from prismbench.emulate import emulate
from prismbench.plots import memory_event_times_s, phase_bands, plot_memory_timeline
from prismbench.spec import job_spec_from_dict
from tests.emulator.capture.test_op_recorder import BATCH, GPT, SEQ, VOCAB, run_step
from tests.emulator.memory.test_replay import capture
from tests.emulator.synthetic_traces import Stage, build

PNG = b"\x89PNG\r\n\x1a\n"
OP_S = 1e-3  # every compute op of the replayed step takes 1 ms


def two_micro_batches():
    """A fake-mode GPT step with recompute: two micro-batches of forward and backward
    (gradient accumulation), then the optimizer."""
    with FakeTensorMode():
        model = GPT(recompute=True)
        opt = torch.optim.AdamW(model.parameters(), foreach=True)
        idx = torch.randint(0, VOCAB, (BATCH, SEQ))
        rec = OpRecorder()
        rec.tag(model, "parameter")
        rec.tag(idx, "other")
        run_step(model, opt, idx, rec, micro_batches=2)
    return rec.trace()


@pytest.fixture(scope="module")
def step():
    """(trace, memory replay, per-event times) of the two-micro-batch step on one rank whose
    compute ops take OP_S each."""
    trace = two_micro_batches()
    memory = replay_memory(trace, gpu="h100-sxm-80g")
    world = World.grid(dp=1, pp=1, cp=1, tp=1)
    durations = np.where(trace.columns["kind"] == COMPUTE, OP_S, 0.0)
    graph = build_graph({0: trace}, world, None, durations_s={0: durations})
    timing = replay(graph)
    timeline = timing.timelines[world.representative(0)]
    times = memory_event_times_s(trace, graph.classes[0], timeline, memory.timeline.rows)
    return trace, memory, times, timing.iteration_time_s


def test_memory_timeline_is_a_png(tmp_path):
    trace = capture()[0]
    result = replay_memory(trace, gpu="h100-sxm-80g")
    path = plot_memory_timeline(result, tmp_path / "memory.png", title="one rank")
    assert path.read_bytes()[:8] == PNG


def test_memory_timeline_over_time_with_phase_bands_is_a_png(tmp_path, step):
    trace, memory, times, _ = step
    path = plot_memory_timeline(
        memory, tmp_path / "memory.png", title="two micro-batches", trace=trace, event_times_s=times
    )
    assert path.read_bytes()[:8] == PNG


def test_phase_bands_are_forward_backward_per_micro_batch_then_the_optimizer(step):
    trace, memory, _, _ = step
    bands = phase_bands(trace, memory.timeline.rows)
    # the steady iteration's events (the model state was allocated before it, in the first);
    # recompute is inside B0 and B1
    assert [b.label for b in bands] == ["F0", "B0", "F1", "B1", "opt"]
    assert [b.micro_batch for b in bands] == [0, 0, 1, 1, -1]
    assert bands[0].start == 0 and bands[-1].stop == memory.events
    assert all(a.stop == b.start < b.stop for a, b in zip(bands, bands[1:], strict=False))


def test_an_event_is_at_the_time_the_ops_issued_before_it_have_taken(step):
    trace, memory, times, iteration_s = step
    rows = memory.timeline.rows
    ops = np.flatnonzero(trace.columns["kind"] == COMPUTE)
    ops_before = np.searchsorted(ops, rows)  # compute ops at rows before each event's row
    np.testing.assert_allclose(times, ops_before * OP_S, atol=1e-12)
    assert np.all(np.diff(times) >= 0) and times[-1] <= iteration_s


def test_after_a_collective_an_event_is_at_its_issue_and_after_a_wait_at_its_end():
    world = World.grid(dp=2, pp=1, cp=1, tp=1)
    s = Stage(world, pp=0)
    s.compute(1.0)
    handle = s.collective("all_reduce", "dp", duration_s=3.0, async_op=True)  # 1 s .. 4 s
    s.compute(2.0)  # 1 s .. 3 s, overlapping the all-reduce
    s.wait(handle)  # the compute stream waits until 4 s
    s.compute(1.0)
    graph = build(world, [s])
    timeline = replay(graph).timelines[0]
    trace, _ = s.trace()
    # an event at each op's row comes after the op before it: none, the first compute, the
    # all-reduce's issue, the second compute, the wait
    times = memory_event_times_s(trace, graph.classes[0], timeline, np.arange(len(trace)))
    np.testing.assert_allclose(times, [0.0, 1.0, 1.0, 3.0, 4.0])


@pytest.mark.integration
def test_emulate_writes_a_memory_timeline_per_class(tmp_path, monkeypatch):
    monkeypatch.setenv("PRISMBENCH_CACHE", str(tmp_path / "cache"))
    job = job_spec_from_dict(
        {
            "model": {"name": "llama-debug"},
            "parallel": {"pp": 2},
            "batch": {"seq_len": 64, "global_batch": 4},
            "train": {"precision": "bf16"},
        }
    )
    emulate(job, name="tiny", workers=1, memory_dir=tmp_path / "memory")
    for p in range(2):
        assert (tmp_path / "memory" / f"memory_class_{p:04d}.png").read_bytes()[:8] == PNG
