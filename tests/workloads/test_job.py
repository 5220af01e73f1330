"""The job's sections (workloads.job): each refuses a value of the wrong kind by name."""

import pytest

from prismbench.spec import job_spec_from_dict
from workloads.config import SpecError
from workloads.job import ParallelSpec


@pytest.mark.parametrize("zero", [True, 1.0])
def test_zero_stage_is_an_integer_not_a_boolean_or_a_float(zero):
    # True == 1 == 1.0 in Python: both ran as ZeRO-1 until the stage's type was checked too
    with pytest.raises(SpecError, match=rf"parallel.zero={zero!r} must be one of \[0, 1, 2, 3\]"):
        ParallelSpec(dp=8, zero=zero)
    assert ParallelSpec(dp=8, zero=1).zero == 1


@pytest.mark.parametrize("recompute", ["full", "selective"])
def test_zero_bubble_with_recompute_is_refused_naming_both_fields(recompute):
    # the real program fails at its first weight-gradient step (torch's composable checkpoint
    # recomputes in a context the split backward enters twice): refused before anything runs
    spec = {
        "model": {"name": "gpt-debug"},
        "parallel": {"pp": 2, "schedule": "zero-bubble"},
        "batch": {"seq_len": 32, "global_batch": 4},
    }
    with pytest.raises(SpecError, match="parallel.schedule='zero-bubble' needs train.recompute"):
        job_spec_from_dict(spec | {"train": {"recompute": recompute}})
    assert job_spec_from_dict(spec).train.recompute == "none"


def test_zero_bubble_with_resharding_fsdp_is_refused_naming_fsdp_reshard():
    # the split backward computed no weight gradient for parameters FSDP resharded after
    # forward: the last stage of this job never reduced its gradients nor stepped
    spec = {
        "model": {"name": "llama-debug"},
        "parallel": {"pp": 2, "dp": 2, "zero": 3, "schedule": "zero-bubble"},
        "batch": {"seq_len": 32, "global_batch": 4},
    }
    with pytest.raises(SpecError, match="needs kernels.fsdp_reshard='none' \\(is 'all'\\)"):
        job_spec_from_dict(spec)
    kept_gathered = job_spec_from_dict(spec | {"kernels": {"fsdp_reshard": "none"}})
    assert kept_gathered.kernels.fsdp_reshard == "none"
