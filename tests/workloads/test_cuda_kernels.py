"""The custom ops' CUDA kernels (workloads/models/cuda_kernels.py): each op's reference math,
compiled. On CPU: every reference compiles as one graph (what Inductor needs to fuse it) and
computes what the eager op computes; on a GPU (`gpu` marker): the ops run fused kernels and the
loss keeps no float32 copy of the logits."""

import warnings

import pytest
import torch

from workloads import loss
from workloads.models import rope_ops, unfused_attention

CUSTOM_OPS = (
    "prism::rope",
    "prism::cross_entropy",
    "prism::cross_entropy_backward",
    "prism::cross_entropy_backward_",
    "prism::causal_softmax",
    "prism::causal_softmax_backward_",
)


@pytest.mark.parametrize("op", CUSTOM_OPS)
def test_every_custom_op_has_a_cuda_kernel_of_its_own(op):
    assert torch._C._dispatch_has_kernel_for_dispatch_key(op, "CUDA")


def _logits(tokens=6, vocab=11, dtype=torch.bfloat16):
    torch.manual_seed(0)
    logits = torch.randn(tokens, vocab).to(dtype)
    labels = torch.randint(0, 2 * vocab, (tokens,))  # half outside this shard (tp)
    return logits, labels


def _one_graph(fn):
    """`fn` compiled with fullgraph=True: fails on any graph break. aot_eager traces what
    Inductor would get without generating kernels (seconds on a CPU)."""
    return torch.compile(fn, fullgraph=True, dynamic=False, backend="aot_eager")


def test_the_loss_references_compile_as_one_graph_and_compute_the_eager_values():
    logits, labels = _logits()
    lse, target = loss._stats(logits, labels, 0)
    torch.testing.assert_close(_one_graph(loss._stats)(logits, labels, 0), (lse, target))
    grad_loss = torch.rand(labels.shape)
    expected = loss._gradient_in_dtype(grad_loss, logits, labels, lse, 0)
    torch.testing.assert_close(
        _one_graph(loss._gradient_in_dtype)(grad_loss, logits, labels, lse, 0), expected
    )
    over = logits.clone()
    _one_graph(loss._gradient_over_logits)(grad_loss, over, labels, lse, 0)
    torch.testing.assert_close(over, expected)


def test_the_loss_gradient_is_softmax_minus_the_label_where_this_shard_holds_it():
    logits, labels = _logits(dtype=torch.float32)
    vocab_start = 11  # this shard holds columns 11..21
    lse, _ = loss._stats(logits, labels, vocab_start)
    grad = loss._gradient(torch.ones(labels.shape), logits, labels, lse, vocab_start)
    softmax = (logits - lse[:, None]).exp()
    for row, label in enumerate(labels.tolist()):
        expected = softmax[row].clone()
        if vocab_start <= label < vocab_start + 11:
            expected[label - vocab_start] -= 1
        torch.testing.assert_close(grad[row], expected)


def test_the_rope_and_softmax_references_compile_as_one_graph():
    x = torch.randn(2, 5, 3, 8, dtype=torch.bfloat16)
    positions = torch.arange(5)
    torch.testing.assert_close(
        _one_graph(rope_ops.rotate)(x, positions, 10000.0, False),
        rope_ops.rotate(x, positions, 10000.0, False),
    )
    scores = torch.randn(3, 4, 4, dtype=torch.bfloat16)
    probs = unfused_attention._masked_softmax(scores)
    torch.testing.assert_close(_one_graph(unfused_attention._masked_softmax)(scores), probs)
    grad = torch.randn_like(scores)
    expected = grad.clone()
    unfused_attention._softmax_backward_over_grad(expected, probs)
    _one_graph(unfused_attention._softmax_backward_over_grad)(grad, probs)
    torch.testing.assert_close(grad, expected)


def _cuda_kernels(fn) -> list[str]:
    """Names of the CUDA kernels `fn()` launches (profiler records, after a warm-up call)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_rope_is_one_kernel_and_matches_the_cpu_reference():
    x = torch.randn(2, 512, 8, 128, dtype=torch.bfloat16)
    positions = torch.arange(512)
    expected = rope_ops.rope(x, positions, 10000.0, False)
    x, positions = x.cuda(), positions.cuda()
    got = rope_ops.rope(x, positions, 10000.0, False)
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-2, atol=1e-2)
    kernels = _cuda_kernels(lambda: rope_ops.rope(x, positions, 10000.0, False))
    assert len(kernels) == 1 and kernels[0].startswith("triton"), kernels  # eager: ~17


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_fused_loss_keeps_no_float32_copy_of_the_logits():
    tokens, vocab = 4096, 50304
    logits = torch.randn(tokens, vocab, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, vocab, (tokens,), device="cuda")

    def step():
        loss.fused_cross_entropy(logits, labels, None, vocab, inplace=False).backward()

    step()  # compile outside the measurement
    logits.grad = None
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    extra = torch.cuda.max_memory_allocated() - before
    # the gradient in bf16 (2 B per logit) and per-token vectors; a float32 copy would add 4 B
    assert extra < tokens * vocab * 3, extra
    reference = torch.nn.functional.cross_entropy(logits.float(), labels)
    fused = loss.fused_cross_entropy(logits, labels, None, vocab, inplace=False)
    torch.testing.assert_close(fused, reference, rtol=1e-3, atol=1e-3)


def test_a_kernel_whose_compile_fails_warns_once_and_runs_the_reference():
    from workloads.models.cuda_kernels import compiled_kernel

    def failing_compile(fn, **_):
        def run(*_args):
            raise RuntimeError("no Triton here")

        return run

    kernel = compiled_kernel("prism::double", lambda x: 2 * x, compile=failing_compile)
    with pytest.warns(UserWarning, match="prism::double: its compiled CUDA kernel failed"):
        assert kernel(torch.tensor(3.0)) == 6.0
    with warnings.catch_warnings(record=True) as later:
        warnings.simplefilter("always")
        assert kernel(torch.tensor(4.0)) == 8.0
    assert not later  # once is enough: it runs the reference from then on


def test_out_of_memory_in_a_compiled_kernel_is_not_a_compiler_failure():
    from workloads.models.cuda_kernels import compiled_kernel

    def out_of_memory(fn, **_):
        def run(*_args):
            raise torch.OutOfMemoryError("CUDA out of memory")

        return run

    kernel = compiled_kernel("prism::big", lambda x: x, compile=out_of_memory)
    with pytest.raises(torch.OutOfMemoryError):
        kernel(torch.tensor(1.0))
