"""Ranking noise sources by ablation on programs whose answer is known by construction."""

import numpy as np
import pytest

from emulator.variability.attribution import ALL_SOURCES, attribute_variance, drill_down
from emulator.variability.model import NetworkRegime, VariabilityModel
from emulator.variability.sources import noise_sources
from emulator.world.mesh import World
from tests.emulator.synthetic_traces import Stage, build

CV = 0.05


def _sources(graph, model, stages):
    traces, spreads = {}, {}
    for s in stages:
        traces[s.pp], durations = s.trace()
        spreads[s.pp] = model.temporal_cv * durations
    return noise_sources(graph, model, traces, spreads)


def test_one_gpu_one_segment_ranks_gemms_first_with_their_share_of_the_variance():
    # One segment is one draw: mean + sqrt(sum of the kernels' variances) x z, and every run
    # makes the same draws, so a class alone gives exactly its share of the summed variance.
    world = World.grid(dp=1, pp=1, cp=1, tp=1)
    s = Stage(world, 0)
    kernels = [("mm", 1.0), ("norm", 0.1), ("addmm", 2.0), ("elementwise", 0.3)]
    for name, d in kernels:
        s.compute(d, name=name)
    graph = build(world, [s], temporal_cv=CV)
    model = VariabilityModel(spatial_cv=0.0, temporal_cv=CV, collective_cv=0.0)
    a = attribute_variance(graph, model, _sources(graph, model, [s]), samples=400, seed=1)
    assert [e.source for e in a.sources] == ["compute gemm", "compute elementwise", "compute norm"]
    total = sum(d**2 for _, d in kernels)
    gemm = a.sources[0]
    assert gemm.variance_share == pytest.approx((1.0 + 4.0) / total, rel=1e-9)
    assert sum(e.variance_share for e in a.sources) == pytest.approx(1.0, rel=1e-9)
    assert a.total.source == ALL_SOURCES and a.total.variance_share == pytest.approx(1.0)


def test_dp_collectives_rank_first_where_they_carry_the_noise():
    # Per layer: all-gather of the weights over dp (0.4 s), 1 s of GEMMs, reduce-scatter of the
    # gradients (0.4 s), all blocking. A collective's draw is shared by its 8 members, CV 0.1:
    # std 0.04 s per call; the compute's CV 0.005 gives 0.005 s per segment per GPU, and the
    # maximum over 8 GPUs at each collective has a smaller spread still.
    world = World.grid(dp=8, pp=1, cp=1, tp=1)
    s = Stage(world, 0)
    for _ in range(4):
        s.collective("all_gather", "dp", duration_s=0.4)
        s.compute(1.0, name="mm")
        s.collective("reduce_scatter", "dp", duration_s=0.4)
    model = VariabilityModel(spatial_cv=0.0, temporal_cv=0.005, collective_cv=0.1)
    graph = build(world, [s], temporal_cv=model.temporal_cv)
    a = attribute_variance(graph, model, _sources(graph, model, [s]), samples=500, seed=2)
    names = [e.source for e in a.sources]
    assert set(names[:2]) == {"all_gather on dp", "reduce_scatter on dp"}
    assert names[2] == "compute gemm"
    assert a.sources[2].std_s < 0.25 * a.sources[1].std_s
    assert all(e.p95_excess_s > 0 for e in a.sources)


def test_attribution_is_reproducible_and_serialises():
    world = World.grid(dp=2, pp=1, cp=1, tp=1)
    s = Stage(world, 0)
    s.compute(1.0)
    s.collective("all_reduce", "dp", duration_s=0.5)
    model = VariabilityModel(spatial_cv=0.02, temporal_cv=CV, collective_cv=CV)
    graph = build(world, [s], temporal_cv=CV)
    sources = _sources(graph, model, [s])
    a = attribute_variance(graph, model, sources, samples=50, seed=3)
    b = attribute_variance(graph, model, sources, samples=50, seed=3)
    assert a.sources == b.sources and a.total == b.total
    d = a.to_dict()
    assert d["total"]["source"] == ALL_SOURCES
    assert [x["source"] for x in d["sources"]] == [e.source for e in a.sources]
    assert np.isfinite([x["std_s"] for x in d["sources"]]).all()


