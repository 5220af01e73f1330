"""The program one rank runs for a job: `workloads` wrapped as an `emulator.capture.RankProgram`.

This is the one place that joins the workloads and the emulator: the mesh is built
outside fake mode; the model is built, initialised, split and parallelised inside it,
directly on fake "cpu" tensors (no memory is allocated; `to_empty` from meta is avoided
because fake mode refuses to swap plain fake parameters in place). A one-GPU job's build is
recorded: its real program (as the shared H100 measurements ran it, `build_training(job,
None, device="cuda")`) builds the model in fp32 on the device and casts it, leaving freed
fp32 segments cached before its first iteration; a job of several ranks is taken to build
on meta and materialise its shards in place (what a large job must do), which leaves nothing
behind, so its build is not recorded. `train.model_init` says otherwise where a program does
(`TrainingJob.builds_on_meta`; `prismbench record` builds as it says). The optimizer state
is created by one optimizer step on zero gradients, so the recorded iteration is a
steady-state one; what that step created is declared apart from what the optimizer held
before it, so the memory replay can create it where a real first iteration does.
"""

from __future__ import annotations

import contextlib
import functools

import torch

from emulator.capture.compile_fusion import block_region
from emulator.capture.rank import RankProgram
from prismbench.workload_ops import register_workload_ops

# Tensors of workloads.zero.DistributedOptimizer that hold gradients, not optimizer state:
# Megatron's persistent main-grad buffer.
_GRADIENT_ATTRIBUTES = ("grad_buffer",)


def _optimizer_tensors(optimizer) -> list[torch.Tensor]:
    """Every optimizer-state tensor an optimizer object holds: torch optimizers' states, and
    the tensors and inner optimizers of a wrapper such as workloads.zero.DistributedOptimizer
    (its gradient buffer excepted)."""
    if isinstance(optimizer, torch.optim.Optimizer):
        return [
            t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)
        ]
    found = []
    for name, value in vars(optimizer).items():
        if isinstance(value, torch.Tensor) and name not in _GRADIENT_ATTRIBUTES:
            found.append(value)
        elif isinstance(value, torch.optim.Optimizer):
            found.extend(_optimizer_tensors(value))
    return found


def _gradient_tensors(optimizer) -> list[torch.Tensor]:
    return [getattr(optimizer, name) for name in _GRADIENT_ATTRIBUTES if hasattr(optimizer, name)]


def _create_optimizer_state(state) -> dict[str, list[torch.Tensor]]:
    """Run one step on zero gradients; the optimizer's tensors by when a real run has them:
    "master_weights" from construction (fp32 copies), "optimizer_state" from the first step
    (AdamW's moments and step counts; emulator.memory.iterations replays them there)."""
    before = {id(t) for t in _optimizer_tensors(state.optimizer)}
    params = [p for part in state.parts for p in part.parameters()]
    for param in params:
        param.grad = torch.zeros_like(param)
    state.optimizer.step()
    state.optimizer.zero_grad()
    tensors = _optimizer_tensors(state.optimizer)
    return {
        "master_weights": [t for t in tensors if id(t) in before],
        "optimizer_state": [t for t in tensors if id(t) not in before],
    }


def rank_program(job) -> RankProgram:
    """The program of one rank of `job`; its build is recorded where the real program builds
    on the device (`TrainingJob.builds_on_meta`)."""
    from workloads import build_training, make_mesh, train_step
    from workloads.parallelize import data_parallel_mesh

    register_workload_ops()

    def setup():
        mesh = make_mesh(job)
        data_parallel_mesh(mesh)  # flattening fails inside fake mode: do it here, it is cached
        return mesh

    def build(mesh):
        # fake "cpu" tensors: nothing is allocated, and values do not exist to initialise
        state = build_training(job, mesh, device="cpu", initialize=False)
        rows = job.local_batch_rows
        tokens = torch.zeros(rows, job.batch.seq_len, dtype=torch.long)
        return state, tokens

    def declare(built):
        state, _ = built
        optimizer_tensors = _create_optimizer_state(state)
        return {
            "parameter": [p for part in state.parts for p in part.parameters()],
            **optimizer_tensors,
            "gradient": _gradient_tensors(state.optimizer),
        }

    def step(built, phase):
        state, tokens = built
        train_step(job, state, tokens, tokens, phase=phase)

    return RankProgram(
        setup=setup,
        build=build,
        declare=declare,
        step=step,
        roots=lambda built: built[0].parts,
        micro_batch_steps=lambda built: built[0],  # TrainingState.forward / .backward
        pipeline_steps=lambda built: _own_pipeline(built[0]),
        record_build=not job.builds_on_meta,
        recording_rules=_recording_rules(job),
        # torchtitan compiles each TransformerBlock (`apply_compile`); the workloads' blocks
        # are `layers.<i>` as torchtitan's are
        compiled_region=block_region("layers") if job.kernels.compile else None,
        collectives_read_activations=job.kernels.sp_regather and job.parallel.sequence_parallel,
    )


def _own_pipeline(state):
    """Megatron's 1F1B (`kernels.pipeline_recv = "per-transfer"`), whose forward and backward
    steps capture marks and reuses; None under torch's pipelining or without a pipeline."""
    from workloads.megatron_schedule import PerTransferOneFOneB

    return state.schedule if isinstance(state.schedule, PerTransferOneFOneB) else None


def _recording_rules(job):
    """The job's kernels that eager torch does not run: fp8 casts as torch.compile or Transformer
    Engine run them (`kernels.fp8_casts`)."""
    if job.train.precision == "fp8" and job.kernels.fp8_casts == "fused":
        from emulator.capture.fp8_casts import fused_fp8_casts

        return functools.partial(fused_fp8_casts, compiled=job.kernels.compile)
    if job.train.precision == "fp8" and job.kernels.fp8_casts == "transformer-engine":
        from emulator.capture.fp8_casts import transformer_engine_fp8_casts

        return transformer_engine_fp8_casts
    return lambda recorder: contextlib.nullcontext()
