"""Tests for emulator.graph.build: segment merging, streams, joins, p2p matching, save/load,
and that the graph asks the cost models for its durations."""

import numpy as np
import pytest

from emulator.costs.collectives import Topology, collective_time_s
from emulator.costs.overlap import (
    async_tp_exposed_s,
    memory_slowdown_per_Bps,
    weight_grad_overlap_exposed_s,
)
from emulator.costs.pricing import CostContext
from emulator.graph.build import (
    async_tp_pairs,
    axes_of_group,
    segment_rows,
    weight_grad_pairs,
)
from emulator.graph.execution_graph import (
    COLLECTIVE,
    RECV,
    SEGMENT,
    SEND,
    WAIT_NODE,
    ExecutionGraph,
)
from emulator.hardware import gpu_preset, inter_node_network, intra_node_link
from emulator.world.mesh import World
from tests.emulator.synthetic_traces import Stage, build, pipeline

TOPO = Topology(
    gpu=gpu_preset("h100-sxm-80g"),
    gpus_per_node=8,
    link=intra_node_link("nvlink4"),
    network=inter_node_network("ib-ndr-8x400"),
)


def _kinds(graph, pp=0):
    return graph.classes[pp]["kind"].tolist()


def test_consecutive_compute_merges_into_one_segment():
    world = World.grid(dp=2, pp=1, cp=1, tp=1)
    s = Stage(world, 0)
    for d in (1.0, 2.0, 3.0):
        s.compute(d, flops=10)
    g = build(world, [s]).classes[0]
    assert _kinds(build(world, [s])) == [SEGMENT]
    assert (g["duration_s"][0], g["flops"][0], g["rows"][0]) == (6.0, 30, 3)


def test_a_segment_s_flops_may_pass_int64():
    # each op within int64 (the job spec's rule), their segment's sum beyond it: a huge
    # micro-batch's `emulate` ended in an OverflowError building the graph
    world = World.grid(dp=1, pp=1, cp=1, tp=1)
    s = Stage(world, 0)
    for _ in range(3):
        s.compute(1.0, flops=2**62)
    assert build(world, [s]).classes[0]["flops"][0] == 3 * 2**62


def test_collective_and_wait_split_segments():
    world = World.grid(dp=2, pp=1, cp=1, tp=1)
    s = Stage(world, 0)
    s.compute(1.0)
    h = s.collective("all_reduce", "dp", async_op=True)
    s.compute(1.0)
    s.wait(h)
    s.compute(1.0)
    g = build(world, [s]).classes[0]
    assert g["kind"].tolist() == [SEGMENT, COLLECTIVE, SEGMENT, WAIT_NODE, SEGMENT]
    assert g["issue"][1] == 0  # enqueued after the compute before it
    assert g["dep"][3] == 1
    assert g["stream"][1] != g["stream"][0]


def test_micro_batch_change_splits_segments_and_streams_do_not_merge():
    world = World.grid(dp=1, pp=1, cp=1, tp=1)
    s = Stage(world, 0)
    s.compute(1.0, mb=0)
    s.compute(1.0, mb=1)
    s.compute(1.0, mb=1, stream=1)
    s.compute(1.0, mb=1)
    g = build(world, [s]).classes[0]
    assert g["duration_s"].tolist() == [1.0, 2.0, 1.0]
    assert len(g.streams) == 2


def test_segment_rows_maps_every_compute_row_to_the_segment_summing_it():
    # Two streams interleaved, a micro-batch change and a collective split the segments: each
    # segment's duration is the sum of the durations of the rows mapped to it.
    world = World.grid(dp=2, pp=1, cp=1, tp=1)
    s = Stage(world, 0)
    for i, (stream, mb) in enumerate([(0, 0), (1, 0), (0, 0), (0, 1), (1, 0), (0, 1)]):
        s.compute(2.0**i, stream=stream, mb=mb)
        if i == 2:
            s.collective("all_reduce", "dp", async_op=True)
    trace, durations = s.trace()
    g = build(world, [s]).classes[0]
    rows, nodes = segment_rows(trace, g)
    assert sorted(rows.tolist()) == np.flatnonzero(durations > 0).tolist()
    assert (np.diff(nodes) >= 0).all()
    summed = np.bincount(nodes, weights=durations[rows], minlength=len(g))
    assert np.array_equal(summed[g["kind"] == SEGMENT], g["duration_s"][g["kind"] == SEGMENT])


