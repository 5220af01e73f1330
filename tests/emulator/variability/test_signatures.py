"""Signatures of a noise source on synthetic programs: their keys and names, their masks
partitioning the source's, the pre-rank and the "other" entry."""

import numpy as np
import pytest

from emulator.graph.execution_graph import COLLECTIVE
from emulator.variability.model import NetworkRegime, VariabilityModel
from emulator.variability.signatures import (
    OTHER,
    bytes_text,
    compute_signature_variances_s2,
    source_signatures,
    split_source,
)
from emulator.variability.sources import noise_sources, op_class_variances_s2
from emulator.world.mesh import World
from tests.emulator.synthetic_traces import Stage, build

CV = 0.05
BF16 = "bfloat16"


def _gemm(stage, d, a, b, dtype=BF16):
    stage.compute(
        d, name="mm", tensors=((a, dtype, False), (b, dtype, False), ((a[0], b[1]), dtype, True))
    )


@pytest.fixture
def case():
    """dp 4 over 2 nodes: per layer two GEMM shapes, a norm, two all-gathers of different
    sizes over dp (across nodes) and a tp-free all-reduce of a third size."""
    world = World.grid(dp=4, pp=1, cp=1, tp=1, gpus_per_node=2)
    s = Stage(world, 0)
    for _ in range(3):
        s.collective("all_gather", "dp", duration_s=0.4, nbytes=2 * 10**9)
        _gemm(s, 1.0, (8, 16), (16, 32))
        s.compute(0.2, name="norm")
        s.collective("all_gather", "dp", duration_s=0.1, nbytes=3 * 10**6)
        _gemm(s, 0.5, (8, 32), (32, 16))
    s.collective("all_reduce", "dp", duration_s=0.05, nbytes=512 * 10**3)
    model = VariabilityModel(spatial_cv=0.0, temporal_cv=CV, collective_cv=CV,
                             network=(NetworkRegime(0.5, 1.0), NetworkRegime(0.5, 1.5)))  # fmt: skip
    graph = build(world, [s], temporal_cv=CV)
    trace, durations = s.trace()
    traces, spreads = {0: trace}, {0: CV * durations}
    sources = {x.name: x for x in noise_sources(graph, model, traces, spreads)}
    return graph, model, traces, spreads, sources


def test_bytes_are_printed_in_decimal_units():
    assert [bytes_text(n) for n in (8, 512e3, 1.07e9, 2e12)] == ["8 B", "512 kB", "1.07 GB", "2 TB"]


def test_a_collective_signature_is_kind_group_members_and_bytes(case):
    graph, model, traces, spreads, sources = case
    names = [
        s.name
        for s in source_signatures(sources["all_gather on dp"], graph, model, traces, spreads)
    ]
    # pre-ranked: three 0.4 s calls before three 0.1 s ones
    assert names == ["all_gather on dp (4 members), 2 GB", "all_gather on dp (4 members), 3 MB"]


def test_compute_signatures_are_the_input_shapes_and_add_up_to_the_op_class(case):
    graph, _, traces, spreads, _ = case
    parts = compute_signature_variances_s2(graph, traces, spreads, "gemm")
    assert sorted(parts) == ["gemm bf16[8, 16] x bf16[16, 32]", "gemm bf16[8, 32] x bf16[32, 16]"]
    whole = op_class_variances_s2(graph, traces, spreads)["gemm"][0]
    assert np.allclose(sum(v[0] for v in parts.values()), whole)
    assert parts["gemm bf16[8, 16] x bf16[16, 32]"][0].sum() == pytest.approx(3 * (CV * 1.0) ** 2)


def test_one_shape_in_two_dtypes_is_two_compute_signatures():
    # a kernel is chosen by dtype as well as shape: fp32 and bf16 GEMMs of one shape differ
    world = World.grid(dp=1, pp=1, cp=1, tp=1, gpus_per_node=1)
    s = Stage(world, 0)
    _gemm(s, 1.0, (8, 16), (16, 32))
    _gemm(s, 3.0, (8, 16), (16, 32), dtype="float32")
    graph = build(world, [s], temporal_cv=CV)
    trace, durations = s.trace()
    parts = compute_signature_variances_s2(graph, {0: trace}, {0: CV * durations}, "gemm")
    assert {k: float(v[0].sum()) for k, v in parts.items()} == pytest.approx({
        "gemm bf16[8, 16] x bf16[16, 32]": (CV * 1.0) ** 2,
        "gemm fp32[8, 16] x fp32[16, 32]": (CV * 3.0) ** 2,
    })


