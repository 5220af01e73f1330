"""The workloads' custom ops as the program adapter describes them to the capture."""

import pytest
import torch

import workloads.models.attention_ops  # noqa: F401  (defines prism::masked_attention)
import workloads.models.rope_ops  # noqa: F401  (defines prism::rope)
from emulator.capture.opmap import ALWAYS_CAUSAL, CustomOp, op_info, register_op
from prismbench.workload_ops import register_workload_ops


def test_workload_ops_are_priced_as_their_fused_gpu_kernels():
    register_workload_ops()
    register_workload_ops()  # once per process: a second call changes nothing
    attention = op_info(torch.ops.prism.masked_attention.default)
    backward = op_info(torch.ops.prism.masked_attention_backward.default)
    rope = op_info(torch.ops.prism.rope.default)
    assert (attention.name, attention.causal_arg) == ("flash_attn_fwd", ALWAYS_CAUSAL)
    assert (backward.name, backward.causal_arg) == ("flash_attn_bwd", ALWAYS_CAUSAL)
    assert rope.name == "elementwise"
    q = torch.empty(2, 4, 128, 64)
    # causal by position: half of QK^T and PV
    assert (
        attention.flop_fn((q, q, q, None, None, None), {}, None) == 2 * 2 * 4 * 128 * 128 * 128 // 2
    )


def test_a_workload_op_cannot_be_registered_twice():
    register_workload_ops()
    with pytest.raises(ValueError, match="already described"):
        register_op(CustomOp(packet="prism.rope", name="elementwise"))
