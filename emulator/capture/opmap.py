"""What a GPU runs for each aten op captured on CPU: normalized name, FLOPs, bytes, workspace.

Capture runs on device `cpu` (NOTES.md: fake `cuda` tensors do not survive backward), so a few
ops are CPU-specific kernels. `GPU_EQUIVALENT` maps them to the op a CUDA build dispatches
instead; `NORMALIZED` maps aten ops to the vocabulary of `emulator/costs/ops.py`
(`OP_NAMES`). Ops not listed fall back on their tags: pointwise -> "elementwise". A program's
own custom ops (torch.library) are described by whoever hands the program over, with
`register_op(CustomOp(...))`: the core names no workload's ops.

FLOPs: `torch.utils.flop_counter.flop_registry` where it has a formula, except that the
attention formulas below replace its attention entries: they count a causal mask as half the
work (FlashAttention-2 paper, Dao 2023, section 4 benchmarks; flash kernels skip masked
tiles) and also cover the CPU flash ops that flop_counter misses. Backward is 2.5x the
forward (5 matmuls against 2, as flop_counter and FlashAttention-2 count it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.flop_counter import flop_registry

from emulator import torch_compat
from emulator.costs.ops import OP_NAMES

_aten = torch.ops.aten

# CPU-only kernel -> the aten op a CUDA build runs for the same Python call. Memory is the same
# for the flash pair: both keep the output and a float32 logsumexp of B x H x S_q
# (checked in tests/emulator/capture/test_opmap.py); the CUDA op's extra philox outputs are 0-dim.
GPU_EQUIVALENT = {
    "aten._scaled_dot_product_flash_attention_for_cpu": "aten._scaled_dot_product_flash_attention",
    "aten._scaled_dot_product_flash_attention_for_cpu_backward": "aten._scaled_dot_product_flash_attention_backward",
}

# aten overload packet name -> normalized op name of emulator/costs/ops.py.
NORMALIZED = {
    "aten.mm": "mm",
    "aten.addmm": "addmm",
    "aten.bmm": "bmm",
    "aten.baddbmm": "bmm",
    "aten.linear": "linear",
    "aten._scaled_mm": "scaled_mm",
    "aten._scaled_dot_product_flash_attention_for_cpu": "flash_attn_fwd",
    "aten._scaled_dot_product_flash_attention": "flash_attn_fwd",
    "aten._scaled_dot_product_efficient_attention": "flash_attn_fwd",
    "aten._scaled_dot_product_cudnn_attention": "flash_attn_fwd",
    "aten._flash_attention_forward": "flash_attn_fwd",
    # the kernels' own ops under SDPA on CUDA, as a profile of a GPU run lists them
    "aten._efficient_attention_forward": "flash_attn_fwd",
    "aten._cudnn_attention_forward": "flash_attn_fwd",
    "aten._scaled_dot_product_flash_attention_for_cpu_backward": "flash_attn_bwd",
    "aten._scaled_dot_product_flash_attention_backward": "flash_attn_bwd",
    "aten._scaled_dot_product_efficient_attention_backward": "flash_attn_bwd",
    "aten._scaled_dot_product_cudnn_attention_backward": "flash_attn_bwd",
    "aten._flash_attention_backward": "flash_attn_bwd",
    "aten._efficient_attention_backward": "flash_attn_bwd",
    "aten._cudnn_attention_backward": "flash_attn_bwd",
    "aten.native_layer_norm": "norm",
    "aten.native_layer_norm_backward": "norm",
    "aten._fused_rms_norm": "norm",
    "aten._fused_rms_norm_backward": "norm",
    "aten.native_group_norm": "norm",
    "aten.native_group_norm_backward": "norm",
    "aten._softmax": "softmax",
    "aten._log_softmax": "softmax",
    "aten._softmax_backward_data": "softmax",
    "aten._log_softmax_backward_data": "softmax",
    "aten.nll_loss_forward": "cross_entropy",
    "aten.nll_loss_backward": "cross_entropy",
    "aten.embedding": "embedding",
    "aten.embedding_dense_backward": "embedding",
    "aten._fused_adamw_": "optimizer_step",
    "aten._fused_adam_": "optimizer_step",
    "aten._fused_sgd_": "optimizer_step",
    "aten._foreach_norm": "reduction",
    "aten.sum": "reduction",
    "aten.mean": "reduction",
    "aten.amax": "reduction",
    "aten.amin": "reduction",
    "aten.max": "reduction",
    "aten.min": "reduction",
    "aten.argmax": "reduction",
    "aten.var_mean": "reduction",
    "aten.linalg_vector_norm": "reduction",
    "aten.norm": "reduction",
    "aten.cumsum": "reduction",
    "aten.copy_": "copy",
    "aten._to_copy": "copy",
    "aten.clone": "copy",
    "aten.cat": "copy",
    "aten.stack": "copy",
    "aten.index": "copy",
    "aten.index_select": "copy",
    "aten.index_put": "copy",
    "aten.index_put_": "copy",
    "aten.gather": "copy",
    "aten.scatter": "copy",
    "aten.scatter_add": "copy",
    "aten.slice_scatter": "copy",
    "aten.select_scatter": "copy",
    "aten.constant_pad_nd": "copy",
    "aten.zeros": "copy",
    "aten.zeros_like": "copy",
    "aten.ones": "copy",
    "aten.ones_like": "copy",
    "aten.full": "copy",
    "aten.full_like": "copy",
    "aten.fill_": "copy",
    "aten.zero_": "copy",
    "aten.new_zeros": "copy",
    "aten.new_ones": "copy",
    "aten.new_full": "copy",
}

# Ops that take a tensor for its dtype, device or shape only: their kernel (a fill) writes the
# output and reads nothing. `x.new_zeros(())` is one element, whatever x's size (ZeRO's
# gradient norm: priced as a copy of the whole fp32 gradient shard before, 1.0 ms too slow on
# the 760M GPT's H100 reprofile, results/calibration/README.md).
READS_NO_INPUT = frozenset(
    {
        "aten.zeros_like",
        "aten.ones_like",
        "aten.full_like",
        "aten.new_zeros",
        "aten.new_ones",
        "aten.new_full",
    }
)

# Ops that only allocate (no kernel), only touch metadata, or are bookkeeping: never compute.
# Views are found from the schema (`OpOverload.is_view`); `_unsafe_view` is not flagged there.
NO_KERNEL = frozenset(
    {
        "aten.empty",
        "aten.empty_like",
        "aten.empty_strided",
        "aten.new_empty",
        "aten.new_empty_strided",
        "aten._unsafe_view",
        "aten.resize_",
        "aten.set_",
        "aten.sym_size",
        "aten.sym_stride",
        "aten.sym_numel",
        "aten.sym_storage_offset",
        "aten.is_same_size",
        "aten.promote_types",  # dtype arithmetic (RoPE's reference math asks it)
        "aten.result_type",
        "aten._local_scalar_dense",
        "aten.record_stream",
    }
)
# Namespaces of ops that are never kernels of this rank's compute stream.
NO_KERNEL_NAMESPACES = frozenset({"prim", "profiler"})
# Collectives reach the dispatcher as ops of these namespaces; the virtual backend records
# them as comm events, the recorder only tracks the buffers they allocate.
COMM_NAMESPACES = frozenset({"c10d", "_c10d_functional", "_c10d_functional_autograd"})


def _attention_dims(query, key) -> tuple[int, int, int, int, int]:
    b, h_q, s_q, d = query.shape
    return b, h_q, s_q, key.shape[-2], d


def attention_fwd_flops(query, key, value, is_causal: bool) -> int:
    """QK^T and PV: 2 matmuls of 2*s_q*s_k*d per (batch, query head); causal keeps half."""
    b, h_q, s_q, s_k, d = _attention_dims(query, key)
    flops = 2 * b * h_q * s_q * s_k * (d + value.shape[-1])
    return flops // 2 if is_causal else flops


def attention_bwd_flops(query, key, value, is_causal: bool) -> int:
    """Recomputed QK^T plus dV, dP, dQ, dK: 5 matmuls, 2.5x the forward."""
    return attention_fwd_flops(query, key, value, is_causal) * 5 // 2


def _flash_fwd_flops(args, kwargs) -> int:
    # (query, key, value, dropout_p=0., is_causal=False, ...) for every sdpa forward variant
    causal = kwargs.get("is_causal", args[4] if len(args) > 4 else False)
    return attention_fwd_flops(args[0], args[1], args[2], bool(causal))


def _flash_cpu_bwd_flops(args, kwargs) -> int:
    # (grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, ...)
    return attention_bwd_flops(args[1], args[2], args[3], bool(args[7]))


def _flash_cuda_bwd_flops(args, kwargs) -> int:
    # (grad_out, q, k, v, out, lse, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, ...)
    return attention_bwd_flops(args[1], args[2], args[3], bool(args[11]))


def _efficient_bwd_flops(args, kwargs) -> int:
    # (grad_out, q, k, v, attn_bias, out, lse, philox_seed, philox_offset, dropout_p,
    #  grad_input_mask, is_causal=False, ...)
    causal = kwargs.get("is_causal", args[11] if len(args) > 11 else False)
    return attention_bwd_flops(args[1], args[2], args[3], bool(causal))


# Formulas taking (args, kwargs); they win over flop_counter's registry.
FLOP_FORMULAS = {
    "aten._scaled_dot_product_flash_attention_for_cpu": _flash_fwd_flops,
    "aten._scaled_dot_product_flash_attention": _flash_fwd_flops,
    "aten._scaled_dot_product_efficient_attention": _flash_fwd_flops,
    "aten._scaled_dot_product_flash_attention_for_cpu_backward": _flash_cpu_bwd_flops,
    "aten._scaled_dot_product_flash_attention_backward": _flash_cuda_bwd_flops,
    "aten._scaled_dot_product_efficient_attention_backward": _efficient_bwd_flops,
}

# Causal flag position in the positional args of attention ops (for the trace's causal column);
# ALWAYS_CAUSAL for ops whose mask is causal by construction.
ALWAYS_CAUSAL = -2
CAUSAL_ARG = {
    "aten._scaled_dot_product_flash_attention_for_cpu": 4,
    "aten._scaled_dot_product_flash_attention": 4,
    "aten._scaled_dot_product_efficient_attention": 4,
    "aten._scaled_dot_product_flash_attention_for_cpu_backward": 7,
    "aten._scaled_dot_product_flash_attention_backward": 11,
    "aten._scaled_dot_product_efficient_attention_backward": 11,
}


def _round_up(x: int, multiple: int) -> int:
    return (x + multiple - 1) // multiple * multiple


def flash_bwd_workspace_bytes(query, key) -> int:
    """Float32 scratch the CUDA FlashAttention-2 backward allocates for the call's duration.

    FlashAttention-2 `mha_bwd` (csrc/flash_attn/flash_api.cpp, vendored by torch under
    aten/src/ATen/native/transformers/cuda/flash_attn/): softmax_d of B x H x S_q_rounded and
    dq_accum of B x S_q_rounded x H x D_rounded (S rounded to 128, D to 32), float32; with
    GQA also dK, dV expanded to the query heads in the input dtype. torch's cuDNN backward
    (the default on an H100) holds the same buffers in one workspace: the shared H100 profiles
    list its kernels (compute_dot_do_o, convert_dq_to_16bits, and fmha_reduce_head twice under
    GQA), whose durations fit float32 dQ and 16-bit expanded dK/dV traffic.
    """
    b, h_q, s_q, s_k, d = _attention_dims(query, key)
    s_q_rounded, d_rounded = _round_up(s_q, 128), _round_up(d, 32)
    scratch = 4 * b * h_q * s_q_rounded * (1 + d_rounded)
    if key.shape[1] != h_q:
        scratch += 2 * b * s_k * h_q * d * query.element_size()
    return scratch


WORKSPACE_FORMULAS = {
    "aten._scaled_dot_product_flash_attention_for_cpu_backward": lambda args, kwargs: (
        flash_bwd_workspace_bytes(args[1], args[2])
    ),
    "aten._scaled_dot_product_flash_attention_backward": lambda args, kwargs: (
        flash_bwd_workspace_bytes(args[1], args[2])
    ),
}


# Ops whose CUDA kernel zero-fills one of its outputs with a dispatched fill before writing into
# it (the fill is a kernel of its own, which the profiles list as a nested `aten::fill_`; on CPU
# under fake tensors it does not run): output index. ATen: nll_loss_backward_out_cuda_template
# calls `grad_input.zero_()`; embedding_dense_backward_cuda makes grad_weight with `at::zeros`.
# A real H100 run of the 125M GPT: 997 us for the float32 [16 384, 50 304] gradient
# (results/calibration/README.md).
ZERO_FILLED_OUTPUT = {
    "aten.nll_loss_backward": 0,
    "aten.embedding_dense_backward": 0,
}
ZERO_FILL = "aten.fill_"  # what the profiles call that kernel

# Overloads whose ATen implementation copies an input to a contiguous tensor before its kernel
# runs (a `clone` kernel and a transient buffer of the input's size, on every device; under
# fake tensors the meta kernel skips it): input index. ATen/native/ReduceAllOps.cpp: `max()`
# and `min()` call their all-reduce stub on `self.contiguous()`. torchao's tensorwise fp8 amax
# is `max(abs(w.t()))`: on a real H100 each weight cast copied the transposed weight first,
# 439 us for a [4 096, 14 336] bf16 weight of Llama 3 8B (results/calibration/README.md).
CONTIGUOUS_INPUT = {
    "aten.max.default": 0,
    "aten.min.default": 0,
}


# Out-of-place ops that ATen implements as a clone of `self` and the in-place op on it: a copy
# kernel and the in-place kernel on a GPU, where a dispatch mode sees one op (the recorder
# records the two). ATen/native/TensorAdvancedIndexing.cpp `masked_fill`: `self` broadcast
# against the mask, `clone(at::MemoryFormat::Contiguous)`, then `masked_fill_`; the shared H100
# profile of MPT-7B (86a4f47's ALiBi bias) lists that copy: 357 us for [32, 2 048, 2 048] fp32.
CLONES_SELF = frozenset({"aten.masked_fill"})


@dataclass(frozen=True, kw_only=True)
class CustomOp:
    """How a program's own custom op is priced: what a GPU runs for it (`name`, a costs/ops.py
    op), its FLOPs (args, kwargs) -> int, where its causal flag is (or ALWAYS_CAUSAL), and the
    scratch it allocates while it runs (args, kwargs) -> bytes."""

    packet: str  # "namespace.op", as torch.library names it ("prism.rope")
    name: str
    flops: object = None
    causal_arg: int = -1
    workspace: object = None


_CUSTOM_OPS: dict[str, CustomOp] = {}


def register_op(op: CustomOp) -> None:
    """Tell the capture what `op.packet` is; a second registration of a name is refused.

    Registered before capture: the recorder describes each op once (`op_info`)."""
    if op.packet in _CUSTOM_OPS or op.packet in NORMALIZED or op.packet in FLOP_FORMULAS:
        raise ValueError(f"op {op.packet!r} is already described; register it once")
    if op.name not in OP_NAMES:
        raise ValueError(f"op {op.packet!r}: name={op.name!r} is not one of {sorted(OP_NAMES)}")
    _CUSTOM_OPS[op.packet] = op


def registered_op(packet: str) -> CustomOp | None:
    return _CUSTOM_OPS.get(packet)


def unregister_op(packet: str) -> None:
    """Forget a registration (tests)."""
    _CUSTOM_OPS.pop(packet, None)


@dataclass(frozen=True, kw_only=True, slots=True)
class OpInfo:
    """Everything the recorder needs about one OpOverload, computed once per overload."""

    aten: str  # overload packet name as a GPU build spells it ("aten.mm")
    name: str  # normalized name (costs/ops.py vocabulary), "" when no kernel runs
    is_view: bool  # output aliases an input: never allocates
    is_comm: bool
    mutated_args: tuple[tuple[int, str], ...]  # (position, name) of arguments written in place
    flop_fn: object  # callable(args, kwargs, out) -> int, or None
    workspace_fn: object  # callable(args, kwargs) -> bytes, or None
    causal_arg: int  # position of is_causal, -1 when not an attention op
    ignored: bool  # bookkeeping op (prim.device, profiler): neither compute nor memory
    zero_filled_output: int = -1  # ZERO_FILLED_OUTPUT's index for this op, -1 when none
    # a view by its schema that CompositeImplicitAutograd implements and that may copy
    # (contiguous, reshape, to): it reaches a dispatch mode whole only from code below autograd
    # (a tensor subclass's __torch_dispatch__: torchao's fp8 GEMMs make their operands
    # contiguous there), where the recorder decomposes it: a CUDA build runs its parts (the
    # `clone` of a transposed tensor's contiguous is a copy kernel)
    decomposes: bool = False
    contiguous_input: int = -1  # CONTIGUOUS_INPUT's index for this overload, -1 when none
    reads_inputs: bool = True  # False for READS_NO_INPUT
    clones_self: bool = False  # CLONES_SELF


def _registry_flops(formula):
    return lambda args, kwargs, out: formula(*args, **kwargs, out_val=out)


def _table_flops(formula):
    return lambda args, kwargs, out: formula(args, kwargs)


def normalized_name(packet: str) -> str:
    """Normalized op name, or "" when the op launches no kernel.

    Ops missing from `NORMALIZED` (pointwise math, foreach updates, masks, dropout) are priced
    as "elementwise": memory-bound, by the bytes they move.
    """
    namespace = packet.split(".", 1)[0]
    if packet in NO_KERNEL or namespace in NO_KERNEL_NAMESPACES or namespace in COMM_NAMESPACES:
        return ""
    if packet in _CUSTOM_OPS:
        return _CUSTOM_OPS[packet].name
    return NORMALIZED.get(packet, "elementwise")


def op_info(func) -> OpInfo:
    """Describe one OpOverload (the recorder caches the answer per overload)."""
    cpu_packet = f"{func.namespace}.{func._opname}"
    packet = GPU_EQUIVALENT.get(cpu_packet, cpu_packet)
    is_view = bool(getattr(func, "is_view", False)) or cpu_packet == "aten._unsafe_view"
    name = "" if is_view else normalized_name(cpu_packet)
    mutated = tuple(
        (i, arg.name)
        for i, arg in enumerate(func._schema.arguments)
        if arg.alias_info is not None and arg.alias_info.is_write
    )
    custom = _CUSTOM_OPS.get(cpu_packet)
    if custom is not None and custom.flops is not None:
        flop_fn = _table_flops(custom.flops)
    elif cpu_packet in FLOP_FORMULAS:
        flop_fn = _table_flops(FLOP_FORMULAS[cpu_packet])
    elif func.overloadpacket in flop_registry:
        flop_fn = _registry_flops(flop_registry[func.overloadpacket])
    else:
        flop_fn = None
    return OpInfo(
        aten=packet,
        name=name,
        is_view=is_view,
        is_comm=func.namespace in COMM_NAMESPACES,
        mutated_args=mutated,
        flop_fn=flop_fn if name else None,
        workspace_fn=custom.workspace if custom else WORKSPACE_FORMULAS.get(cpu_packet),
        causal_arg=custom.causal_arg if custom else CAUSAL_ARG.get(cpu_packet, -1),
        ignored=func.namespace in NO_KERNEL_NAMESPACES,
        zero_filled_output=ZERO_FILLED_OUTPUT.get(packet, -1) if name else -1,
        decomposes=is_view
        and func.namespace == "aten"
        and torch_compat.is_composite_implicit(func),
        contiguous_input=CONTIGUOUS_INPUT.get(f"{cpu_packet}.{func._overloadname}", -1),
        reads_inputs=packet not in READS_NO_INPUT,
        clones_self=packet in CLONES_SELF,
    )


def check_vocabulary() -> list[str]:
    """Normalized names used here that costs/ops.py does not know (must stay empty)."""
    return sorted({*NORMALIZED.values(), "elementwise"} - set(OP_NAMES))
