"""Closed-form checks of emulator.graph.replay on synthetic stage programs (tests/emulator/synthetic_traces.py)."""

import dataclasses

import numpy as np
import pytest

from emulator.costs.collectives import Topology
from emulator.costs.pricing import CostContext
from emulator.graph.execution_graph import COLLECTIVE, SEGMENT, SEND
from emulator.graph.replay import replay, replay_samples
from emulator.graph.results import BREAKDOWN_FIELDS
from emulator.hardware import gpu_preset, inter_node_network, intra_node_link
from emulator.world.mesh import World
from tests.emulator.synthetic_traces import Stage, build, node_of, pipeline


def _dp_program(world, compute_s, allreduce_s):
    s = Stage(world, 0)
    s.compute(compute_s, phase="backward")
    s.collective("all_reduce", "dp", duration_s=allreduce_s)
    s.compute(0.0, phase="optimizer")
    return s


def test_pure_dp_without_overlap_is_compute_plus_allreduce():
    world = World.grid(dp=8, pp=1, cp=1, tp=1)
    result = replay(build(world, [_dp_program(world, 3.0, 0.5)]))
    assert result.iteration_time_s == pytest.approx(3.5)
    c = result.per_class[0]
    assert (c.compute_s, c.exposed_comm_s, c.bubble_s, c.idle_s) == pytest.approx(
        (3.0, 0.5, 0.0, 0.0)
    )
    assert c.comm_s_by_group == {"dp": pytest.approx(0.5)}


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (8, 16)])
def test_uniform_pipeline_iteration_and_bubble(schedule, p, m):
    world = World.grid(dp=1, pp=p, cp=1, tp=1)
    f, b = 1.0, 2.0
    result = replay(build(world, pipeline(world, m, f, b, schedule)))
    assert result.iteration_time_s == pytest.approx((m + p - 1) * (f + b))
    for c in result.per_class:
        assert c.compute_s == pytest.approx(m * (f + b))
        assert (c.bubble_s + c.idle_s) / result.iteration_time_s == pytest.approx(
            (p - 1) / (m + p - 1)
        )


def test_waiting_for_another_stage_at_a_collective_over_the_stages_is_bubble():
    # 1F1B ends with a gradient-norm all-reduce over the stages: the last stage reaches it
    # (p - 1)(f + b) before the first one does; that wait is the pipeline's drain, not comm
    world = World.grid(dp=1, pp=4, cp=1, tp=1)
    f, b, c, m, p = 1.0, 2.0, 0.5, 8, 4
    stages = pipeline(world, m, f, b, "1f1b")
    for st in stages:
        st.collective("all_reduce", "pp", duration_s=c)
    result = replay(build(world, stages))
    assert result.iteration_time_s == pytest.approx((m + p - 1) * (f + b) + c)
    for cls in result.per_class:
        assert cls.exposed_comm_s == pytest.approx(c)
        assert cls.bubble_s + cls.idle_s == pytest.approx((p - 1) * (f + b))


@pytest.mark.parametrize("v", [2, 4])
@pytest.mark.parametrize(("p", "m"), [(4, 8), (8, 16)])
def test_interleaving_shrinks_the_bubble_by_vpp(v, p, m):
    # Megatron's interleaved 1F1B with chunks of f/v and b/v: bubble (p-1)(f+b)/v exactly.
    world = World.grid(dp=1, pp=p, cp=1, tp=1, vpp=v)
    f, b = 1.0, 2.0
    result = replay(build(world, pipeline(world, m, f, b, "interleaved")))
    assert result.iteration_time_s == pytest.approx(m * (f + b) + (p - 1) * (f + b) / v)
    for c in result.per_class:
        assert c.bubble_s + c.idle_s == pytest.approx((p - 1) * (f + b) / v)


def _async_dp(world, before_s, after_s, allreduce_s):
    s = Stage(world, 0)
    s.compute(before_s, phase="backward")
    h = s.collective("all_reduce", "dp", duration_s=allreduce_s, async_op=True)
    s.compute(after_s, phase="backward")
    s.wait(h)
    s.compute(0.25, phase="optimizer")
    return s


def test_async_allreduce_hidden_behind_long_enough_backward():
    world = World.grid(dp=4, pp=1, cp=1, tp=1)
    result = replay(build(world, [_async_dp(world, 1.0, 2.0, 1.5)]))
    assert result.iteration_time_s == pytest.approx(1.0 + 2.0 + 0.25)
    assert result.per_class[0].exposed_comm_s == pytest.approx(0.0)


