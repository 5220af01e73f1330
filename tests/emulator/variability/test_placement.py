"""Placing k slow GPUs: which ranks each placement holds, hand-calculated steps without noise,
and, with noise, that no sample gets faster (the same draws, a monotone replay)."""

import numpy as np
import pytest

from emulator.graph.replay import replay
from emulator.variability.model import NO_VARIABILITY, PRISM_HIGH
from emulator.variability.monte_carlo import sample_step_times
from emulator.variability.placement import (
    NO_SLOW_GPUS,
    compare_placements,
    placement_ranks,
    slow_gpu_factors,
)
from emulator.world.mesh import World
from tests.emulator.synthetic_traces import Stage, build, pipeline


def _ranks(world, k):
    return {name: r.tolist() for name, r in placement_ranks(world, k).items()}


def test_placements_hold_the_ranks_they_name():
    world = World.grid(dp=4, pp=2, cp=1, tp=2)  # rank = (dp*2 + pp)*2 + tp
    assert _ranks(world, 2) == {
        "tp-group = stage": [0, 1],  # cp = 1: one stage of one replica is one TP group
        "stage-across-replicas": [0, 4],  # dp 0 and dp 1 at pp 0
        "spread": [0, 7],  # (dp 0, pp 0, tp 0) and (dp 1, pp 1, tp 1)
    }
    assert _ranks(world, 5) == {}
    cp = World.grid(dp=2, pp=1, cp=2, tp=2)
    assert _ranks(cp, 3) == {"stage": [0, 1, 2]}  # tp 0, 1 at cp 0, tp 0 at cp 1


def _tp_dp_program(world):
    s = Stage(world, 0)
    for _ in range(3):
        s.compute(1.0, phase="forward")
        s.collective("all_reduce", "tp", duration_s=0.2)
    s.collective("all_reduce", "dp", duration_s=0.7)
    s.compute(0.25, phase="optimizer")
    return s


def test_without_noise_a_tp_group_of_slow_gpus_costs_what_one_does():
    # A blocking tp all-reduce after every layer and the dp all-reduce at the end put the
    # slowest GPU's compute (3.25 s) on the critical path wherever it is: the step grows by
    # (s - 1) x 3.25 s, for the whole TP group slow as for one GPU per replica.
    world = World.grid(dp=4, pp=1, cp=1, tp=2)
    graph = build(world, [_tp_dp_program(world)])
    base = replay(graph).iteration_time_s
    study = compare_placements(graph, NO_VARIABILITY, 2, 1.1, samples=4)
    hand = base + 0.1 * 3.25
    assert study.reference.p95_s == base
    assert [p.placement for p in study.placements] == [
        "tp-group = stage",
        "stage-across-replicas",
        "spread",
    ]
    for p in study.placements:
        assert p.deterministic_s == pytest.approx(hand, rel=1e-12)
        assert p.p95_s == pytest.approx(hand, rel=1e-12)
        assert p.p95_ratio == pytest.approx(hand / base, rel=1e-12)


def _pipeline_graph(temporal_cv=0.0):
    world = World.grid(dp=2, pp=2, cp=1, tp=1)
    stages = pipeline(world, 4, 1.0, 2.0, "1f1b")
    for s in stages:
        s.collective("all_reduce", "dp", duration_s=0.5)
    return build(world, stages, temporal_cv=temporal_cv)


def test_without_noise_spread_costs_the_worst_of_its_stages_single_slow_gpus():
    # The replicas' pipelines meet only at the dp all-reduce of each stage: k slow GPUs at the
    # first stage of k replicas cost what one does; one per replica at different stages costs
    # the worst stage's single slow GPU, so never less.
    graph = _pipeline_graph()
    world = graph.world
    single = {
        p: replay(graph, speed_factors=slow_gpu_factors(world, [world.rank_of(pp=p)], 1.2))
        for p in (0, 1)
    }
    study = {
        p.placement: p
        for p in compare_placements(graph, NO_VARIABILITY, 2, 1.2, samples=4).placements
    }
    assert study["stage-across-replicas"].p95_s == single[0].iteration_time_s
    worst = max(r.iteration_time_s for r in single.values())
    assert study["spread"].p95_s == worst
    assert study["spread"].p95_s >= study["stage-across-replicas"].p95_s


def test_with_noise_no_sample_gets_faster_with_slow_gpus():
    graph = _pipeline_graph(temporal_cv=0.05)
    world = graph.world
    ones = np.ones(world.shape)
    reference = sample_step_times(graph, PRISM_HIGH.with_speed_factors(ones), samples=200, seed=4)
    for name, ranks in placement_ranks(world, 2).items():
        model = PRISM_HIGH.with_speed_factors(slow_gpu_factors(world, ranks, 1.1))
        slow = sample_step_times(graph, model, samples=200, seed=4)
        assert (slow >= reference * (1 - 1e-12)).all(), name
        assert slow.mean() > reference.mean(), name


def test_bad_inputs_are_refused_with_the_numbers():
    world = World.grid(dp=2, pp=1, cp=1, tp=2)
    graph = build(world, [_tp_dp_program(world)])
    with pytest.raises(ValueError, match="slow_gpus=5 fits no placement"):
        compare_placements(graph, NO_VARIABILITY, 5, 1.1)
    with pytest.raises(ValueError, match="factor=0"):
        compare_placements(graph, NO_VARIABILITY, 1, 0)
    study = compare_placements(graph, NO_VARIABILITY, 1, 1.1, samples=2)
    assert study.reference.placement == NO_SLOW_GPUS
    assert study.to_dict()["placements"][0]["ranks"] == (0,)
