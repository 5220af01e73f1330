"""Data parallelism for zero=0 and zero=1: a Megatron-style distributed optimizer.

`DistributedOptimizer` keeps the gradients of every local parameter (the local
shard of a DTensor under tensor parallelism) in one persistent buffer, as
Megatron-LM's `main_grad` buffer (fp32, or the parameters' dtype as Megatron-LM's
fp16 runs kept it: `kernels.grad_accumulation`), and reduces it over the data-parallel group
(dp x cp) in buckets, overlapped with backward, as torch DDP and Megatron's
overlap_grad_reduce do:
- buckets are contiguous slices of the buffer holding the parameters in reverse
  order (the order backward makes their gradients ready), at most `bucket_bytes`
  of gradient each (one larger parameter gets a bucket of its own); buckets
  never span two model chunks (virtual pipeline stages), as Megatron keeps one
  buffer per chunk, and a pipeline-split tied embedding gets a bucket of its own,
  as Megatron does so both copies are sharded alike over dp;
- a post-accumulate-grad hook adds each `param.grad` into the buffer and frees it
  (`param.grad = None`); when a bucket has received every gradient of the last
  micro-batch of the iteration it launches an async all-reduce (zero=0) or an
  in-place reduce-scatter (zero=1, each bucket padded to a multiple of the dp size; or an
  all-reduce of the whole bucket, of which the rank then steps its share, as DeepSpeed's
  BF16 optimizer under its pipeline engine does: `reduce_scatter=False`);
  `step()` waits for the buckets in launch order;
- zero=0 then steps AdamW on the whole fp32 master copy on every rank; zero=1 steps
  on the rank's 1/D share of every bucket and all-gathers each updated bucket.
Default bucket size: zero=0 uses torch DDP's 25 MiB, zero=1 Megatron-core's
max(40M, 1M x dp) parameters (x the gradient's bytes).

Memory (what the emulator's allocator replay sees): the grad buffer (4 or 2 bytes
per local parameter, plus bucket padding) is allocated once and lives for the whole
run, as Megatron's; a bf16/fp16 `.grad` lives only from its accumulation in backward
to the hook. Step-time temporaries: foreach AdamW's square root of the second
moment (the size of the master copy; the fused step, `kernels.optimizer_step = "fused"`
as Megatron's apex FusedAdam, has none), the rank's
reduced-gradient shards gathered into one tensor (zero=1), and one bucket's
model-dtype shard and all-gather output at a time (zero=1; Megatron gathers into its
parameter buffer). The grad norm (one multi-tensor norm over ranges) and the copy
back into the parameters (per parameter, converting) make none of the master's size.
A grad buffer in the model's dtype is cast to float32 at the step, one temporary of
the master's size (Megatron's `_copy_model_grads_to_main_grads` casts parameter by
parameter). Gradients are reduced in the buffer's dtype (fp32: Megatron's
accumulate_allreduce_grads_in_fp32).
With bf16/fp16 model parameters the fp32 master copy is what keeps precision (the
mixed-precision recipe of Micikevicius et al. 2018 and Megatron).

Under sequence parallelism the norm weights' gradients leave backward Partial over
tp; their local parts are accumulated as they are and summed over tp in one
all-reduce after the dp reduction (Megatron's _allreduce_layernorm_grads).

Gradient-norm clipping uses the global norm: squared norms of the rank's (shard of)
reduced gradients, with parameters replicated over the tp group (norm weights,
row-parallel biases) counted once and the last stage's copy of a tied embedding
left out, summed over dp x cp (zero=1), tp and pp.
`clip_fsdp_grad_norm_` does the same for FSDP2 (DTensor) parameters.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

# torch DDP's default bucket_cap_mb (torch/nn/parallel/distributed.py, _DEFAULT_BUCKET_CAP_MB)
DDP_BUCKET_BYTES = 25 * 1024 * 1024
# Megatron-core DistributedDataParallelConfig.bucket_size default, in parameters:
# max(40000000, 1000000 * dp_size) (megatron/core/distributed/distributed_data_parallel_config.py)
MEGATRON_BUCKET_PARAMS = 40_000_000
MEGATRON_BUCKET_PARAMS_PER_DP_RANK = 1_000_000
FP32_BYTES = 4


def step_options(step: str) -> dict[str, bool]:
    """torch AdamW's implementation flag for `kernels.optimizer_step`. Always explicit: torch's
    default checks type(param) in (Tensor, Parameter), so a FakeTensor parameter would get the
    per-tensor loop and its two extra full-size temporaries (sqrt, div), not the foreach ops a
    GPU runs."""
    if step not in ("foreach", "fused"):
        raise ValueError(f"optimizer step {step!r} must be 'foreach' or 'fused'")
    return {step: True}


def default_bucket_bytes(*, shard: bool, dp_size: int, grad_bytes: int = FP32_BYTES) -> int:
    """DDP's bucket for all-reduce (zero=0), Megatron's for reduce-scatter (zero=1), for
    gradients of `grad_bytes` each."""
    if not shard:
        return DDP_BUCKET_BYTES
    params = max(MEGATRON_BUCKET_PARAMS, MEGATRON_BUCKET_PARAMS_PER_DP_RANK * dp_size)
    return params * grad_bytes


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


def is_shared_embedding(param: torch.Tensor) -> bool:
    """Either copy of a tied embedding split over pipeline stages (set by workloads.train)."""
    return getattr(param, "is_shared_embedding", False)


def _partial_over_tp(param: torch.Tensor, grad: torch.Tensor) -> bool:
    return (
        isinstance(grad, DTensor)
        and all(p.is_partial() for p in grad.placements)
        and all(p.is_replicate() for p in param.placements)
    )


def plan_buckets(chunks: list[list[torch.Tensor]], *, cap_numel: int) -> list[list[torch.Tensor]]:
    """The parameters of each bucket, buckets in the order backward completes them.

    Per chunk, parameters in reverse order; a bucket closes before a parameter that
    would take it past cap_numel elements; a shared embedding is alone in its bucket.
    """
    buckets: list[list[torch.Tensor]] = []
    for chunk in chunks:
        current: list[torch.Tensor] = []
        size = 0
        for param in reversed(chunk):
            numel = local_tensor(param).numel()
            alone = is_shared_embedding(param) or (current and is_shared_embedding(current[0]))
            if current and (alone or size + numel > cap_numel):
                buckets.append(current)
                current, size = [], 0
            current.append(param)
            size += numel
        if current:
            buckets.append(current)
    return buckets


@dataclass(kw_only=True)
class GradBucket:
    """Buffer slice [start, start + numel) reduced by one collective once `expected` grads arrived."""

    params: list[torch.Tensor]
    starts: list[int]  # each parameter's offset in the grad buffer
    start: int
    numel: int  # padded to a multiple of the dp size when sharded
    expected: int  # len(params) * micro-batches per iteration
    arrived: int = 0
    launched: bool = False


class DistributedOptimizer:
    """AdamW over an fp32 master copy, its gradients reduced in buckets during backward."""

    def __init__(
        self,
        chunks: list[list[torch.nn.Parameter]],
        *,
        dp_group,
        shard: bool,
        tp_size: int,
        max_norm: float,
        adamw: dict,
        norm_groups: list = (),
        tp_group=None,
        microbatches: int = 1,
        grad_scale: float = 1.0,
        bucket_bytes: int | None = None,
        overlap: bool = True,
        step: str = "foreach",
        grads_in_model_dtype: bool = False,
        reduce_scatter: bool = True,
    ) -> None:
        """chunks: the parameters of each model chunk in registration order; microbatches:
        backward passes per iteration (each parameter's hook fires once per pass);
        grad_scale: multiplies the summed gradients before the dp reduction; overlap: reduce
        each bucket as backward completes it (torch DDP, Megatron-core's overlap_grad_reduce),
        else reduce every chunk's whole buffer in one collective once backward is done, as
        Megatron-LM's local DDP did (`allreduce_gradients()` after `forward_backward_func`),
        bucket_bytes then unused; grads_in_model_dtype: keep the grad buffer in the
        parameters' dtype, not float32; reduce_scatter: sharded (zero=1), reduce-scatter each
        bucket, else all-reduce it whole and step this rank's share (the same sums, twice the
        bytes on the wire)."""
        self.params = [p for chunk in chunks for p in chunk]
        dtypes = {p.dtype for p in self.params}
        if len(dtypes) != 1:
            raise ValueError(f"DistributedOptimizer needs one parameter dtype, got {dtypes}")
        if microbatches < 1:
            raise ValueError(f"microbatches({microbatches}) must be >= 1")
        self.dtype = dtypes.pop()
        self.grad_dtype = grad_dtype = self.dtype if grads_in_model_dtype else torch.float32
        grad_bytes = grad_dtype.itemsize
        self.dp_group = dp_group
        self.dp_size = dist.get_world_size(dp_group) if dp_group is not None else 1
        self.dp_rank = dist.get_rank(dp_group) if dp_group is not None else 0
        self.shard = shard and self.dp_size > 1
        self.reduce_scatter = reduce_scatter
        self.tp_group = tp_group if tp_size > 1 else None
        self.norm_groups = [g for g in norm_groups if g is not None and dist.get_world_size(g) > 1]
        self.max_norm = max_norm
        self.grad_scale = grad_scale
        self.overlap = overlap
        self.bucket_bytes = bucket_bytes or default_bucket_bytes(
            shard=self.shard, dp_size=self.dp_size, grad_bytes=grad_bytes
        )
        if not overlap:  # one bucket per chunk (a split tied embedding still alone)
            self.bucket_bytes = grad_bytes * sum(local_tensor(p).numel() for p in self.params)
        if self.bucket_bytes < grad_bytes:
            raise ValueError(f"bucket_bytes({self.bucket_bytes}) holds no {grad_dtype} gradient")
        self.buckets = self._layout(chunks, tp_size, microbatches)
        device = local_tensor(self.params[0]).device
        total = sum(b.numel for b in self.buckets)
        self.grad_buffer = torch.zeros(total, dtype=grad_dtype, device=device)
        self._shard_ranges = [self._shard_range(b) for b in self.buckets]
        self._norm_ranges = self._master_norm_ranges(tp_size)
        self._views: dict[int, torch.Tensor] = {}
        self._hooks: dict[int, object] = {}
        for bucket in self.buckets:
            for param, start in zip(bucket.params, bucket.starts, strict=True):
                local = local_tensor(param)
                view = self.grad_buffer[start : start + local.numel()].view(local.shape)
                hook = partial(self._accumulate, bucket, view)
                self._views[id(param)] = view
                self._hooks[id(param)] = hook
                param.register_post_accumulate_grad_hook(hook)
        self._works: list = []
        self._synced = False
        self.late_buckets = 0
        self._tp_partial: dict[int, torch.Tensor] = {}
        with torch.no_grad():
            flat = torch.zeros(total, dtype=torch.float32, device=device)
            for bucket in self.buckets:
                for param, start in zip(bucket.params, bucket.starts, strict=True):
                    local = local_tensor(param)
                    flat[start : start + local.numel()].copy_(local.reshape(-1))
            self.master = torch.nn.Parameter(self._gather_shards(flat))
        self.optimizer = torch.optim.AdamW([self.master], **adamw, **step_options(step))
        self.last_grad_norm: torch.Tensor | None = None

    def _layout(self, chunks, tp_size: int, microbatches: int) -> list[GradBucket]:
        parts = self.dp_size if self.shard else 1
        cap_numel = self.bucket_bytes // self.grad_dtype.itemsize
        buckets, offset = [], 0
        for params in plan_buckets(chunks, cap_numel=cap_numel):
            # by norm weight inside a bucket: each weight covers few contiguous ranges
            params = sorted(params, key=lambda p: norm_weight(p, tp_size))
            starts, end = [], offset
            for param in params:
                starts.append(end)
                end += local_tensor(param).numel()
            numel = -(-(end - offset) // parts) * parts
            buckets.append(
                GradBucket(
                    params=params,
                    starts=starts,
                    start=offset,
                    numel=numel,
                    expected=len(params) * microbatches,
                )
            )
            offset += numel
        return buckets

    def _shard_range(self, bucket: GradBucket) -> tuple[int, int]:
        """This rank's part of a bucket in grad-buffer coordinates (all of it unless sharded)."""
        if not self.shard:
            return bucket.start, bucket.start + bucket.numel
        size = bucket.numel // self.dp_size
        lo = bucket.start + self.dp_rank * size
        return lo, lo + size

    def _gather_shards(self, flat: torch.Tensor) -> torch.Tensor:
        """The rank's shards of every bucket, concatenated (the master copy's layout)."""
        if not self.shard:
            return flat
        return torch.cat([flat[lo:hi] for lo, hi in self._shard_ranges])

    def _master_norm_ranges(self, tp_size: int) -> list[tuple[int, int, float]]:
        """(start, end, weight) ranges of the master copy, equal neighbours merged."""
        ranges: list[tuple[int, int, float]] = []
        master_offset = 0
        for bucket, (lo, hi) in zip(self.buckets, self._shard_ranges, strict=True):
            for param, start in zip(bucket.params, bucket.starts, strict=True):
                a = max(start, lo)
                b = min(start + local_tensor(param).numel(), hi)
                if b <= a:
                    continue
                weight = norm_weight(param, tp_size)
                a, b = a - lo + master_offset, b - lo + master_offset
                if ranges and ranges[-1][1] == a and ranges[-1][2] == weight:
                    ranges[-1] = (ranges[-1][0], b, weight)
                else:
                    ranges.append((a, b, weight))
            master_offset += hi - lo
        return ranges

    @torch.no_grad()
    def _accumulate(self, bucket: GradBucket, view: torch.Tensor, param: torch.Tensor) -> None:
        """Post-accumulate-grad hook: move the gradient into the buffer, launch a full bucket."""
        grad = param.grad
        if self.tp_group is not None and _partial_over_tp(param, grad):
            self._tp_partial[id(param)] = view
            grad = grad._local_tensor
        else:
            grad = local_grad(param)
        view.add_(grad)
        param.grad = None
        bucket.arrived += 1
        if self.overlap and bucket.arrived == bucket.expected and not bucket.launched:
            self._launch(bucket)

    def _launch(self, bucket: GradBucket) -> None:
        bucket.launched = True
        data = self.grad_buffer[bucket.start : bucket.start + bucket.numel]
        scale = self.grad_scale / self.dp_size
        if scale != 1.0:
            data.mul_(scale)
        if self.dp_size == 1:
            return
        if self.shard and self.reduce_scatter:
            lo, hi = self._shard_range(bucket)
            out = self.grad_buffer[lo:hi]  # in place, as Megatron's reduce-scatter
            work = renamed_c10d("reduce_scatter_single", "reduce_scatter_tensor")(
                out, data, group=self.dp_group, async_op=True
            )
        else:
            work = dist.all_reduce(data, group=self.dp_group, async_op=True)
        self._works.append(work)

    def take_pending_grads(self, params) -> None:
        """Accumulate gradients written to `.grad` without the hook firing.

        torch's zero-bubble weight backward (`stage_backward_weight`) computes them
        with `autograd.grad` and assigns `.grad` itself.
        """
        for param in params:
            if param.grad is not None:
                self._hooks[id(param)](param)

    def main_grad(self, param: torch.Tensor) -> torch.Tensor:
        """The parameter's slice of the grad buffer, laid out like its local tensor."""
        return self._views[id(param)]

    @torch.no_grad()
    def finish_grad_sync(self) -> None:
        """Wait for every bucket's reduction (launch order), then sum Partial grads over tp.

        Without overlap every bucket is reduced here. With it, buckets that backward left
        incomplete (gradients assigned to `.grad` directly, as when optimizer state is
        created from zero gradients) are reduced here, late; `late_buckets` counts them (0
        when every reduction overlapped backward).
        """
        if self._synced:
            return
        self.late_buckets = 0
        for bucket in self.buckets:
            if not bucket.launched:
                self.take_pending_grads(bucket.params)
            if not bucket.launched:
                self._launch(bucket)
                self.late_buckets += self.overlap
        for work in self._works:
            work.wait()
        self._works.clear()
        if self._tp_partial:
            views = list(self._tp_partial.values())
            flat = torch.cat([v.reshape(-1) for v in views])
            dist.all_reduce(flat, group=self.tp_group)
            offset = 0
            for view in views:
                view.copy_(flat[offset : offset + view.numel()].view_as(view))
                offset += view.numel()
        self._synced = True

    def _grad_norm(self, shard_grad: torch.Tensor) -> torch.Tensor:
        # one multi-tensor norm over the weighted ranges, as Megatron's multi_tensor_l2norm:
        # no temporary of the gradient's size
        ranges = [(start, end, weight) for start, end, weight in self._norm_ranges if weight]
        total = shard_grad.new_zeros(())
        if ranges:
            norms = torch._foreach_norm([shard_grad[start:end] for start, end, _ in ranges])
            weighted = torch._foreach_mul(torch._foreach_mul(norms, norms), [w for *_, w in ranges])
            total = total + torch.stack(weighted).sum()
        if self.shard:
            dist.all_reduce(total, group=self.dp_group)
        for group in self.norm_groups:
            dist.all_reduce(total, group=group)
        return total.sqrt()

    @torch.no_grad()
    def step(self) -> None:
        self.finish_grad_sync()
        grad = self._gather_shards(self.grad_buffer).float()
        norm = self._grad_norm(grad)
        self.last_grad_norm = norm
        grad.mul_(torch.clamp(self.max_norm / (norm + 1e-6), max=1.0))
        self.master.grad = grad
        self.optimizer.step()
        self.master.grad = None
        self._copy_to_params(self.master)

    def _copy_to_params(self, master: torch.Tensor) -> None:
        """Write the updated fp32 master copy into the parameters, bucket by bucket.

        Each parameter's copy converts to the model dtype, as Megatron's does: no model-dtype
        copy of the whole master (sharded, only a bucket's shard to all-gather)."""
        offset = 0
        for bucket, (lo, hi) in zip(self.buckets, self._shard_ranges, strict=True):
            full = master[offset : offset + hi - lo]
            offset += hi - lo
            if self.shard:
                gathered = torch.empty(bucket.numel, dtype=self.dtype, device=full.device)
                renamed_c10d("all_gather_single", "all_gather_into_tensor")(
                    gathered, full.to(self.dtype), group=self.dp_group
                )
                full = gathered
            for param, start in zip(bucket.params, bucket.starts, strict=True):
                local = local_tensor(param)
                begin = start - bucket.start
                local.copy_(full[begin : begin + local.numel()].view_as(local))

    def zero_grad(self) -> None:
        self.grad_buffer.zero_()
        for bucket in self.buckets:
            bucket.arrived = 0
            bucket.launched = False
        self._synced = False
        for param in self.params:
            param.grad = None


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


def renamed_c10d(new: str, old: str):
    """torch 2.13 renamed these c10d calls (the old names warn); torch 2.11 has only the old."""
    return getattr(dist, new, None) or getattr(dist, old)
