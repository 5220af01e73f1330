"""Sequence-parallel all-gathers and reduce-scatters along the leading dimension, without copies.

Megatron-LM keeps activations as [s, b, h] and gathers or reduce-scatters the sequence along
that first dimension straight into, or out of, a contiguous buffer: `_gather_along_first_dim`
and `_reduce_scatter_along_first_dim` (megatron/mpu/mappings.py at bbab79f869, the code of the
Korthikanti runs; Megatron-core's tensor_parallel/mappings.py keeps them), and the column
linear's own `_all_gather_base` in `LinearWithGradAccumulationAndAsyncCommunication`. No copy
runs before or after either collective.

The workloads keep [b, s, h] and shard the sequence as dimension 1. DTensor's redistribute then
copies: a reduce-scatter along dimension 1 starts with a copy that brings the sequence chunks to
the front (`torch.cat(torch.chunk(...))` in `_functional_collectives.reduce_scatter_single`), an
all-gather along it ends with one unless every dimension before it has size 1
(`torch._utils._maybe_view_chunk_cat`), and the backward of each is the other.

Here the collectives run on rows: a rank's shard [b, s/tp, h] is b * s/tp contiguous rows, the
all-gather lays the ranks' blocks one after another and the reduce-scatter hands each rank its
block back, with no copy either way (forward and backward). With one sequence per micro-batch
those rows are already in sequence order. With more, the gathered rows are in *rank order*
(rank, then sequence, then position in the rank's chunk) while keeping the label [b, s, h]:
right for row-wise work (the linears, the MLP), wrong for what mixes positions (RoPE,
attention). `to_sequence_order` and `to_rank_order` convert a [b, s, n] tensor between the two
with one copy; the workloads apply them to attention's q, k, v and to wo's input, which are
1/tp of the hidden width each, where DTensor copies full-width activations.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor, Replicate, Shard


def _rows_then_rest(t: torch.Tensor, dim: int) -> tuple[int, ...]:
    return (-1, *t.shape[dim + 1 :])


def _one_sequence(t: torch.Tensor, dim: int) -> bool:
    return all(size == 1 for size in t.shape[:dim])


def gather_sequence(shard: DTensor, *, rank_order: bool = False, async_op: bool = False) -> DTensor:
    """The sequence shard `shard` (Shard(d) over a 1-D mesh) all-gathered to Replicate; its
    backward reduce-scatters the gradient. Without a copy where a micro-batch is one sequence or
    `rank_order` allows the rows to stay in rank order (module docstring); otherwise DTensor's
    redistribute, with its copy. `async_op`: waited at first use, not at once."""
    (placement,) = shard.placements
    dim = placement.dim
    if not (_one_sequence(shard, dim) or rank_order):
        return shard.redistribute(shard.device_mesh, [Replicate()], async_op=async_op)
    local = shard.to_local()
    rows = DTensor.from_local(
        local.reshape(_rows_then_rest(local, dim)), shard.device_mesh, [Shard(0)], run_check=False
    )
    gathered = rows.redistribute(shard.device_mesh, [Replicate()], async_op=async_op)
    return gathered.view(shard.shape)


def scatter_sequence(partial: DTensor, dim: int, *, rank_order: bool = False) -> torch.Tensor:
    """The partial sums `partial` reduce-scattered along `dim`: this rank's local shard, waited
    at first use (as RowwiseParallel's own); its backward all-gathers the gradient. Without a
    copy where a micro-batch is one sequence or `partial`'s rows are in rank order."""
    if not (_one_sequence(partial, dim) or rank_order):
        return partial.redistribute(partial.device_mesh, [Shard(dim)], async_op=True).to_local()
    rows = partial.view(_rows_then_rest(partial, dim))
    scattered = rows.redistribute(partial.device_mesh, [Shard(0)], async_op=True).to_local()
    shape = list(partial.shape)
    shape[dim] //= partial.device_mesh.size()
    return scattered.view(shape)


def to_sequence_order(t: torch.Tensor, tp: int) -> torch.Tensor:
    """[b, s, n] whose rows are in rank order -> in sequence order (one copy)."""
    b, s, n = t.shape
    return t.view(tp, b, s // tp, n).transpose(0, 1).reshape(b, s, n)


def to_rank_order(t: torch.Tensor, tp: int) -> torch.Tensor:
    """[b, s, n] whose rows are in sequence order -> in rank order (one copy)."""
    b, s, n = t.shape
    return t.view(b, tp, s // tp, n).transpose(0, 1).reshape(b, s, n)