def test_async_allreduce_partly_exposed_behind_short_backward():
    world = World.grid(dp=4, pp=1, cp=1, tp=1)
    result = replay(build(world, [_async_dp(world, 1.0, 0.5, 1.5)]))
    assert result.iteration_time_s == pytest.approx(1.0 + 1.5 + 0.25)
    assert result.per_class[0].exposed_comm_s == pytest.approx(1.0)


def _tp_then_dp(world):
    s = Stage(world, 0)
    s.compute(1.0)
    tp = s.collective("all_reduce", "tp")
    s.compute(1.0)
    dp = s.collective("all_reduce", "dp")
    return s, tp, dp


def test_slowed_rank_delays_exactly_the_collectives_it_joins():
    world = World.grid(dp=2, pp=1, cp=1, tp=2)
    stage, tp_seq, dp_seq = _tp_then_dp(world)
    graph = build(world, [stage])
    factors = np.ones(world.shape)
    factors[0, 0, 0, 0] = 2.0  # rank 0 computes at half speed
    result = replay(graph, speed_factors=factors, ranks=[1, 2, 3])
    tp_node, dp_node = node_of(graph, 0, stage, tp_seq), node_of(graph, 0, stage, dp_seq)
    start = {r: result.timelines[r].start_s for r in range(4)}
    assert start[1][tp_node] == pytest.approx(2.0)  # rank 0's tp partner waits for it
    assert start[2][tp_node] == pytest.approx(1.0)  # the other tp group is not delayed
    assert start[2][dp_node] == pytest.approx(4.0)  # until a dp collective joins it with rank 0
    assert start[3][dp_node] == pytest.approx(3.0)  # rank 3 joins rank 1 (delayed once, by tp)
    assert result.iteration_time_s == pytest.approx(4.0)


def test_an_expert_all_to_all_on_a_factored_torchtitan_mesh_joins_its_block_only():
    """torchtitan's MoE mesh: EP = dp_shard_in_ep x cp, carved out of dp_shard x cp. A slow
    rank delays its EP block and, through the dp_shard x cp reduce-scatter, every rank of it."""
    world = World(axes=(("dp_shard_mod_ep", 2), ("dp_shard_in_ep", 2), ("cp", 2), ("tp", 2)))
    s = Stage(world, 0)
    s.compute(1.0)
    ep = s.collective("all_to_all", ("dp_shard_in_ep", "cp"))
    s.compute(1.0)
    fsdp = s.collective("reduce_scatter", ("dp_shard_mod_ep", "dp_shard_in_ep", "cp"))
    graph = build(world, [s])
    assert graph.lanes == world.shape  # no pipeline axis: one class, every axis a lane axis
    factors = np.ones(world.shape)
    factors[0, 0, 0, 0] = 3.0  # rank 0 computes at a third of the speed
    others = world.group_of(0, "tp")[1:].tolist() + [world.rank_of(dp_shard_mod_ep=1)]
    ep_mate = world.rank_of(dp_shard_in_ep=1)
    result = replay(graph, speed_factors=factors, ranks=[ep_mate, *others])
    start = {r: t.start_s for r, t in result.timelines.items()}
    ep_node, fsdp_node = node_of(graph, 0, s, ep), node_of(graph, 0, s, fsdp)
    assert start[ep_mate][ep_node] == pytest.approx(3.0)  # same EP block as rank 0
    assert start[others[1]][ep_node] == pytest.approx(1.0)  # other EP block
    assert start[others[1]][fsdp_node] == pytest.approx(6.0)  # joined by the reduce-scatter
    assert start[others[0]][fsdp_node] == pytest.approx(2.0)  # tp peer: not in the group


@pytest.mark.parametrize("case", ["dp", "pipeline"])
def test_unit_factors_match_uniform_replay(case):
    if case == "dp":
        world = World.grid(dp=2, pp=1, cp=1, tp=2)
        graph = build(world, [_async_dp(world, 1.0, 0.5, 1.5)])
    else:
        world = World.grid(dp=2, pp=4, cp=1, tp=2)
        graph = build(world, pipeline(world, 8, 1.0, 2.0, "1f1b"))
    uniform = replay(graph)
    lanes = replay(graph, speed_factors=np.ones(world.shape))
    assert uniform.uniform and not lanes.uniform
    assert lanes.iteration_time_s == uniform.iteration_time_s
    assert lanes.per_class == uniform.per_class
    for rank, t in uniform.timelines.items():
        np.testing.assert_array_equal(lanes.timelines[rank].end_s, t.end_s)


def test_override_replaces_one_node_duration():
    world = World.grid(dp=2, pp=1, cp=1, tp=1)
    stage = _dp_program(world, 3.0, 0.5)
    graph = build(world, [stage])
    result = replay(graph, overrides={0: {0: 1.0}})
    assert result.iteration_time_s == pytest.approx(1.5)