def test_blocking_collective_without_wait_event_gets_one():
    from emulator.capture.trace import build_trace
    from emulator.graph.build import build_graph
    from emulator.world.comm_events import CommEvent

    world = World.grid(dp=2, pp=1, cp=1, tp=1)
    event = CommEvent(
        seq=1,
        kind="all_reduce",
        group_id="g",
        group_size=2,
        op="SUM",
        dtype="bfloat16",
        numel=4,
        nbytes=8,
        async_op=False,
    )
    trace = build_trace(comm_events=[event], groups={"g": np.array([0, 1])})
    g = build_graph({0: trace}, world, None, durations_s={0: np.zeros(1)}).classes[0]
    assert g["kind"].tolist() == [COLLECTIVE, WAIT_NODE]


def test_one_comm_stream_per_group():
    world = World.grid(dp=2, pp=1, cp=1, tp=2)
    s = Stage(world, 0)
    s.collective("all_reduce", "tp")
    s.collective("all_reduce", "dp")
    s.collective("all_reduce", "tp")
    g = build(world, [s]).classes[0]
    comm = g["kind"] == COLLECTIVE
    streams = g["stream"][comm].tolist()
    assert streams[0] == streams[2] != streams[1]
    assert [g.strings[i] for i in g["group"][comm]] == ["tp", "dp", "tp"]


def test_kth_send_matches_kth_recv():
    world = World.grid(dp=1, pp=2, cp=1, tp=1)
    graph = build(world, pipeline(world, 3, 1.0, 1.0, "gpipe"))
    g0, g1 = graph.classes
    sends = np.flatnonzero((g0["kind"] == SEND) & (g0["peer_class"] == 1))
    recvs = np.flatnonzero((g1["kind"] == RECV) & (g1["peer_class"] == 0))
    assert g1["join"][recvs].tolist() == sends.tolist()


def test_unmatched_recv_is_refused():
    world = World.grid(dp=1, pp=2, cp=1, tp=1)
    a, b = Stage(world, 0), Stage(world, 1)
    b.recv(0)
    with pytest.raises(ValueError, match="sends 0 messages"):
        build(world, [a, b])


def test_pp_collectives_join_by_order():
    world = World.grid(dp=2, pp=3, cp=1, tp=1)
    stages = [Stage(world, p) for p in range(3)]
    for s in stages:
        s.collective("all_reduce", "pp")
        s.collective("all_reduce", ("dp", "pp"))
        s.collective("all_reduce", "pp")
    graph = build(world, stages)
    assert len(graph.join_offsets) - 1 == 3
    j = graph.classes[1]["join"][graph.classes[1]["kind"] == COLLECTIVE]
    assert sorted(graph.join_members(int(j[2]))) == [
        (p, int(np.flatnonzero(graph.classes[p]["kind"] == COLLECTIVE)[2])) for p in range(3)
    ]


def test_axes_of_group():
    world = World.grid(dp=2, pp=4, cp=2, tp=4)
    assert axes_of_group(world, world.group_of(0, "tp")) == (("tp",), (0,))
    assert axes_of_group(world, world.group_of(0, ("dp", "cp"))) == (("dp", "cp"), (0,))
    assert axes_of_group(world, world.rank_of(pp=np.array([0, 3]))) == ((), (0, 3))
    with pytest.raises(ValueError, match="not a full mesh group"):
        axes_of_group(world, np.array([0, 1]))


