"""The figures read off sampled step times, the K-step bound on one allocation above all."""

import numpy as np
import pytest
from scipy import stats

from emulator.variability.summary import MAX_SAMPLES, check_allocations, summarize

Z95 = stats.norm.ppf(0.95)


def test_one_step_per_allocation_bounds_k_independent_steps():
    times = np.random.default_rng(0).normal(2.0, 0.1, 1000)
    d = summarize(times, 2.0, seed=0, k_steps=400)
    assert d.allocation_std_s is None and d.within_allocation_std_s is None
    assert d.allocations == 1000
    assert d.k_steps_bound_s == pytest.approx(400 * times.mean() + Z95 * 20 * times.std(ddof=1))


def test_steps_that_repeat_their_allocation_bound_k_steps_by_the_larger_bound():
    # No noise within an allocation: a run of K steps takes K x its allocation's step. The
    # mixture's bound is K x the allocations' 95th percentile (19 of 20 below: the middle of
    # the gap to the 20th, 19.5 s). With sigma_w = 0 the pivotal bound is Student's
    # prediction bound, K x (mean + t_19 x sqrt(1 + 1/20) x std of the allocations) (its
    # quantities make a t variate), up to its draws' noise: the larger here, 20 allocations
    # say little.
    per_allocation = np.arange(1.0, 21.0)  # 20 allocations, 1 s .. 20 s a step
    times = np.repeat(per_allocation, 5)
    d = summarize(times, 1.0, seed=0, k_steps=100, steps_per_allocation=5)
    assert d.within_allocation_std_s == 0
    assert d.allocation_std_s == pytest.approx(per_allocation.std(ddof=1))
    normal = 100 * (10.5 + stats.t.ppf(0.95, 19) * np.sqrt(1.05) * per_allocation.std(ddof=1))
    assert d.k_steps_bound_s == pytest.approx(normal, rel=5e-3) and normal > 100 * 19.5
    # as independent steps: 100 x 10.5 s + 1.645 x 10 x 5.8 s, 1 145 s, far short of a run on
    # one of the two slowest allocations in twenty
    assert summarize(times, 1.0, seed=0, k_steps=100).k_steps_bound_s < 1150


def test_a_few_slow_allocations_set_the_bound_by_the_mixture():
    # 2 of 40 allocations twice as slow, no noise within: 95 % of runs take K x 1 s a step or
    # less, and the gap to K x 2 s is where the bound falls (its middle, as the mixture of
    # narrow normals gives); a normal bound would say K x 1.43 s, inside the gap.
    times = np.repeat(np.r_[np.ones(38), 2.0, 2.0], 5)
    d = summarize(times, 1.0, seed=0, k_steps=100, steps_per_allocation=5)
    assert d.k_steps_bound_s == pytest.approx(150.0)


def test_the_bound_on_one_allocation_matches_the_random_effects_normal():
    # Allocation means normal (sd 0.02 s), steps normal around them (sd 0.1 s): the time of K
    # steps on a random allocation is normal, mean K mu, variance K sw^2 + K^2 sb^2.
    rng = np.random.default_rng(1)
    allocations, steps, k = 2000, 10, 1000
    means = rng.normal(5.0, 0.02, allocations)
    times = (means[:, None] + rng.normal(0, 0.1, (allocations, steps))).ravel()
    d = summarize(times, 5.0, seed=0, k_steps=k, steps_per_allocation=steps)
    assert d.allocation_std_s == pytest.approx(0.02, rel=0.1)
    assert d.within_allocation_std_s == pytest.approx(0.1, rel=0.02)
    expected = k * 5.0 + Z95 * np.sqrt(k * 0.1**2 + k**2 * 0.02**2)
    assert d.k_steps_bound_s == pytest.approx(expected, abs=0.1 * (expected - k * 5.0))
    # taking the steps as independent misses most of the margin
    assert summarize(times, 5.0, seed=0, k_steps=k).k_steps_bound_s - k * 5.0 < 0.35 * (
        expected - k * 5.0
    )


