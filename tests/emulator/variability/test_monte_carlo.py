"""Monte Carlo over the replay on synthetic programs (tests/emulator/synthetic_traces.py):
reproducibility, the deterministic limit, a slow GPU, shared collective draws, segment noise."""

from dataclasses import replace

import numpy as np
import pytest
from scipy import stats

from emulator.graph.execution_graph import RECV, SEND
from emulator.graph.replay import replay
from emulator.variability.model import (
    DEFAULT_NETWORK,
    MAX_NORMAL_CV,
    NO_VARIABILITY,
    PRISM_HIGH,
    VariabilityModel,
)
from emulator.variability.monte_carlo import (
    draws_per_sample,
    network_regime_nodes,
    sample_step_times,
)
from emulator.variability.summary import summarize
from emulator.world.mesh import World
from tests.emulator.synthetic_traces import Stage, build, pipeline


def _tp_dp_program(world, layers=3):
    """Per layer: compute, a blocking tp all-reduce; then a dp all-reduce and the optimizer."""
    s = Stage(world, 0)
    for _ in range(layers):
        s.compute(1.0, phase="forward")
        s.compute(0.5, phase="forward")
        s.collective("all_reduce", "tp", duration_s=0.2)
    s.collective("all_reduce", "dp", duration_s=0.7)
    s.compute(0.25, phase="optimizer")
    return s


@pytest.fixture
def tp_dp_graph():
    world = World.grid(dp=4, pp=1, cp=1, tp=2)
    return build(world, [_tp_dp_program(world)], temporal_cv=0.05)


@pytest.fixture
def pipeline_graph():
    world = World.grid(dp=2, pp=4, cp=1, tp=2)
    return build(world, pipeline(world, 8, 1.0, 2.0, "1f1b"), temporal_cv=0.05)


@pytest.fixture
def timed_transfers_graph():
    """pipeline_graph with transfers of 0.05 s: synthetic programs' transfers are free."""
    world = World.grid(dp=2, pp=4, cp=1, tp=2)
    graph = build(world, pipeline(world, 8, 1.0, 2.0, "1f1b"), temporal_cv=0.05)
    for c in graph.classes:
        c["duration_s"][np.isin(c["kind"], (SEND, RECV))] = 0.05
    return graph


def test_without_a_transfer_cv_transfers_draw_the_collectives_cv_as_before(timed_transfers_graph):
    times = sample_step_times(timed_transfers_graph, PRISM_HIGH, samples=64, seed=11)
    # the first samples before transfer_cv existed (rel 1e-12: numpy's exp may differ in the
    # last bit between CPUs; another draw order would differ in the third digit), taken again
    # when a send and a receive between two stages stopped waiting for each other (one stream
    # a direction)
    before = [36.63706380144018, 41.84536784820353, 44.51641392531662]
    assert times[:3].tolist() == pytest.approx(before, rel=1e-12)
    same = replace(PRISM_HIGH, transfer_cv=PRISM_HIGH.collective_cv)
    again = sample_step_times(timed_transfers_graph, same, samples=64, seed=11)
    assert np.array_equal(again, times)


def test_a_transfer_cv_spreads_the_transfers_and_nothing_else(timed_transfers_graph, tp_dp_graph):
    transfers_only = replace(NO_VARIABILITY, transfer_cv=0.1)
    times = sample_step_times(timed_transfers_graph, transfers_only, samples=200, seed=1)
    assert times.std() > 0
    # a job without a pipeline has no transfer to draw: nothing changes
    assert draws_per_sample(tp_dp_graph, transfers_only) == 0
    times = sample_step_times(tp_dp_graph, transfers_only, samples=64, seed=1)
    assert (times == replay(tp_dp_graph).iteration_time_s).all()


