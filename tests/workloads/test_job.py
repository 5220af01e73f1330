"""The job's sections (workloads.job): each refuses a value of the wrong kind by name."""

import pytest

from workloads.config import SpecError
from workloads.job import ParallelSpec


@pytest.mark.parametrize("zero", [True, 1.0])
def test_zero_stage_is_an_integer_not_a_boolean_or_a_float(zero):
    # True == 1 == 1.0 in Python: both ran as ZeRO-1 until the stage's type was checked too
    with pytest.raises(SpecError, match=rf"parallel.zero={zero!r} must be one of \[0, 1, 2, 3\]"):
        ParallelSpec(dp=8, zero=zero)
    assert ParallelSpec(dp=8, zero=1).zero == 1