@pytest.mark.parametrize("name", ["compute gemm", "all_gather on dp", "network regime",
                                  "network regime on all_gather on dp"])  # fmt: skip
@pytest.mark.parametrize("per_source", [1, 2, 4])
def test_the_signatures_masks_partition_their_sources(case, name, per_source):
    # every noisy node of the source is in exactly one entry (a signature or "other"), and a
    # segment's variances over the entries add up to the source's
    graph, model, traces, spreads, sources = case
    source = sources[name]
    entries = split_source(
        source, source_signatures(source, graph, model, traces, spreads), per_source
    )
    assert len(entries) <= per_source + 1
    if source.category == "compute":
        variances = [np.square(e.mask.segment_std_s[0]) for e in entries]
        assert np.allclose(sum(variances), np.square(source.mask.segment_std_s[0]))
        assert all(v.sum() > 0 for v in variances)
        return
    field = "network_comm" if source.category == "network" else "comm"
    counts = sum(getattr(e.mask, field)[0].astype(int) for e in entries)
    comm = graph.classes[0]["kind"] == COLLECTIVE  # every call crosses nodes here
    selected = getattr(source.mask, field)
    noisy = comm if selected is None else comm & selected[0]
    assert (counts[noisy] == 1).all() and (counts[~noisy] == 0).all()


def test_the_rest_run_as_one_other_entry_counting_them(case):
    graph, model, traces, spreads, sources = case
    source = sources["network regime"]  # three signatures: 2 GB, 3 MB, 512 kB
    found = source_signatures(source, graph, model, traces, spreads)
    assert len(found) == 3
    assert split_source(source, found, 2) == found  # one left over runs as itself
    kept = split_source(source, found, 1)
    assert [e.name for e in kept] == [found[0].name, f"{OTHER} (2 signatures)"]
    assert kept[1].lumped == 2 and kept[1].nodes == found[1].nodes + found[2].nodes


def test_the_per_gpu_speed_has_no_signature(case):
    graph, model, traces, spreads, _ = case
    from dataclasses import replace

    spatial = replace(model, spatial_cv=0.02)
    speed = {x.name: x for x in noise_sources(graph, spatial, traces, spreads)}["per-GPU speed"]
    assert source_signatures(speed, graph, spatial, traces, spreads) == ()


def test_two_sizes_that_print_alike_keep_apart_with_their_bytes_in_full():
    world = World.grid(dp=2, pp=1, cp=1, tp=1)
    s = Stage(world, 0)
    s.collective("all_reduce", "dp", duration_s=0.2, nbytes=1_070_000_000)
    s.collective("all_reduce", "dp", duration_s=0.1, nbytes=1_071_000_000)
    model = VariabilityModel(spatial_cv=0.0, temporal_cv=0.0, collective_cv=CV)
    graph = build(world, [s])
    trace, durations = s.trace()
    (source,) = noise_sources(graph, model, {0: trace}, {0: 0 * durations})
    found = source_signatures(source, graph, model, {0: trace}, {0: 0 * durations})
    assert [x.name for x in found] == [
        "all_reduce on dp (2 members), 1,070,000,000 B",
        "all_reduce on dp (2 members), 1,071,000,000 B",
    ]
    assert [x.nodes for x in found] == [1, 1]


def _collective_signatures(world, stages):
    """The signatures of the stages' one noise source, their collectives' per-call noise (no
    compute or spatial noise)."""
    model = VariabilityModel(spatial_cv=0.0, temporal_cv=0.0, collective_cv=CV)
    graph = build(world, stages)
    traced = {p: s.trace() for p, s in enumerate(stages)}
    traces = {p: trace for p, (trace, _) in traced.items()}
    spreads = {p: 0 * durations for p, (_, durations) in traced.items()}
    (source,) = noise_sources(graph, model, traces, spreads)
    return source_signatures(source, graph, model, traces, spreads)


