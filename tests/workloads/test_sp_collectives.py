"""Megatron's sequence-parallel collectives (`kernels.sp_collectives = "first-dim"`,
workloads.sp_collectives): captured on a virtual world of tp 2, the same all-gathers and
reduce-scatters as DTensor's, without its copies where a micro-batch is one sequence. Loss
parity of real gloo runs is in test_parallel_parity (the `-sp-first-dim` cases)."""

from collections import Counter

import numpy as np
import pytest

from emulator.capture.trace import COMM, COMPUTE, PHASES
from tests.workloads.sp_jobs import LAYERS, MICRO_BATCHES, capture, sp_job


def job(collectives: str, *, micro_batch=1, sequence_parallel=True):
    return sp_job(
        {"sp_collectives": collectives},
        micro_batch=micro_batch,
        sequence_parallel=sequence_parallel,
    )


def census(spec) -> tuple[Counter, Counter]:
    """(phase, collective, bytes) of every collective; the cats of forward and backward."""
    trace = capture(spec)
    c = trace.columns
    collectives, cats = Counter(), Counter()
    for i in np.flatnonzero(c["kind"] == COMM):
        name = trace.strings[c["name"][i]]
        collectives[(PHASES[c["phase"][i]], name, int(c["size_bytes"][i]))] += 1
    for i in np.flatnonzero(c["kind"] == COMPUTE):
        phase = PHASES[c["phase"][i]]
        if trace.strings[c["aten"][i]] == "aten.cat" and phase in ("forward", "backward"):
            cats[phase] += 1
    return collectives, cats


@pytest.mark.integration
def test_one_sequence_per_micro_batch_gathers_and_scatters_without_copies():
    dtensor_collectives, dtensor_cats = census(job("dtensor"))
    collectives, cats = census(job("first-dim"))
    assert collectives == dtensor_collectives  # the same transfers, of the same sizes
    # DTensor reduce-scatters after wo and w2 and the embedding in forward, and in backward
    # the input gradients of attention, MLP and output layer, each through a copy; only the
    # embedding's (its vocabulary-masked sum stays DTensor's) is left
    assert dtensor_cats == {
        "forward": (2 * LAYERS + 1) * MICRO_BATCHES,
        "backward": (2 * LAYERS + 1) * MICRO_BATCHES,
    }
    assert cats == {"forward": MICRO_BATCHES}


@pytest.mark.integration
@pytest.mark.parametrize(
    "variant", [{"micro_batch": 2}, {"sequence_parallel": False}], ids=["two-sequences", "no-sp"]
)
def test_it_changes_nothing_where_no_copy_free_form_exists(variant):
    assert census(job("first-dim", **variant)) == census(job("dtensor", **variant))