@pytest.mark.parametrize(
    "world",
    [
        World.grid(dp=2, pp=2, cp=1, tp=2),
        World(axes=(("pp", 2), ("dp_replicate", 2), ("dp_shard", 2), ("tp", 2)), vpp=2),
    ],
)
def test_save_load_round_trip(tmp_path, world):
    graph = build(world, pipeline(world, 2, 1.0, 1.0, "1f1b"))
    graph.save(tmp_path / "g.npz")
    loaded = ExecutionGraph.load(tmp_path / "g.npz")
    assert loaded.world == world
    for a, b in zip(graph.classes, loaded.classes, strict=True):
        assert a.streams == b.streams and a.strings == b.strings
        for k, v in a.nodes.items():
            np.testing.assert_array_equal(v, b[k])


def test_edges_are_csr_of_predecessors():
    world = World.grid(dp=2, pp=1, cp=1, tp=1)
    s = Stage(world, 0)
    s.compute(1.0)
    s.collective("all_reduce", "dp")
    s.compute(1.0)
    offsets, preds = build(world, [s]).classes[0].edges()
    assert offsets.tolist() == [0, 0, 1, 3, 4]
    assert preds.tolist() == [0, 0, 1, 2]


def test_collectives_are_priced_on_the_topology():
    world = World.grid(dp=1, pp=1, cp=1, tp=8)
    s = Stage(world, 0)
    s.collective("all_reduce", "tp", nbytes=1 << 28)
    g = build(world, [s], CostContext(topology=TOPO)).classes[0]
    assert g["duration_s"][0] > 1e-4


def test_a_collective_nvls_cannot_reduce_is_priced_without_it():
    # FSDP2's reduce-scatter averages float32 gradients: NCCL offers it no NVLS (device.h)
    world = World.grid(dp=8, pp=1, cp=1, tp=1)
    s = Stage(world, 0)
    s.collective("reduce_scatter", "dp", nbytes=1 << 22, op="SUM", dtype="bfloat16")
    s.collective("reduce_scatter", "dp", nbytes=1 << 22, op="AVG", dtype="float32")
    g = build(world, [s], CostContext(topology=TOPO)).classes[0]
    summed, averaged = g["duration_s"][g["kind"] == COLLECTIVE]
    ranks = np.arange(8)
    assert summed == collective_time_s("reduce_scatter", 1 << 22, ranks, TOPO)
    assert averaged == collective_time_s("reduce_scatter", 1 << 22, ranks, TOPO, nvls_reduction=False)
    assert averaged > summed


def test_a_collective_costs_what_the_lane_whose_group_straddles_two_nodes_takes():
    # tp 3 on 8-GPU nodes: the representative's group [0, 1, 2] sits on node 0, lane dp 2's
    # [6, 7, 8] on nodes 0 and 1; the lanes finish with the slowest
    world = World.grid(dp=3, pp=1, cp=1, tp=3)
    s = Stage(world, 0)
    s.collective("all_reduce", "tp", nbytes=1 << 28)
    g = build(world, [s], CostContext(topology=TOPO)).classes[0]
    straddling = collective_time_s("all_reduce", 1 << 28, np.array([6, 7, 8]), TOPO)
    assert straddling > 2 * collective_time_s("all_reduce", 1 << 28, np.array([0, 1, 2]), TOPO)
    assert g["duration_s"][0] == straddling


def test_host_bounds_of_a_segment_and_a_collective():
    world = World.grid(dp=2, pp=1, cp=1, tp=1)
    s = Stage(world, 0)
    for k, d in ((3.0, 1.0), (1.0, 2.0), (1.0, 4.0)):
        s.compute(k, dispatch_s=d)
    s.collective("all_reduce", "dp", duration_s=1.0, dispatch_s=0.5)
    g = build(world, [s], host=True).classes[0]
    seg, coll = g["kind"] == SEGMENT, g["kind"] == COLLECTIVE
    # issued at 1, 3, 7: the segment ends no earlier than max(1 + 5, 3 + 2, 7 + 1) = 8
    assert g["host_s"][seg].tolist() == [1.0]
    assert g["host_end_s"][seg].tolist() == [8.0]
    assert g["host_s"][coll].tolist() == [7.5]


