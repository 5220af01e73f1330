"""Noise masks and sources on synthetic programs: an all-on mask is the unmasked run, an all-off
mask the deterministic replay, op classes split a segment's variance, and every source named."""

from dataclasses import replace

import numpy as np
import pytest

from emulator.graph.execution_graph import RECV, SEND
from emulator.graph.replay import replay
from emulator.variability.model import (
    NO_VARIABILITY,
    PRISM_HIGH,
    NetworkRegime,
    VariabilityModel,
)
from emulator.variability.monte_carlo import NoiseMask, sample_step_times
from emulator.variability.sources import no_noise, noise_sources, op_class_variances_s2
from emulator.world.mesh import World
from tests.emulator.synthetic_traces import Stage, build, pipeline

CV = 0.05


def _traces_and_spreads(stages):
    traces, spreads = {}, {}
    for s in stages:
        traces[s.pp], durations = s.trace()
        spreads[s.pp] = CV * durations
    return traces, spreads


@pytest.fixture
def pipeline_case():
    world = World.grid(dp=2, pp=2, cp=1, tp=2)
    stages = pipeline(world, 4, 1.0, 2.0, "1f1b", optimizer_s=0.1)
    for s in stages:
        s.collective("all_reduce", "tp", duration_s=0.05)
        s.collective("reduce_scatter", "dp", duration_s=0.2)
    graph = build(world, stages, temporal_cv=CV)
    for g in graph.classes:  # transfers are free in synthetic programs: give them a duration
        g["duration_s"][np.isin(g["kind"], (SEND, RECV))] = 0.01
    return graph, stages


def test_an_all_on_mask_reproduces_the_unmasked_run_exactly(pipeline_case):
    graph, _ = pipeline_case
    plain = sample_step_times(graph, PRISM_HIGH, samples=64, seed=5)
    masked = sample_step_times(graph, PRISM_HIGH, samples=64, seed=5, mask=NoiseMask())
    assert np.array_equal(plain, masked)


def test_an_all_off_mask_gives_the_deterministic_step_in_every_sample(pipeline_case):
    graph, _ = pipeline_case
    times = sample_step_times(graph, PRISM_HIGH, samples=64, seed=5, mask=no_noise(graph))
    assert (times == replay(graph).iteration_time_s).all()


def test_a_mask_of_the_wrong_shape_is_refused(pipeline_case):
    graph, _ = pipeline_case
    bad = NoiseMask(comm=tuple(np.ones(3, bool) for _ in graph.classes))
    with pytest.raises(ValueError, match="NoiseMask.comm"):
        sample_step_times(graph, PRISM_HIGH, samples=4, mask=bad)


def test_op_class_variances_add_up_to_the_segments_variance():
    world = World.grid(dp=1, pp=1, cp=1, tp=1)
    s = Stage(world, 0)
    for name, d in [("mm", 1.0), ("norm", 0.1), ("addmm", 2.0), ("elementwise", 0.3)]:
        s.compute(d, name=name)
    graph = build(world, [s], temporal_cv=CV)
    parts = op_class_variances_s2(graph, *_traces_and_spreads([s]))
    assert sorted(parts) == ["elementwise", "gemm", "norm"]  # mm and addmm are one class
    assert parts["gemm"][0][0] == pytest.approx((CV * 1.0) ** 2 + (CV * 2.0) ** 2)
    total = sum(v[0] for v in parts.values())
    assert np.allclose(total, graph.classes[0]["variance_s2"])


def test_every_signature_is_a_source_and_a_model_without_it_has_none(pipeline_case):
    graph, stages = pipeline_case
    traces, spreads = _traces_and_spreads(stages)
    names = [s.name for s in noise_sources(graph, PRISM_HIGH, traces, spreads)]
    assert names == [
        "compute gemm",
        "all_reduce on tp",
        "reduce_scatter on dp",
        "send/recv on pp",
        "per-GPU speed",
        "network regime",
        "network regime on all_reduce on tp",
        "network regime on reduce_scatter on dp",
        "network regime on send/recv on pp",
    ]
    assert noise_sources(graph, NO_VARIABILITY, traces, spreads) == ()


