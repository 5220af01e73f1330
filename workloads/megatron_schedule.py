"""Megatron-LM's 1F1B, with a receive buffer allocated per transfer.

`[kernels] pipeline_recv = "per-transfer"` runs a pipeline job with this executor instead
of torch.distributed.pipelining: schedule "1f1b" as below, "interleaved-1f1b" in the order
`workloads.megatron_interleaved` gives, with the same transfers and steps. It follows
Megatron-core:
- schedule (megatron/core/pipeline_parallel/schedules.py,
  `forward_backward_pipelining_without_interleaving`): the stage with pipeline rank r runs
  min(pp - r - 1, m) warm-up forwards, then one forward and one backward per remaining
  micro-batch, then the cool-down backwards. Any m >= 1 runs, m < pp included: the
  pipeline then idles (its bubble) where torch's Schedule1F1B refuses the job;
- transfers (megatron/core/pipeline_parallel/p2p_communication.py, `_communicate` and
  `_batched_p2p_ops`): every receive allocates its buffer with `torch.empty` when it is
  posted, and the buffer lives as long as what consumes it (a received activation until
  its micro-batch's backward, a received gradient until that backward ran); sends and
  receives of one step go out together through `batch_isend_irecv` (sends listed first,
  see `_Run.communicate`) and are waited for at once. torch's PipelineStage
  instead allocates one receive buffer per micro-batch and direction at setup and keeps
  them;
- `deallocate_output_tensor`: once a stage's output is sent, its data is replaced by a
  one-element tensor (Megatron-LM sets `deallocate_pipeline_outputs=True` in
  `core_transformer_config_from_args`), and the backward runs through autograd's engine
  directly (Megatron's `custom_backward`), which skips the shape check the freed output
  would fail;
- scatter-gather (`kernels.pipeline_transfer`, Megatron-LM's
  `scatter_gather_tensors_in_pipeline`, `split_tensor_into_1d_equal_chunks` and
  `gather_split_1d_tensor` of megatron/mpu at bbab79f869): with a `scatter_gather_group` (the
  tp group) each rank sends only its 1/tp slice of the flattened tensor, receives a buffer of
  that size and all-gathers the slices over the group into a fresh full buffer, which is what
  the stage then holds;
- the loss of each micro-batch is divided by m before its backward (Megatron's
  `forward_step`), so the gradients are the iteration mean without a later rescale.

Data parallelism by FSDP2 accumulates unsharded gradients over micro-batches and reduces
them during the last backward (what torch's pipelining does, here through autograd's own
post-backward hooks); workloads.zero's optimizer takes gradients by its hooks as usual.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule

from workloads.megatron_interleaved import with_interleaving
from workloads.pipeline import StagePlan
from workloads.zero import renamed_c10d


@dataclass(frozen=True, kw_only=True)
class ActivationMeta:
    """Shape and dtype of one micro-batch's activation between two stages (both directions)."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device


@dataclass(kw_only=True)
class PerTransferOneFOneB:
    """One rank's part of a pipeline run by Megatron's 1F1B (module docstring): one model
    chunk (non-interleaved), or vpp chunks, virtual stages rank, rank + pp, ... (interleaved).

    The schedule runs each micro-batch's forward and backward of a chunk through
    `forward_step` and `backward_step`, looked up on the instance, so that a caller may wrap
    them: the emulator's capture marks micro-batches there and records one for the others."""

    modules: list[nn.Module]
    plans: list[StagePlan]
    group: dist.ProcessGroup
    num_microbatches: int
    activation: ActivationMeta
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    scatter_gather_group: dist.ProcessGroup | None = None

    def __post_init__(self) -> None:
        if self.num_microbatches < 1:
            raise ValueError(f"num_microbatches({self.num_microbatches}) must be >= 1")
        if self.scatter_gather_group is not None:
            parts = dist.get_world_size(self.scatter_gather_group)
            numel = torch.Size(self.activation.shape).numel()
            if numel % parts:
                raise ValueError(
                    f"an activation of {numel} elements does not split into {parts} equal "
                    "parts for scatter-gather (Megatron then sends it whole)"
                )
        if len(self.modules) != len(self.plans):
            raise ValueError(f"{len(self.modules)} modules for {len(self.plans)} stage plans")

    def step(self, tokens: torch.Tensor | None, labels: torch.Tensor | None) -> list[torch.Tensor]:
        """Forward and backward of every micro-batch; the last stage returns their losses.

        tokens (first stage) and labels (last stage) hold all micro-batches along dim 0."""
        run = _Run(self, tokens, labels)
        if len(self.modules) == 1:
            _without_interleaving(run)
        else:
            with_interleaving(run)
        return run.losses

    def forward_step(self, chunk: int, micro_batch: int, inputs: torch.Tensor) -> torch.Tensor:
        """Model chunk `chunk`'s forward of one micro-batch (the loss is the schedule's)."""
        return self.modules[chunk](inputs)

    def backward_step(
        self,
        chunk: int,
        micro_batch: int,
        output: torch.Tensor,
        output_grad: torch.Tensor,
        inputs: torch.Tensor | None,
    ) -> torch.Tensor | None:
        """Backward of one micro-batch from its (deallocated) output; the gradient of its
        received input (None on the first stage)."""
        # Megatron's custom_backward: the engine takes a gradient whose shape differs
        # from the (deallocated) output's; torch.autograd.backward would refuse it
        torch.autograd.Variable._execution_engine.run_backward(
            (output,),
            (output_grad,),
            keep_graph=False,
            create_graph=False,
            inputs=(),
            allow_unreachable=True,
            accumulate_grad=True,
        )
        return inputs.grad if inputs is not None else None