def test_every_source_on_is_the_monte_carlo_it_explains_so_its_times_can_be_handed_over():
    # `prismbench variability --rank-sources` passes its main run's step times rather than
    # sampling them a second time: the same draws, so the same attribution
    from emulator.variability.monte_carlo import sample_step_times

    world = World.grid(dp=2, pp=1, cp=1, tp=1)
    s = Stage(world, 0)
    s.compute(1.0, name="mm")
    s.collective("all_reduce", "dp", duration_s=0.5)
    model = VariabilityModel(spatial_cv=0.02, temporal_cv=CV, collective_cv=CV)
    graph = build(world, [s], temporal_cv=CV)
    sources = _sources(graph, model, [s])
    draws = dict(samples=60, seed=4, steps_per_allocation=3)
    main_run = sample_step_times(graph, model, **draws)
    sampled = attribute_variance(graph, model, sources, **draws)
    handed = attribute_variance(graph, model, sources, **draws, everything=main_run)
    assert sampled.total == handed.total and sampled.sources == handed.sources


def _two_all_gathers(world):
    """Per layer a big (2 GB, 0.4 s) and a small (3 MB, 0.1 s) blocking all-gather over dp
    around 1 s of GEMMs, and a blocking tp all-reduce."""
    s = Stage(world, 0)
    for _ in range(4):
        s.collective("all_gather", "dp", duration_s=0.4, nbytes=2 * 10**9)
        s.compute(1.0, name="mm")
        s.collective("all_gather", "dp", duration_s=0.1, nbytes=3 * 10**6)
        s.collective("all_reduce", "tp", duration_s=0.05)
    return s


def test_a_source_that_provably_adds_no_noise_is_listed_and_not_run(monkeypatch):
    # tp 2 inside a node of 2 GPUs: the network regime never reaches the tp all-reduce
    from emulator.variability import attribution
    from emulator.variability.sources import NO_CALL_CROSSES_NODES

    world = World.grid(dp=4, pp=1, cp=1, tp=2, gpus_per_node=2)
    s = _two_all_gathers(world)
    graph = build(world, [s])
    model = VariabilityModel(spatial_cv=0.0, temporal_cv=0.0, collective_cv=CV,
                             network=(NetworkRegime(0.9, 1.0), NetworkRegime(0.1, 1.4)))  # fmt: skip
    run = []
    real = attribution.sample_step_times
    monkeypatch.setattr(attribution, "sample_step_times",
                        lambda *a, mask=None, **k: run.append(mask) or real(*a, mask=mask, **k))  # fmt: skip
    sources = _sources(graph, model, [s])
    a = attribute_variance(graph, model, sources, samples=50, seed=1)
    inert = "network regime on all_reduce on tp"
    assert [(x.source, x.reason) for x in a.skipped] == [(inert, NO_CALL_CROSSES_NODES)]
    assert inert not in [e.source for e in a.sources]
    ran = {id(m) for m in run}
    assert {x.name for x in sources if id(x.mask) in ran} == {e.source for e in a.sources}
    assert len(run) == 1 + len(a.sources)  # the all-on run and every source not skipped
    assert a.to_dict()["skipped"] == [
        {"source": inert, "category": "network", "reason": NO_CALL_CROSSES_NODES}
    ]


def _drilled(world, model, top=3, per_source=4, samples=300, seed=5):
    s = _two_all_gathers(world)
    graph = build(world, [s], temporal_cv=model.temporal_cv)
    trace, durations = s.trace()
    traces, spreads = {0: trace}, {0: model.temporal_cv * durations}
    sources = noise_sources(graph, model, traces, spreads)
    a = attribute_variance(graph, model, sources, samples=samples, seed=seed)
    return drill_down(graph, model, a, sources, traces, spreads, top=top, per_source=per_source)


