"""Chunk reuse (emulator/capture/chunk_reuse.py) for Megatron's 1F1B (workloads/megatron_schedule.py).

A stage's first forward and backward are recorded and copied for every micro-batch but the
last; the receive buffers, sends and loss around them run for real. Event for event (ops,
collectives, p2p and their waits, storage pairing, categories, phases, micro-batches), the
reused trace must be the one running every chunk records, with fewer, as many and more
micro-batches than stages. Jobs are debug flavors (4 layers, hidden 64), captured in this
process.
"""

from __future__ import annotations

import pytest

from emulator.capture.chunk_reuse import ChunkReuse, ChunkReuseError
from emulator.capture.rank import capture_rank
from prismbench.capture import capture_job, world_of
from prismbench.program import rank_program
from prismbench.spec import job_spec_from_dict
from tests.cases import case_params
from tests.prismbench.capture_cases import first_difference, normalised

LLAMA, GPT = {"name": "llama-debug"}, {"name": "gpt-debug"}
LLAMA_8 = {**LLAMA, "layers": 8}
INTERLEAVED = {"pp": 2, "vpp": 2, "schedule": "interleaved-1f1b"}
# name: (model, parallel, micro-batches per pipeline)
CASES = {
    "pp2-m1": (LLAMA, {"pp": 2}, 1),
    "pp2-m2": (LLAMA, {"pp": 2}, 2),
    "pp2-m6": (LLAMA, {"pp": 2}, 6),
    "pp4-m2": (LLAMA, {"pp": 4}, 2),
    "pp4-m4": (LLAMA, {"pp": 4}, 4),
    "pp4-m8": (LLAMA, {"pp": 4}, 8),
    "pp2-dp2-zero0-gpt-tied": (GPT, {"pp": 2, "dp": 2}, 5),
    "pp4-dp2-zero1": (LLAMA, {"pp": 4, "dp": 2, "zero": 1}, 6),
    "pp2-tp2-sp": (LLAMA, {"pp": 2, "tp": 2}, 5),
    "pp2-cp2-zero1-gpt-tied": (GPT, {"pp": 2, "cp": 2, "dp": 2, "zero": 1}, 4),
    "pp2-full-recompute": (GPT, {"pp": 2}, 4),
    # FSDP2 records stream events, which a chunk's copy does not replay: every chunk runs
    "pp2-dp2-zero3": (LLAMA, {"pp": 2, "dp": 2, "zero": 3}, 4),
    # Megatron's interleaved 1F1B: each model chunk has templates of its own
    "pp2-vpp2-m2": (LLAMA, INTERLEAVED, 2),
    "pp2-vpp2-m6": (LLAMA, INTERLEAVED, 6),
    "pp4-vpp2-m8-dp2-zero1": (LLAMA_8, {**INTERLEAVED, "pp": 4, "dp": 2, "zero": 1}, 8),
    "pp2-vpp2-tp2-m4-gpt-tied": (GPT, {**INTERLEAVED, "tp": 2}, 4),
}
# CI runs fewer (pp2-m1), more (pp4-m8) micro-batches than stages, each other axis and the
# interleaved schedule once; these repeat a case it runs with other counts or another dp layout
SLOW_CASES = {
    "pp2-m2",
    "pp2-m6",
    "pp4-m2",
    "pp4-m4",
    "pp2-dp2-zero0-gpt-tied",
    "pp4-dp2-zero1",
    "pp2-vpp2-m6",
    "pp4-vpp2-m8-dp2-zero1",
}


def make_job(model: dict, parallel: dict, micro_batches: int, train: dict | None = None):
    return job_spec_from_dict(
        {
            "model": model,
            "parallel": parallel,
            "batch": {
                "seq_len": 32,
                "micro_batch": 1,
                "global_batch": parallel.get("dp", 1) * micro_batches,
            },
            "train": train or {},
            "kernels": {"pipeline_recv": "per-transfer"},
        }
    )


@pytest.mark.integration
@pytest.mark.parametrize("case", case_params(CASES, SLOW_CASES))
def test_reused_chunks_give_the_trace_every_chunk_gives(case, stub_count):
    model, parallel, micro_batches = CASES[case]
    train = {"recompute": "full"} if case.endswith("full-recompute") else {}
    job = make_job(model, parallel, micro_batches, train)
    world = world_of(job)
    for class_id in world.classes():
        rank = world.representative(class_id)
        reused = capture_rank(rank, world.world_size, rank_program(job))
        full = capture_rank(rank, world.world_size, rank_program(job), reuse_chunks=False)
        difference = first_difference(
            normalised(reused, world, rank), normalised(full, world, rank)
        )
        assert difference is None, (class_id, difference)
    # a stub stands for each forward of a model chunk but the first (the template) and the
    # last (its backward completes the gradient buckets); a class holds vpp chunks
    stubs = 0 if parallel.get("zero") == 3 else max(0, micro_batches - 2)
    assert stub_count["n"] == stubs * parallel.get("vpp", 1) * len(world.classes())


def test_each_chunk_is_marked_with_its_own_micro_batch():
    # Megatron's 1F1B runs a backward between later forwards: the backward's rows belong to
    # the micro-batch it differentiates, not to the last one that went forward
    import numpy as np

    from emulator.capture.trace import COMPUTE, PHASES

    job = make_job(LLAMA, {"pp": 4}, 6)
    world = world_of(job)
    trace = capture_rank(world.representative(0), world.world_size, rank_program(job))
    c = trace.columns
    backward = (c["kind"] == COMPUTE) & (c["phase"] == PHASES.index("backward"))
    order = c["micro_batch"][backward]
    firsts = order[np.r_[True, order[1:] != order[:-1]]]
    assert firsts.tolist() == list(range(6))


def test_a_chunk_that_cannot_be_copied_is_captured_again_with_every_chunk_run(
    tmp_path, monkeypatch, stub_count
):
    job = make_job(LLAMA, {"pp": 2}, 4)

    def refuse(self, templates, frees, micro_batch):
        raise ChunkReuseError("refused by the test")

    monkeypatch.setattr(ChunkReuse, "_match_outside_frees", refuse)
    with pytest.raises(ChunkReuseError, match="refused by the test"):
        capture_rank(0, world_of(job).world_size, rank_program(job))
    captured = capture_job(job, workers=1, cache_dir=tmp_path)
    world = captured.world
    for class_id in world.classes():
        rank = world.representative(class_id)
        full = capture_rank(rank, world.world_size, rank_program(job), reuse_chunks=False)
        assert (
            first_difference(
                normalised(captured.traces[class_id], world, rank), normalised(full, world, rank)
            )
            is None
        )
