"""replay_memory on captured programs: MemTracker agreement, peaks, OOM, exports."""

import dataclasses
import pickle

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.cuda import _memory_viz
from torch.distributed._tools.mem_tracker import _TOTAL_KEY, MemTracker, _UpdateType

from emulator.capture.op_recorder import OpRecorder
from emulator.capture.trace import ALLOC, FREE
from emulator.hardware import gpu_preset
from emulator.memory import (
    CachingAllocator,
    allocation_size,
    parse_alloc_conf,
    replay_memory,
    round_size,
)
from emulator.memory.export import _segments, history_by_iteration, snapshot, write_snapshot
from emulator.memory.outside import CUBLAS_WORKSPACE_BYTES, CUBLASLT_WORKSPACE_BYTES
from emulator.memory.replay import _op_at
from emulator.units import MiB
from tests.emulator.capture.test_op_recorder import BATCH, GPT, SEQ, VOCAB, run_step


def capture(recompute=False, tracker=None):
    """A fake-mode GPT step recorded by the op recorder (and MemTracker when given): the trace
    and, with a tracker, its total after every ADD/DEL/SIZE update from the tracked start."""
    totals, recording = [], [True]
    with FakeTensorMode():
        model = GPT(recompute=recompute)
        opt = torch.optim.AdamW(model.parameters(), foreach=True)
        idx = torch.randint(0, VOCAB, (BATCH, SEQ))
        rec = OpRecorder()
        modes = []
        if tracker is not None:
            tracker.track_external(model, opt, idx)
            totals.append(sum(s[_TOTAL_KEY] for s in tracker._curr_mem_snap.values()))
            update = tracker._update_snap

            def spy(u_type, *args, **kwargs):
                update(u_type, *args, **kwargs)
                if recording[0] and u_type is not _UpdateType.REF:  # REF: a category change
                    totals.append(sum(s[_TOTAL_KEY] for s in tracker._curr_mem_snap.values()))

            tracker._update_snap = spy
            modes = [tracker]
        rec.tag(model, "parameter")
        rec.tag(idx, "other")
        run_step(model, opt, idx, rec, extra_modes=modes)
        recording[0] = False  # the recorder has exited: later frees are not in its trace
    return rec.trace(), totals


@pytest.fixture(scope="module")
def trace():
    return capture()[0]


@pytest.mark.parametrize("recompute", [False, True])
def test_live_bytes_equal_memtracker_at_every_update(recompute):
    trace, totals = capture(recompute, MemTracker())
    live = trace.live_bytes()[np.isin(trace["kind"], (ALLOC, FREE))].tolist()
    start = live.index(totals[0])  # the recorder tags the same tensors first, in its own order
    assert live[start:] == totals


def test_categories_at_the_peak_sum_to_peak_allocated(trace):
    result = replay_memory(trace, gpu="h100-sxm-80g")
    assert sum(result.live_at_peak_by_category.values()) == result.peak_allocated_bytes
    # cuBLAS's on both threads; cuBLASLt's on the forward one, whose linears have biases
    # (backward runs plain mm)
    assert result.live_at_peak_by_category["cublas_workspace"] == (
        2 * CUBLAS_WORKSPACE_BYTES["hopper"] + CUBLASLT_WORKSPACE_BYTES
    )
    assert result.peak_requested_bytes <= result.peak_allocated_bytes <= result.peak_reserved_bytes


