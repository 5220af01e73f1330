"""Megatron's sequence-parallel inputs (`kernels.sp_regather`, workloads.sp_regather): captured
on a virtual world of tp 2, the shard is kept and all-gathered again in backward. Loss parity
of real gloo runs is in test_parallel_parity (the `-sp-regather` cases)."""

import numpy as np
import pytest
import torch

from emulator.capture.trace import COMM, COMPUTE, PHASES, WAIT
from tests.workloads.sp_jobs import LAYERS, MICRO_BATCHES, capture, sp_job
from workloads.sp_regather import regather_in_backward


def job(*, regather: bool, recompute="none", sequence_parallel=True, micro_batch=2, **kernels):
    return sp_job(
        {"framework": "megatron", "sp_regather": regather, **kernels},
        micro_batch=micro_batch,
        recompute=recompute,
        sequence_parallel=sequence_parallel,
    )


def gathers_and_peak(spec) -> tuple[dict[str, int], int]:
    trace = capture(spec)
    c = trace.columns
    comm = np.flatnonzero(c["kind"] == COMM)
    gathers = {phase: 0 for phase in PHASES}
    for i in comm:
        if trace.strings[c["name"][i]] == "all_gather":
            gathers[PHASES[c["phase"][i]]] += 1
    return gathers, trace.summary().peak_live_bytes


@pytest.mark.integration
@pytest.mark.parametrize("micro_batch", [1, 2])
def test_the_shard_is_kept_and_gathered_again_in_backward(micro_batch):
    kept, kept_peak = gathers_and_peak(job(regather=False, micro_batch=micro_batch))
    regathered, regathered_peak = gathers_and_peak(job(regather=True, micro_batch=micro_batch))
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


@pytest.mark.integration
@pytest.mark.parametrize(
    "micro_batch, collectives, beside",
    [
        (1, "first-dim", True),
        # slow: two sequences in rank order need no copy either (CI: one sequence, and DTensor's
        # copy of two)
        pytest.param(2, "first-dim", True, marks=pytest.mark.slow),
        (1, "dtensor", True),
        (2, "dtensor", False),
    ],
)
def test_where_no_copy_follows_the_gather_it_runs_beside_the_input_gradient_gemm(
    micro_batch, collectives, beside
):
    # rows in rank order need no copy; DTensor's gather of two sequences ends in one, at once
    trace = capture(job(regather=True, micro_batch=micro_batch, sp_collectives=collectives))
    c = trace.columns
    backward = c["phase"] == PHASES.index("backward")
    rows = np.flatnonzero(backward & np.isin(c["kind"], (COMM, COMPUTE, WAIT)))
    names = [trace.strings[c["name"][r]] for r in rows]
    kinds = c["kind"][rows]
    overlapped = []
    for i in range(len(rows) - 2):
        # the feed-forward's: issued, the input-gradient GEMM, then waited for the weight's
        if names[i] == "all_gather" and trace.strings[c["module"][rows[i]]].endswith(
            "feed_forward"
        ):
            overlapped.append((names[i + 1], kinds[i + 2]) == ("mm", WAIT))
    assert overlapped == [beside] * (LAYERS * MICRO_BATCHES)


def test_a_module_without_a_sequence_parallel_plan_is_refused_when_it_runs():
    linear = torch.nn.Linear(4, 4)
    regather_in_backward(linear)
    with pytest.raises(TypeError, match="needs DTensor inputs before and after"):
        linear(torch.randn(2, 4))
