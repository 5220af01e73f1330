"""Estimating temporal variation from repeated durations (emulator/variability/calibration.py)."""

import numpy as np
import pytest

from emulator.variability.calibration import (
    estimate_kernel_noise,
    expected_range,
    fit_signatures,
    iteration_kernel_cv,
    range_density,
    range_to_std,
    step_cv_dispersion_of,
    step_cv_of,
)
from emulator.variability.model import VariabilityModel, noise_class


def test_expected_range_matches_the_closed_form_and_tippetts_table():
    assert expected_range(2) == pytest.approx(2 / np.sqrt(np.pi), rel=1e-9)
    assert expected_range(8) == pytest.approx(2.847, abs=5e-4)


def test_range_to_std_refuses_an_inverted_range():
    assert range_to_std(1.0, 1.0 + 2.847, 8) == pytest.approx(1.0, rel=1e-3)
    with pytest.raises(ValueError, match="max_s"):
        range_to_std(2.0, 1.0, 8)


def _pools(rng, cv, floor_s):
    """Pools drawn from the model: short kernels (2 us) and long GEMMs and copies."""
    pools = {}
    for i, (klass, mean) in enumerate(
        [("memory", 2e-6)] * 6 + [("gemm", 100e-6)] * 6 + [("memory", 50e-6)] * 6
    ):
        std = np.hypot(cv[klass] * mean, floor_s)
        pools[("op", i)] = (klass, mean + std * rng.standard_normal(400))
    return pools


def test_estimate_recovers_the_floor_and_class_cvs_it_was_drawn_from():
    cv = {"gemm": 0.02, "memory": 0.01}
    noise = estimate_kernel_noise(fit_signatures(_pools(np.random.default_rng(0), cv, 1.5e-7)))
    assert noise.floor_s == pytest.approx(1.5e-7, rel=0.1)
    assert noise.cv_by_class == pytest.approx(cv, rel=0.1)
    assert noise.pools_by_class == {"gemm": 6, "memory": 6}
    assert noise.short_pools == 6


def test_pools_too_small_to_fit_are_left_out():
    fits = fit_signatures(
        {"small": ("gemm", [1.0, 1.1, 0.9]), "big": ("gemm", np.linspace(1, 2, 8))}
    )
    assert [f.signature for f in fits] == ["big"]


def test_without_short_pools_the_floor_is_not_guessed():
    fits = fit_signatures({"g": ("gemm", np.linspace(100e-6, 110e-6, 10))})
    with pytest.raises(ValueError, match="floor"):
        estimate_kernel_noise(fits)


def test_independent_kernels_average_out_and_the_step_cv_is_the_rest():
    noise = estimate_kernel_noise(
        fit_signatures(_pools(np.random.default_rng(1), {"gemm": 0.02, "memory": 0.02}, 0.0))
    )
    # 100 equal GEMMs of 2 % each: the sum varies by 2 % / sqrt(100)
    cv = iteration_kernel_cv(np.full(100, 1e-3), ["gemm"] * 100, noise)
    assert cv == pytest.approx(0.002, rel=0.1)
    assert step_cv_of(0.005, 0.003) == pytest.approx(0.004)
    assert step_cv_of(0.002, 0.003) == 0.0


def test_model_spreads_follow_each_ops_class_and_the_floor():
    model = VariabilityModel(
        spatial_cv=0.0,
        temporal_cv=0.05,
        collective_cv=0.0,
        temporal_cv_by_class={"gemm": 0.01},
        temporal_floor_s=1e-6,
    )
    spreads = model.temporal_spreads_s([1e-3, 1e-3, 1e-7, 0.0], ["mm", "elementwise", "norm", "mm"])
    assert spreads == pytest.approx(
        [np.hypot(1e-5, 1e-6), np.hypot(5e-5, 1e-6), np.hypot(5e-9, 1e-6), 0.0]
    )
    assert noise_class("scaled_mm") == "gemm" and noise_class("flash_attn_bwd") == "attention"


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("temporal_cv_by_class", {"gemmz": 0.01}, "not one of"),
        ("temporal_cv_by_class", {"gemm": 0.5}, "must be in"),
        ("temporal_floor_s", -1.0, ">= 0"),
        ("step_cv", -0.1, ">= 0"),
        ("step_cv_dispersion", -0.1, "must be in"),
        ("step_cv_dispersion", 3.5, "must be in"),
    ],
)
def test_model_refuses_bad_measured_figures(field, value, message):
    with pytest.raises(ValueError, match=message):
        VariabilityModel(spatial_cv=0.0, temporal_cv=0.0, collective_cv=0.0, **{field: value})


def test_a_step_cv_is_not_kernel_noise():
    # a per-step factor on every rank (emulator.variability.monte_carlo), not per segment
    model = VariabilityModel(spatial_cv=0.0, temporal_cv=0.0, collective_cv=0.0, step_cv=0.01)
    assert not model.has_kernel_noise


def test_the_range_density_integrates_to_one_with_mean_d2():
    w = np.linspace(0.0, 12.0, 4001)
    density = range_density(w, 8)
    assert np.trapezoid(density, w) == pytest.approx(1.0, abs=1e-6)
    assert np.trapezoid(w * density, w) == pytest.approx(expected_range(8), rel=1e-6)


# ~20 s each on 2 cores (the likelihood integrates 12 000 range densities per evaluation): CI
# recovers a spread, `slow` the edge where there is none
@pytest.mark.parametrize("dispersion", [pytest.param(0.0, marks=pytest.mark.slow), 0.8])
def test_the_dispersion_of_the_step_cv_is_recovered_from_ranges_of_eight(dispersion):
    # 300 runs of 8 iterations, each with its own step CV (median 1 %) and 0.2 % kernel noise:
    # the maximum likelihood recovers the spread asked for from the ranges alone.
    rng = np.random.default_rng(11)
    run_cvs = 0.01 * np.exp(dispersion * rng.standard_normal(300))
    cvs = np.hypot(run_cvs, 0.002)
    iterations = 1.0 + cvs[:, None] * rng.standard_normal((300, 8))
    ranges = np.ptp(iterations, axis=1) / np.median(iterations, axis=1)
    fitted = step_cv_dispersion_of(ranges, [8] * 300, [0.002] * 300, step_cv=0.01)
    # near 0 the estimate of a spread is ~0.1 from sampling alone (its square's error, 300 runs)
    assert fitted == pytest.approx(dispersion, abs=0.15)


def test_no_step_cv_has_no_dispersion_and_bad_inputs_are_refused():
    assert step_cv_dispersion_of([0.01, 0.02], [8, 8], [0.002, 0.002], step_cv=0.0) == 0.0
    with pytest.raises(ValueError, match="one range, count and kernel CV per job"):
        step_cv_dispersion_of([0.01, 0.02], [8], [0.002, 0.002], step_cv=0.01)
    with pytest.raises(ValueError, match=">= 0"):
        step_cv_dispersion_of([-0.01], [8], [0.002], step_cv=0.01)