def test_graph_saved_without_later_columns_loads_with_zeros(tmp_path):
    world = World.grid(dp=1, pp=2, cp=1, tp=1)
    graph = build(world, pipeline(world, 2, 1.0, 2.0, "1f1b"))
    graph.save(tmp_path / "g.npz")
    later = ("_host_s", "_host_end_s", "_memory_slowdown_per_Bps", "_traffic_bytes")
    with np.load(tmp_path / "g.npz") as z:
        old = {k: z[k] for k in z.files if not k.endswith(later)}
    np.savez(tmp_path / "old.npz", **old)
    loaded = ExecutionGraph.load(tmp_path / "old.npz")
    for column in ("host_end_s", "memory_slowdown_per_Bps", "traffic_bytes"):
        assert not loaded.classes[0][column].any()


def test_a_segment_carries_its_memory_bound_share_and_a_collective_its_bytes():
    world = World.grid(dp=1, pp=1, cp=1, tp=8)
    s = Stage(world, 0)
    s.collective("all_gather", "tp", nbytes=1 << 20)
    s.compute(3e-3, name="mm")
    s.compute(1e-3, name="add")
    g = build(world, [s], CostContext(topology=TOPO)).classes[0]
    seg, coll = g["kind"] == SEGMENT, g["kind"] == COLLECTIVE
    # the GEMM's factor weighs 3/4 of the segment (the add's is 1), the add's slope 1/4
    gemm_factor = TOPO.gpu.sm_count / (TOPO.gpu.sm_count - TOPO.link.channels)
    assert g["slowdown"][seg].tolist() == pytest.approx([0.75 * gemm_factor + 0.25])
    slope = 0.25 * memory_slowdown_per_Bps(TOPO.gpu)
    assert g["memory_slowdown_per_Bps"][seg].tolist() == pytest.approx([slope])
    # 1 MiB gathered over 8 members: each moves 7/8 of it (below the link's rate for the call)
    assert g["traffic_bytes"][coll].tolist() == pytest.approx([7 / 8 * (1 << 20)])


def _sequence_parallel_layer(
    world, tokens=4096, hidden=4096, ffn_shard=3584, module="Llama.layers.0.feed_forward"
):
    """One SP layer's forward as DTensor records it: all-gather -> 2 GEMMs reading the gathered
    input (and one that does not), an elementwise op, a GEMM -> reduce-scatter; in a compiled
    block (`layers.<i>`) unless `module` says otherwise."""
    s = Stage(world, 0)
    x = ((tokens, hidden), "bfloat16", False)
    ag = s.collective("all_gather", "tp", nbytes=2 * tokens * hidden, async_op=True)
    s.wait(ag)
    w = ((hidden, ffn_shard), "bfloat16", False)
    for name in ("w1", "w3"):  # column parallel
        s.compute(1e-3, name="mm", tensors=(x, w), module=f"{module}.{name}")
    s.compute(1e-4, name="mul", tensors=(), module=module)  # silu * up: not a GEMM
    a, w2 = ((tokens, ffn_shard), "bfloat16", False), ((ffn_shard, hidden), "bfloat16", False)
    s.compute(1e-3, name="mm", tensors=(a, w2), module=f"{module}.w2")
    rs = s.collective("reduce_scatter", "tp", nbytes=2 * tokens * hidden, async_op=True)
    s.wait(rs)
    return s, ag, rs