def test_without_workspaces_allocated_is_live_bytes_rounded_to_512(trace):
    result = replay_memory(trace, workspaces=False)
    sizes = np.where(trace["kind"] == ALLOC, -(-trace["size_bytes"] // 512) * 512, 0)
    sizes -= np.where(trace["kind"] == FREE, -(-trace["size_bytes"] // 512) * 512, 0)
    # Every tensor here is small (<= 1 MiB): small-pool blocks are exactly the rounded size.
    assert result.peak_allocated_bytes == np.cumsum(sizes).max()
    assert result.peak_requested_bytes == trace.summary().peak_live_bytes
    assert (
        result.fragmentation_at_peak_bytes
        == result.timeline.reserved[result.peak.event_index] - result.peak_allocated_bytes
    )


def test_peak_event_names_phase_and_module(trace):
    result = replay_memory(trace)
    assert result.peak.phase in ("forward", "backward", "optimizer")
    assert result.to_dict()["peak"]["seq"] == result.peak.seq
    assert result.oom is None and result.to_dict()["is_oom"] is False


def test_device_total_adds_context_and_nccl_to_reserved(trace):
    result = replay_memory(trace, gpu="a100-sxm-80g")
    assert (
        result.device_total_estimate_bytes
        == result.peak_reserved_bytes + result.outside.total_bytes
    )
    assert result.outside.cuda_context_bytes == 300 * MiB and result.outside.nccl_communicators == 0


def _gpu_with(capacity):
    return dataclasses.replace(gpu_preset("h100-sxm-80g"), usable_capacity_bytes=capacity)


@pytest.mark.parametrize("conf", ["", "expandable_segments:True"])
def test_oom_on_both_sides_of_the_capacity_line(trace, conf):
    free_run = replay_memory(trace, gpu="h100-sxm-80g", alloc_conf=conf)
    reserved = max(free_run.peak_reserved_bytes, free_run.first_iteration_peak_reserved_bytes)
    need = reserved + free_run.outside.total_bytes  # what cudaMemGetInfo must offer
    fits = replay_memory(trace, gpu=_gpu_with(need), alloc_conf=conf)
    assert fits.oom is None and fits.peak_reserved_bytes == free_run.peak_reserved_bytes
    short = replay_memory(trace, gpu=_gpu_with(need - 1), alloc_conf=conf)
    assert short.oom is not None
    report = short.oom
    # what a cudaMalloc of a new segment, or the 20 MiB pages an expandable segment maps, adds
    pages = -(-report.request_bytes // (20 * MiB)) * 20 * MiB
    added = pages if conf else report.allocation_bytes
    assert report.reserved_bytes + added > report.allocator_capacity_bytes
    assert (
        report.at.phase
        and report.at.module
        and sum(report.live_by_category.values()) == report.allocated_bytes
    )
    # The figures are still given, as on an unlimited device.
    assert short.peak_allocated_bytes == free_run.peak_allocated_bytes
    assert short.to_dict()["is_oom"] is True


def test_an_oom_report_holds_the_figures_of_torch_s_message(trace):
    free_run = replay_memory(trace, gpu="h100-sxm-80g")
    need = free_run.peak_reserved_bytes + free_run.outside.total_bytes
    report = replay_memory(trace, gpu=_gpu_with(need - 1)).oom
    conf = parse_alloc_conf("")
    assert report.allocation_bytes == allocation_size(round_size(report.request_bytes, conf), conf)
    assert report.outside_bytes == free_run.outside.total_bytes
    assert report.process_in_use_bytes == report.reserved_bytes + report.outside_bytes
    # what is free and what the process holds make up what CUDA offers
    assert report.free_bytes + report.process_in_use_bytes == need - 1


def test_an_allocation_is_named_after_the_op_it_is_made_for(trace):
    c = trace.columns
    aten = [trace.strings[i] for i in c["aten"].tolist()]
    nll = aten.index("aten.nll_loss_backward")
    # the zero fill CUDA runs on the op's output first is recorded between the two
    assert c["kind"][nll - 2] == ALLOC and aten[nll - 1] == "aten.fill_"
    assert _op_at(trace, nll - 2) == "aten.nll_loss_backward"
    mm = aten.index("aten.mm")
    assert c["kind"][mm - 1] == ALLOC and _op_at(trace, mm - 1) == "aten.mm"


def test_snapshot_is_read_by_torch_memory_viz(trace, tmp_path):
    snap = pickle.loads(
        write_snapshot(trace, tmp_path / "snap.pickle", gpu="h100-sxm-80g").read_bytes()
    )
    result = replay_memory(trace, gpu="h100-sxm-80g")
    assert "total_reserved" in _memory_viz.segsum(snap)
    assert f"{len(snap['device_traces'][0])} entries" in _memory_viz.trace(snap)
    assert "add_local_files" in _memory_viz.trace_plot(snap) and _memory_viz.segment_plot(snap)
    assert _memory_viz.memory(snap, format_flamegraph=lambda lines: lines).count("active_allocated")
    # the history is the steady iteration's; what was live before it is in the segments only
    final = result.timeline
    actions = [e["action"] for e in snap["device_traces"][0]]
    assert actions.count("alloc") == len(final.alloc_event) - final.carried_allocations
    assert result.steady_converged and actions.count("segment_alloc") == 0
    assert sum(s["total_size"] for s in snap["segments"]) == final.reserved[-1]
    assert sum(s["allocated_size"] for s in snap["segments"]) == final.allocated[-1]


def test_history_by_iteration_is_the_replay_cut_where_a_process_starts_each_part(trace):
    parts = history_by_iteration(trace, gpu="h100-sxm-80g", steady_iterations=2)
    result = replay_memory(trace, gpu="h100-sxm-80g")

    def strip(events):
        return [(e["action"], e["addr"], e["size"], e["stream"]) for e in events]

    # the state declared before the first op is the setup: one request per storage
    setup_allocs = np.flatnonzero((trace.columns["phase"] < 0) & (trace.columns["kind"] == ALLOC))
    assert [e["action"] for e in parts["setup"]].count("alloc") == len(setup_allocs)
    # the last steady iteration is what a snapshot records
    assert strip(parts["steady"][-1]) == strip(snapshot(trace, gpu="h100-sxm-80g")["device_traces"][0])
    # every segment was opened in one of the parts, and none after the first iteration here
    opened = [sum(e["size"] for e in part if e["action"] == "segment_alloc")
              for part in (parts["setup"], parts["first"], *parts["steady"])]  # fmt: skip
    assert sum(opened) == result.peak_reserved_bytes and opened[2:] == [0, 0]
    with pytest.raises(ValueError, match="steady_iterations=-1 must be >= 0"):
        history_by_iteration(trace, steady_iterations=-1)


def test_history_by_iteration_gives_each_parts_peaks_as_a_process_resetting_them_reads(trace):
    parts = history_by_iteration(trace, gpu="h100-sxm-80g", steady_iterations=2)
    result = replay_memory(trace, gpu="h100-sxm-80g")
    peaks = parts["peaks"]
    keys = ("allocated", "reserved", "requested")

    def figures(part):
        return tuple(part[k] for k in keys)

    # the steady part is replay_memory's headline; from an empty allocator, the first
    # iteration's peaks are those of the build and the first iteration together, since the
    # peaks reset at each part's start
    assert result.steady_converged and result.steady_iterations <= 2
    assert figures(peaks["steady"][-1]) == (
        result.peak_allocated_bytes,
        result.peak_reserved_bytes,
        result.peak_requested_bytes,
    )
    from_empty = tuple(map(max, figures(peaks["setup"]), figures(peaks["first"])))
    assert from_empty == (
        result.first_iteration_peak_allocated_bytes,
        result.first_iteration_peak_reserved_bytes,
        result.first_iteration_peak_requested_bytes,
    )
    # the setup (parameters and the declared state) stays live: the first iteration's peak is
    # above what the setup holds; reserved never falls without empty_cache
    assert peaks["first"]["allocated"] > peaks["setup"]["allocated"] > 0
    reserved = [peaks[part]["reserved"] for part in ("setup", "first")]
    reserved.append(peaks["steady"][0]["reserved"])
    assert reserved == sorted(reserved)


def test_snapshot_splits_expandable_segments_into_mapped_runs():
    a = CachingAllocator(parse_alloc_conf("expandable_segments:True"))
    a.malloc(5 * MiB)
    (seg,) = _segments(a.blocks(), [])
    assert (
        seg["is_expandable"] and seg["total_size"] == 20 * MiB and seg["allocated_size"] == 5 * MiB
    )


def test_a_one_rank_hopper_job_holds_what_a_real_h200_run_held_outside_the_allocator(trace):
    # torch's OOM message of a one-rank llama2-7b run on an H200 (results/gpu_runs/
    # h200-2026-11-27/checks_second): "this process has 114.73 GiB memory in use. Of the
    # allocated memory 113.03 GiB is allocated by PyTorch, and 423.46 MiB is reserved by
    # PyTorch but unallocated": 1.2865 GiB outside, each figure rounded to 0.005 GiB
    measured_gib = 114.73 - 113.03 - 423.46 / 1024
    outside = replay_memory(trace, gpu="h200-141g").outside
    assert outside.nccl_communicators == 0
    assert abs(outside.total_bytes / (1 << 30) - measured_gib) <= 0.015