def test_a_transfer_cv_of_0_leaves_the_transfers_exact_under_collective_noise(
    timed_transfers_graph,
):
    # the synthetic pipeline has no collective: only its transfers could vary
    quiet = replace(NO_VARIABILITY, collective_cv=0.1, transfer_cv=0.0)
    assert draws_per_sample(timed_transfers_graph, quiet) == 0
    times = sample_step_times(timed_transfers_graph, quiet, samples=64, seed=1)
    assert (times == replay(timed_transfers_graph).iteration_time_s).all()


@pytest.mark.parametrize("cv", [-0.01, MAX_NORMAL_CV + 0.01])
def test_a_transfer_cv_outside_what_a_normal_draw_keeps_positive_is_refused(cv):
    with pytest.raises(ValueError, match=r"transfer_cv=.* must be in \[0, 0.15\]"):
        replace(NO_VARIABILITY, transfer_cv=cv)


def test_same_seed_same_answer_other_seed_another(pipeline_graph):
    a = sample_step_times(pipeline_graph, PRISM_HIGH, samples=200, seed=7)
    b = sample_step_times(pipeline_graph, PRISM_HIGH, samples=200, seed=7)
    c = sample_step_times(pipeline_graph, PRISM_HIGH, samples=200, seed=8)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


@pytest.mark.parametrize("graph", ["tp_dp_graph", "pipeline_graph"])
def test_zero_variance_reproduces_the_deterministic_iteration_exactly(graph, request):
    g = request.getfixturevalue(graph)
    times = sample_step_times(g, NO_VARIABILITY, samples=64, seed=3)
    assert (times == replay(g).iteration_time_s).all()


@pytest.mark.parametrize("slow", [1.1, 1.5])
def test_one_slow_gpu_delays_the_step_by_its_extra_compute(tp_dp_graph, slow):
    # Every layer ends in a blocking tp all-reduce, the step in a dp all-reduce: the slowest
    # rank's compute is all on the critical path, so the step grows by (slow - 1) x its compute.
    world = tp_dp_graph.world
    deterministic = replay(tp_dp_graph)
    compute_s = deterministic.per_class[0].compute_s
    factors = np.ones(world.shape)
    factors[world.coords(5)[0].tolist()] = slow  # rank 5: dp 2, tp 1
    model = NO_VARIABILITY.with_speed_factors(factors)
    d = summarize(
        sample_step_times(tp_dp_graph, model, samples=32, seed=0),
        deterministic.iteration_time_s,
        seed=0,
    )
    expected = deterministic.iteration_time_s + (slow - 1) * compute_s
    assert d.p95_s == pytest.approx(expected, rel=1e-12)
    assert d.p95_s == replay(tp_dp_graph, speed_factors=factors).iteration_time_s


def _two_ranks_noisy_layers(layers: int, cv: float):
    """dp 2; per layer 1 s of compute with std cv, then a blocking 0.1 s dp all-reduce."""
    world = World.grid(dp=2, pp=1, cp=1, tp=1)
    s = Stage(world, 0)
    for _ in range(layers):
        s.compute(1.0, phase="forward")
        s.collective("all_reduce", "dp", duration_s=0.1)
    return build(world, [s], temporal_cv=cv)


def test_each_blocking_collective_waits_for_its_slowest_member():
    """Each layer ends when the slower of two iid N(1, cv^2) computes does: E[max of two iid
    normals] = mu + sigma / sqrt(pi), so the mean step exceeds the deterministic one by
    L cv / sqrt(pi), here 16 x 0.05 / 1.772 = 0.451 s. Collectives that let each rank run on
    would give only the maximum of the two ranks' sums, sqrt(L) cv / sqrt(pi) = 0.113 s. The
    step's std is cv sqrt(L (1 - 1/pi)) = 0.165 s (a maximum's variance is sigma^2 (1 - 1/pi)),
    so 4 000 samples hold the mean within 4 x 0.0026 s."""
    layers, cv, samples = 16, 0.05, 4000
    graph = _two_ranks_noisy_layers(layers, cv)
    model = VariabilityModel(spatial_cv=0.0, temporal_cv=cv, collective_cv=0.0)
    shift = (
        sample_step_times(graph, model, samples=samples, seed=4).mean()
        - replay(graph).iteration_time_s
    )
    step_std = cv * np.sqrt(layers * (1 - 1 / np.pi))
    assert shift == pytest.approx(layers * cv / np.sqrt(np.pi), abs=4 * step_std / np.sqrt(samples))


