"""Tests for emulator.graph.timeline: the Trace Event Format structure of a replay export."""

import json

import numpy as np
import pytest

from emulator.graph.replay import replay
from emulator.graph.timeline import TIMELINE_SCHEMA_VERSION, trace_events, write_trace
from emulator.world.mesh import World
from tests.emulator.synthetic_traces import Stage, build, pipeline


@pytest.fixture(scope="module")
def exported():
    world = World.grid(dp=2, pp=2, cp=1, tp=2)
    stages = pipeline(world, 4, 1.0, 2.0, "1f1b")
    for s in stages:
        s.collective("all_reduce", "dp", duration_s=0.5)
    graph = build(world, stages)
    ranks = [0, 1, 2, 3]  # both tp ranks of each stage, dp index 0
    result = replay(graph, ranks=ranks)
    return graph, result, trace_events(graph, result, ranks)


def test_required_keys_and_types(exported):
    *_, doc = exported
    assert doc["otherData"]["prismbench_timeline_schema_version"] == TIMELINE_SCHEMA_VERSION
    for e in doc["traceEvents"]:
        assert isinstance(e["ph"], str) and isinstance(e["pid"], int) and isinstance(e["tid"], int)
        assert isinstance(e["name"], str)
        if e["ph"] == "X":
            assert e["ts"] >= 0 and e["dur"] >= 0
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name") and isinstance(
                e["args"]["name"], str
            )


def test_a_process_per_rank_and_named_threads(exported):
    graph, _, doc = exported
    procs = {e["pid"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert procs == {0, 1, 2, 3}
    threads = {(e["pid"], e["tid"]) for e in doc["traceEvents"] if e["name"] == "thread_name"}
    used = {(e["pid"], e["tid"]) for e in doc["traceEvents"] if e["ph"] == "X"}
    assert used <= threads


def test_every_flow_start_has_a_finish(exported):
    *_, doc = exported
    starts = {e["id"] for e in doc["traceEvents"] if e["ph"] == "s"}
    finishes = {e["id"] for e in doc["traceEvents"] if e["ph"] == "f"}
    assert starts == finishes and starts
    assert all(e.get("bp") == "e" for e in doc["traceEvents"] if e["ph"] == "f")


def test_flows_join_tp_partners_and_pipeline_neighbours(exported):
    *_, doc = exported
    flows = {e["id"]: [] for e in doc["traceEvents"] if e["ph"] == "s"}
    for e in doc["traceEvents"]:
        if e["ph"] in "sf":
            flows[e["id"]].append(e["pid"])
    pairs = {tuple(sorted(p)) for p in flows.values()}
    assert (0, 2) in pairs  # a send/recv between stages
    assert (0, 1) not in pairs  # the dp all-reduce does not join tp partners 0 and 1


def test_complete_events_sorted_per_thread(exported):
    *_, doc = exported
    per_thread = {}
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            per_thread.setdefault((e["pid"], e["tid"]), []).append(e["ts"])
    assert all(np.all(np.diff(ts) >= 0) for ts in per_thread.values())


def test_write_trace_is_json(tmp_path, exported):
    graph, result, _ = exported
    write_trace(tmp_path / "t.json", graph, result)
    doc = json.loads((tmp_path / "t.json").read_text())
    assert {e["pid"] for e in doc["traceEvents"]} == {0, 2}


def test_untracked_rank_is_refused(exported):
    graph, result, _ = exported
    with pytest.raises(ValueError, match="no timeline"):
        trace_events(graph, result, [4])


def test_a_launch_bound_segment_says_how_much_of_its_slice_is_kernels():
    # ten 1 us kernels, the host issuing one every 10 us: the slice runs from the first issue
    # (10 us) to the last kernel's end (101 us), 10 us of it kernels
    world = World.grid(dp=1, pp=1, cp=1, tp=1)
    stage = Stage(world, 0)
    for _ in range(10):
        stage.compute(1e-6, dispatch_s=10e-6)
    graph = build(world, [stage], host=True)
    (segment,) = [e for e in trace_events(graph, replay(graph))["traceEvents"] if e["ph"] == "X"]
    assert segment["dur"] == pytest.approx(91.0)
    assert segment["args"]["kernels_us"] == pytest.approx(10.0)
    assert segment["args"]["host_wait_us"] == pytest.approx(81.0)