def test_per_lane_override_takes_the_slowest_member():
    world = World.grid(dp=2, pp=1, cp=1, tp=1)
    graph = build(world, [_dp_program(world, 3.0, 0.5)])
    result = replay(graph, overrides={0: {0: np.array([1.0, 2.0]).reshape(2, 1, 1)}})
    assert not result.uniform
    assert result.iteration_time_s == pytest.approx(2.5)


def test_pp_spanning_allreduce_joins_all_stages():
    world = World.grid(dp=1, pp=3, cp=1, tp=1)
    stages = []
    for p, compute_s in enumerate([1.0, 3.0, 2.0]):
        s = Stage(world, p)
        s.compute(compute_s)
        s.collective("all_reduce", "pp", duration_s=0.5)
        stages.append(s)
    result = replay(build(world, stages))
    assert [c.end_s for c in result.per_class] == pytest.approx([3.5, 3.5, 3.5])


def test_tied_embedding_allreduce_joins_only_first_and_last_stage():
    world = World.grid(dp=1, pp=3, cp=1, tp=1)
    stages = []
    for p, compute_s in enumerate([1.0, 3.0, 2.0]):
        s = Stage(world, p)
        s.compute(compute_s)
        if p in (0, 2):
            s.collective("all_reduce", "pp", duration_s=0.5, ranks=[0, 2])
        stages.append(s)
    result = replay(build(world, stages))
    assert [c.end_s for c in result.per_class] == pytest.approx([2.5, 3.0, 2.5])


def _one_gpu_nodes_topology():
    return Topology(gpu=gpu_preset("h100-sxm-80g"), gpus_per_node=1,
                    link=intra_node_link("nvlink4"), network=inter_node_network("ib-ndr-8x400"))  # fmt: skip


def test_a_send_and_a_receive_between_two_stages_run_at_once_and_two_sends_in_turn():
    # the schedules post a stage's send and receive together (batch_isend_irecv): NCCL runs
    # them side by side on full-duplex links, while calls of one direction keep their order
    world = World.grid(dp=1, pp=2, cp=1, tp=1)
    cost = CostContext(topology=_one_gpu_nodes_topology())
    exchange = []
    for p in range(2):
        s = Stage(world, p)
        s.send(1 - p, nbytes=1 << 26)
        s.recv(1 - p, nbytes=1 << 26)
        exchange.append(s)
    graph = build(world, exchange, cost)
    one = graph.classes[0]["duration_s"][graph.classes[0]["kind"] == SEND][0]
    assert one > 1e-3
    assert replay(graph).iteration_time_s == pytest.approx(one)
    first, second = Stage(world, 0), Stage(world, 1)
    for _ in range(2):
        first.send(1, nbytes=1 << 26)
        second.recv(0, nbytes=1 << 26)
    assert replay(build(world, [first, second], cost)).iteration_time_s == pytest.approx(2 * one)


def test_receive_before_send_on_both_sides_is_a_deadlock():
    world = World.grid(dp=1, pp=2, cp=1, tp=1)
    stages = []
    for p in range(2):
        s = Stage(world, p)
        s.recv(1 - p)
        s.send(1 - p)
        stages.append(s)
    with pytest.raises(RuntimeError, match="deadlock"):
        replay(build(world, stages))


def test_critical_path_is_contiguous_and_spans_the_iteration():
    world = World.grid(dp=1, pp=4, cp=1, tp=1)
    result = replay(build(world, pipeline(world, 8, 1.0, 2.0, "1f1b")))
    path = result.critical_path
    assert path[0].start_s == pytest.approx(0.0)
    assert path[-1].start_s + path[-1].duration_s == pytest.approx(result.iteration_time_s)
    for a, b in zip(path, path[1:], strict=False):
        assert b.start_s == pytest.approx(a.start_s + a.duration_s)
    assert sum(e.duration_s for e in path) == pytest.approx(result.iteration_time_s)


def test_compute_overlapping_a_collective_is_slowed():
    topo = Topology(
        gpu=gpu_preset("h100-sxm-80g"),
        gpus_per_node=8,
        link=intra_node_link("nvlink4"),
        network=inter_node_network("ib-ndr-8x400"),
    )
    world = World.grid(dp=1, pp=1, cp=1, tp=8)
    s = Stage(world, 0)
    h = s.collective("all_reduce", "tp", nbytes=1 << 30, async_op=True)
    s.compute(1e-3, name="mm")
    s.wait(h)
    graph = build(world, [s], CostContext(topology=topo))
    comm_s = float(graph.classes[0]["duration_s"][0])
    slow = topo.gpu.sm_count / (topo.gpu.sm_count - topo.link.channels)
    expected = min(1e-3 * slow, 1e-3 + comm_s * (1 - 1 / slow))
    t = replay(graph).timelines[0]
    seg = int(np.flatnonzero(graph.classes[0]["kind"] == 0)[0])
    assert t.end_s[seg] - t.start_s[seg] == pytest.approx(expected)
    assert expected > 1e-3


