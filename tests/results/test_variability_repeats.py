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
