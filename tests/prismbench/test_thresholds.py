"""Tests for prismbench/thresholds.py: the threshold grammar shared by gate and validate."""

import pytest

from prismbench.thresholds import Threshold, field_value, numeric_fields, parse_thresholds
from workloads.config import SpecError


def test_parses_signed_and_absolute_bounds():
    parsed = parse_thresholds("iteration_time_s:+2%, tokens_per_s:-1.5%,breakdown.compute_s:5%")
    assert parsed == [
        Threshold("iteration_time_s", "+", 2.0),
        Threshold("tokens_per_s", "-", 1.5),
        Threshold("breakdown.compute_s", "", 5.0),
    ]
    assert str(parsed[1]) == "tokens_per_s:-1.5%"


@pytest.mark.parametrize(
    "text",
    ["", "iteration_time_s", "iteration_time_s:2", "x:+2 %", "1x:2%", "iteration_time_s:+2%,", ",,"],
)
def test_malformed_items_are_named(text):
    with pytest.raises(SpecError, match="--fail"):
        parse_thresholds(text)


def test_a_signed_bound_only_fails_in_its_direction():
    rise, fall, either = Threshold("f", "+", 2), Threshold("f", "-", 2), Threshold("f", "", 2)
    assert rise.crossed(0.021) and not rise.crossed(-0.5)
    assert fall.crossed(-0.021) and not fall.crossed(0.5)
    assert either.crossed(0.021) and either.crossed(-0.021) and not either.crossed(0.02)


def test_a_change_that_is_no_number_breaks_every_bound():
    for bound in (Threshold("f", "+", 2), Threshold("f", "-", 2), Threshold("f", "", 2)):
        assert bound.crossed(float("nan"))
        assert bound.crossed(float("inf"), slack_below=1.0, slack_above=1.0)


def test_a_bound_widens_by_its_own_side_s_slack():
    # the measured iterations reached 1 % below their median and 5 % above
    slack = dict(slack_below=0.01, slack_above=0.05)
    either, rise, fall = Threshold("f", "", 2), Threshold("f", "+", 2), Threshold("f", "-", 2)
    assert not either.crossed(0.069, **slack) and either.crossed(0.071, **slack)
    assert not either.crossed(-0.029, **slack) and either.crossed(-0.031, **slack)
    assert not rise.crossed(0.069, **slack) and fall.crossed(-0.031, **slack)


def test_field_values_follow_dots_and_name_what_exists():
    result = {"iteration_time_s": 1.5, "oom": False, "breakdown": {"compute_s": 1.0}, "job": "x"}
    assert field_value(result, "breakdown.compute_s", where="a") == 1.0
    assert numeric_fields(result) == ["iteration_time_s", "breakdown.compute_s"]
    with pytest.raises(SpecError, match="no numeric field 'iteration_s'; known: breakdown"):
        field_value(result, "iteration_s", where="a")
    with pytest.raises(SpecError, match="is str, not a number"):
        field_value(result, "job", where="a")
