"""The capture against a real multi-process CPU run: every rank's step recorded both ways.

test_real_vs_capture compares one rank's real CPU step with its capture; the kernels choices that
act only with several ranks (loss-parallel at tp > 1, the pipeline's receive buffers and
transfers, the data-parallel gradient collective, the sequence-parallel collectives and
regathering, FSDP's reshard policy, context-parallel attention) need a world. Here a real gloo
world of WORLD processes runs each case's second train_step (the first creates the optimizer
state) under the OpRecorder, and `capture_rank` records each rank of the same job in the virtual
world (no processes). For every rank:
- every compute op class (phase, aten op) runs as often, with as many FLOPs and bytes, both ways;
- the collectives and p2p calls are the same calls in the same order: kind, group (global ranks),
  reduce op, dtype, bytes, coalesced sizes, peer, and the phase and micro-batch they are issued
  in. A real run's c10d calls pass through torch's dispatcher, where
  `tests.prismbench.real_steps.C10dRecorder` sees them and writes the CommEvent the virtual
  backend writes for the same call.

One spawn runs all selected cases in turn (each builds its own mesh on the same process group),
as test_parallel_parity does; context-parallel cases get a spawn each (its SPAWNS: running them
after other cases in one process corrupted the heap inside torch/gloo).
"""

from __future__ import annotations

import warnings

import pytest
import torch

from emulator.capture.fused_ops import gpu_fused_ops
from emulator.capture.op_recorder import OpRecorder
from emulator.capture.rank import (
    capture_rank,
    garbage_collected_at_micro_batches,
    micro_batch_markers,
)
from emulator.capture.trace import EventSequence, RankTrace
from emulator.world.comm_events import Recorder
from prismbench.launch import RanksDied, run_ranks
from prismbench.program import rank_program
from tests.cases import case_params, selected_cases
from tests.prismbench import real_steps
from tests.prismbench.capture_cases import debug_job
from tests.prismbench.real_steps import C10dRecorder, comm_calls, differing, op_classes

WORLD = 4

# name: (parallel table, kernels table, model table); llama-debug with 2 layers unless the model
# table says otherwise, seq 32, micro-batch 1, max(2, pp) micro-batches per dp rank
CASES = {
    # loss-parallel at tp 2 (torch's loss_parallel on vocab-sharded logits), the default
    # program's DTensor sequence-parallel collectives
    "tp2-sp-dp2-loss-parallel": ({"tp": 2, "dp": 2, "zero": 1}, {"loss": "loss-parallel"}, {}),
    # Megatron's regathered sequence-parallel inputs, the output layer's among them (a real
    # run's input plan hands it a collective's output not yet waited: workloads.sp_regather)
    "tp2-sp-dp2-regather": ({"tp": 2, "dp": 2, "zero": 1}, {"sp_regather": True}, {}),
    # Megatron's first-dim sp collectives; its vocab-parallel loss (unfused-fp32 at tp 2)
    "tp2-sp-dp2-first-dim": ({"tp": 2, "dp": 2, "zero": 1}, {"sp_collectives": "first-dim"}, {}),
    # torch's pipelining (receive buffers per micro-batch), whole transfers; dp's gradient
    # buffer reduce-scattered
    "pp2-dp2-per-microbatch": (
        {"pp": 2, "dp": 2, "zero": 1},
        {"pipeline_recv": "per-microbatch", "dp_grad_collective": "reduce-scatter"},
        {},
    ),
    # Megatron's 1F1B (a buffer per receive), whole transfers; the buffer all-reduced
    "pp2-dp2-per-transfer-all-reduce": (
        {"pp": 2, "dp": 2, "zero": 1},
        {"pipeline_recv": "per-transfer", "dp_grad_collective": "all-reduce"},
        {},
    ),
    # Megatron's scatter-gather transfers need tp without sequence parallelism
    "pp2-tp2-per-transfer-scatter-gather": (
        {"pp": 2, "tp": 2, "sequence_parallel": False},
        {"pipeline_recv": "per-transfer", "pipeline_transfer": "scatter-gather"},
        {},
    ),
    **{
        f"fsdp-dp4-reshard-{reshard}": ({"dp": 4, "zero": 3}, {"fsdp_reshard": reshard}, {})
        for reshard in ("all", "not-root", "not-root-or-last", "none")
    },
    **{
        f"cp2-dp2-{attention}": ({"cp": 2, "dp": 2}, {"cp_attention": attention}, {})
        for attention in ("all-gather", "ring")
    },
    # the other schedules: GPipe, interleaved 1F1B (two stages a rank), and zero-bubble's split
    # backward with loss-parallel's view of a loss (workloads.pipeline.detachable_in_place)
    "pp2-dp2-gpipe": ({"pp": 2, "dp": 2, "schedule": "gpipe"}, {}, {}),
    "pp2-dp2-interleaved": (
        {"pp": 2, "dp": 2, "vpp": 2, "schedule": "interleaved-1f1b"},
        {},
        {"layers": 4},
    ),
    "pp2-tp2-zero-bubble-loss-parallel": (
        {"pp": 2, "tp": 2, "schedule": "zero-bubble"},
        {"loss": "loss-parallel"},
        {},
    ),
}
# cases CI leaves out (each spawn of four processes costs ~20 s on CI's 2 cores, the default set
# runs one): FSDP's reshard values beside `all` and `not-root-or-last`, which between them free
# and keep the root and the last block, and context parallelism, whose cases need a spawn each
SLOW_CASES = {
    "fsdp-dp4-reshard-not-root",
    "fsdp-dp4-reshard-none",
    "cp2-dp2-all-gather",
    "cp2-dp2-ring",
    "pp2-dp2-gpipe",
    "pp2-dp2-interleaved",
    "pp2-tp2-zero-bubble-loss-parallel",
}
SPAWNS_APART = ("cp",)
# A difference found here: under zero-bubble the capture gives the tp collectives of the split
# backward no module ('Global') where the real run has the block's ('Llama.layers.0.feed_forward');
# every op class, and every call's kind, group, bytes, phase and micro-batch, agree (checked with
# modules left out), so the timing is the real run's and only per-module attribution (reports,
# OOM messages) is not. Not strict: which module the real run gives depends on when Python's
# garbage collector runs in the rank (2026-12-02: ranks forked from launch's fork server give
# 'Global', as the capture does; spawned ranks, and forked ones with gc disabled, the block's),
# so the real run's attribution there rests on a collection, not on the program. The capture
# collects at micro-batch boundaries (garbage_collected_at_micro_batches); whether its 'Global'
# is the same effect is not checked.
XFAIL = {
    "pp2-tp2-zero-bubble-loss-parallel": "zero-bubble's split backward: the capture's tp "
    "collectives carry no module where the real run's carry the block's, or not, as the "
    "rank's garbage collection falls"
}