def test_a_slow_gpu_under_noise_sets_p95_by_its_scaled_compute():
    """Rank 1 at factor f = 1.5 computes f (1 + sigma z), sigma = 0.02: 25 of its stds above
    rank 0's 1 + sigma z, so it alone sets the step: f (1 + sigma z) + the 0.1 s all-reduce, and
    p95 = f (1 + 1.645 sigma) + 0.1 = 1.5494 s (the factor scales the noise too; scaling the
    mean alone would give 1.5329 s). At 4 000 samples a p95's std is sqrt(0.95 x 0.05 / N) /
    pdf(1.645) x f sigma = 1.0 ms; the mean is f + 0.1 within 4 x f sigma / sqrt(N)."""
    slow, cv, samples = 1.5, 0.02, 4000
    graph = _two_ranks_noisy_layers(1, cv)
    model = VariabilityModel(spatial_cv=0.0, temporal_cv=cv, collective_cv=0.0)
    times = sample_step_times(
        graph,
        model.with_speed_factors(np.array([1.0, slow]).reshape(graph.world.shape)),
        samples=samples,
        seed=5,
    )
    quantile_std_s = np.sqrt(0.95 * 0.05 / samples) / stats.norm.pdf(1.645) * slow * cv
    assert np.percentile(times, 95) == pytest.approx(
        slow * (1 + 1.645 * cv) + 0.1, abs=4 * quantile_std_s
    )
    assert times.mean() == pytest.approx(slow + 0.1, abs=4 * slow * cv / np.sqrt(samples))


def test_a_collective_is_one_draw_shared_by_its_members():
    # dp all-reduce of 1 s after 1 s of compute on 8 ranks: one draw per call keeps the mean at
    # 1 s; a draw per member would end at their max, 1 + 1.42 x cv on average (max of 8 normals).
    world = World.grid(dp=8, pp=1, cp=1, tp=1)
    s = Stage(world, 0)
    s.compute(1.0, phase="backward")
    s.collective("all_reduce", "dp", duration_s=1.0)
    graph = build(world, [s])
    cv = 0.1
    model = VariabilityModel(spatial_cv=0.0, temporal_cv=0.0, collective_cv=cv)
    comm = sample_step_times(graph, model, samples=2000, seed=1) - 1.0
    assert comm.mean() == pytest.approx(1.0, abs=4 * cv / np.sqrt(2000))
    assert comm.std() == pytest.approx(cv, rel=0.1)


def test_segment_noise_has_the_summed_variance_of_its_kernels():
    # One rank, one segment of four 1 s ops each with std cv: the step's std is 2 cv (sqrt 4).
    world = World.grid(dp=1, pp=1, cp=1, tp=1)
    s = Stage(world, 0)
    for _ in range(4):
        s.compute(1.0, phase="forward")
    graph = build(world, [s], temporal_cv=0.03)
    model = VariabilityModel(spatial_cv=0.0, temporal_cv=0.03, collective_cv=0.0)
    times = sample_step_times(graph, model, samples=4000, seed=2)
    assert times.mean() == pytest.approx(4.0, abs=1e-2)
    assert times.std() == pytest.approx(2 * 0.03, rel=0.05)