def _without_interleaving(run: _Run) -> None:
    """`forward_backward_pipelining_without_interleaving`: warm-up forwards, 1F1B, cool-down."""
    m = run.pipe.num_microbatches
    warmup = min(run.pp - run.rank - 1, m)
    pending: list[tuple[torch.Tensor | None, torch.Tensor]] = []  # (input, output)
    for _ in range(warmup):
        received = run.communicate(recv_prev=True)[0]
        output = run.forward(0, received)
        run.communicate(send_next=output)
        pending.append((received, run.deallocated(0, output)))
    received = run.communicate(recv_prev=True)[0] if m > warmup else None
    for i in range(m - warmup):
        output = run.forward(0, received)
        output_grad = run.communicate(send_next=output, recv_next=True)[1]
        pending.append((received, run.deallocated(0, output)))
        input_grad = run.backward(0, *pending.pop(0), output_grad)
        if i == m - warmup - 1:
            received = None
            run.communicate(send_prev=input_grad)
        else:
            received = run.communicate(send_prev=input_grad, recv_prev=True)[0]
    for _ in range(warmup):
        output_grad = run.communicate(recv_next=True)[1]
        input_grad = run.backward(0, *pending.pop(0), output_grad)
        run.communicate(send_prev=input_grad)


class _Run:
    """The state of one `step`: peers, micro-batch counters per chunk and the losses so far."""

    def __init__(self, pipe: PerTransferOneFOneB, tokens, labels):
        self.pipe = pipe
        m = pipe.num_microbatches
        self.tokens = tokens.chunk(m) if tokens is not None else None
        self.labels = labels.chunk(m) if labels is not None else None
        self.rank, self.pp = dist.get_rank(pipe.group), dist.get_world_size(pipe.group)
        prev, next_ = (self.rank - 1) % self.pp, (self.rank + 1) % self.pp
        # Megatron's p2p ring wraps around (the last rank's next is the first): interleaved
        # chunks pass from rank pp - 1 to rank 0; without interleaving the ends have no peer
        wraps = len(pipe.modules) > 1
        self.prev = dist.get_global_rank(pipe.group, prev) if wraps or self.rank > 0 else None
        last = self.rank == self.pp - 1
        self.next = dist.get_global_rank(pipe.group, next_) if wraps or not last else None
        self.forwards = [0] * len(pipe.modules)
        self.backwards = [0] * len(pipe.modules)
        self.losses: list[torch.Tensor] = []

    def communicate(
        self,
        *,
        send_next: torch.Tensor | None = None,
        send_prev: torch.Tensor | None = None,
        recv_prev: bool = False,
        recv_next: bool = False,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Megatron's `_communicate`: a fresh buffer per receive, all ops batched and waited.

        A transfer towards a missing neighbour (the ends of a non-interleaved pipeline) is
        skipped, as Megatron's send_*/recv_* helpers skip it on the first and last stage."""
        recv_prev = recv_prev and self.prev is not None
        recv_next = recv_next and self.next is not None
        from_prev = self._buffer() if recv_prev else None
        from_next = self._buffer() if recv_next else None
        if self.pipe.scatter_gather_group is not None:
            send_next = self._own_slice(send_next)
            send_prev = self._own_slice(send_prev)
        # Megatron lists send_prev, recv_prev, send_next, recv_next; a batch posts all of them
        # at once, so the order only matters where the calls are matched in order: sends go
        # first (a recv is matched in program order, and an interleaved ring of receives
        # listed before its sends is a cycle), the activation before the gradient (in a ring
        # of two ranks both go to one peer, which receives recv_prev first)
        ops = []
        if send_next is not None and self.next is not None:
            ops.append(dist.P2POp(dist.isend, send_next, self.next, self.pipe.group))
        if send_prev is not None and self.prev is not None:
            ops.append(dist.P2POp(dist.isend, send_prev, self.prev, self.pipe.group))
        if from_prev is not None:
            ops.append(dist.P2POp(dist.irecv, from_prev, self.prev, self.pipe.group))
        if from_next is not None:
            ops.append(dist.P2POp(dist.irecv, from_next, self.next, self.pipe.group))
        if ops:
            for request in dist.batch_isend_irecv(ops):
                request.wait()
        if self.pipe.scatter_gather_group is not None:
            from_prev = self._gathered(from_prev)
            from_next = self._gathered(from_next)
        # a received activation is a leaf of the stage's graph: its .grad is what goes back
        return from_prev.requires_grad_() if from_prev is not None else None, from_next

    def _buffer(self) -> torch.Tensor:
        meta = self.pipe.activation
        shape = meta.shape
        if self.pipe.scatter_gather_group is not None:
            shape = (torch.Size(shape).numel() // self.scatter_gather_parts,)
        return torch.empty(shape, dtype=meta.dtype, device=meta.device)

    @property
    def scatter_gather_parts(self) -> int:
        return dist.get_world_size(self.pipe.scatter_gather_group)

    def _own_slice(self, tensor: torch.Tensor | None) -> torch.Tensor | None:
        """Megatron's split_tensor_into_1d_equal_chunks: this rank's part, a view."""
        if tensor is None:
            return None
        size = tensor.numel() // self.scatter_gather_parts
        start = size * dist.get_rank(self.pipe.scatter_gather_group)
        return tensor.detach().view(-1)[start : start + size]

    def _gathered(self, part: torch.Tensor | None) -> torch.Tensor | None:
        """Megatron's gather_split_1d_tensor: the slices of every rank, in a fresh buffer."""
        if part is None:
            return None
        whole = torch.empty(
            part.numel() * self.scatter_gather_parts, dtype=part.dtype, device=part.device
        )
        all_gather = renamed_c10d("all_gather_single", "all_gather_into_tensor")
        all_gather(whole, part, group=self.pipe.scatter_gather_group)
        # no view of the flat buffer (Megatron's make_viewless_tensor): a plain leaf of its shape
        return whole.view(self.pipe.activation.shape).detach()

    def is_first(self, chunk: int) -> bool:
        return self.pipe.plans[chunk].is_first

    def is_last(self, chunk: int) -> bool:
        return self.pipe.plans[chunk].is_last

    def forward(self, chunk: int, received: torch.Tensor | None) -> torch.Tensor:
        """The chunk's forward of its next micro-batch; on the last stage its loss / m."""
        i = self.forwards[chunk]
        self.forwards[chunk] += 1
        inputs = self.tokens[i] if self.is_first(chunk) else received
        output = self.pipe.forward_step(chunk, i, inputs)
        if not self.is_last(chunk):
            return output
        loss = self.pipe.loss_fn(output, self.labels[i])
        self.losses.append(loss.detach())
        return loss / self.pipe.num_microbatches

    def deallocated(self, chunk: int, output: torch.Tensor) -> torch.Tensor:
        """Megatron's deallocate_output_tensor: a sent output keeps only its autograd node."""
        if not self.is_last(chunk):
            output.data = torch.empty((1,), device=output.device, dtype=output.dtype)
        return output

    def backward(
        self,
        chunk: int,
        received: torch.Tensor | None,
        output: torch.Tensor,
        output_grad: torch.Tensor | None,
    ) -> torch.Tensor | None:
        """Backward of the chunk's oldest pending micro-batch; its received input's gradient."""
        i = self.backwards[chunk]
        self.backwards[chunk] += 1
        _set_gradient_sync(self.pipe.modules[chunk], i == self.pipe.num_microbatches - 1)
        if output_grad is None:  # the last stage's loss: d loss / d loss
            output_grad = torch.ones_like(output)
        return self.pipe.backward_step(chunk, i, output, output_grad, received)


def _set_gradient_sync(module: nn.Module, last: bool) -> None:
    """FSDP2: accumulate unsharded gradients, reduce and reshard in the last backward."""
    if isinstance(module, FSDPModule):
        module.set_is_last_backward(last)
        module.set_reshard_after_backward(last)
        module.set_requires_gradient_sync(last)
