"""The workloads' custom ops, described to the emulator's op map (`emulator.capture.opmap`).

The workloads define torch.library ops so that capture sees one op where a GPU runs one
fused kernel: `prism::masked_attention` and its backward (position-masked attention for ALiBi
and context parallelism: one FlashAttention kernel each way, which takes ALiBi slopes; see
workloads/models/attention_ops.py), `prism::rope` (one fused elementwise kernel each way,
as Megatron-core's fused RoPE; workloads/models/rope_ops.py), and the fused cross-entropy
`prism::cross_entropy` with its backward, out of place or in place (`kernels.loss = "fused"`
or "fused-inplace"; workloads/loss.py), and Megatron's fused causal softmax of the unfused
attention with its in-place backward (`kernels.attention = "unfused"`;
workloads/models/unfused_attention.py): memory-bound kernels priced by the bytes they move,
which the recorder takes from their inputs and outputs (an in-place backward writes the
tensor it reads). This module says what they are;
`register_workload_ops()` registers them once per process, before any capture.
"""

from __future__ import annotations

from emulator.capture.opmap import (
    ALWAYS_CAUSAL,
    CustomOp,
    attention_bwd_flops,
    attention_fwd_flops,
    register_op,
    registered_op,
)


def _masked_fwd_flops(args, kwargs) -> int:
    # (q, k, v, q_positions, kv_positions, slopes): causal by position. Within one sequence that
    # is half of s_q * s_kv; for load-balanced context parallelism (chunks i and 2cp-1-i) it is
    # exactly half too, by construction.
    return attention_fwd_flops(args[0], args[1], args[2], True)


def _masked_bwd_flops(args, kwargs) -> int:
    # (grad_out, q, k, v, out, logsumexp, q_positions, kv_positions, slopes)
    return attention_bwd_flops(args[1], args[2], args[3], True)


WORKLOAD_OPS = (
    CustomOp(
        packet="prism.masked_attention",
        name="flash_attn_fwd",
        flops=_masked_fwd_flops,
        causal_arg=ALWAYS_CAUSAL,
    ),
    CustomOp(
        packet="prism.masked_attention_backward",
        name="flash_attn_bwd",
        flops=_masked_bwd_flops,
        causal_arg=ALWAYS_CAUSAL,
    ),
    CustomOp(packet="prism.rope", name="elementwise"),
    CustomOp(packet="prism.cross_entropy", name="cross_entropy"),
    CustomOp(packet="prism.cross_entropy_backward", name="cross_entropy"),
    CustomOp(packet="prism.cross_entropy_backward_", name="cross_entropy"),
    CustomOp(packet="prism.causal_softmax", name="softmax"),
    CustomOp(packet="prism.causal_softmax_backward_", name="softmax"),
)


def register_workload_ops() -> None:
    """Register WORKLOAD_OPS with the op map, once per process."""
    for op in WORKLOAD_OPS:
        existing = registered_op(op.packet)
        if existing is None:
            register_op(op)
        elif existing != op:
            raise ValueError(f"op {op.packet!r} is registered with another description")
