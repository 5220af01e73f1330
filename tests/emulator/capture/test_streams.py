"""Stream tracking: torch.cpu stream calls become stream ids, records and waits in the trace,
and the execution graph makes a stream wait where the program made it wait."""

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from emulator.capture import streams
from emulator.capture.op_recorder import OpRecorder
from emulator.capture.trace import COMPUTE, RECORD, STREAM_WAIT
from emulator.graph.build import build_graph
from emulator.graph.execution_graph import WAIT_NODE
from emulator.graph.replay import replay
from emulator.world.mesh import World


def record_two_streams(wait: bool):
    """Compute on a side stream, then (optionally) the default stream waits for it."""
    rec = OpRecorder()
    with FakeTensorMode(), rec, streams.tracking(rec.stream_tracker()):
        side = torch.cpu.Stream()
        x = torch.ones(64, 64)
        with torch.cpu.stream(side):
            y = x @ x
        if wait:
            torch.cpu.current_stream().wait_stream(side)
        z = x + 1
        del y, z
    return rec.trace()


def test_ops_carry_the_stream_they_ran_on():
    trace = record_two_streams(wait=False)
    compute = trace["kind"] == COMPUTE
    names = [trace.strings[i] for i in trace["name"][compute]]
    on_stream = dict(zip(names, trace["stream"][compute].tolist(), strict=True))
    assert on_stream.pop("mm") == 1  # the matmul ran inside `with torch.cpu.stream(side)`
    assert set(on_stream.values()) == {0}  # the rest (the fill of `ones`, the add) on the default


def test_wait_stream_is_a_record_on_the_other_stream_and_a_wait_on_this_one():
    trace = record_two_streams(wait=True)
    kinds = trace["kind"].tolist()
    rec, wait = kinds.index(RECORD), kinds.index(STREAM_WAIT)
    assert rec < wait
    assert (trace["stream"][rec], trace["stream"][wait]) == (1, 0)
    assert trace["tag"][rec] == trace["tag"][wait]


def test_stream_calls_are_no_ops_again_after_tracking():
    record_two_streams(wait=True)
    assert torch.cpu.Stream().record_event() is None
    assert streams.current_stream_id() == 0


def replayed(wait: bool, durations: dict[str, float]):
    trace = record_two_streams(wait)
    names = [trace.strings[i] for i in trace["name"]]
    per_row = [durations.get(n, 0.0) if k == COMPUTE else 0.0 for n, k in zip(names, trace["kind"].tolist(), strict=True)]
    world = World.grid(dp=1, pp=1, cp=1, tp=1)
    graph = build_graph({0: trace}, world, None, durations_s={0: per_row})
    return graph, replay(graph)


def test_the_waiting_stream_resumes_when_the_other_one_finishes():
    graph, result = replayed(wait=True, durations={"mm": 5.0, "elementwise": 1.0})
    assert (graph.classes[0]["kind"] == WAIT_NODE).sum() == 1
    assert result.iteration_time_s == 6.0  # the add waits for the 5 s matmul on the side stream


def test_without_a_wait_the_streams_overlap():
    _, result = replayed(wait=False, durations={"mm": 5.0, "elementwise": 1.0})
    assert result.iteration_time_s == 5.0