def test_transfers_are_a_source_where_their_own_cv_is_above_0(pipeline_case):
    graph, stages = pipeline_case
    traces, spreads = _traces_and_spreads(stages)

    def comm_sources(model):
        sources = noise_sources(graph, model, traces, spreads)
        return [s.name for s in sources if s.category in ("collective", "pipeline")]

    transfers_only = replace(NO_VARIABILITY, transfer_cv=0.05)
    assert comm_sources(transfers_only) == ["send/recv on pp"]
    collectives_only = replace(NO_VARIABILITY, collective_cv=0.05, transfer_cv=0.0)
    assert comm_sources(collectives_only) == ["all_reduce on tp", "reduce_scatter on dp"]


def test_the_network_regime_on_one_signature_stretches_only_those_calls():
    # 1 s of compute, a blocking tp all-reduce (0.1 s) and dp all-reduce (0.5 s); half the
    # steps congested at 2x: the regime on one signature adds its duration or nothing. One GPU
    # per node, so that every call crosses the network (the regime's default scope).
    world = World.grid(dp=4, pp=1, cp=1, tp=2, gpus_per_node=1)
    s = Stage(world, 0)
    s.compute(1.0)
    s.collective("all_reduce", "tp", duration_s=0.1)
    s.collective("all_reduce", "dp", duration_s=0.5)
    graph = build(world, [s])
    model = VariabilityModel(
        spatial_cv=0.0,
        temporal_cv=0.0,
        collective_cv=0.0,
        network=(NetworkRegime(0.5, 1.0), NetworkRegime(0.5, 2.0)),
    )
    sources = {x.name: x for x in noise_sources(graph, model, *_traces_and_spreads([s]))}
    expected = {
        "network regime": 0.6,
        "network regime on all_reduce on tp": 0.1,
        "network regime on all_reduce on dp": 0.5,
    }
    assert set(sources) == set(expected)
    for name, extra in expected.items():
        times = sample_step_times(graph, model, samples=64, seed=0, mask=sources[name].mask)
        assert np.allclose(np.unique(times.round(12)), [1.6, 1.6 + extra]), name


def _regime_model(**kw):
    return VariabilityModel(
        spatial_cv=0.0,
        temporal_cv=0.0,
        collective_cv=0.0,
        network=(NetworkRegime(0.5, 1.0), NetworkRegime(0.5, 2.0)),
        **kw,
    )


def test_the_regime_on_calls_inside_a_node_is_inert_and_on_calls_across_nodes_is_not():
    # tp 2 inside a node of 2 GPUs, dp 4 across nodes: the regime (inter-node scope) never
    # reaches the tp all-reduce, and does reach the dp one
    from emulator.variability.sources import NO_CALL_CROSSES_NODES, inert_reason

    world = World.grid(dp=4, pp=1, cp=1, tp=2, gpus_per_node=2)
    s = Stage(world, 0)
    s.compute(1.0)
    s.collective("all_reduce", "tp", duration_s=0.1)
    s.collective("all_reduce", "dp", duration_s=0.5)
    graph = build(world, [s])
    model = _regime_model()
    sources = {x.name: x for x in noise_sources(graph, model, *_traces_and_spreads([s]))}
    reasons = {name: inert_reason(x, graph, model) for name, x in sources.items()}
    assert reasons == {
        "network regime": None,
        "network regime on all_reduce on tp": NO_CALL_CROSSES_NODES,
        "network regime on all_reduce on dp": None,
    }
    # the regime on every call (network_scope "all") reaches the tp calls too
    everywhere = replace(model, network_scope="all")
    assert inert_reason(sources["network regime on all_reduce on tp"], graph, everywhere) is None


def test_a_source_whose_mask_selects_nothing_noisy_is_inert_whatever_its_name():
    from emulator.variability.sources import NOTHING_NOISY, NoiseSource, inert_reason

    world = World.grid(dp=2, pp=1, cp=1, tp=1)
    s = Stage(world, 0)
    s.compute(1.0)
    s.collective("all_reduce", "dp", duration_s=0.5)
    graph = build(world, [s], temporal_cv=CV)
    model = VariabilityModel(spatial_cv=0.0, temporal_cv=CV, collective_cv=CV)
    off = NoiseSource("compute gemm", "compute", no_noise(graph), op_class="gemm")
    assert inert_reason(off, graph, model) == NOTHING_NOISY
    for source in noise_sources(graph, model, *_traces_and_spreads([s])):
        assert inert_reason(source, graph, model) is None, source.name