def _topology(link_GBps=370.8):
    link = dataclasses.replace(intra_node_link("nvlink4"), bandwidth_GBps=link_GBps)
    return Topology(
        gpu=gpu_preset("h100-sxm-80g"),
        gpus_per_node=8,
        link=link,
        network=inter_node_network("ib-ndr-8x400"),
    )


def _elementwise_beside(kind, nbytes, topo, ops=50, op_s=2e-6):
    """Replay of `ops` memory-bound ops issued beside an async tp collective; (graph, result)."""
    world = World.grid(dp=1, pp=1, cp=1, tp=8)
    s = Stage(world, 0)
    h = s.collective(kind, "tp", nbytes=nbytes, async_op=True)
    for _ in range(ops):
        s.compute(op_s, name="add")
    s.wait(h)
    graph = build(world, [s], CostContext(topology=topo))
    return graph, replay(graph)


def test_a_memory_bound_op_is_slowed_by_the_traffic_of_the_collective_beside_it():
    topo = _topology()
    graph, result = _elementwise_beside("all_gather", 1 << 26, topo)  # 64 MiB, ~0.2 ms
    g, t = graph.classes[0], result.timelines[0]
    seg = int(np.flatnonzero(g["kind"] == SEGMENT)[0])
    comm_s = float(g["duration_s"][0])
    traffic_Bps = 7 / 8 * (1 << 26) / comm_s  # what each member moves per second
    assert traffic_Bps < 370.8e9  # below the link's rate: the call's own traffic counts
    slow = 1 + 2 * traffic_Bps / (topo.gpu.hbm_bandwidth_GBps * 1e9 * topo.gpu.hbm_efficiency)
    assert comm_s >= 100e-6 * slow  # it outlasts the ops even slowed: all of them are
    assert t.end_s[seg] - t.start_s[seg] == pytest.approx(100e-6 * slow)


def test_a_latency_bound_collective_hardly_slows_the_ops_beside_it():
    _, result = _elementwise_beside("all_reduce", 4096, _topology())
    assert result.iteration_time_s == pytest.approx(100e-6, rel=1e-3)


@pytest.mark.parametrize("kind, nbytes", [("all_reduce", 4096), ("all_gather", 1 << 26)])
def test_a_faster_link_never_slows_ops_that_hide_a_collective(kind, nbytes):
    # 5 ms of memory-bound ops hide the collective on every link: a faster one moves its bytes
    # in less time, so the ops beside it are slowed no more in all
    times = [
        _elementwise_beside(kind, nbytes, _topology(bw), ops=100, op_s=50e-6)[1].iteration_time_s
        for bw in (100.0, 185.4, 370.8, 450.0)
    ]
    assert all(b <= a * (1 + 1e-12) for a, b in zip(times, times[1:], strict=False))


def _two_calls_then_work(world, calls, work_s, durations_s):
    """Two async all-reduces ((axis, bytes) each) issued before `work_s` of memory-bound work,
    their durations then set to `durations_s` so the window's length is known: (graph, class
    0, its collective nodes)."""
    s = Stage(world, 0)
    handles = [s.collective("all_reduce", axis, nbytes=n, async_op=True) for axis, n in calls]
    s.compute(work_s, name="add")
    for h in handles:
        s.wait(h)
    graph = build(world, [s], CostContext(topology=_topology()))
    g = graph.classes[0]
    coll = np.flatnonzero(g["kind"] == COLLECTIVE)
    g["duration_s"][coll] = durations_s
    return graph, g, coll


def test_collectives_overlapping_one_another_add_their_bytes():
    world = World.grid(dp=2, pp=1, cp=1, tp=8)
    calls = [("tp", 1 << 20), ("dp", 1 << 20)]
    graph, g, coll = _two_calls_then_work(world, calls, 2e-3, [1e-3, 1e-3])
    t = replay(graph).timelines[0]
    seg = int(np.flatnonzero(g["kind"] == SEGMENT)[-1])
    # both calls run from 0 to 1 ms, each on its group's stream: the window [0, 1 ms) moves
    # both calls' bytes, and the 2 ms segment runs beside it for 1 ms
    window_Bps = float(g["traffic_bytes"][coll].sum()) / 1e-3
    slow = 1 + float(g["memory_slowdown_per_Bps"][seg]) * window_Bps
    assert t.start_s[seg] == pytest.approx(0.0)
    assert t.end_s[seg] == pytest.approx(2e-3 + 1e-3 * (1 - 1 / slow))


