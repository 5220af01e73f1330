"""The scoring of predicted step times against repeated GPU iterations
(results/fidelity/variability_repeats.py), on synthetic times: no emulation, no GPU."""

import numpy as np
import pytest
from scipy import stats

from tests.results.conftest import load_script

MEASURED_ITERATIONS = 40
PREDICTED_SAMPLES = 2_000


@pytest.fixture(scope="module")
def repeats():
    """results/fidelity/variability_repeats.py: scores the variability model on GPU repeats."""
    return load_script("fidelity/variability_repeats.py")


def lognormal_times(rng, n, median_s=0.08, cv=0.01):
    return median_s * rng.lognormal(0.0, cv, n)


def test_the_same_distribution_scores_about_what_sampling_alone_gives(repeats):
    rng = np.random.default_rng(0)
    score = repeats.score(
        lognormal_times(rng, MEASURED_ITERATIONS), lognormal_times(rng, PREDICTED_SAMPLES)
    )
    assert score.ks_expected == pytest.approx(0.1333, abs=1e-4)  # scipy's kstwo(40).mean()
    # the 99th percentile of the KS statistic under an exact model
    assert score.ks_raw < stats.kstwo(MEASURED_ITERATIONS).ppf(0.99)
    assert score.ks_shape < stats.kstwo(MEASURED_ITERATIONS).ppf(0.99)
    assert score.cv_predicted == pytest.approx(0.01, rel=0.05)
    assert abs(score.p95_error) < 0.01


def test_a_shifted_mean_fails_raw_but_not_over_the_medians(repeats):
    rng = np.random.default_rng(1)
    measured = lognormal_times(rng, MEASURED_ITERATIONS)
    predicted = 1.05 * lognormal_times(rng, PREDICTED_SAMPLES)  # the compute model 5 % slow
    score = repeats.score(measured, predicted)
    assert score.ks_raw > 0.9
    assert score.ks_shape < stats.kstwo(MEASURED_ITERATIONS).ppf(0.99)
    assert score.p95_error == pytest.approx(0.05, abs=0.01)
    assert score.tail_error == pytest.approx(0.0, abs=0.01)


def test_a_too_narrow_spread_fails_over_the_medians_too(repeats):
    rng = np.random.default_rng(2)
    measured = lognormal_times(rng, MEASURED_ITERATIONS, cv=0.02)
    score = repeats.score(measured, lognormal_times(rng, PREDICTED_SAMPLES, cv=0.002))
    assert score.ks_shape > 0.3
    assert score.cv_measured > 5 * score.cv_predicted
    assert score.tail_predicted < score.tail_measured


def test_autocorrelation_sees_a_drift_and_not_independent_noise(repeats):
    rng = np.random.default_rng(3)
    assert abs(repeats.lag1_autocorrelation(rng.standard_normal(1000))) < 0.1
    assert repeats.lag1_autocorrelation(np.linspace(1.0, 2.0, 40)) > 0.9


def test_forty_iterations_cannot_show_a_ks_of_ten_percent(repeats):
    needed = repeats.iterations_for_goal()
    assert needed > MEASURED_ITERATIONS
    assert stats.kstwo(needed).ppf(0.95) <= repeats.KS_GOAL < stats.kstwo(needed - 1).ppf(0.95)


def test_the_95_percent_level_is_kstwos_and_falls_below_the_goal_at_200(repeats):
    assert repeats.ks_level(40) == pytest.approx(stats.kstwo(40).ppf(0.95))
    assert repeats.ks_level(40) > repeats.KS_GOAL > repeats.ks_level(200)


def ar1(rng, n, phi):
    """An AR(1) series of n values with lag-1 autocorrelation phi, around 1."""
    x = np.empty(n)
    x[0] = rng.standard_normal()
    for i in range(1, n):
        x[i] = phi * x[i - 1] + np.sqrt(1 - phi**2) * rng.standard_normal()
    return 1.0 + 0.01 * x


def test_ljung_box_rejects_an_autocorrelated_series_only(repeats):
    rng = np.random.default_rng(4)
    assert repeats.ljung_box_p(1.0 + 0.01 * rng.standard_normal(200)) > 0.01
    assert repeats.ljung_box_p(ar1(rng, 200, 0.5)) < 1e-6


def test_trend_sees_a_drift_over_the_run(repeats):
    rng = np.random.default_rng(5)
    noise = 0.01 * rng.standard_normal(200)
    rho, p = repeats.trend(1.0 + noise)
    assert abs(rho) < 0.2 and p > 0.01
    rho, p = repeats.trend(np.linspace(1.0, 1.02, 200) + noise)
    assert rho > 0.5 and p < 1e-6


def test_block_resamples_keep_runs_of_consecutive_iterations(repeats):
    times = np.arange(100)
    series = repeats.block_resamples(times, 10, 50, np.random.default_rng(6))
    assert series.shape == (50, 100)
    blocks = series.reshape(50, 10, 10)
    assert (np.diff(blocks, axis=2) == 1).all()  # each block: 10 consecutive iterations


def test_the_dependent_level_is_kstwos_for_independent_iterations_and_more_for_ar1(repeats):
    rng = np.random.default_rng(7)
    independent = repeats.ks_level_dependent(rng.standard_normal(200), seed=0)
    assert independent == pytest.approx(repeats.ks_level(200), abs=0.02)
    # lag-1 autocorrelation 0.8: the true 95 % level is about 0.19 (simulated AR(1) series)
    assert repeats.ks_level_dependent(ar1(rng, 200, 0.8), seed=0) > 1.3 * repeats.ks_level(200)


def test_the_p95_interval_holds_the_measured_p95(repeats):
    times = lognormal_times(np.random.default_rng(8), 200)
    low, high = repeats.p95_interval(times, seed=0)
    assert low < np.percentile(times, 95) < high


def test_the_fitted_step_cv_takes_the_kernel_noise_out(repeats):
    rng = np.random.default_rng(9)
    times = 1.0 + 0.005 * rng.standard_normal(10_000)  # CV 0.5 %
    assert repeats.fitted_step_cv(times, 0.003) == pytest.approx(0.004, rel=0.05)
    assert repeats.fitted_step_cv(times, 0.006) == 0.0  # kernel noise alone is wider


def test_the_goals_hold_both_ways(repeats):
    assert repeats.met(-0.049, repeats.P95_GOAL) == "yes"
    assert repeats.met(-0.051, repeats.P95_GOAL) == "no"
    assert repeats.met(0.10, repeats.KS_GOAL) == "yes"


def test_every_default_recording_is_its_recorded_baselines_job(repeats):
    paths = [p for folder in repeats.REPEATS for p in sorted(folder.glob("repeat_*.json"))]
    loaded = [repeats.load_repeat(p) for p in paths]
    assert len(loaded) == 6
    long = [r for r in loaded if len(r.times_s) >= repeats.iterations_for_goal()]
    assert [(r.case, r.session, len(r.times_s)) for r in long] == [
        ("gpt3-125m-s2048-mb8-none", "h200-2026-11-30", 200),
        ("llama3-8b-l2-s8192-mb2-none", "h200-2026-11-30", 200),
    ]


def test_the_bulks_cv_is_a_normals_and_ignores_a_few_slow_iterations(repeats):
    times = 1.0 + 0.01 * np.random.default_rng(10).standard_normal(10_000)
    assert repeats.iqr_cv(times) == pytest.approx(0.01, rel=0.05)
    times[:50] = 1.5  # 0.5 % of the iterations 50 % slow
    assert repeats.iqr_cv(times) == pytest.approx(0.01, rel=0.05)
    assert repeats.cv(times) > 3 * 0.01