def test_async_tp_pairs_an_all_gather_with_its_gemms_and_a_gemm_with_its_reduce_scatter():
    world = World.grid(dp=1, pp=1, cp=1, tp=4)
    s, ag, rs = _sequence_parallel_layer(world)
    trace, _ = s.trace()
    pairs = async_tp_pairs(trace, world)
    row = {int(q): i for i, q in enumerate(trace["seq"].tolist())}
    names = trace.text("name")
    assert sorted(pairs) == [row[ag], row[rs]]
    assert [names[r] for r in pairs[row[ag]]] == ["mm", "mm"]  # w1, w3: not w2
    assert pairs[row[rs]] == [pairs[row[ag]][-1] + 2]  # w2, after the mul


def test_async_tp_pairs_across_fp8_amax_syncs_and_a_scatter_layout_cat():
    """torchao's fp8 casts all-reduce a one-element amax between the all-gather and its GEMMs;
    a scatter along the sequence dim lays the GEMM's output out with a cat first."""
    world = World.grid(dp=1, pp=1, cp=1, tp=4)
    s = Stage(world, 0)
    block = "Llama.layers.0.attention"
    x, w = ((4096, 4096), "bfloat16", False), ((4096, 1024), "bfloat16", False)
    ag = s.collective("all_gather", "tp", nbytes=2 * 4096 * 4096, async_op=True)
    s.wait(ag)
    s.collective("all_reduce", "tp", nbytes=2)  # amax of the gathered input's fp8 cast
    wq = s.compute(1e-3, name="mm", tensors=(x, w), module=f"{block}.wq")
    s.compute(1e-5, name="cat", tensors=(), module=block)
    rs = s.collective("reduce_scatter", "tp", nbytes=2 * 4096 * 1024, async_op=True)
    trace, _ = s.trace()
    row = {int(q): i for i, q in enumerate(trace["seq"].tolist())}
    assert async_tp_pairs(trace, world) == {row[ag]: [row[wq]], row[rs]: [row[wq]]}


def test_async_tp_pairs_only_gemms_of_compiled_blocks():
    world = World.grid(dp=1, pp=1, cp=1, tp=4)
    s, _, _ = _sequence_parallel_layer(world, module="Llama.output")  # torchtitan: eager
    assert async_tp_pairs(s.trace()[0], world) == {}


def test_async_tp_leaves_a_tp_collective_only_the_time_beyond_its_gemms():
    world = World.grid(dp=1, pp=1, cp=1, tp=4)
    s, ag, rs = _sequence_parallel_layer(world)
    plain = build(world, [s], CostContext(topology=TOPO)).classes[0]
    fused = build(world, [s], CostContext(topology=TOPO, async_tp=True)).classes[0]
    comm = np.flatnonzero(plain["kind"] == COLLECTIVE)
    assert len(comm) == 2
    for node, gemm_s in zip(comm, (2e-3, 1e-3), strict=True):
        expected = async_tp_exposed_s(plain["duration_s"][node], gemm_s, 4)
        assert fused["duration_s"][node] == pytest.approx(expected)
        assert fused["duration_s"][node] < plain["duration_s"][node]
        # the node keeps that part of the call's bytes: the call's rate, not a denser one
        rate = plain["traffic_bytes"][node] / plain["duration_s"][node]
        assert fused["traffic_bytes"][node] == pytest.approx(rate * expected)
    others = plain["kind"] != COLLECTIVE
    np.testing.assert_array_equal(plain["duration_s"][others], fused["duration_s"][others])