def _slowed_s(work_s, window_s, slowdown):
    """Work beside a window of comm from its start (replay's rule): min(r s, r + w (1 - 1/s))."""
    return min(work_s * slowdown, work_s + window_s * (1 - 1 / slowdown))


def test_a_call_queued_behind_another_on_its_stream_joins_its_window():
    # a 1 GiB all-reduce over [0, 2 ms), a 4 KiB one queued behind it over [2, 3 ms): the
    # window is [0, 3 ms)
    world = World.grid(dp=1, pp=1, cp=1, tp=8)
    calls = [("tp", 1 << 30), ("tp", 4096)]
    graph, g, coll = _two_calls_then_work(world, calls, 5e-3, [2e-3, 1e-3])
    seg = int(np.flatnonzero(g["kind"] == SEGMENT)[0])
    t = replay(graph).timelines[0]
    slow = 1 + float(g["memory_slowdown_per_Bps"][seg]) * float(g["traffic_bytes"][coll].sum()) / 3e-3
    assert t.end_s[seg] - t.start_s[seg] == pytest.approx(_slowed_s(5e-3, 3e-3, slow))


def _late_gather(sender_s, gather_bytes, then, name, *, wait_gather):
    """Stage 1 of a pp 2 x tp 2 job: a prefetched recv that waits `sender_s` for its sender,
    then a tp all-gather that starts at 0 (replayed after the recv: program order), then
    `then` seconds of `name` beside the gather or after it: (graph, class 1, its timeline)."""
    world = World.grid(dp=1, pp=2, cp=1, tp=2)
    s0 = Stage(world, 0)
    s0.compute(sender_s, name="mm")
    s0.send(1, nbytes=1 << 20)
    s1 = Stage(world, 1)
    recv = s1.recv(0, nbytes=1 << 20, wait=False)
    gather = s1.collective("all_gather", "tp", nbytes=gather_bytes, async_op=True)
    if wait_gather:
        s1.wait(gather)
    s1.compute(then, name=name)
    if not wait_gather:
        s1.wait(gather)
    s1.wait(recv)
    graph = build(world, [s0, s1], CostContext(topology=_topology()))
    return graph, graph.classes[1], replay(graph).timelines[world.representative(1)]


def test_a_call_replayed_late_that_started_early_opens_the_window_back():
    # the recv runs from 0.1 ms, the all-gather from 0 to past it: one window from 0
    graph, g, t = _late_gather(1e-4, 1 << 28, 1e-3, "add", wait_gather=False)
    seg = int(np.flatnonzero(g["kind"] == SEGMENT)[0])
    recv, gather = np.flatnonzero(g["traffic_bytes"] > 0)
    assert t.start_s[recv] == pytest.approx(1e-4) and t.start_s[gather] == 0.0
    assert t.end_s[gather] > t.start_s[recv]  # they overlap
    window_s = max(t.end_s[recv], t.end_s[gather])
    window_Bps = float(g["traffic_bytes"][recv] + g["traffic_bytes"][gather]) / window_s
    slow = 1 + float(g["memory_slowdown_per_Bps"][seg]) * window_Bps
    assert t.end_s[seg] - t.start_s[seg] == pytest.approx(_slowed_s(1e-3, window_s, slow))


def test_a_call_that_ended_before_the_window_opened_does_not_stretch_it():
    # the all-gather is over long before the recv starts at 10 ms: a GEMM run after it, with
    # nothing beside it, is not slowed (the rank keeps one window: the gather is left out)
    graph, g, t = _late_gather(10e-3, 1 << 26, 5e-3, "mm", wait_gather=True)
    recv, gather = np.flatnonzero(g["traffic_bytes"] > 0)
    seg = int(np.flatnonzero(g["kind"] == SEGMENT)[-1])
    assert t.end_s[gather] <= t.start_s[seg] < t.end_s[seg] <= t.start_s[recv]
    assert t.end_s[seg] - t.start_s[seg] == pytest.approx(5e-3)


def _late_recv_beside_work(world):
    """Stage 1's prefetched recv waits 10 ms for its sender while 12 ms of elementwise work
    issued after it runs: (graph, class 1, the work's segment, the recv's node)."""
    s0 = Stage(world, 0)
    s0.compute(10e-3, name="mm")
    s0.send(1, nbytes=1 << 28)
    s1 = Stage(world, 1)
    recv = s1.recv(0, nbytes=1 << 28, wait=False)
    s1.compute(12e-3, name="add")
    s1.wait(recv)
    graph = build(world, [s0, s1], CostContext(topology=_topology()))
    g = graph.classes[1]
    seg = int(np.flatnonzero(g["kind"] == SEGMENT)[0])
    return graph, g, seg, int(np.flatnonzero(g["traffic_bytes"] > 0)[0])


