"""The per-launch and per-call host figures side by side (results/calibration/host_per_call.py):
the medians it predicts each profile from, on figures small enough to check by hand."""

import statistics

import pytest


def figures(sum_us, launches, calls):
    empty = {"intervals": 0, "calls": 0, "sum_us": 0.0}
    one = {"intervals": launches, "calls": calls, "sum_us": sum_us}
    return {"forward": one, "backward": empty, "optimizer": empty}


def test_a_profile_is_predicted_from_the_other_profiles_medians(host_per_call):
    profiles = {
        "a": figures(1000.0, 10, 20),  # 100 us a launch, 50 a call
        "b": figures(1200.0, 10, 30),  # 120, 40
        "c": figures(600.0, 10, 10),  # 60, 60: few calls between its launches
    }
    assert host_per_call.medians(profiles, "forward", skip="c") == pytest.approx((110.0, 45.0))
    assert host_per_call.medians(profiles, "forward") == pytest.approx((100.0, 50.0))
    with pytest.raises(statistics.StatisticsError):
        host_per_call.medians(profiles, "backward")  # no profile measured the class
