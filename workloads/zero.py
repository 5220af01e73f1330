"""Data parallelism for zero=0 and zero=1: a Megatron-style distributed optimizer.

`DistributedOptimizer` keeps every local parameter (the local shard of a DTensor
under tensor parallelism) in one flat fp32 "master" buffer, as Megatron-LM's
distributed optimizer does, and after backward:
- zero=0 (DDP): all-reduces the flat gradient over the data-parallel group
  (dp x cp) and steps AdamW on the whole fp32 master copy on every rank;
- zero=1: reduce-scatters the flat gradient, steps AdamW on the rank's 1/D shard
  of master params and Adam states, and all-gathers the updated shard into the
  model parameters.
Gradients are reduced in fp32 (Megatron's accumulate_allreduce_grads_in_fp32).
With bf16/fp16 model parameters the fp32 master copy is what keeps precision (the
mixed-precision recipe of Micikevicius et al. 2018 and Megatron). Gradient
reduction runs after the whole backward (no bucketed overlap with backward, as
torch DDP or Megatron's overlap_grad_reduce would do).

Gradient-norm clipping uses the global norm: squares of the rank's (shard of)
reduced gradients, with parameters replicated over the tp group (norm weights,
row-parallel biases) counted once and the last stage's copy of a tied embedding
left out, summed over dp x cp (zero=1), tp and pp.
`clip_fsdp_grad_norm_` does the same for FSDP2 (DTensor) parameters.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if isinstance(t, DTensor) else t


def local_grad(param: torch.Tensor) -> torch.Tensor | None:
    """The local gradient laid out like the local parameter.

    DTensor autograd may leave a gradient Partial (norm weights under sequence
    parallelism: all-reduced here over tp, as Megatron all-reduces them) or
    Replicate where the parameter is sharded (the vocab-parallel embedding).
    """
    grad = param.grad
    if grad is None or not isinstance(grad, DTensor):
        return grad
    if tuple(grad.placements) != tuple(param.placements):
        grad = grad.redistribute(param.device_mesh, param.placements)
    return grad._local_tensor


def replicated_over_tp(param: torch.Tensor) -> bool:
    """True unless tensor parallelism shards the parameter (a DTensor with a Shard placement)."""
    return not (isinstance(param, DTensor) and any(p.is_shard() for p in param.placements))


def is_tied_copy(param: torch.Tensor) -> bool:
    """The last stage's copy of a tied embedding: left out of the gradient norm, as Megatron
    counts a shared embedding once (on the first stage)."""
    return getattr(param, "is_tied_copy", False)


def norm_weight(param: torch.Tensor, tp_size: int) -> float:
    """How much a parameter's squared gradient counts in the rank's share of the global norm."""
    if is_tied_copy(param):
        return 0.0
    return 1.0 / tp_size if replicated_over_tp(param) else 1.0


class DistributedOptimizer:
    """AdamW over a flat fp32 master copy, optionally sharded over the data-parallel group."""

    def __init__(
        self,
        params: list[torch.nn.Parameter],
        *,
        dp_group,
        shard: bool,
        tp_size: int,
        norm_groups: list,
        max_norm: float,
        adamw: dict,
    ) -> None:
        # Sorted by norm weight, so each weight covers one contiguous range of the flat buffer.
        self.params = sorted(params, key=lambda p: norm_weight(p, tp_size))
        dtypes = {p.dtype for p in self.params}
        if len(dtypes) != 1:
            raise ValueError(f"DistributedOptimizer needs one parameter dtype, got {dtypes}")
        self.dtype = dtypes.pop()
        self.dp_group = dp_group
        self.dp_size = dist.get_world_size(dp_group) if dp_group is not None else 1
        self.dp_rank = dist.get_rank(dp_group) if dp_group is not None else 0
        self.shard = shard and self.dp_size > 1
        self.tp_size = tp_size
        self.norm_groups = [g for g in norm_groups if g is not None and dist.get_world_size(g) > 1]
        self.max_norm = max_norm
        self.numels = [local_tensor(p).numel() for p in self.params]
        self._norm_ranges = _weighted_ranges(
            [norm_weight(p, tp_size) for p in self.params], self.numels
        )
        total = sum(self.numels)
        parts = self.dp_size if self.shard else 1
        self.padded = -(-total // parts) * parts
        self.shard_numel = self.padded // parts
        self.lo = self.dp_rank * self.shard_numel if self.shard else 0
        with torch.no_grad():
            flat = self._flatten([local_tensor(p) for p in self.params])
            self.master = torch.nn.Parameter(flat[self.lo : self.lo + self.shard_numel].clone())
        self.optimizer = torch.optim.AdamW([self.master], **adamw)
        self.last_grad_norm: torch.Tensor | None = None

    def _flatten(self, tensors: list[torch.Tensor | None]) -> torch.Tensor:
        device = local_tensor(self.params[0]).device
        pieces = [
            t.reshape(-1).to(torch.float32) if t is not None else torch.zeros(n, device=device)
            for t, n in zip(tensors, self.numels, strict=True)
        ]
        pad = self.padded - sum(self.numels)
        if pad:
            pieces.append(torch.zeros(pad, device=device))
        return torch.cat(pieces)

    def _reduce_grads(self) -> torch.Tensor:
        grads = [local_grad(p) for p in self.params]
        flat = self._flatten(grads)
        if self.dp_size == 1:
            return flat
        flat /= self.dp_size
        if not self.shard:
            dist.all_reduce(flat, group=self.dp_group)
            return flat
        out = torch.empty(self.shard_numel, device=flat.device)
        dist.reduce_scatter_tensor(out, flat, group=self.dp_group)
        return out

    def _grad_norm(self, shard_grad: torch.Tensor) -> torch.Tensor:
        squares = shard_grad.square()
        total = squares.new_zeros(())
        for start, end, weight in self._norm_ranges:
            lo = min(max(start - self.lo, 0), self.shard_numel)
            hi = min(max(end - self.lo, 0), self.shard_numel)
            if weight and hi > lo:
                total = total + squares[lo:hi].sum() * weight
        if self.shard:
            dist.all_reduce(total, group=self.dp_group)
        for group in self.norm_groups:
            dist.all_reduce(total, group=group)
        return total.sqrt()

    @torch.no_grad()
    def step(self) -> None:
        grad = self._reduce_grads()
        norm = self._grad_norm(grad)
        self.last_grad_norm = norm
        grad.mul_(torch.clamp(self.max_norm / (norm + 1e-6), max=1.0))
        self.master.grad = grad
        self.optimizer.step()
        self.master.grad = None
        full = self.master.to(self.dtype)
        if self.shard:
            gathered = torch.empty(self.padded, dtype=self.dtype, device=full.device)
            dist.all_gather_into_tensor(gathered, full, group=self.dp_group)
            full = gathered
        offset = 0
        for param, numel in zip(self.params, self.numels, strict=True):
            local = local_tensor(param)
            local.copy_(full[offset : offset + numel].view_as(local))
            offset += numel

    def zero_grad(self) -> None:
        for param in self.params:
            param.grad = None


def _weighted_ranges(weights: list[float], numels: list[int]) -> list[tuple[int, int, float]]:
    """(start, end, weight) ranges of the flat buffer, one per run of equal weights."""
    ranges: list[tuple[int, int, float]] = []
    offset = 0
    for weight, numel in zip(weights, numels, strict=True):
        if ranges and ranges[-1][2] == weight:
            ranges[-1] = (ranges[-1][0], offset + numel, weight)
        else:
            ranges.append((offset, offset + numel, weight))
        offset += numel
    return ranges


@torch.no_grad()
def clip_fsdp_grad_norm_(
    params: list[torch.nn.Parameter], max_norm: float, pp_group
) -> torch.Tensor:
    """Clip DTensor (FSDP2 [+ TP]) gradients to a global norm also taken over pipeline stages.

    As torchtitan does: the DTensor norm reduces over the dp/cp/tp mesh, and the
    squares of the per-stage norms are summed over the pp group.
    """
    grads = [p.grad for p in params if p.grad is not None and not is_tied_copy(p)]
    norm = torch.nn.utils.get_total_norm(grads, foreach=True)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    if pp_group is not None and dist.get_world_size(pp_group) > 1:
        squared = norm.square()
        dist.all_reduce(squared, group=pp_group)
        norm = squared.sqrt()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm, foreach=True)
    return norm
