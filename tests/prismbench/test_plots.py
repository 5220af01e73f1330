"""The harness's figures: a memory timeline PNG from a replayed capture, the functions that
give it its x axis (phase bands, event times), and what it draws (colours, limits, the table,
the OOM, which iterations)."""

import dataclasses

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from emulator.capture.op_recorder import OpRecorder
from emulator.capture.trace import CATEGORIES, COMPUTE
from emulator.graph.build import build_graph
from emulator.graph.replay import replay
from emulator.hardware import gpu_preset
from emulator.memory import OutsideMemory, replay_memory
from emulator.memory.events import KERNEL_WORKSPACE_CATEGORY, WORKSPACE_CATEGORY
from emulator.units import GiB, MiB
from emulator.world.mesh import World
from prismbench.emulate import emulate
from prismbench.plots import (
    category_colours,
    iterations_drawn,
    limit_lines,
    memory_event_times_s,
    phase_bands,
    plot_memory_timeline,
    plot_title,
    table_rows,
)
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


OUTSIDE = OutsideMemory(  # 1 MiB outside the allocator, as a CUDA context would hold
    cuda_context_bytes=MiB,
    nccl_setup_bytes=0,
    nccl_buffer_bytes=0,
    nccl_communicators=0,
    nccl_channels=0,
)


def _on_a_gpu_of(capacity_bytes: int):
    """The test capture replayed on an H100 that offers `capacity_bytes`, 1 MiB of it outside
    the allocator."""
    gpu = dataclasses.replace(gpu_preset("h100-sxm-80g"), usable_capacity_bytes=capacity_bytes)
    return replay_memory(capture()[0], gpu=gpu, outside=OUTSIDE)


@pytest.fixture(scope="module")
def roomy():
    """A replay with room to spare: its peak reserved plus 1 MiB outside, plus 8 MiB."""
    free = replay_memory(capture()[0], gpu="h100-sxm-80g", outside=OUTSIDE)
    reserved = max(free.peak_reserved_bytes, free.first_iteration_peak_reserved_bytes)
    return _on_a_gpu_of(reserved + MiB + 8 * MiB)


@pytest.fixture(scope="module")
def short():
    """The same replay on a GPU one byte short of what it needs: an OOM."""
    free = replay_memory(capture()[0], gpu="h100-sxm-80g", outside=OUTSIDE)
    reserved = max(free.peak_reserved_bytes, free.first_iteration_peak_reserved_bytes)
    result = _on_a_gpu_of(reserved + MiB - 1)
    assert result.oom is not None
    return result


def test_every_category_the_replay_knows_has_its_own_colour():
    known = (*CATEGORIES, WORKSPACE_CATEGORY, KERNEL_WORKSPACE_CATEGORY)
    colours = category_colours(known)
    assert len(set(colours.values())) == len(known)
    assert colours[KERNEL_WORKSPACE_CATEGORY] != colours["parameter"]  # tab10 gave both C0


def test_a_category_keeps_its_colour_whatever_else_is_drawn():
    assert category_colours(["kernel_workspace"]) == {
        "kernel_workspace": category_colours(["parameter", "kernel_workspace"])["kernel_workspace"]
    }
    colours = category_colours(["parameter", "zeta", "alpha"])  # unknown labels: colours left
    assert len(set(colours.values())) == 3


def test_the_limits_are_the_usable_capacity_and_the_allocator_limit_1MiB_under_it(roomy):
    lines = {line.label: line.size_bytes for line in limit_lines(roomy)}
    assert lines == {
        "h100-sxm-80g usable capacity": roomy.gpu_capacity_bytes,
        "allocator limit (capacity - outside the allocator)": roomy.gpu_capacity_bytes - MiB,
    }


def test_limits_far_above_the_job_are_not_drawn_but_are_in_the_table():
    small = replay_memory(capture()[0], gpu="h100-sxm-80g")  # MiB of a job on 79 GiB
    assert limit_lines(small) == []
    rows = {row.name: row.size_bytes for row in table_rows(small, set())}
    assert rows["h100-sxm-80g usable capacity"] == small.gpu_capacity_bytes > 79 * GiB
    outside = rows["outside the allocator (CUDA context, NCCL)"]
    assert outside == small.outside.total_bytes > 0
    assert rows["allocator limit (capacity - outside)"] == small.gpu_capacity_bytes - outside


def test_without_a_gpu_there_are_no_limits():
    result = replay_memory(capture()[0])
    assert limit_lines(result) == []
    assert [row.name for row in table_rows(result, set()) if not row.category] == [
        "peak allocated",
        "peak reserved",
    ]


def test_the_table_lists_every_drawn_category_largest_first_with_its_share(roomy):
    rows = table_rows(roomy, {"drawn_but_not_live"})
    categories = [row for row in rows if row.category]
    assert {row.name: row.size_bytes for row in categories}["drawn_but_not_live"] == 0
    sizes = [row.size_bytes for row in categories]
    assert sizes == sorted(sizes, reverse=True)
    assert sum(sizes) == roomy.peak_allocated_bytes
    assert not any(row.name.startswith("OOM") for row in rows)


def test_an_oom_before_the_first_micro_batch_names_none_in_the_title(short):
    # a step's first forward ops run before its first micro-batch begins (the trace's -1)
    at = dataclasses.replace(short.oom.at, phase="forward", micro_batch=-1)
    early = dataclasses.replace(short, oom=dataclasses.replace(short.oom, at=at))
    assert "iteration (forward): " in plot_title(early, "one rank")
    at = dataclasses.replace(at, micro_batch=2)
    later = dataclasses.replace(short, oom=dataclasses.replace(short.oom, at=at))
    assert "iteration (forward of micro-batch 2): " in plot_title(later, "one rank")


def test_only_the_steady_iteration_is_drawn_when_the_first_peaks_no_higher(roomy):
    assert roomy.first_iteration_peak_reserved_bytes <= roomy.peak_reserved_bytes
    assert iterations_drawn(roomy) == ("steady",)
    higher = dataclasses.replace(
        roomy, first_iteration_peak_allocated_bytes=roomy.peak_allocated_bytes + 1
    )
    assert iterations_drawn(higher) == ("first", "steady")


def test_an_oom_is_said_in_the_title_listed_in_the_table_and_its_iteration_drawn(short):
    oom = short.oom
    title = plot_title(short, "one rank")
    assert title.startswith(f"OUT OF MEMORY in the {oom.iteration} iteration ({oom.at.phase}")
    assert title.endswith("\none rank")
    assert plot_title(dataclasses.replace(short, oom=None), "one rank") == "one rank"
    last = table_rows(short, set())[-1]
    assert last.name == f"OOM: refused request ({oom.iteration} iteration)"
    assert last.size_bytes == oom.request_bytes
    assert oom.iteration in iterations_drawn(short)


def test_a_first_iteration_oom_is_drawn_over_its_event_times(short, tmp_path):
    oom_first = dataclasses.replace(short, oom=dataclasses.replace(short.oom, iteration="first"))
    times = {
        "event_times_s": np.linspace(0, 1, short.events),
        "first_event_times_s": np.linspace(0, 1, len(short.first_timeline.rows)),
    }
    path = plot_memory_timeline(oom_first, tmp_path / "oom.png", title="one rank", **times)
    assert path.read_bytes()[:8] == PNG
    with pytest.raises(ValueError, match="first iteration: 3 event times"):
        plot_memory_timeline(oom_first, tmp_path / "x.png", first_event_times_s=np.zeros(3))


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
