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
(`torch._utils._maybe_view_chunk_cat`), and the backward of each is the other. When a
micro-batch is one sequence the rows of [1, s, h] are its leading dimension: viewed as [s, h],
the sequence shard is `Shard(0)` and both collectives, forward and backward, run as Megatron's,
without a copy. With more sequences no view puts the shards in order, and DTensor's
redistribute runs as before (its copies stay: a known difference from Megatron's program).
"""

from __future__ import annotations

from torch.distributed.tensor import DTensor, Replicate, Shard


def _rows(t: DTensor, dim: int) -> DTensor | None:
    """`t` viewed with `dim` as its leading dimension, or None if a dimension before it is
    not of size 1 (DTensor's view keeps a sharding of `dim` as Shard(0))."""
    if any(size != 1 for size in t.shape[:dim]):
        return None
    return t.view(t.shape[dim:])


def gather_sequence(shard: DTensor, *, async_op: bool = False) -> DTensor:
    """The sequence shard `shard` (Shard(d) over a 1-D mesh) all-gathered to Replicate; its
    backward reduce-scatters the gradient. `async_op`: waited at first use, not at once (a
    copy after the all-gather, where one is needed, reads it at once anyway)."""
    (placement,) = shard.placements
    rows = _rows(shard, placement.dim) if isinstance(placement, Shard) else None
    if rows is None:
        return shard.redistribute(shard.device_mesh, [Replicate()], async_op=async_op)
    gathered = rows.redistribute(shard.device_mesh, [Replicate()], async_op=async_op)
    return gathered.view(shard.shape)


def scatter_sequence(partial: DTensor, dim: int) -> DTensor:
    """The partial sums `partial` reduce-scattered to Shard(`dim`), waited at first use (as
    RowwiseParallel's own); its backward all-gathers the gradient."""
    rows = _rows(partial, dim)
    if rows is None:
        return partial.redistribute(partial.device_mesh, [Shard(dim)], async_op=True)
    scattered = rows.redistribute(partial.device_mesh, [Shard(0)], async_op=True)
    return scattered.view(partial.shape)
