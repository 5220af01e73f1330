"""Activation recomputation of a GPT/Llama model: "none", "selective" or "full".

- "full" checkpoints every TransformerBlock: only the block's input is kept,
  the whole block reruns in backward (Megatron `--recompute-granularity full`,
  uniform, one layer per checkpoint; torchtitan `mode = "full"`).
- "selective" is torchtitan's op-level selective activation checkpointing
  (`create_selective_checkpoint_contexts`), per block: the outputs of matmuls
  and of attention are saved, all pointwise and normalisation ops are recomputed,
  and every second matmul is recomputed too (torchtitan's `_save_list` policy;
  `OP_POLICIES`: torchtitan's also keeps `abs`, the workloads' own at 86a4f47 did not).
  `apply_recompute(..., selective="core-attention")` is Korthikanti et al.'s scheme
  instead, Megatron's `--recompute-granularity selective`: only each block's core
  attention (QK^T, softmax, dropout, AV) reruns (`kernels.selective_recompute`). With
  flash attention it saves little, since the S x S scores are never stored; with
  Megatron's unfused attention it is what keeps them out of memory.

Both use the composable `torch.distributed._composable.checkpoint` (non-reentrant),
which keeps parameter names unchanged, so tensor-parallel plans, pipeline splits
and `init_weights` seeds still find them. Apply it after tensor/context
parallelism and before FSDP, as torchtitan does. RNG state is saved for the
recomputation only when a block draws random numbers (attention dropout,
`preserve_rng_state`), as Megatron's checkpoint restores its RNG tracker.
`early_stop`: torch's non-reentrant checkpoint (torchtitan) stops rerunning a region once
backward has every tensor it saved (a block's last GEMM, whose output nothing saves, is not
rerun); Megatron's reentrant `CheckpointFunction` reruns the whole region
(`kernels.recompute_reruns`).
"""

from __future__ import annotations

import contextlib
import functools
from collections import defaultdict

import torch
from torch import nn
from torch.distributed._composable import checkpoint
from torch.utils.checkpoint import (
    SAC_IGNORED_OPS,
    CheckpointPolicy,
    create_selective_checkpoint_contexts,
)

from workloads.job import RECOMPUTE_MODES
from workloads.kernels import SELECTIVE_GRANULARITIES

_aten = torch.ops.aten
# The attention kernels: the GPU's (flash, memory-efficient; cuDNN's where SDPA picks it on an
# H100 in device mode) and the CPU one the capture runs in their place.
_ATTENTION = {
    _aten._scaled_dot_product_flash_attention.default,
    _aten._scaled_dot_product_efficient_attention.default,
    _aten._scaled_dot_product_cudnn_attention.default,
    _aten._scaled_dot_product_flash_attention_for_cpu.default,
}


# Matmuls as an op-level policy sees them (every second one is recomputed): `aten.mm`, which
# is also how torchao's float8 GEMMs reach it (a dispatch mode sees `mm` on Float8TrainingTensor
# before the subclass calls `_scaled_mm`); `addmm` (a linear with a bias) and `_scaled_mm` (the
# workloads' own float8 linears call it directly).
_GEMMS = frozenset({_aten.mm.default, _aten.addmm.default, _aten._scaled_mm.default})
_KEPT = (
    _GEMMS
    | _ATTENTION
    | {
        torch.ops._c10d_functional.reduce_scatter_tensor.default,
        _aten.max.default,  # a float8 cast's amax
    }
)
# The ops whose outputs a policy keeps. "op": torchtitan's `_save_list` at 9dec370
# (torchtitan/parallelisms/parallelize_llama.py, the code of its Dec 2024 benchmarks), which
# also keeps `abs` ("the result of max(abs(tensor))" for float8, torchtitan #701, Nov 2024;
# `abs` left the list in #820, Feb 2025, for the memory it held). "op-prism-86a4f47": the
# workloads' own policy at 86a4f47, without `abs`.
OP_POLICIES = {"op": _KEPT | {_aten.abs.default}, "op-prism-86a4f47": _KEPT}


def _op_policy(granularity: str = "op"):
    """The SAC policy function of `OP_POLICIES[granularity]`, with its own matmul counts
    (forward and recomputation apart, as torchtitan counts them)."""
    kept = OP_POLICIES[granularity]
    matmul_counts: dict[bool, int] = defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        if func in _GEMMS:
            matmul_counts[ctx.is_recompute] += 1
            # recompute every second matmul, as torchtitan does, to trade memory for compute
            if matmul_counts[ctx.is_recompute] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        if func in kept:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


# Bookkeeping ops that FSDP2's hooks run inside a block's recompute but outside its first
# forward (its pre-forward hook runs before the checkpoint region is entered): they launch no
# kernel, and SAC must not count them or recompute finds no stored entry for them.
_BOOKKEEPING_OPS = {
    torch.ops.profiler._record_function_enter_new.default,
    torch.ops.profiler._record_function_exit._RecordFunction,
}


@contextlib.contextmanager
def _ignoring_bookkeeping(context):
    added = _BOOKKEEPING_OPS - SAC_IGNORED_OPS
    SAC_IGNORED_OPS.update(added)
    try:
        with context:
            yield
    finally:
        SAC_IGNORED_OPS.difference_update(added)


def _op_context(granularity: str):
    forward, recompute = create_selective_checkpoint_contexts(_op_policy(granularity))
    return _ignoring_bookkeeping(forward), _ignoring_bookkeeping(recompute)


def apply_recompute(
    model: nn.Module,
    mode: str,
    *,
    selective: str = "op",
    preserve_rng_state: bool = False,
    early_stop: bool = True,
) -> nn.Module:
    """Checkpoint each block of `model.layers` per `mode`; returns the same model."""
    if mode not in RECOMPUTE_MODES:
        raise ValueError(f"train.recompute={mode!r} must be one of {RECOMPUTE_MODES}")
    if selective not in SELECTIVE_GRANULARITIES:
        raise ValueError(f"selective={selective!r} must be one of {SELECTIVE_GRANULARITIES}")
    if mode == "none":
        return model
    for block in model.layers.values():
        options = {"preserve_rng_state": preserve_rng_state, "early_stop": early_stop}
        if mode == "full":
            checkpoint(block, **options)
        elif selective in OP_POLICIES:
            checkpoint(block, context_fn=functools.partial(_op_context, selective), **options)
        else:
            checkpoint(block.attention.core_attention, **options)
    return model