def test_no_spread_between_allocations_nears_the_independent_steps_bound():
    # 400 allocations pin sigma_b near 0 at K = 500: the bound is about the independent one
    rng = np.random.default_rng(2)
    times = rng.normal(3.0, 0.05, 4000)
    d = summarize(times, 3.0, seed=0, k_steps=500, steps_per_allocation=10)
    independent = summarize(times, 3.0, seed=0, k_steps=500)
    margin = independent.k_steps_bound_s - 500 * times.mean()
    assert d.allocation_std_s < 0.01 * 0.05 * 10  # sampling noise of the split
    assert d.k_steps_bound_s - 500 * times.mean() == pytest.approx(margin, rel=0.15)


def test_a_sigma_b_the_samples_cannot_rule_out_widens_the_bound_but_not_absurdly():
    # No spatial spread, 100 allocations of 10 steps, K = 1 000: a sigma_b of a tenth of
    # sigma_w cannot be ruled out, and over 1 000 steps it would matter, so the bound's margin
    # is wider than independent steps' (z sqrt(K) sigma_w) but a few times it, in every data
    # set (a Student-t bound over Satterthwaite's degrees of freedom gave 1e27 times it).
    rng = np.random.default_rng(4)
    ratios = []
    for _ in range(50):
        times = rng.normal(1.0, 0.01, 1000)
        d = summarize(times, 1.0, seed=0, k_steps=1000, steps_per_allocation=10)
        ratios.append((d.k_steps_bound_s - d.k_steps_mean_s) / (Z95 * np.sqrt(1000) * 0.01))
    assert 1.0 < min(ratios) and max(ratios) < 10.0


def test_no_variability_bounds_k_steps_by_k_deterministic_steps():
    d = summarize(np.full(200, 2.5), 2.5, seed=0, k_steps=1000, steps_per_allocation=10)
    assert d.k_steps_bound_s == 2500.0
    assert d.allocation_std_s == 0 and d.within_allocation_std_s == 0


def test_a_shorter_last_allocation_takes_its_part_in_the_split():
    rng = np.random.default_rng(3)
    means = rng.normal(5.0, 0.05, 301)
    steps = np.repeat(means, 10)[:3005] + rng.normal(0, 0.1, 3005)  # the last allocation: 5
    d = summarize(steps, 5.0, seed=0, steps_per_allocation=10)
    assert d.allocations == 301 and d.samples == 3005
    assert d.within_allocation_std_s == pytest.approx(0.1, rel=0.05)
    assert d.allocation_std_s == pytest.approx(0.05, rel=0.15)


@pytest.mark.parametrize(
    ("samples", "steps", "message"),
    [
        (190, 10, "samples=190 makes 19 allocation.s. of steps_per_allocation=10"),
        (10, 0, "steps_per_allocation=0 must be an int >= 1"),
    ],
)
def test_fewer_than_min_allocations_or_a_bad_s_is_refused(samples, steps, message):
    with pytest.raises(ValueError, match=message):
        check_allocations(samples, steps)
    with pytest.raises(ValueError, match=message):
        summarize(np.ones(samples), 1.0, seed=0, steps_per_allocation=steps)


def test_more_samples_than_the_maximum_are_refused_before_any_draw():
    check_allocations(MAX_SAMPLES, 10)
    with pytest.raises(ValueError, match=f"--samples={MAX_SAMPLES + 1:,}: at most {MAX_SAMPLES:,} samples"):
        check_allocations(MAX_SAMPLES + 1, 10, samples_name="--samples")


@pytest.mark.parametrize("steps", [1, 10])
def test_a_k_beyond_int64_is_bounded_as_a_float_not_refused_by_numpy(steps):
    # numpy has no sqrt for a Python int past int64; the bound scales as K for a huge K
    times = np.random.default_rng(1).normal(2.0, 0.1, 1000)
    k = 10**21
    d = summarize(times, 2.0, seed=0, k_steps=k, steps_per_allocation=steps)
    assert d.k_steps == k and d.k_steps_mean_s == pytest.approx(k * times.mean())
    assert d.k_steps_bound_s == pytest.approx(k * times.mean(), rel=0.05)
    assert d.k_steps_bound_s >= d.k_steps_mean_s