def test_work_before_the_window_opens_runs_at_full_speed():
    # of the 12 ms of work issued after the recv, the first 10 ms run before it starts, unslowed
    world = World.grid(dp=1, pp=2, cp=1, tp=1)
    graph, g, seg, node = _late_recv_beside_work(world)
    t = replay(graph).timelines[world.representative(1)]
    assert t.start_s[node] == pytest.approx(10e-3) and t.start_s[seg] == 0.0
    transfer_s = float(g["duration_s"][node])
    slow = 1 + float(g["memory_slowdown_per_Bps"][seg]) * float(g["traffic_bytes"][node]) / transfer_s
    expected = 10e-3 + _slowed_s(2e-3, transfer_s, slow)
    assert t.end_s[seg] - t.start_s[seg] == pytest.approx(expected)
    assert expected > 12e-3


def test_a_window_of_zero_length_in_some_lanes_slows_nothing_there():
    # the recv a memory-bound op runs beside takes no time in one dp lane: there the window
    # has no length and no rate (nothing divided by zero), in the other it slows the op as
    # in a replay of that lane alone
    world = World.grid(dp=2, pp=2, cp=1, tp=1)
    graph, g, seg, node = _late_recv_beside_work(world)
    transfer_s = float(g["duration_s"][node])
    lanes = replay(
        graph,
        overrides={1: {node: np.array([0.0, transfer_s]).reshape(world.lane_shape)}},
        ranks=[world.rank_of(dp=0, pp=1), world.rank_of(dp=1, pp=1)],
    )
    with np.errstate(divide="raise", invalid="raise"):
        zero, alone = (
            replay(graph, overrides={1: {node: d}}).timelines[world.representative(1)]
            for d in (0.0, transfer_s)
        )
    assert zero.end_s[seg] - zero.start_s[seg] == pytest.approx(12e-3)
    assert alone.end_s[seg] - alone.start_s[seg] > 12e-3
    for dp, t in enumerate((zero, alone)):
        np.testing.assert_array_equal(lanes.timelines[world.rank_of(dp=dp, pp=1)].end_s, t.end_s)


def _mixed_program(world, dispatch_s=0.0):
    """Per stage: a prefetched recv, a tp all-gather and dp all-reduce beside GEMMs and
    elementwise ops on two streams, a send, a blocking all-reduce over every lane axis; the
    host takes `dispatch_s` to issue each compute op (build(host=True))."""
    stages = []
    for p in range(world.pp):
        s = Stage(world, p)
        recv = s.recv(p - 1, nbytes=1 << 24, wait=False) if p > 0 else None
        gather = s.collective("all_gather", "tp", nbytes=1 << 25, async_op=True)
        for _ in range(3):
            s.compute(1e-4, name="add", dispatch_s=dispatch_s)
            s.compute(2e-4, name="mm", dispatch_s=dispatch_s)
        reduce = s.collective("all_reduce", "dp", nbytes=1 << 20, async_op=True)
        s.compute(3e-4, name="add", stream=1, dispatch_s=dispatch_s)
        if recv is not None:
            s.wait(recv)
        s.compute(1e-4, name="mul")
        if p < world.pp - 1:
            s.send(p + 1, nbytes=1 << 24)
        s.wait(gather)
        s.wait(reduce)
        s.collective("all_reduce", ("dp", "cp", "tp"), nbytes=4096)
        s.compute(2e-4, name="add")
        stages.append(s)
    return stages


@pytest.mark.parametrize("dispatch_s", [0.0, 1.5e-4])  # the host binds nothing, or some ops
def test_the_fast_paths_give_what_the_full_arithmetic_gives(monkeypatch, dispatch_s):
    import emulator.graph.replay as replay_module

    world = World.grid(dp=2, pp=3, cp=1, tp=2)
    program = _mixed_program(world, dispatch_s)
    graph = build(world, program, CostContext(topology=_topology(50.0)), host=True)
    factors = np.random.default_rng(0).lognormal(0.0, 0.1, world.shape)

    def runs():
        uniform = replay(graph).timelines
        lanes = replay(graph, speed_factors=factors, ranks=range(world.world_size)).timelines
        return uniform, lanes

    fast = runs()
    never = dict(some=lambda x: True, every=lambda x: False, least=lambda x: -np.inf,
                 most=lambda x: np.inf)  # fmt: skip
    for name in ("_scalar_ops", "_array_ops"):  # the fast paths never taken
        make = getattr(replay_module, name)
        monkeypatch.setattr(replay_module, name, lambda *a, make=make: make(*a)._replace(**never))
    full = runs()
    for a, b in zip(fast, full, strict=True):
        assert a.keys() == b.keys()
        for rank in a:
            for field in ("ready_s", "start_s", "end_s", "free_s", "kernel_s"):
                np.testing.assert_array_equal(getattr(a[rank], field), getattr(b[rank], field))