def _column_parallel_backward(
    world, kind="all_reduce", tokens=2048, hidden=4096, tp=4, regather=False
):
    """The backward of an attention block as the workloads record it without a fused QKV: the
    row-parallel wo (input and weight gradient), then wv, wk and wq (input gradient, weight
    gradient), then the tp collective of the block input's gradient. `regather`: the block
    input all-gathered again when wv's backward starts and waited before its weight gradient
    (`kernels.sp_regather`)."""
    s = Stage(world, 0)
    s.phase = "backward"
    local = hidden // tp
    grad_out, x = ((tokens, hidden), "bfloat16", False), ((tokens, local), "bfloat16", False)
    s.compute(1e-3, name="mm", tensors=(grad_out, ((hidden, local), "bfloat16", False)))
    s.compute(1e-3, name="mm", tensors=(((hidden, tokens), "bfloat16", False), x))
    wgrads = []
    for linear in ("wv", "wk", "wq"):
        gather = None
        if regather and linear == "wv":
            gather = s.collective("all_gather", "tp", nbytes=2 * tokens * hidden, async_op=True)
        g = ((tokens, local), "bfloat16", False)
        s.compute(1e-3, name="mm", tensors=(g, ((local, hidden), "bfloat16", False)))
        if gather is not None:
            s.wait(gather)
        gt, inp = ((local, tokens), "bfloat16", False), ((tokens, hidden), "bfloat16", False)
        wgrads.append(s.compute(2e-3, name="mm", tensors=(gt, inp)))
        s.compute(1e-5, name="add_", tensors=())  # the gradient into the grad buffer
    comm = s.collective(kind, "tp", nbytes=2 * tokens * hidden, async_op=True)
    s.wait(comm)
    return s, wgrads, comm


@pytest.mark.parametrize("kind", ["all_reduce", "reduce_scatter"])
@pytest.mark.parametrize("regather", [False, True], ids=["kept", "regathered"])
def test_megatron_overlap_pairs_a_block_inputs_gradient_collective_with_its_weight_gradients(
    kind, regather
):
    world = World.grid(dp=1, pp=1, cp=1, tp=4)
    s, wgrads, comm = _column_parallel_backward(world, kind, regather=regather)
    trace, _ = s.trace()
    row = {int(q): i for i, q in enumerate(trace["seq"].tolist())}
    # wq, wk, wv's weight gradients; not wo's (its input gradient is sharded)
    assert weight_grad_pairs(trace, world) == {row[comm]: [row[w] for w in wgrads]}


def test_megatron_overlap_pairs_only_backward_tp_collectives():
    world = World.grid(dp=1, pp=1, cp=1, tp=4)
    s, _, _ = _column_parallel_backward(world)
    s.phase = "forward"  # a forward all-reduce after the same GEMMs is not Megatron's async one
    s.compute(
        1e-3,
        name="mm",
        tensors=(((2048, 1024), "bfloat16", False), ((1024, 4096), "bfloat16", False)),
    )
    s.compute(
        2e-3,
        name="mm",
        tensors=(((1024, 2048), "bfloat16", False), ((2048, 4096), "bfloat16", False)),
    )
    forward = s.collective("all_reduce", "tp", nbytes=2 * 2048 * 4096, async_op=True)
    trace, _ = s.trace()
    row = {int(q): i for i, q in enumerate(trace["seq"].tolist())}
    assert row[forward] not in weight_grad_pairs(trace, world)


def test_megatron_overlap_leaves_the_collective_only_what_the_weight_gradients_do_not_hide():
    world = World.grid(dp=1, pp=1, cp=1, tp=4)
    s, _, _ = _column_parallel_backward(world, tokens=16384)
    plain = build(world, [s], CostContext(topology=TOPO)).classes[0]
    overlapped = build(world, [s], CostContext(topology=TOPO, tp_grad_overlap=True)).classes[0]
    (node,) = np.flatnonzero(plain["kind"] == COLLECTIVE)
    slowdown = TOPO.gpu.sm_count / (TOPO.gpu.sm_count - TOPO.link.channels)  # costs.overlap
    expected = weight_grad_overlap_exposed_s(plain["duration_s"][node], 3 * 2e-3, slowdown)
    assert overlapped["duration_s"][node] == pytest.approx(expected)
    assert 0 < overlapped["duration_s"][node] < plain["duration_s"][node]
    rate = plain["traffic_bytes"][node] / plain["duration_s"][node]
    assert overlapped["traffic_bytes"][node] == pytest.approx(rate * expected)
    others = plain["kind"] != COLLECTIVE
    np.testing.assert_array_equal(plain["duration_s"][others], overlapped["duration_s"][others])