def case_job(name: str):
    parallel, kernels, model = CASES[name]
    model = {"model": "llama-debug", "layers": 2, **model}
    return debug_job(parallel, kernels=kernels, **model)


def _tokens(job) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    return torch.randint(
        job.model.vocab, (job.local_batch_rows, job.batch.seq_len), generator=generator
    )


def _real_steps(names: list[str]) -> dict[str, tuple[RankTrace, list[str]]]:
    """On each rank: the trace of every case's second real train_step, and the c10d ops it
    called that C10dRecorder has no rule for."""
    from workloads import build_training, make_mesh, train_step

    results = {}
    with real_steps.fused_rms_norm_on_cpu(), real_steps.waits_are_backend_fills():
        for name in names:
            job = case_job(name)
            state = build_training(job, make_mesh(job), device="cpu", seed=0)
            tokens = _tokens(job)
            # the capture's micro-batch marks: root forwards, pipeline chunks, Megatron's 1F1B
            program = rank_program(job)
            built = (state, tokens)
            with gpu_fused_ops():
                train_step(job, state, tokens, tokens)
                sequence = EventSequence()
                comm = Recorder(_counter=sequence)
                recorder = OpRecorder(sequence=sequence)
                spy = C10dRecorder(comm)
                with (
                    recorder,
                    spy,
                    garbage_collected_at_micro_batches(),
                    micro_batch_markers(
                        recorder, program.roots(built), program.pipeline_steps(built)
                    ),
                ):
                    train_step(job, state, tokens, tokens, phase=recorder.phase)
            results[name] = (recorder.trace(comm.events, comm.groups), spy.unknown)
    return results


def _run_spawn(names: list[str]) -> list[dict]:
    try:
        return run_ranks(WORLD, _real_steps, names, timeout_s=600)
    except RanksDied as died:  # test_parallel_parity's SPAWNS: gloo's rare context-parallel crash
        if not died.by_signal:
            raise
        warnings.warn(f"spawn {names}: {died}; running it once more", stacklevel=2)
        return run_ranks(WORLD, _real_steps, names, timeout_s=600)


@pytest.fixture(scope="module")
def real_ranks(request) -> list[dict]:
    """Each rank's results of the selected cases, in rank order."""
    wanted = selected_cases(request.session, __file__, CASES)
    apart = [name for name in wanted if name.startswith(SPAWNS_APART)]
    spawns = [[name for name in wanted if name not in apart]] + [[name] for name in apart]
    merged: list[dict] = [{} for _ in range(WORLD)]
    for names in spawns:
        if names:
            for rank, results in enumerate(_run_spawn(names)):
                merged[rank].update(results)
    return merged


def _compared(calls: list[tuple]) -> list[tuple]:
    """The calls with a pipeline p2p call's micro-batch and module left out. A comm row inherits
    phase, module and micro-batch from the recorder row before it (emulator/capture/trace.py
    `build_trace`), and torch's schedules post a stage's next send or receive between chunks,
    outside any micro-batch, where that row is a free: under torch's pipelining (per-microbatch)
    the real run frees one [1, 32, 64] bf16 storage just after stage 0's backward chunk, the
    capture inside it, so the following receive reads micro-batch -1 in one and 0 in the other;
    under GPipe, interleaved 1F1B and zero-bubble the module the call inherits differs the same
    way (a block's or the embedding's in one, none in the other). Which call, group, peer,
    bytes and phase still compare."""
    return [
        call[:1] + (None, None) + call[3:] if call[3] in ("send", "recv") else call
        for call in calls
    ]


@pytest.mark.integration
@pytest.mark.parametrize(
    "name",
    case_params(
        CASES,
        SLOW_CASES,
        **{name: [pytest.mark.xfail(reason=why, strict=False)] for name, why in XFAIL.items()},
    ),
)
def test_every_rank_s_real_step_runs_the_ops_and_calls_the_capture_records(name, real_ranks):
    job = case_job(name)
    assert job.world_size == WORLD
    program = rank_program(job)
    for rank in range(WORLD):
        real, unknown = real_ranks[rank][name]
        assert unknown == []  # every c10d op the real run called was recorded
        captured = capture_rank(rank, WORLD, program, reuse_chunks=False)
        assert differing(op_classes(real), op_classes(captured)) == {}, f"rank {rank}"
        assert _compared(comm_calls(real)) == _compared(comm_calls(captured)), f"rank {rank}"
