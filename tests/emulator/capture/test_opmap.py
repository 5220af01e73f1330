"""Tests for emulator/capture/opmap.py: CPU->GPU op mapping, normalized names, FLOP formulas."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count

from emulator.capture import opmap

aten = torch.ops.aten


def test_every_normalized_name_is_in_the_cost_model_vocabulary():
    assert opmap.check_vocabulary() == []


@pytest.mark.parametrize("cpu, gpu", sorted(opmap.GPU_EQUIVALENT.items()))
def test_gpu_equivalents_are_real_aten_ops_with_the_same_normalized_name(cpu, gpu):
    for name in (cpu, gpu):
        assert hasattr(aten, name.removeprefix("aten."))
    assert opmap.NORMALIZED[cpu] == opmap.NORMALIZED[gpu]


def test_cpu_flash_forward_keeps_output_and_float32_logsumexp_as_cuda_flash_does():
    with FakeTensorMode():
        q = torch.empty(2, 4, 16, 8, dtype=torch.bfloat16)
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, q, q, 0.0, True)
    assert (out.shape, out.dtype) == (q.shape, torch.bfloat16)
    assert (tuple(lse.shape), lse.dtype) == ((2, 4, 16), torch.float32)


def test_op_info_maps_cpu_flash_to_the_cuda_op_name():
    info = opmap.op_info(aten._scaled_dot_product_flash_attention_for_cpu.default)
    assert (info.aten, info.name, info.causal_arg) == (
        "aten._scaled_dot_product_flash_attention",
        "flash_attn_fwd",
        4,
    )


@pytest.mark.parametrize(
    "op, name, is_view, is_comm",
    [
        (aten.view.default, "", True, False),
        (aten._unsafe_view.default, "", True, False),
        (aten.empty.memory_format, "", False, False),
        (aten.mm.default, "mm", False, False),
        (aten.gelu.default, "elementwise", False, False),
        (aten._fused_adamw_.default, "optimizer_step", False, False),
        (torch.ops._c10d_functional.all_gather_into_tensor.default, "", False, True),
    ],
)
def test_op_info_classifies_kernels_views_and_collectives(op, name, is_view, is_comm):
    info = opmap.op_info(op)
    assert (info.name, info.is_view, info.is_comm) == (name, is_view, is_comm)


def test_op_info_finds_in_place_arguments():
    assert opmap.op_info(aten.add_.Tensor).mutated_args == ((0, "self"),)
    assert opmap.op_info(aten.add.Tensor).mutated_args == ()


def test_non_causal_attention_flops_match_flop_counter():
    q, k = torch.empty(2, 8, 64, 16), torch.empty(2, 2, 96, 16)  # GQA, s_q != s_k
    assert opmap.attention_fwd_flops(q, k, k, False) == sdpa_flop_count(q.shape, k.shape, k.shape)
    assert opmap.attention_bwd_flops(q, k, k, False) == sdpa_backward_flop_count(
        q.shape, q.shape, k.shape, k.shape
    )


def test_causal_attention_counts_half_the_work():
    q = torch.empty(1, 4, 128, 64)
    full = 4 * 1 * 4 * 128 * 128 * 64
    assert opmap.attention_fwd_flops(q, q, q, True) == full // 2
    assert opmap.attention_bwd_flops(q, q, q, True) == full * 5 // 4


def test_scaled_mm_flops_are_those_of_the_gemm():
    info = opmap.op_info(aten._scaled_mm.default)
    a, b, scale = torch.empty(32, 64), torch.empty(64, 16), torch.empty(())
    assert info.name == "scaled_mm"
    assert info.flop_fn((a, b, scale, scale), {}, torch.empty(32, 16)) == 2 * 32 * 64 * 16
    assert aten._scaled_mm in flop_registry


def test_flash_backward_workspace_rounds_sequence_and_head_dim():
    q = torch.empty(2, 4, 100, 40, dtype=torch.bfloat16)
    # softmax_d 2*4*128 floats + dq_accum 2*128*4*64 floats
    assert opmap.flash_bwd_workspace_bytes(q, q) == 4 * 2 * 4 * 128 * (1 + 64)
    k = torch.empty(2, 2, 100, 40, dtype=torch.bfloat16)
    assert (
        opmap.flash_bwd_workspace_bytes(q, k) - opmap.flash_bwd_workspace_bytes(q, q)
        == 2 * 2 * 100 * 4 * 40 * 2
    )


@torch.library.custom_op("prismtest::scaled_copy", mutates_args=())
def _scaled_copy(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def test_a_custom_op_is_priced_as_registered_and_unregistered_falls_back_to_elementwise():
    func = torch.ops.prismtest.scaled_copy.default
    assert opmap.op_info(func).name == "elementwise"  # the documented fallback
    op = opmap.CustomOp(
        packet="prismtest.scaled_copy",
        name="norm",
        flops=lambda args, kwargs: 7 * args[0].numel(),
        causal_arg=opmap.ALWAYS_CAUSAL,
    )
    opmap.register_op(op)
    try:
        info = opmap.op_info(func)
        assert (info.name, info.causal_arg) == ("norm", opmap.ALWAYS_CAUSAL)
        assert info.flop_fn((torch.ones(3),), {}, None) == 21
        with pytest.raises(ValueError, match="already described"):
            opmap.register_op(op)
    finally:
        opmap.unregister_op("prismtest.scaled_copy")


def test_registration_refuses_an_unknown_kernel_name_and_a_builtin_op():
    with pytest.raises(ValueError, match="is not one of"):
        opmap.register_op(opmap.CustomOp(packet="prismtest.other", name="magic"))
    with pytest.raises(ValueError, match="already described"):
        opmap.register_op(opmap.CustomOp(packet="aten.mm", name="mm"))