def test_samples_are_independent_so_the_mean_converges_as_one_over_sqrt_n():
    # One rank, 500 segments of 1 s with std cv: a step's std is cv sqrt(500). Independent
    # samples give a mean whose seed-to-seed std is that over sqrt(N); samples sharing a
    # 16-window pool of normals gave 5x it (each value reused ~500/16 times across samples).
    world = World.grid(dp=1, pp=1, cp=1, tp=1)
    s = Stage(world, 0)
    for mb in range(500):
        s.compute(1.0, phase="forward", mb=mb)  # a micro-batch each: 500 segments
    cv, samples = 0.01, 1000
    graph = build(world, [s], temporal_cv=cv)
    model = VariabilityModel(spatial_cv=0.0, temporal_cv=cv, collective_cv=0.0)
    means = [sample_step_times(graph, model, samples=samples, seed=k).mean() for k in range(20)]
    error_of_mean = cv * np.sqrt(500) / np.sqrt(samples)
    # 20 seeds estimate a std within ~16 % (1 / sqrt(2 x 19)): 1.5x is three of those away
    assert np.std(means, ddof=1) < 1.5 * error_of_mean


def test_variability_only_slows_a_synchronous_step_on_average(pipeline_graph):
    d = summarize(
        sample_step_times(pipeline_graph, PRISM_HIGH, samples=300, seed=0),
        replay(pipeline_graph).iteration_time_s,
        seed=0,
    )
    assert d.p5_s <= d.p50_s <= d.p95_s <= d.p99_s
    assert d.slowdown_mean > 1  # joins take maxima of the members' noise
    assert d.k_steps_bound_s > d.k_steps_mean_s == pytest.approx(d.k_steps * d.mean_s)


def _one_gpu_four_seconds():
    """One GPU, four 1 s segments, no communication."""
    world = World.grid(dp=1, pp=1, cp=1, tp=1)
    s = Stage(world, 0)
    for _ in range(4):
        s.compute(1.0, phase="forward")
    return build(world, [s])


def test_a_per_step_factor_scales_a_single_gpus_step_by_its_cv():
    graph = _one_gpu_four_seconds()
    model = VariabilityModel(spatial_cv=0.0, temporal_cv=0.0, collective_cv=0.0, step_cv=0.02)
    times = sample_step_times(graph, model, samples=4000, seed=3)
    # one GPU, no communication: the step is the deterministic one times one lognormal factor
    assert times.mean() == pytest.approx(4.0, rel=2e-3)
    assert times.std() / times.mean() == pytest.approx(0.02, rel=0.05)


def test_the_steps_of_one_allocation_share_its_gpus_speed_factors(tp_dp_graph, monkeypatch):
    # Spatial variation alone: every step of an allocation takes the same time, allocations
    # differ; chunks of 3 samples are widened to whole allocations of 5.
    import emulator.variability.monte_carlo as monte_carlo

    monkeypatch.setattr(monte_carlo, "CHUNK_ELEMENTS", 3 * 8)  # 3 samples of 8 lanes
    model = VariabilityModel(spatial_cv=0.1, temporal_cv=0.0, collective_cv=0.0)
    times = sample_step_times(tp_dp_graph, model, samples=100, seed=0, steps_per_allocation=5)
    runs = times.reshape(20, 5)
    assert (runs == runs[:, :1]).all()
    assert len(np.unique(runs[:, 0])) == 20
    d = summarize(times, replay(tp_dp_graph).iteration_time_s, seed=0, k_steps=100,
                  steps_per_allocation=5)  # fmt: skip
    assert d.within_allocation_std_s == pytest.approx(0, abs=1e-12)  # a mean's rounding
    # no noise within an allocation: the bound is Student's prediction bound over the 20
    # allocations' steps (test_summary.py), above the two slowest allocations' middle
    step = runs[:, 0]
    normal = 100 * (step.mean() + stats.t.ppf(0.95, 19) * np.sqrt(1.05) * step.std(ddof=1))
    assert d.k_steps_bound_s == pytest.approx(normal, rel=2e-3)
    assert d.k_steps_bound_s > 100 * np.sort(step)[-2:].mean()


