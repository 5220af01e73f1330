"""The per-launch and per-call host rules side by side (results/calibration/host_per_call.py),
on figures small enough to check by hand."""

import math

import pytest


def figures(forward_sum_us, launches, calls):
    empty = {"intervals": 0, "calls": 0, "sum_us": 0.0}
    one = {"intervals": launches, "calls": calls, "sum_us": forward_sum_us}
    return {"forward": one, "backward": empty, "optimizer": empty}


def test_each_profile_is_predicted_from_the_others_medians(host_per_call):
    per_call = {
        "a": figures(1000.0, 10, 20),  # 100 us a launch, 50 a call
        "b": figures(1200.0, 10, 30),  # 120, 40
        "c": figures(600.0, 10, 10),  # 60, 60: few calls between its launches
    }
    rows = {r["profile"]: r for r in host_per_call.loo_rows(per_call)}
    assert set(rows) == {"a", "b", "c"}  # classes no profile measured give no rows
    c = rows["c"]
    assert c["per_launch_ms"] == pytest.approx(10 * 110 / 1e3)  # median of 100 and 120
    assert c["per_call_ms"] == pytest.approx(10 * 45 / 1e3)  # median of 50 and 40
    assert c["per_call_ln"] == pytest.approx(math.log(450 / 600))
