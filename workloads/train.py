"""Build a rank's training state and run one training iteration (`train_step`).

`build_training` builds this rank's model parts (one per virtual pipeline stage it
holds), applies `workloads.parallelize`, builds the pipeline schedule when pp > 1,
and the optimizer. `train_step` runs one complete iteration: every micro-batch of
the schedule (plain gradient accumulation when pp == 1: each micro-batch runs
`state.forward` then `state.backward`, by default `micro_batch_forward` and
`micro_batch_backward`, which a caller may wrap), gradient reduction over
dp x cp (zero 0/1: in buckets launched during the last micro-batch's backward, see
`workloads.zero`), global grad-norm clipping to 1.0, the AdamW step and zero_grad. A
tied GPT split over pipeline stages all-reduces its two embedding copies' gradients
over the first and last stage (Megatron-LM's embedding group), after the dp reduction.

Optimizer: AdamW, lr 3e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on every
parameter, no schedule (GPT-3's betas/eps/decay, Brown et al. 2020 appendix B;
torchtitan's Llama 3 defaults). zero 0/1 use `workloads.zero.DistributedOptimizer`
(fp32 master copy), zero 2/3 torch's AdamW over FSDP2's sharded fp32 parameters.

Loss: token-mean cross-entropy of each micro-batch, averaged over micro-batches, run as
`kernels.loss` says (`workloads.loss`). With tp > 1 the logits stay vocabulary-sharded and
the loss is vocab-parallel (all-reduces of max, target logit and sum of exp over the tp
group) instead of gathering [b, s, vocab] logits. The model is built with the padded
vocabulary (`TrainingJob.built_model`); labels stay below the true vocabulary.

Under FakeTensorMode `train_step` returns None (a fake loss has no value).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn
from torch._subclasses.fake_tensor import is_fake
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from workloads.config import check_schedule
from workloads.context_parallel import chunk_positions, shard_sequence
from workloads.job import TrainingJob
from workloads.loss import cross_entropy, loss_context
from workloads.megatron_schedule import ActivationMeta, PerTransferOneFOneB
from workloads.models import build_model
from workloads.parallelize import COMPUTE_DTYPES, data_parallel_mesh, parallelize_stage
from workloads.pipeline import (
    build_schedule,
    local_stage_ids,
    split_model,
    stage_plans,
)
from workloads.zero import DistributedOptimizer, clip_fsdp_grad_norm_, step_options

MESH_DIMS = ("dp", "pp", "cp", "tp")  # the job contract's mesh: emulator.world.mesh.JOB_AXES
ADAMW = {"lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
MAX_GRAD_NORM = 1.0


def make_mesh(job: TrainingJob, device_type: str = "cpu"):
    """The (dp, pp, cp, tp) DeviceMesh of the job (needs an initialised process group)."""
    par = job.parallel
    return init_device_mesh(device_type, (par.dp, par.pp, par.cp, par.tp), mesh_dim_names=MESH_DIMS)


def micro_batch_forward(model: nn.Module, loss_fn, tokens, labels) -> torch.Tensor:
    """The forward and loss of one gradient-accumulation micro-batch (pp == 1)."""
    return loss_fn(model(tokens), labels)


def micro_batch_backward(loss: torch.Tensor, micro_batches: int) -> None:
    """Its backward: gradients of the loss averaged over micro-batches accumulate in `.grad`."""
    (loss / micro_batches).backward()


@dataclass(kw_only=True)
class TrainingState:
    """What `train_step` needs: this rank's stage models, schedule and optimizer."""

    parts: list[nn.Module]
    vocab: int  # rows of the output layer (the padded vocabulary)
    loss: str  # kernels.loss: how the cross-entropy runs (workloads.loss)
    plans: list
    optimizer: object
    fsdp: bool
    schedule: object | None = None
    stages: list = field(default_factory=list)
    cp_rank: int = 0
    cp: int = 1
    tp_mesh: object | None = None  # the tp DeviceMesh when tp > 1
    pp_group: object | None = None
    embedding_group: object | None = None  # first + last pipeline rank, tied embeddings only
    # the two halves of a gradient-accumulation micro-batch, called through the state so that
    # a caller may wrap them (the emulator's capture stands recorded ones in for them)
    forward: Callable[..., torch.Tensor] = micro_batch_forward
    backward: Callable[[torch.Tensor, int], None] = micro_batch_backward

    @property
    def tp_group(self):
        return self.tp_mesh.get_group() if self.tp_mesh is not None else None

    @property
    def has_first(self) -> bool:
        return any(plan.is_first for plan in self.plans)

    @property
    def has_last(self) -> bool:
        return any(plan.is_last for plan in self.plans)

    def loss_fn(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return cross_entropy(self.loss, logits, labels, self.tp_mesh, self.vocab)


def _positions_hook(seq_len: int, cp_rank: int, cp: int):
    """A forward pre-hook that passes the rank's absolute positions (of the full seq_len) to the model."""

    def hook(module, args, kwargs):
        device = next(module.parameters()).device
        if cp > 1:
            positions = chunk_positions(seq_len, cp_rank, cp, device)
        else:
            positions = torch.arange(seq_len, device=device)
        return args, {**kwargs, "positions": positions}

    return hook


def _stage_activation(job: TrainingJob, tp: int, dtype, device) -> torch.Tensor:
    """An example of one micro-batch's activation between two pipeline stages (local shape)."""
    batch, par = job.batch, job.parallel
    seq_local = batch.seq_len // par.cp
    seq_hidden = seq_local // tp if par.sequence_parallel and tp > 1 else seq_local
    # requires_grad marks activations and outputs as differentiable: the static stage
    # metadata derives its gradient buffers from it
    return torch.empty(
        batch.micro_batch,
        seq_hidden,
        job.model.hidden,
        dtype=dtype,
        device=device,
        requires_grad=True,
    )


def _stage_example_args(
    job: TrainingJob, plan, tp: int, dtype, device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Example tensors with one micro-batch's local input and output shapes of a virtual stage."""
    spec, batch, par = job.built_model, job.batch, job.parallel
    seq_local = batch.seq_len // par.cp
    hidden = _stage_activation(job, tp, dtype, device)
    if plan.is_first:
        inp = torch.empty(batch.micro_batch, seq_local, dtype=torch.long, device=device)
    else:
        inp = hidden
    if plan.is_last:
        vocab_local = -(-spec.vocab // tp) if tp > 1 else spec.vocab
        out = torch.empty(
            batch.micro_batch,
            seq_local,
            vocab_local,
            dtype=dtype,
            device=device,
            requires_grad=True,
        )
    else:
        out = hidden
    return inp, out


def build_training(
    job: TrainingJob,
    mesh,
    *,
    device="cpu",
    init_device=None,
    seed: int = 0,
    lr=None,
    bucket_bytes=None,
    initialize: bool = True,
):
    """This rank's TrainingState for `job` on the (dp, pp, cp, tp) `mesh` (None: one process).

    With init_device=None the model is built and initialised on `device` before it
    is split and sharded (values match a single-process model of the same seed);
    with init_device="meta" it is built on meta, parallelised, then materialised by
    `to_empty(device=...)` and `init_weights(seed)`.
    initialize=False skips `init_weights` (fake tensors under capture have no values).
    bucket_bytes: the gradient bucket size of zero 0/1 (None: `workloads.zero`'s default).
    """
    par = job.parallel
    device = torch.device(device)
    if mesh is None and job.world_size != 1:
        raise ValueError(f"a job of world_size({job.world_size}) needs a DeviceMesh")
    num_stages = par.pp * par.vpp
    plans_all = stage_plans(job.model.layers, num_stages)
    pp_rank = mesh["pp"].get_local_rank() if mesh is not None else 0
    plans = [plans_all[i] for i in local_stage_ids(pp_rank, par.pp, par.vpp)]
    if num_stages > 1:
        check_schedule(
            par.schedule, par.pp, par.vpp, job.num_microbatches, job.kernels.pipeline_recv
        )
    dp_mesh = data_parallel_mesh(mesh) if mesh is not None else None
    cp_rank = mesh["cp"].get_local_rank() if mesh is not None else 0
    parts = []
    for plan in plans:
        with torch.device(init_device or device):
            model = build_model(job.built_model, layer_ids=plan.layers)
        if init_device is None and initialize:
            model.init_weights(seed)
        split_model(model, plan)
        parallelize_stage(model, mesh, job, dp_mesh)
        if init_device is not None:
            model.to_empty(device=device)  # keeps tied parameters tied
            if initialize:
                model.init_weights(seed)
        model.register_forward_pre_hook(
            _positions_hook(job.batch.seq_len, cp_rank, par.cp), with_kwargs=True
        )
        if job.model.tie_embeddings and par.pp > 1 and plan.is_last:
            model.output.weight.is_tied_copy = True  # see workloads.zero.is_tied_copy
        if job.model.tie_embeddings and par.pp > 1:
            for end in (model.tok_embeddings, model.output):
                if end is not None:
                    end.weight.is_shared_embedding = True  # see workloads.zero.plan_buckets
        parts.append(model)
    state = TrainingState(
        parts=parts,
        vocab=job.built_model.vocab,
        loss=job.kernels.loss,
        plans=plans,
        optimizer=_build_optimizer(job, mesh, dp_mesh, parts, lr, bucket_bytes),
        fsdp=mesh is not None and par.zero >= 2,
        cp_rank=cp_rank,
        cp=par.cp,
        tp_mesh=mesh["tp"] if mesh is not None and par.tp > 1 else None,
        pp_group=mesh["pp"].get_group() if mesh is not None and par.pp > 1 else None,
    )
    if job.model.tie_embeddings and par.pp > 1 and (state.has_first or state.has_last):
        state.embedding_group = _embedding_group(state.pp_group)
    if par.pp > 1 and job.kernels.pipeline_recv == "per-transfer":
        # check_schedule: "1f1b" (one chunk per rank) or "interleaved-1f1b" (vpp chunks)
        hidden = _stage_activation(job, par.tp, COMPUTE_DTYPES[job.train.precision], device)
        state.schedule = PerTransferOneFOneB(
            modules=parts,
            plans=plans,
            group=state.pp_group,
            num_microbatches=job.num_microbatches,
            activation=ActivationMeta(shape=tuple(hidden.shape), dtype=hidden.dtype, device=device),
            loss_fn=state.loss_fn,
            scatter_gather_group=_scatter_gather_group(job, state.tp_group, hidden),
        )
    elif par.pp > 1:
        dtype = COMPUTE_DTYPES[job.train.precision]
        examples = [_stage_example_args(job, plan, par.tp, dtype, device) for plan in plans]
        state.stages, state.schedule = build_schedule(
            parts,
            plans,
            schedule=par.schedule,
            num_microbatches=job.num_microbatches,
            group=state.pp_group,
            device=device,
            input_args=[inp for inp, _ in examples],
            output_args=[out for _, out in examples],
            loss_fn=state.loss_fn,
        )
        if isinstance(state.optimizer, DistributedOptimizer):
            for stage in state.stages:
                _hand_weight_grads_to(stage, state.optimizer)
    return state


def _scatter_gather_group(job: TrainingJob, tp_group, hidden: torch.Tensor):
    """The tp group a pipeline transfer is split over (`kernels.pipeline_transfer`), or None:
    Megatron sends whole tensors under sequence parallelism (already split) and when tp does
    not divide the activation (`override_scatter_gather_tensors_in_pipeline`)."""
    if job.kernels.pipeline_transfer != "scatter-gather" or tp_group is None:
        return None
    if job.parallel.sequence_parallel or hidden.numel() % job.parallel.tp:
        return None
    return tp_group


def _hand_weight_grads_to(stage, optimizer: DistributedOptimizer) -> None:
    """Zero-bubble's weight backward assigns `.grad` without firing post-accumulate-grad
    hooks (torch's `stage_backward_weight`): pass those gradients on right after it, so
    their buckets still reduce during the pipeline's backward."""
    params = list(stage.submod.parameters())

    def backward_weight_one_chunk(*args, **kwargs):
        # looked up at call time, so a later patch of the class method (capture's
        # micro-batch markers) still applies
        result = type(stage).backward_weight_one_chunk(stage, *args, **kwargs)
        optimizer.take_pending_grads(params)
        return result

    stage.backward_weight_one_chunk = backward_weight_one_chunk


def _embedding_group(pp_group):
    """Megatron's embedding group: the ranks of the first and last stage of one pipeline.

    A pipeline split unties tied embeddings (each end holds a copy, equal at init);
    all-reducing their gradients keeps the copies equal, as Megatron-LM does. Only the
    two members create it (`use_local_synchronization`), so no rank loops over the world.
    """
    ranks = dist.get_process_group_ranks(pp_group)
    return dist.new_group([ranks[0], ranks[-1]], use_local_synchronization=True)


def _tied_embedding_params(state: TrainingState) -> list[torch.nn.Parameter]:
    params = []
    for plan, part in zip(state.plans, state.parts, strict=True):
        if plan.is_first:
            params.append(part.tok_embeddings.weight)
        if plan.is_last:
            params.append(part.output.weight)
    return params


def _tied_embedding_grads(state: TrainingState) -> list[torch.Tensor]:
    """The local gradient shards of both copies, laid out like their (vocab-sharded) weights."""
    grads = []
    for param in _tied_embedding_params(state):
        if isinstance(param.grad, DTensor):
            # the embedding's gradient leaves DTensor's backward replicated over the vocabulary
            if param.grad.placements != param.placements:
                param.grad = param.grad.redistribute(param.device_mesh, param.placements)
            grads.append(param.grad.to_local())
        else:
            grads.append(param.grad)
    return grads


def _sync_tied_embeddings(state: TrainingState) -> None:
    if isinstance(state.optimizer, DistributedOptimizer):
        # after the dp reduction, on the fp32 grad buffer (Megatron's finalize_model_grads order)
        grads = [state.optimizer.main_grad(p) for p in _tied_embedding_params(state)]
    else:
        grads = _tied_embedding_grads(state)
    for grad in grads:
        dist.all_reduce(grad, group=state.embedding_group)


def _build_optimizer(job: TrainingJob, mesh, dp_mesh, parts, lr, bucket_bytes):
    adamw = {**ADAMW, **({"lr": lr} if lr is not None else {})}
    if mesh is not None and job.parallel.zero >= 2:
        params = [p for part in parts for p in part.parameters()]
        return torch.optim.AdamW(params, **adamw, **step_options(job.kernels.optimizer_step))
    pp = job.parallel.pp
    return DistributedOptimizer(
        [list(part.parameters()) for part in parts],
        dp_group=dp_mesh.get_group() if dp_mesh is not None else None,
        shard=job.parallel.zero == 1,
        tp_size=job.parallel.tp,
        tp_group=mesh["tp"].get_group() if mesh is not None else None,
        norm_groups=[mesh["tp"].get_group(), mesh["pp"].get_group()] if mesh is not None else [],
        max_norm=MAX_GRAD_NORM,
        adamw=adamw,
        step=job.kernels.optimizer_step,
        microbatches=job.num_microbatches,
        # torch's pipeline schedules scale by 1/num_microbatches in scale_grads, which finds
        # no .grad left; Megatron's 1F1B (per-transfer) divides each micro-batch's loss
        grad_scale=1.0 / job.num_microbatches
        if pp > 1 and job.kernels.pipeline_recv == "per-microbatch"
        else 1.0,
        bucket_bytes=bucket_bytes,
        overlap=job.kernels.grad_reduce == "overlapped",
        grads_in_model_dtype=job.kernels.grad_accumulation == "model-dtype",
        reduce_scatter=job.kernels.dp_grad_collective == "reduce-scatter",
    )


def train_step(
    job: TrainingJob,
    state: TrainingState,
    tokens: torch.Tensor,
    labels: torch.Tensor,
    *,
    phase=None,
):
    """One iteration on this rank's local batch [num_microbatches * micro_batch, seq_len].

    Returns the loss averaged over micro-batches on ranks that hold the last
    pipeline stage (every rank when pp == 1), else None; None under FakeTensorMode.
    `phase(name)`, when given, is a context manager entered around the "optimizer"
    part (gradient sync, clipping, step), so a profiler can tell it apart.
    """
    tokens = shard_sequence(tokens, state.cp_rank, state.cp)
    labels = shard_sequence(labels, state.cp_rank, state.cp)
    with loss_context(state.loss, state.tp_mesh):
        if state.schedule is not None:
            losses: list[torch.Tensor] = []
            args = (tokens,) if state.has_first else ()
            target = labels if state.has_last else None
            if isinstance(state.schedule, PerTransferOneFOneB):
                losses = state.schedule.step(tokens if state.has_first else None, target)
            else:
                # the losses are all this step needs: return_outputs (torch's default) would
                # keep every micro-batch's logits on the last stage and concatenate them
                state.schedule.step(*args, target=target, losses=losses, return_outputs=False)
            loss = torch.stack([x.detach() for x in losses]).mean() if state.has_last else None
        else:
            loss = _accumulate(job, state, tokens, labels)
    with phase("optimizer") if phase is not None else contextlib.nullcontext():
        _optimizer_step(state)
    if loss is None or is_fake(loss):
        return None
    return loss.item()


def _accumulate(job: TrainingJob, state: TrainingState, tokens, labels) -> torch.Tensor:
    (model,) = state.parts
    n = job.num_microbatches
    total = torch.zeros((), device=tokens.device)
    for tok, lbl in zip(tokens.chunk(n), labels.chunk(n), strict=True):
        loss = state.forward(model, state.loss_fn, tok, lbl)
        state.backward(loss, n)
        total = total + loss.detach()
    return total / n


def _optimizer_step(state: TrainingState) -> None:
    if isinstance(state.optimizer, DistributedOptimizer):
        state.optimizer.finish_grad_sync()
    if state.embedding_group is not None:
        _sync_tied_embeddings(state)
    if state.fsdp:
        params = [p for part in state.parts for p in part.parameters()]
        clip_fsdp_grad_norm_(params, MAX_GRAD_NORM, state.pp_group)
    state.optimizer.step()
    state.optimizer.zero_grad()