def test_samples_replayed_at_once_are_each_sample_replayed_alone():
    # replay_samples' arithmetic (samples last, a group's maximum taken first, the host's
    # bounds skipped where no lane reaches them) against one replay per sample: per-lane
    # speeds, and durations scaled so that the host binds in some samples and not others
    world = World.grid(dp=2, pp=3, cp=1, tp=2)
    graph = build(
        world, _mixed_program(world, 1.5e-4), CostContext(topology=_topology(50.0)), host=True
    )
    factors = np.random.default_rng(1).lognormal(0.0, 0.1, world.shape)
    scales = np.array([0.5, 1.0, 3.0])

    def durations(p, node):
        c = graph.classes[p]
        d = c["duration_s"][node] * scales
        return d * np.take(factors, p, world.pipeline_position)[..., None] if c[
            "kind"
        ][node] == SEGMENT else d

    times = replay_samples(graph, len(scales), durations)
    for k, scale in enumerate(scales):
        overrides = {
            p: {n: float(d) for n, d in enumerate(c["duration_s"] * scale)}
            for p, c in enumerate(graph.classes)
        }
        alone = replay(graph, speed_factors=factors, overrides=overrides)
        assert times[k] == alone.iteration_time_s
    assert replay(graph).per_class[0].host_wait_s > 0.0


def test_to_dict_has_the_figures():
    world = World.grid(dp=2, pp=1, cp=1, tp=1)
    d = replay(build(world, [_dp_program(world, 3.0, 0.5)])).to_dict()
    assert d["iteration_time_s"] == pytest.approx(3.5)
    assert set(BREAKDOWN_FIELDS) <= set(d["per_class"][0])


# ---- host dispatch (emulator.costs.host_dispatch, graph.build.host_bounds) ---------------------


def _ops(world, kernels_s, dispatch_s):
    s = Stage(world, 0)
    for k, d in zip(kernels_s, dispatch_s, strict=True):
        s.compute(k, dispatch_s=d)
    return s


def test_gpu_bound_stream_hides_the_host():
    # kernels of 10 us issued every 1 us: the GPU waits only for the first one
    world = World.grid(dp=1, pp=1, cp=1, tp=1)
    result = replay(build(world, [_ops(world, [10e-6] * 10, [1e-6] * 10)], host=True))
    assert result.iteration_time_s == pytest.approx(1e-6 + 100e-6)


def test_host_bound_stream_runs_at_the_dispatch_rate():
    # kernels of 1 us issued every 10 us: each starts when issued, the GPU idles in between
    world = World.grid(dp=1, pp=1, cp=1, tp=1)
    result = replay(build(world, [_ops(world, [1e-6] * 10, [10e-6] * 10)], host=True))
    assert result.iteration_time_s == pytest.approx(100e-6 + 1e-6)


def test_long_kernel_lets_the_host_run_ahead():
    # 100 us kernel, then ten 1 us kernels issued every 5 us: queued during the long one
    world = World.grid(dp=1, pp=1, cp=1, tp=1)
    program = _ops(world, [100e-6] + [1e-6] * 10, [1e-6] + [5e-6] * 10)
    result = replay(build(world, [program], host=True))
    assert result.iteration_time_s == pytest.approx(1e-6 + 100e-6 + 10e-6)


def test_launch_queue_end_is_the_max_over_ops():
    rng = np.random.default_rng(0)
    kernels, dispatch = rng.uniform(0, 10e-6, 50), rng.uniform(0, 10e-6, 50)
    world = World.grid(dp=1, pp=1, cp=1, tp=1)
    result = replay(build(world, [_ops(world, kernels, dispatch)], host=True))
    gpu = 0.0
    for k, issued in zip(kernels, np.cumsum(dispatch), strict=True):  # kernel by kernel
        gpu = max(gpu, issued) + k
    assert result.iteration_time_s == pytest.approx(gpu)


