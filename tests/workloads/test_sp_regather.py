"""Megatron's sequence-parallel inputs (`kernels.sp_regather`, workloads.sp_regather): captured
on a virtual world of tp 2, the shard is kept and all-gathered again in backward. Loss parity
of real gloo runs is in test_parallel_parity (the `-sp-regather` cases)."""

import numpy as np
import pytest

from emulator.capture.trace import COMM, PHASES
from prismbench.capture import capture_job
from prismbench.spec import job_spec_from_dict

LAYERS = 2
MICRO_BATCHES = 2


def job(*, regather: bool, recompute: str = "none", sequence_parallel: bool = True):
    return job_spec_from_dict(
        {
            "model": {"name": "gpt-debug", "layers": LAYERS},
            "parallel": {"tp": 2, "sequence_parallel": sequence_parallel},
            "batch": {"seq_len": 64, "micro_batch": 2, "global_batch": 2 * MICRO_BATCHES},
            "train": {"precision": "bf16", "recompute": recompute},
            "kernels": {"framework": "megatron", "sp_regather": regather},
        }
    )


def gathers_and_peak(spec) -> tuple[dict[str, int], int]:
    trace = capture_job(spec, use_cache=False, workers=1).traces[0]
    c = trace.columns
    comm = np.flatnonzero(c["kind"] == COMM)
    gathers = {phase: 0 for phase in PHASES}
    for i in comm:
        if trace.strings[c["name"][i]] == "all_gather":
            gathers[PHASES[c["phase"][i]]] += 1
    return gathers, trace.summary().peak_live_bytes


@pytest.mark.integration
def test_the_shard_is_kept_and_gathered_again_in_backward():
    kept, kept_peak = gathers_and_peak(job(regather=False))
    regathered, regathered_peak = gathers_and_peak(job(regather=True))
    # one more all-gather per attention, MLP and output layer of each micro-batch
    assert regathered["backward"] - kept["backward"] == (2 * LAYERS + 1) * MICRO_BATCHES
    assert regathered["forward"] == kept["forward"]
    assert regathered_peak < kept_peak  # the gathered inputs are not kept for backward


@pytest.mark.integration
@pytest.mark.parametrize(
    "variant", [{"recompute": "full"}, {"sequence_parallel": False}], ids=["full", "no-sp"]
)
def test_it_changes_nothing_where_nothing_gathered_is_kept(variant):
    assert gathers_and_peak(job(regather=True, **variant)) == gathers_and_peak(
        job(regather=False, **variant)
    )
