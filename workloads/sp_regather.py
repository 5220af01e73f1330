"""Keep the sequence shard of a column-parallel input for backward and all-gather it again there.

Under sequence parallelism a column-parallel linear's input arrives as a sequence shard and is
all-gathered before the GEMM. Torch's DTensor plan (`workloads.parallelize`) saves the gathered
input for the weight gradient, tp times the shard. Megatron-LM saves only the shard and
all-gathers it again in backward, beside the input-gradient GEMM (Korthikanti et al. 2022, sec.
4.2.2; `LinearWithGradAccumulationAndAsyncCommunication` in megatron/mpu/layers.py at bbab79f869,
megatron/core/tensor_parallel/layers.py since): `regather_in_backward` makes a module whose
input DTensor plan all-gathers do the same, with torch's saved-tensor hooks. While the module
runs forward, every tensor autograd saves that is (a view of) the gathered input is packed as
the shard; the first unpack in backward all-gathers once more, the later ones (wq, wk and wv
read the same input) reuse it, and it is freed when the last of them has run. Megatron runs that
all-gather beside the input-gradient GEMM. Here, where the all-gather needs no copy after it
(one sequence per micro-batch, or rows in rank order: `workloads.sp_collectives`), it is waited
where the weight-gradient GEMM first reads it, so it runs beside the first linear's
input-gradient GEMM (Megatron's fused QKV linear hides it behind all three); otherwise DTensor's
copy after the all-gather reads it at once.

The module's input plan must run as a forward pre-hook (PrepareModuleInput, ColwiseParallel)
and be registered before this: the hooks here see the input before and after it.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed.tensor import DTensor, Replicate

from workloads.sp_collectives import gather_sequence
from workloads.zero import local_tensor


def _storage_key(t: torch.Tensor) -> int:
    local = local_tensor(t)
    # a collective's output not yet waited (a real run's input plan hands the output layer one):
    # autograd saves the tensor the wait returns, its buffer, not the wrapper's storage
    if isinstance(local, AsyncCollectiveTensor):
        local = local.elem
    return local.untyped_storage()._cdata


class _Gather:
    """One forward all-gather of one module call: the shard it gathered, and again in backward."""

    def __init__(self, shard: DTensor, gathered: DTensor, rank_order: bool) -> None:
        self.shard = shard
        self.gathered_key = _storage_key(gathered)
        self.rank_order = rank_order
        self._again: DTensor | None = None

    def again(self) -> DTensor:
        if self._again is None:
            with torch.no_grad():
                self._again = gather_sequence(self.shard, rank_order=self.rank_order, async_op=True)
        return self._again


class _Saved:
    """A saved view of the gathered input, as its geometry over the gathered tensor."""

    def __init__(self, gather: _Gather, t: DTensor) -> None:
        local = local_tensor(t)
        self.gather = gather
        self.geometry = (local.size(), local.stride(), local.storage_offset())
        self.shape, self.stride = t.shape, t.stride()
        self.mesh, self.placements = t.device_mesh, t.placements

    def unpack(self) -> DTensor:
        local = local_tensor(self.gather.again()).as_strided(*self.geometry)
        return DTensor.from_local(
            local, self.mesh, self.placements, run_check=False, shape=self.shape, stride=self.stride
        )


def regather_in_backward(module: nn.Module, *, rank_order: bool = False) -> None:
    """Make `module` keep its sequence-sharded input for backward instead of the gathered one.
    `rank_order`: the module's input plan gathers the rows in rank order
    (`workloads.sp_collectives`), and so does the gather here."""
    state: dict = {}

    def before_plan(_mod, args):
        state["shard"] = args[0]

    def after_plan(_mod, args):
        shard, gathered = state.pop("shard"), args[0]
        if not (isinstance(shard, DTensor) and isinstance(gathered, DTensor)):
            raise TypeError(
                f"{type(module).__name__}: regather_in_backward needs DTensor inputs before and "
                "after the module's input plan (a sequence-parallel plan)"
            )
        if any(not p.is_shard() for p in shard.placements) or any(
            not isinstance(p, Replicate) for p in gathered.placements
        ):
            raise ValueError(
                f"{type(module).__name__}: its input plan must all-gather a shard "
                f"({shard.placements} -> {gathered.placements})"
            )
        gather = _Gather(shard, gathered, rank_order)

        def pack(t: torch.Tensor):
            if isinstance(t, DTensor) and _storage_key(t) == gather.gathered_key:
                return _Saved(gather, t)
            return t

        def unpack(saved):
            return saved.unpack() if isinstance(saved, _Saved) else saved

        hooks = torch.autograd.graph.saved_tensors_hooks(pack, unpack)
        hooks.__enter__()
        state["hooks"] = hooks

    def after_forward(_mod, _args, _output):
        hooks = state.pop("hooks", None)
        if hooks is not None:
            hooks.__exit__(None, None, None)

    module.register_forward_pre_hook(before_plan, prepend=True)
    module.register_forward_pre_hook(after_plan)
    module.register_forward_hook(after_forward, always_call=True)