def test_the_answer_does_not_depend_on_the_threads(pipeline_graph, monkeypatch):
    # chunks of 8 samples (4 lanes a class), each with its own generator: 8 chunks on one
    # thread or three give the same times; progress hears every chunk, up to all samples
    import emulator.variability.monte_carlo as monte_carlo

    monkeypatch.setattr(monte_carlo, "CHUNK_ELEMENTS", 8 * 4)
    heard = []
    one = sample_step_times(pipeline_graph, PRISM_HIGH, samples=60, seed=2, threads=1,
                            progress=heard.append)  # fmt: skip
    three = sample_step_times(pipeline_graph, PRISM_HIGH, samples=60, seed=2, threads=3)
    assert np.array_equal(one, three)
    assert heard == [8, 16, 24, 32, 40, 48, 56, 60]
    assert len(np.unique(one)) == 60  # no chunk repeats another's draws
    with pytest.raises(ValueError, match="threads=0"):
        sample_step_times(pipeline_graph, PRISM_HIGH, samples=60, threads=0)


def test_one_step_per_allocation_is_the_library_default(pipeline_graph):
    one = sample_step_times(pipeline_graph, PRISM_HIGH, samples=60, seed=4, steps_per_allocation=1)
    assert np.array_equal(one, sample_step_times(pipeline_graph, PRISM_HIGH, samples=60, seed=4))


def test_the_split_recovers_the_per_step_and_spatial_cvs():
    # One GPU, spatial (5 %) and per-step (2 %) factors: within an allocation the steps spread
    # by the per-step factor alone, between allocations by the spatial one.
    graph = _one_gpu_four_seconds()
    model = VariabilityModel(spatial_cv=0.05, temporal_cv=0.0, collective_cv=0.0, step_cv=0.02)
    times = sample_step_times(graph, model, samples=4000, seed=5, steps_per_allocation=20)
    d = summarize(times, 4.0, seed=5, steps_per_allocation=20)
    assert d.allocations == 200
    assert d.within_allocation_std_s == pytest.approx(4.0 * 0.02, rel=0.05)
    assert d.allocation_std_s == pytest.approx(4.0 * 0.05, rel=0.15)


def _per_run_step_cvs(dispersion: float, seed: int = 6):
    """One GPU, a 2 % median step CV spread between runs by `dispersion`: 400 allocations of
    50 steps; each allocation's steps over 4 s."""
    model = VariabilityModel(spatial_cv=0.0, temporal_cv=0.0, collective_cv=0.0, step_cv=0.02,
                             step_cv_dispersion=dispersion)  # fmt: skip
    times = sample_step_times(_one_gpu_four_seconds(), model, samples=20_000, seed=seed,
                              steps_per_allocation=50)  # fmt: skip
    return times.reshape(400, 50) / 4.0


def test_each_run_draws_its_step_cv_lognormally_around_the_median():
    runs = _per_run_step_cvs(0.5)
    run_cvs = runs.std(axis=1, ddof=1) / runs.mean(axis=1)
    # 50 steps estimate a run's CV to ~10 % (sd of its log): 0.5 asked, sqrt(0.5^2 + 0.1^2) seen
    assert np.median(run_cvs) == pytest.approx(0.02, rel=0.08)
    assert np.log(run_cvs).std() == pytest.approx(np.hypot(0.5, 0.1), rel=0.1)
    assert runs.mean() == pytest.approx(1.0, abs=1e-3)  # every run's factor has mean 1


def test_no_dispersion_is_one_step_cv_for_every_run_as_before():
    runs = _per_run_step_cvs(0.0)
    run_cvs = runs.std(axis=1, ddof=1) / runs.mean(axis=1)
    assert np.median(run_cvs) == pytest.approx(0.02, rel=0.03)
    assert np.log(run_cvs).std() == pytest.approx(0.1, rel=0.15)  # the estimate's own spread


