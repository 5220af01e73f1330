"""Otsu splits: pipeline bubble / no-bubble transfers and the network's regimes."""

import numpy as np
import pytest

from emulator.variability.regimes import (
    estimate_network_regimes,
    otsu_threshold,
    split_pipeline_transfers,
)


def test_otsu_cuts_between_two_modes():
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.normal(1.0, 0.05, 300), rng.normal(3.0, 0.1, 100)])
    cut = otsu_threshold(values)
    assert 1.3 < cut < 2.7
    assert otsu_threshold([2.0, 2.0, 2.0]) == 2.0


def test_pipeline_transfers_split_into_no_bubble_and_bubble():
    # 80 % of recvs find the data there (1 ms transfer), 20 % wait ~5 ms more for the peer.
    rng = np.random.default_rng(1)
    fast = rng.normal(1e-3, 2e-5, 400)
    slow = 1e-3 + rng.normal(5e-3, 5e-4, 100)
    regimes = split_pipeline_transfers(np.concatenate([fast, slow]))
    assert regimes.bubble_fraction == pytest.approx(0.2)
    assert regimes.no_bubble.mean == pytest.approx(1e-3, rel=0.01)
    assert regimes.bubble.mean == pytest.approx(6e-3, rel=0.02)


def test_network_regimes_recovered_from_step_factors():
    rng = np.random.default_rng(2)
    nominal = rng.normal(1.0, 0.01, 900)
    congested = rng.normal(1.5, 0.02, 100)
    regimes = estimate_network_regimes(np.concatenate([nominal, congested]))
    assert [r.probability for r in regimes] == pytest.approx([0.9, 0.1])
    assert regimes[0].factor == 1.0
    assert regimes[1].factor == pytest.approx(1.5, rel=0.01)
    assert len(estimate_network_regimes([1.0] * 10)) == 1
