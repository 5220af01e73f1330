"""Tests for emulator/variability/distributions.py on synthetic durations (seeded)."""

import numpy as np
import pytest

from emulator.variability.distributions import fit_durations, from_moments

RNG = np.random.default_rng(0)


@pytest.mark.parametrize(
    ("family", "draw"),
    [
        ("normal", lambda n: RNG.normal(1e-3, 2e-4, n)),  # at 2 % spread the three look alike
        ("gamma", lambda n: RNG.gamma(2.0, 5e-4, n)),
        ("lognormal", lambda n: RNG.lognormal(np.log(1e-3), 0.6, n)),
    ],
)
def test_the_family_that_drew_the_samples_fits_best(family, draw):
    fitted = fit_durations(draw(4000))
    assert fitted.family == family
    assert fitted.ks_statistic < 0.03 and fitted.samples == 4000


def test_moments_are_kept_and_sampling_is_reproducible():
    for family in ("normal", "gamma", "lognormal"):
        d = from_moments(2e-3, 1e-4, family)
        assert d.mean == pytest.approx(2e-3) and d.std == pytest.approx(1e-4)
        a = d.sample(np.random.default_rng(7), 5)
        assert np.array_equal(a, d.sample(np.random.default_rng(7), 5))


def test_refuses_what_cannot_be_fitted():
    with pytest.raises(ValueError, match="at least 8"):
        fit_durations([1e-3] * 3)
    with pytest.raises(ValueError, match="> 0"):
        fit_durations([1e-3] * 7 + [-1e-3])
    assert fit_durations([1e-3] * 8).std == 0.0