def test_a_dispersed_step_cv_is_reproducible_and_zero_variance_stays_exact(tp_dp_graph):
    model = replace(PRISM_HIGH, step_cv=0.01, step_cv_dispersion=0.7)
    a = sample_step_times(tp_dp_graph, model, samples=200, seed=2, steps_per_allocation=10)
    b = sample_step_times(tp_dp_graph, model, samples=200, seed=2, steps_per_allocation=10)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, sample_step_times(tp_dp_graph, replace(model, step_cv_dispersion=0.0),
                                                   samples=200, seed=2, steps_per_allocation=10))  # fmt: skip
    still = replace(NO_VARIABILITY, step_cv_dispersion=0.7)  # a spread of a zero CV: none
    times = sample_step_times(tp_dp_graph, still, samples=80, seed=3, steps_per_allocation=4)
    assert (times == replay(tp_dp_graph).iteration_time_s).all()


def _tp8_layers(dp: int):
    """tp 8 on 8-GPU nodes (one node per dp replica): 1 s compute, a 0.2 s tp all-reduce
    (NVLink, inside the node), then a 0.5 s dp all-reduce (across nodes when dp > 1)."""
    world = World.grid(dp=dp, pp=1, cp=1, tp=8, gpus_per_node=8)
    s = Stage(world, 0)
    s.compute(1.0, phase="forward")
    s.collective("all_reduce", "tp", duration_s=0.2)
    if dp > 1:
        s.collective("all_reduce", "dp", duration_s=0.5)
    return build(world, [s])


NETWORK_ONLY = VariabilityModel(
    spatial_cv=0.0, temporal_cv=0.0, collective_cv=0.0, network=DEFAULT_NETWORK
)


def test_the_network_regime_leaves_a_single_node_job_alone():
    times = sample_step_times(_tp8_layers(dp=1), NETWORK_ONLY, samples=400, seed=0)
    assert (times == 1.2).all()


def test_the_network_regime_slows_communication_across_nodes():
    # Only the dp all-reduce crosses nodes: 10 % of steps take it 1.4x, so the mean step is
    # 1.7 + 0.1 x 0.4 x 0.5 s; 4 000 samples hold the regime's share within ~1.9 % (4 sigma).
    times = sample_step_times(_tp8_layers(dp=2), NETWORK_ONLY, samples=4000, seed=0)
    assert set(np.round(times, 12)) == {1.7, 1.9}
    assert times.mean() == pytest.approx(1.7 + 0.1 * 0.4 * 0.5, abs=4 * 0.2 * np.sqrt(0.09 / 4000))


def test_network_scope_all_applies_the_regime_inside_a_node_too():
    model = replace(NETWORK_ONLY, network_scope="all")
    times = sample_step_times(_tp8_layers(dp=1), model, samples=400, seed=0)
    assert set(np.round(times, 12)) == {1.2, 1.28}


def test_each_samples_network_regime_comes_back_and_its_steps_are_the_slow_ones():
    graph = _tp8_layers(dp=2)
    network = np.empty(400)
    times = sample_step_times(graph, NETWORK_ONLY, samples=400, seed=0, network_out=network)
    assert set(network) == {1.0, 1.4}
    assert (np.round(times, 12) == np.where(network > 1, 1.9, 1.7)).all()
    with pytest.raises(ValueError, match="network_out has shape"):
        sample_step_times(graph, NETWORK_ONLY, samples=400, network_out=np.empty(399))


def test_the_regime_slows_the_nodes_its_scope_names():
    # the tp all-reduce stays in a node, the dp one crosses: inter-node scope slows only it
    assert network_regime_nodes(_tp8_layers(dp=1), NETWORK_ONLY) == 0
    assert network_regime_nodes(_tp8_layers(dp=2), NETWORK_ONLY) == 1
    assert network_regime_nodes(_tp8_layers(dp=2), replace(NETWORK_ONLY, network_scope="all")) == 2