def test_the_bigger_all_gather_ranks_first_under_its_source():
    # both signatures' draws are shared by the 4 members; the 0.4 s call's noise is 4x the
    # 0.1 s one's, so alone it gives ~4x the std
    world = World.grid(dp=4, pp=1, cp=1, tp=2)
    model = VariabilityModel(spatial_cv=0.0, temporal_cv=0.0, collective_cv=0.1)
    a = _drilled(world, model)
    gather = next(e for e in a.sources if e.source == "all_gather on dp")
    names = [x.signature for x in gather.signatures]
    assert names == ["all_gather on dp (4 members), 2 GB", "all_gather on dp (4 members), 3 MB"]
    big, small = gather.signatures
    assert big.own_run and small.own_run
    assert 3.0 < big.std_s / small.std_s < 5.0
    assert a.signature_runs == 2  # the tp all-reduce has one signature: named, not run
    reduce = next(e for e in a.sources if e.source == "all_reduce on tp")
    assert [(x.signature, x.own_run, x.std_s) for x in reduce.signatures] == [
        ("all_reduce on tp (2 members), 1.05 MB", False, reduce.std_s)
    ]


def test_a_signature_with_no_noise_to_apply_gives_zero_std_and_the_deterministic_step():
    # the drill-down of a noisy model's attribution, replayed under a model without noise:
    # every signature's run is the deterministic replay in every sample (its std and mean
    # shift the rounding of a mean of equal values)
    from emulator.variability.model import NO_VARIABILITY

    world = World.grid(dp=4, pp=1, cp=1, tp=2)
    model = VariabilityModel(spatial_cv=0.0, temporal_cv=CV, collective_cv=0.1)
    s = _two_all_gathers(world)
    graph = build(world, [s], temporal_cv=CV)
    trace, durations = s.trace()
    traces, spreads = {0: trace}, {0: CV * durations}
    sources = noise_sources(graph, model, traces, spreads)
    a = attribute_variance(graph, model, sources, samples=100, seed=2)
    quiet = drill_down(graph, NO_VARIABILITY, a, sources, traces, spreads, top=5)
    split = [x for e in quiet.sources for x in e.signatures if x.own_run]
    assert split and quiet.signature_runs == len(split)
    assert all(x.p95_excess_s == 0 for x in split)
    assert all(x.std_s < 1e-12 and abs(x.mean_shift_s) < 1e-12 for x in split)


def test_only_the_top_k_sources_of_several_signatures_are_split_and_the_rest_lumped():
    # one GPU per node: every call crosses nodes, and the network regime reaches all three
    # signatures (2 GB and 3 MB all-gathers, the tp all-reduce's 1.05 MB)
    world = World.grid(dp=4, pp=1, cp=1, tp=2, gpus_per_node=1)
    model = VariabilityModel(spatial_cv=0.0, temporal_cv=0.0, collective_cv=0.1,
                             network=(NetworkRegime(0.9, 1.0), NetworkRegime(0.1, 1.4)))  # fmt: skip
    a = _drilled(world, model, top=1, per_source=1)
    several = [e for e in a.sources if e.signatures and e.signatures[0].own_run]
    assert [e.source for e in several] == [a.sources[0].source]  # the top source only
    entries = several[0].signatures
    assert len(entries) == 2 and sum(x.lumped for x in entries) == 3
    assert a.signature_runs == 2
    d = a.to_dict()
    assert d["signature_runs"] == 2
    assert [x["signature"] for x in d["sources"][0]["signatures"]] == [x.signature for x in entries]


def test_the_drill_down_is_reproducible():
    world = World.grid(dp=4, pp=1, cp=1, tp=2)
    model = VariabilityModel(spatial_cv=0.01, temporal_cv=CV, collective_cv=0.1)
    a, b = _drilled(world, model, samples=60), _drilled(world, model, samples=60)
    assert a.sources == b.sources and a.signature_runs == b.signature_runs > 0
