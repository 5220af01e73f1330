"""Tests for emulator/capture/micro_batch_reuse.py on the real workload: gradient accumulation
without pipelining, captured with reused micro-batches and with every micro-batch run.

Event for event (ops, shapes, collectives and their waits, stream records and waits, storage
pairing, categories, phases), the reused trace is the full one; the emulated iteration time
and peak memory follow. Jobs are debug flavors (4 layers, hidden 64), captured in this process.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest

from emulator.capture import rank as capture_rank_module
from emulator.capture.chunk_reuse import ChunkReuseError
from emulator.capture.rank import capture_rank
from prismbench.capture import world_of
from prismbench.emulate import emulate
from prismbench.program import rank_program
from tests.cases import case_params
from tests.prismbench.capture_cases import debug_job, first_difference, normalised
from workloads.kernels import KernelsSpec

# (parallel, train, model, micro-batches, micro-batches stood in for): the first runs (it
# allocates what the others accumulate into), the second is the template; the last runs too
# where the template fired the program's post-accumulate-grad hooks (workloads.zero's buckets)
CASES = {
    "fsdp-zero3": ({"dp": 2, "zero": 3}, {}, "llama-debug", 4, 2),
    "fsdp-zero2-gpt-full-recompute": (
        {"dp": 2, "zero": 2},
        {"recompute": "full"},
        "gpt-debug",
        4,
        2,
    ),
    "ddp-zero0": ({"dp": 2}, {}, "gpt-debug", 5, 2),
    "zero1-cp": ({"dp": 2, "cp": 2, "zero": 1}, {}, "llama-debug", 4, 1),
    "tp-fsdp": ({"dp": 2, "tp": 2, "zero": 3}, {}, "llama-debug", 4, 2),
    "tp-zero1": ({"dp": 2, "tp": 2, "zero": 1}, {}, "gpt-debug", 4, 1),
}
# CI runs FSDP under tp (tp-fsdp) and zero 1 under cp (zero1-cp); these are the same mechanisms
# on one axis fewer
SLOW_CASES = {"fsdp-zero3", "tp-zero1"}


def _job(parallel, train, model, micro_batches):
    return debug_job(
        parallel, model=model, train=train, global_batch=parallel.get("dp", 1) * micro_batches
    )


def _same_traces(job, program=rank_program) -> None:
    world = world_of(job)
    (class_id,) = world.classes()
    rank = world.representative(class_id)
    reused = capture_rank(rank, world.world_size, program(job))
    full = capture_rank(rank, world.world_size, program(job), reuse_chunks=False)
    difference = first_difference(normalised(reused, world, rank), normalised(full, world, rank))
    assert difference is None


@pytest.mark.integration
@pytest.mark.parametrize("case", case_params(CASES, SLOW_CASES))
def test_reused_micro_batches_give_the_trace_every_micro_batch_gives(case, stand_ins):
    parallel, train, model, micro_batches, stood_in = CASES[case]
    _same_traces(_job(parallel, train, model, micro_batches))
    assert stand_ins["n"] == stood_in


def test_two_or_three_micro_batches_are_all_run(stand_ins):
    # the first allocates, the second is the template, a DDP last one launches the buckets
    _same_traces(_job({"dp": 2}, {}, "gpt-debug", 3))
    assert stand_ins["n"] == 0


def _syncing_only_the_last(job, *, before="forward"):
    """The workload with FSDP2's gradient reduction off but in the last micro-batch (what
    `no_sync`-style accumulation does), set before each micro-batch's `before` step (as the
    loop would, outside the steps capture stands in for): the last backward differs."""
    program = rank_program(job)
    n = job.num_microbatches

    def step(built, phase):
        state = built[0]
        original, seen = getattr(state, before), {"n": 0}

        def syncing(*args):
            state.parts[0].set_requires_gradient_sync(seen["n"] == n - 1)
            seen["n"] += 1
            return original(*args)

        setattr(state, before, syncing)
        try:
            program.step(built, phase)
        finally:
            setattr(state, before, original)

    return dataclasses.replace(program, step=step)


@pytest.mark.integration
def test_a_micro_batch_whose_fsdp_flags_differ_from_the_template_runs(stand_ins):
    job = _job({"dp": 2, "zero": 3}, {}, "llama-debug", 5)
    _same_traces(job, _syncing_only_the_last)
    assert stand_ins["n"] == 2  # micro-batches 2 and 3; the last one reduces, and runs


def test_flags_changed_after_a_stood_in_forward_refuse_the_capture(stand_ins):
    # the last forward is stood in for (FSDP2's flags were the template's); the flags then
    # change before its backward: too late to run it, so the capture must be taken again
    job = _job({"dp": 2, "zero": 3}, {}, "llama-debug", 4)
    program = functools.partial(_syncing_only_the_last, before="backward")
    world = world_of(job)
    with pytest.raises(ChunkReuseError, match="flags changed"):
        capture_rank(0, world.world_size, program(job))
    assert stand_ins["n"] == 2
    capture_rank(0, world.world_size, program(job), reuse_chunks=False)  # the caller's fallback


@pytest.mark.integration
def test_reuse_leaves_the_emulated_time_and_memory_unchanged(tmp_path, monkeypatch, stand_ins):
    monkeypatch.setenv("PRISMBENCH_CACHE", str(tmp_path / "cache"))
    job = _job({"dp": 2, "zero": 3}, {}, "llama-debug", 6)
    reused = emulate(job, workers=1, use_cache=False)
    assert stand_ins["n"] == 4
    monkeypatch.setattr(
        capture_rank_module,
        "capture_rank",
        functools.partial(capture_rank_module.capture_rank, reuse_chunks=False),
    )
    full = emulate(job, workers=1, use_cache=False)
    assert stand_ins["n"] == 4
    assert reused.iteration_time_s == full.iteration_time_s
    assert reused.peak_memory_allocated_bytes == full.peak_memory_allocated_bytes
    assert reused.peak_memory_reserved_bytes == full.peak_memory_reserved_bytes
    assert reused.per_class == full.per_class


@pytest.mark.integration
def test_a_compiled_job_fuses_reused_micro_batches_as_it_fuses_run_ones(stand_ins):
    """Fusion needs each row's storage ids: copies of a template carry them, remapped."""
    job = _job({"dp": 2, "tp": 2, "zero": 1}, {}, "llama-debug", 4)
    job = dataclasses.replace(job, kernels=KernelsSpec(compile=True))
    _same_traces(job)
    assert stand_ins["n"] == 1
