"""Megatron's sequence-parallel collectives (`kernels.sp_collectives = "first-dim"`,
workloads.sp_collectives): captured on a virtual world of tp 2, the same all-gathers and
reduce-scatters as DTensor's, without its copies. Loss parity of real gloo runs is in
test_parallel_parity (the `-sp-first-dim` cases)."""

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
def test_more_sequences_gather_in_rank_order_and_copy_only_a_tp_th_of_the_width():
    dtensor_collectives, dtensor_cats = census(job("dtensor", micro_batch=2))
    collectives, cats = census(job("first-dim", micro_batch=2))
    assert collectives == dtensor_collectives
    # DTensor: a copy after each gather and before each reduce-scatter of attention and MLP,
    # and at the embedding and output layer, each way; left: the embedding's and the output
    # layer's (whose rows the loss reads in sequence order)
    per_micro_batch = {"forward": 4 * LAYERS + 2, "backward": 4 * LAYERS + 2}
    assert dtensor_cats == {k: v * MICRO_BATCHES for k, v in per_micro_batch.items()}
    assert cats == {"forward": 2 * MICRO_BATCHES, "backward": 2 * MICRO_BATCHES}


@pytest.mark.integration
def test_without_sequence_parallelism_it_changes_nothing():
    variant = {"sequence_parallel": False}
    assert census(job("first-dim", **variant)) == census(job("dtensor", **variant))