def test_the_same_call_on_two_stages_is_two_signatures_named_by_stage():
    # a gradient all-reduce of one size on each stage: one may sit on the critical path and the
    # other have slack, so a pipelined job's comm signatures keep them apart
    world = World.grid(dp=2, pp=2, cp=1, tp=1)
    stages = [Stage(world, p) for p in range(2)]
    for stage in stages:
        stage.compute(0.5, name="norm")
        stage.collective("all_reduce", "dp", duration_s=0.2, nbytes=10**9)
    found = _collective_signatures(world, stages)
    assert [x.name for x in found] == [
        "all_reduce on dp (2 members), 1 GB, stage 0",
        "all_reduce on dp (2 members), 1 GB, stage 1",
    ]
    assert [[int(m.sum()) for m in x.mask.comm] for x in found] == [[1, 0], [0, 1]]


def test_the_pre_rank_puts_calls_on_the_critical_path_before_bigger_calls_with_slack():
    # stage 0 sets the step (1.0 s of compute, then a 0.2 s all-reduce); stage 1's all-reduce is
    # twice as long but ends 0.6 s early: its noise moves nothing until it takes up that slack
    from emulator.variability.signatures import critical_nodes

    world = World.grid(dp=2, pp=2, cp=1, tp=1)
    stages = [Stage(world, p) for p in range(2)]
    for stage, compute_s, call_s, nbytes in ((stages[0], 1.0, 0.2, 10**9), (stages[1], 0.2, 0.4, 2 * 10**9)):
        stage.compute(compute_s, name="norm")
        stage.collective("all_reduce", "dp", duration_s=call_s, nbytes=nbytes)
    model = VariabilityModel(spatial_cv=0.0, temporal_cv=0.0, collective_cv=CV)
    graph = build(world, stages)
    traces = {p: s.trace()[0] for p, s in enumerate(stages)}
    spreads = {p: 0 * s.trace()[1] for p, s in enumerate(stages)}
    (source,) = noise_sources(graph, model, traces, spreads)
    by_size = source_signatures(source, graph, model, traces, spreads)
    assert [x.name[-7:] for x in by_size] == ["stage 1", "stage 0"]  # no path: the bigger call
    on_path = source_signatures(source, graph, model, traces, spreads, critical_nodes(graph))
    assert [x.name[-7:] for x in on_path] == ["stage 0", "stage 1"]
    assert on_path[0].prerank_variance_s2 == pytest.approx((CV * 0.2) ** 2)
    assert on_path[1].prerank == (0.0, pytest.approx((CV * 0.4) ** 2))


def test_a_transfer_the_path_reaches_through_its_receive_counts_as_on_the_path():
    # stage 1 is late (1.0 s of compute) and receives 0.3 s of transfer from stage 0 after it:
    # the critical path runs compute, recv, compute on stage 1 alone, but the transfer is drawn
    # at stage 0's send, the node its signature's mask holds
    from emulator.graph.execution_graph import RECV, SEND
    from emulator.variability.signatures import critical_nodes

    world = World.grid(dp=1, pp=2, cp=1, tp=1)
    s0, s1 = Stage(world, 0), Stage(world, 1)
    s0.compute(0.1, name="norm")
    s0.send(1)
    s1.compute(1.0, name="norm")
    s1.recv(0)
    s1.compute(0.1, name="norm")
    graph = build(world, [s0, s1])
    for g, kind in ((graph.classes[0], SEND), (graph.classes[1], RECV)):
        g["duration_s"][g["kind"] == kind] = 0.3
    model = VariabilityModel(spatial_cv=0.0, temporal_cv=0.0, collective_cv=CV)
    traces = {0: s0.trace()[0], 1: s1.trace()[0]}
    spreads = {p: 0 * s.trace()[1] for p, s in enumerate((s0, s1))}
    (source,) = noise_sources(graph, model, traces, spreads)
    (transfer,) = source_signatures(source, graph, model, traces, spreads, critical_nodes(graph))
    assert transfer.name == "send/recv on pp (2 members), 1.05 MB, stage 0"
    assert transfer.prerank == (pytest.approx((CV * 0.3) ** 2), 0.0)


def test_a_collective_spanning_stages_is_one_signature_holding_every_member():
    # one draw serves all members of a pp-spanning call: split by stage, one part would apply
    # all of its noise and the other none
    world = World.grid(dp=1, pp=2, cp=1, tp=1)
    stages = [Stage(world, p) for p in range(2)]
    for stage in stages:
        stage.compute(0.5, name="norm")
        stage.collective("all_reduce", "pp", duration_s=0.2, nbytes=10**6)
    (call,) = _collective_signatures(world, stages)
    assert call.name == "all_reduce on pp (2 members), 1 MB"
    assert [int(m.sum()) for m in call.mask.comm] == [1, 1]
