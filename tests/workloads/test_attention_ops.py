"""Position-masked attention: the custom op pair against autograd, and FlexAttention's mods."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from workloads.models.attention_ops import (
    flex_position_masked_attention,
    masked_attention,
    masked_attention_backward,
    on_real_gpu,
    position_masked_attention,
    real,
)
from workloads.models.common import alibi_slopes


def _inputs(heads=4, kv_heads=2, seq=16, dim=8, dtype=torch.float32, device="cpu"):
    torch.manual_seed(0)
    q = torch.randn(2, heads, seq, dim, dtype=dtype, device=device)
    k = torch.randn(2, kv_heads, seq, dim, dtype=dtype, device=device)
    v = torch.randn(2, kv_heads, seq, dim, dtype=dtype, device=device)
    slopes = torch.tensor(alibi_slopes(heads), dtype=torch.float32, device=device)
    return q, k, v, slopes


def _autograd_reference(q, k, v, q_pos, kv_pos, slopes):
    """The same attention with plain ops (an s x s bias through SDPA), differentiated by autograd."""
    distance = (q_pos[:, None] - kv_pos[None, :]).to(q.dtype)
    bias = (-slopes.to(q.dtype).view(-1, 1, 1) * distance).masked_fill(distance < 0, -math.inf)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=True)


@pytest.mark.parametrize("shifted", [False, True], ids=["one-sequence", "context-parallel-chunk"])
def test_custom_op_pair_matches_autograd_through_plain_attention(shifted):
    q, k, v, slopes = _inputs()
    kv_pos = torch.arange(16)
    # a context-parallel rank holds queries at later positions than the keys' first chunk
    q_pos = torch.arange(16) + (8 if shifted else 0)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = masked_attention(*leaves, q_pos, kv_pos, slopes)
    reference = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = _autograd_reference(*reference, q_pos, kv_pos, slopes)
    torch.testing.assert_close(out, expected)
    grad = torch.randn_like(out)
    out.backward(grad)
    expected.backward(grad)
    for got, want in zip(leaves, reference, strict=True):
        torch.testing.assert_close(got.grad, want.grad)
    assert lse.dtype == torch.float32 and lse.shape == q.shape[:-1]


def test_under_fake_tensors_the_op_allocates_what_the_flash_kernel_keeps():
    with FakeTensorMode():
        q = torch.empty(2, 4, 128, 64, dtype=torch.bfloat16)
        kv = torch.empty(2, 2, 128, 64, dtype=torch.bfloat16)
        pos = torch.arange(128)
        out, lse = masked_attention(q, kv, kv, pos, pos, torch.empty(4))
    assert (out.shape, out.dtype) == (q.shape, torch.bfloat16)
    assert (lse.shape, lse.dtype) == (torch.Size([2, 4, 128]), torch.float32)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_attention_mods_say_the_same_mask_and_bias():
    q, k, v, slopes = _inputs()
    q_pos, kv_pos = torch.arange(16) + 8, torch.arange(16)
    flex = flex_position_masked_attention(q, k, v, q_pos, kv_pos, slopes, compiled=False)
    op_out, _ = masked_attention(q, k, v, q_pos, kv_pos, slopes)
    torch.testing.assert_close(flex, op_out, rtol=1e-4, atol=1e-5)


def test_on_cpu_the_module_path_is_the_custom_op():
    q, k, v, slopes = _inputs()
    pos = torch.arange(16)
    torch.testing.assert_close(
        position_masked_attention(q, k, v, pos, pos, slopes),
        masked_attention(q, k, v, pos, pos, slopes)[0],
    )


def test_the_capture_s_fake_cuda_tensors_take_the_op_not_a_gpu_kernel():
    with FakeTensorMode():
        fake_cuda = torch.empty(2, 4, 16, 8, device="cuda")
    assert fake_cuda.is_cuda and not on_real_gpu(fake_cuda)
    assert not on_real_gpu(torch.empty(2))  # a CPU tensor: no GPU kernel either


def test_the_real_tensor_check_compiles_without_a_graph_break():
    # a graph break here made a compiled, checkpointed block run eagerly on CUDA
    def pick(x):
        return x + 1 if real(x) else x - 1

    x = torch.ones(3)
    assert real(x)
    torch.testing.assert_close(torch.compile(pick, fullgraph=True, backend="eager")(x), x + 1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_compiled_flex_attention_matches_the_reference_forward_and_backward():
    q, k, v, slopes = _inputs(
        heads=8, kv_heads=2, seq=256, dim=64, dtype=torch.bfloat16, device="cuda"
    )
    pos = torch.arange(256, device="cuda")
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = position_masked_attention(*leaves, pos, pos, slopes)
    reference = [t.float().clone().requires_grad_() for t in (q, k, v)]
    expected = _autograd_reference(*reference, pos, pos, slopes)
    torch.testing.assert_close(out.float(), expected, rtol=2e-2, atol=2e-2)
    grad = torch.randn_like(out)
    out.backward(grad)
    expected.backward(grad.float())
    for got, want in zip(leaves, reference, strict=True):
        torch.testing.assert_close(got.grad.float(), want.grad, rtol=5e-2, atol=5e-2)


def test_a_forward_builds_its_block_mask_once_for_all_layers():
    from workloads.models.attention_ops import _block_mask

    positions = torch.arange(256)
    first = _block_mask(positions, positions, 256, 256, False)
    assert _block_mask(positions, positions, 256, 256, False) is first  # the next layer
    assert _block_mask(torch.arange(256), torch.arange(256), 256, 256, False) is not first
    chunk = torch.arange(128, 256)  # context parallelism: queries and keys differ
    assert _block_mask(chunk, positions, 128, 256, False) is not _block_mask(
        chunk, positions, 128, 256, False
    )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_flash_only_attention_runs_the_flash_kernel_not_cudnn():
    from torch.profiler import ProfilerActivity, profile

    from workloads.models.common import CausalAttention

    core = CausalAttention(alibi=False, total_heads=8)
    core.flash_only = True
    q, k, v = (torch.randn(2, 1024, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in "qkv")
    positions = torch.arange(1024, device="cuda")
    core(q, k, v, positions)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        core(q, k, v, positions)
        torch.cuda.synchronize()
    names = [e.name.lower() for e in prof.events() if e.device_type.name == "CUDA"]
    assert any("flash" in n for n in names) and not any("cudnn" in n for n in names), names


def _as_projected(t):
    """t [b, h, s, d] laid out as the workloads pass it: a [b, s, h, d] projection transposed."""
    return t.transpose(1, 2).contiguous().transpose(1, 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_opcheck_passes_forward_and_backward_with_the_workloads_layout(dtype):
    # opcheck compares the fake kernel's outputs with the real one's, strides included: a real
    # kernel that returned contiguous outputs for transposed inputs would fail it
    q, k, v, slopes = _inputs(dtype=dtype)
    q, k, v = (_as_projected(t).requires_grad_() for t in (q, k, v))
    pos = torch.arange(q.shape[2])
    torch.library.opcheck(masked_attention, (q, k, v, pos, pos, slopes))
    out, lse = masked_attention(q, k, v, pos, pos, slopes)
    grad = _as_projected(torch.randn_like(out))
    saved = (t.detach() for t in (q, k, v, out, lse))
    args = (grad, *saved, pos, pos, slopes)
    torch.library.opcheck(masked_attention_backward, args)


def test_outputs_take_the_layout_of_q_k_and_v_as_flex_attention_lays_them_out():
    q, k, v, slopes = _inputs()
    q, k, v = (_as_projected(t).requires_grad_() for t in (q, k, v))
    pos = torch.arange(q.shape[2])
    out, _ = masked_attention(q, k, v, pos, pos, slopes)
    out.backward(_as_projected(torch.randn_like(out)))
    assert out.stride() == q.stride()
    assert [t.grad.stride() for t in (q, k, v)] == [t.stride() for t in (q, k, v)]