def test_blocking_launches_put_the_host_time_on_the_stream():
    # CUDA_LAUNCH_BLOCKING=1: the host waits for each kernel, so nothing of it is hidden, even
    # where kernels are long enough to hide it otherwise
    world = World.grid(dp=1, pp=1, cp=1, tp=1)
    topo = Topology(
        gpu=gpu_preset("a100-sxm-80g"),
        gpus_per_node=8,
        link=intra_node_link("nvlink3"),
        network=inter_node_network("ib-hdr-8x200"),
    )
    kernels, dispatch = [10e-6] * 10, [1e-6] * 10
    blocking = CostContext(topology=topo, launch_blocking=True)
    queued = replay(
        build(world, [_ops(world, kernels, dispatch)], CostContext(topology=topo), host=True)
    )
    waited = replay(build(world, [_ops(world, kernels, dispatch)], blocking, host=True))
    assert queued.iteration_time_s == pytest.approx(1e-6 + 100e-6)
    assert waited.iteration_time_s == pytest.approx(110e-6)


def test_without_dispatch_the_host_binds_nothing():
    world = World.grid(dp=1, pp=1, cp=1, tp=1)
    with_zero = replay(build(world, [_ops(world, [1e-6] * 10, [0.0] * 10)], host=True))
    without = replay(build(world, [_ops(world, [1e-6] * 10, [10e-6] * 10)]))
    assert with_zero.iteration_time_s == pytest.approx(10e-6)
    assert without.iteration_time_s == pytest.approx(10e-6)


def test_collective_waits_for_the_host_to_issue_it():
    # 2 us of compute issued at 1 us, then the host spends 50 us before the collective call
    world = World.grid(dp=8, pp=1, cp=1, tp=1)
    s = Stage(world, 0)
    s.compute(2e-6, dispatch_s=1e-6)
    s.collective("all_reduce", "dp", duration_s=5e-6, dispatch_s=50e-6)
    result = replay(build(world, [s], host=True))
    assert result.iteration_time_s == pytest.approx(51e-6 + 5e-6)


def test_a_launch_bound_critical_path_begins_with_the_host_dispatch():
    # kernels of 1 us issued every 10 us: the host sets the iteration, not the GPU
    world = World.grid(dp=1, pp=1, cp=1, tp=1)
    result = replay(build(world, [_ops(world, [1e-6] * 10, [10e-6] * 10)], host=True))
    host, segment = result.critical_path
    assert (host.kind, host.name, host.start_s) == ("host", "host dispatch", 0.0)
    # the host issues the last kernel at 100 us; the segment's own 10 us of kernels end at 101
    assert host.duration_s == pytest.approx(91e-6)
    assert segment.start_s == pytest.approx(91e-6)
    assert segment.start_s + segment.duration_s == pytest.approx(result.iteration_time_s)


def test_a_collective_issued_late_by_the_host_starts_its_critical_path_with_the_host():
    world = World.grid(dp=8, pp=1, cp=1, tp=1)
    s = Stage(world, 0)
    s.compute(2e-6, dispatch_s=1e-6)
    s.collective("all_reduce", "dp", duration_s=5e-6, dispatch_s=50e-6)
    path = replay(build(world, [s], host=True)).critical_path
    assert [e.kind for e in path] == ["host", "collective"]
    assert path[0].duration_s == pytest.approx(51e-6) == path[1].start_s


def test_time_the_gpu_waits_for_the_host_is_host_wait_not_compute():
    # kernels of 1 us issued every 10 us: 10 us of kernels in a 101 us iteration
    world = World.grid(dp=1, pp=1, cp=1, tp=1)
    launch_bound = replay(build(world, [_ops(world, [1e-6] * 10, [10e-6] * 10)], host=True))
    (c,) = launch_bound.per_class
    assert (c.compute_s, c.host_wait_s, c.exposed_comm_s, c.idle_s) == pytest.approx(
        (10e-6, 91e-6, 0.0, 0.0), abs=1e-12
    )
    # 2 us of compute issued at 1 us; the host spends 50 us before it issues the collective
    world = World.grid(dp=8, pp=1, cp=1, tp=1)
    s = Stage(world, 0)
    s.compute(2e-6, dispatch_s=1e-6)
    s.collective("all_reduce", "dp", duration_s=5e-6, dispatch_s=50e-6)
    (c,) = replay(build(world, [s], host=True)).per_class
    assert (c.compute_s, c.host_wait_s, c.exposed_comm_s, c.idle_s) == pytest.approx(
        (2e-6, 1e-6 + 48e-6, 5e-6, 0.0), abs=1e-12
    )


def test_a_gpu_bound_critical_path_has_no_host_event():
    world = World.grid(dp=1, pp=1, cp=1, tp=1)
    result = replay(build(world, [_ops(world, [10e-6] * 10, [1e-6] * 10)], host=True))
    # the first kernel waits 1 us for its launch; the GPU binds from there on
    assert [e.kind for e in result.critical_path] == ["host", "compute"]
    assert result.critical_path[0].duration_s == pytest.approx(1e-6)
