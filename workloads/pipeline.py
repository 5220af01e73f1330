"""Pipeline parallelism: split a model into virtual stages, build torch stages and schedules.

A model with L layers is cut into pp * vpp virtual stages by
`workloads.config.stage_layer_counts`; the rank with pipeline index p holds the
virtual stages p, p + pp, p + 2 * pp, ... (torch's interleaved placement, the job
contract's convention). Splitting deletes the layers a stage does not own from the
`layers` ModuleDict (global keys, so parameter names match the whole model's) and
sets `tok_embeddings`/`pos_embeddings` (kept by the first stage) and `norm`/`output`
(kept by the last) to None elsewhere.

Stages are built with explicit `input_args`/`output_args` (meta tensors with the
exact local shapes), so torch's warm-up vote always settles on STATIC metadata and
no shape inference (no real forward, no `.item()` on a received tensor) is needed.

Schedules (torch.distributed.pipelining):
- "1f1b": Schedule1F1B, "gpipe": ScheduleGPipe (one stage per rank, vpp == 1);
- "interleaved-1f1b": ScheduleInterleaved1F1B (vpp >= 2);
- "zero-bubble": ScheduleInterleavedZeroBubble (ZB1P, interleaved placement; it also
  runs with vpp == 1, checked by a 2-rank run).
Schedule1F1B refuses num_microbatches < pp; both multi-stage schedules run rounds
of pp micro-batches and refuse num_microbatches % max(1, num_microbatches // pp)
!= 0. ScheduleZBVZeroBubble is not used: it needs exactly 2 stages per rank in the
V placement (stages p and 2*pp-1-p), not the contract's interleaved one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
)

from workloads.config import stage_layer_counts

_SINGLE_STAGE = {"1f1b": Schedule1F1B, "gpipe": ScheduleGPipe}
_MULTI_STAGE = {
    "interleaved-1f1b": ScheduleInterleaved1F1B,
    "zero-bubble": ScheduleInterleavedZeroBubble,
}


@dataclass(frozen=True, kw_only=True)
class StagePlan:
    """Which layers (global indices) and which ends of the model one virtual stage holds."""

    stage: int
    num_stages: int
    layers: tuple[int, ...]

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.num_stages - 1


def stage_plans(layers: int, num_stages: int) -> tuple[StagePlan, ...]:
    """The layer ranges of all virtual stages, in stage order."""
    counts = stage_layer_counts(layers, num_stages)
    plans, start = [], 0
    for stage, count in enumerate(counts):
        plans.append(
            StagePlan(stage=stage, num_stages=num_stages, layers=tuple(range(start, start + count)))
        )
        start += count
    return tuple(plans)


def local_stage_ids(pp_rank: int, pp: int, vpp: int) -> tuple[int, ...]:
    """Virtual stages held by the rank with pipeline index pp_rank (interleaved placement)."""
    return tuple(pp_rank + k * pp for k in range(vpp))


def split_model(model: nn.Module, plan: StagePlan) -> nn.Module:
    """Keep only `plan`'s layers and ends in `model` (in place) and return it."""
    keep = {str(i) for i in plan.layers}
    for key in [k for k in model.layers.keys() if k not in keep]:
        del model.layers[key]
    if not plan.is_first:
        model.tok_embeddings = None
        if hasattr(model, "pos_embeddings"):
            model.pos_embeddings = None
    if not plan.is_last:
        model.norm = None
        model.output = None
    return model


def build_schedule(
    modules: list[nn.Module],
    plans: list[StagePlan],
    *,
    schedule: str,
    num_microbatches: int,
    group,
    device: torch.device,
    input_args: list[torch.Tensor],
    output_args: list[torch.Tensor],
    loss_fn,
):
    """PipelineStages for this rank's virtual stages and the schedule that drives them.

    input_args/output_args are per-stage example tensors of one micro-batch (meta is
    fine); they make the stage metadata static. `loss_fn(output, target)` must return
    the micro-batch mean loss: the schedule divides gradients by num_microbatches.
    """
    stages = [
        PipelineStage(
            module,
            plan.stage,
            plan.num_stages,
            device,
            input_args=inp,
            output_args=out,
            group=group,
        )
        for module, plan, inp, out in zip(modules, plans, input_args, output_args, strict=True)
    ]
    if schedule in _SINGLE_STAGE:
        (stage,) = stages
        return stages, _SINGLE_STAGE[schedule](stage, num_microbatches, loss_fn=loss_fn)
    if schedule == "zero-bubble":
        loss_fn = detachable_in_place(loss_fn)
    return stages, _MULTI_STAGE[schedule](stages, num_microbatches, loss_fn=loss_fn)


def detachable_in_place(loss_fn):
    """`loss_fn` whose loss is never a view: zero-bubble's input backward (torch's
    `stage_backward_input`) detaches the loss in place once it has the input gradients, which
    autograd refuses on a view, such as the local loss `loss-parallel` takes out of its DTensor
    (`DTensor.to_local`). Such a loss is copied (one scalar); any other is returned as is."""

    def loss(output, target):
        value = loss_fn(output, target)
        return value.clone() if value._is_view() else value

    return loss
