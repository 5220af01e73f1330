"""Tests for workloads/loss.py: every `kernels.loss` value is the cross-entropy, and the fused
ones are captured as one op each way that keeps no float32 copy of the logits."""

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed.device_mesh import init_device_mesh

from emulator.capture.op_recorder import OpRecorder
from emulator.capture.trace import ALLOC, COMPUTE, FREE
from emulator.world.virtual_world import destroy_virtual_world, init_virtual_world
from prismbench.launch import free_port
from prismbench.workload_ops import register_workload_ops
from workloads.kernels import LOSSES
from workloads.loss import cross_entropy, loss_context

VOCAB = 11


def _loss_and_grad(kind, logits, labels, tp_mesh=None):
    x = logits.detach().clone().requires_grad_(True)
    with loss_context(kind, tp_mesh):  # loss-parallel's backward runs in torch's context too
        loss = cross_entropy(kind, x * 1.0, labels, tp_mesh, VOCAB)  # * 1.0: an activation
        (grad,) = torch.autograd.grad(loss, x)
    return loss, grad


@pytest.mark.parametrize("kind", LOSSES)
def test_every_loss_equals_cross_entropy_and_its_gradient(kind):
    logits = torch.randn(2, 5, VOCAB)
    labels = torch.randint(VOCAB, (2, 5))
    loss, grad = _loss_and_grad(kind, logits, labels)
    ref_loss, ref_grad = _loss_and_grad("unfused-fp32", logits, labels)
    expected = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert ref_loss.item() == pytest.approx(expected.item(), rel=1e-6)
    torch.testing.assert_close(grad, ref_grad)


@pytest.mark.parametrize("kind", ["fused", "fused-inplace"])
def test_fused_loss_on_bf16_logits_gives_a_bf16_gradient_close_to_fp32(kind):
    logits = torch.randn(4, 8, VOCAB).to(torch.bfloat16)
    labels = torch.randint(VOCAB, (4, 8))
    loss, grad = _loss_and_grad(kind, logits, labels)
    ref_loss, ref_grad = _loss_and_grad("unfused-fp32", logits.float(), labels)
    assert grad.dtype == torch.bfloat16
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-5)
    torch.testing.assert_close(grad.float(), ref_grad, atol=2e-3, rtol=1e-2)


def test_inplace_backward_writes_the_gradient_over_the_logits():
    logits = torch.randn(3, 4, VOCAB, requires_grad=True)
    labels = torch.randint(VOCAB, (3, 4))
    activation = logits * 2.0
    grads = []
    activation.register_hook(grads.append)
    cross_entropy("fused-inplace", activation, labels, None, VOCAB).backward()
    assert grads[0].data_ptr() == activation.data_ptr()


@pytest.mark.parametrize("kind", LOSSES)
def test_vocab_parallel_loss_with_one_rank_matches_cross_entropy(kind):
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    try:
        logits = torch.randn(2, 5, VOCAB)
        labels = torch.randint(VOCAB, (2, 5))
        loss, grad = _loss_and_grad(kind, logits, labels, init_device_mesh("cpu", (1,)))
    finally:
        dist.destroy_process_group()
    ref_loss, ref_grad = _loss_and_grad("unfused-fp32", logits, labels)
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-6)
    torch.testing.assert_close(grad, ref_grad)


TOKENS, BIG_VOCAB = 256, 4096
LOGITS_BYTES = TOKENS * BIG_VOCAB * 2  # bf16


def _capture(kind):
    """Compute rows (aten, read, written) and allocation sizes of the loss's forward and
    backward on bf16 logits [TOKENS, BIG_VOCAB], captured under fake mode."""
    register_workload_ops()
    with FakeTensorMode():
        logits = torch.empty(1, TOKENS, BIG_VOCAB, dtype=torch.bfloat16, requires_grad=True)
        labels = torch.zeros(1, TOKENS, dtype=torch.long)
        recorder = OpRecorder()
        with recorder:
            cross_entropy(kind, logits * 1.0, labels, None, BIG_VOCAB).backward()
    trace = recorder.trace()
    c, s = trace.columns, trace.strings
    rows = [
        (s[c["aten"][i]], int(c["read_bytes"][i]), int(c["write_bytes"][i]))
        for i in range(len(trace))
        if c["kind"][i] == COMPUTE
    ]
    allocs = [int(c["size_bytes"][i]) for i in range(len(trace)) if c["kind"][i] == ALLOC]
    return rows, allocs


@pytest.mark.parametrize("kind", ["fused", "fused-inplace"])
def test_fused_loss_is_captured_as_one_op_each_way_without_a_float32_copy(kind):
    rows, allocs = _capture(kind)
    inplace = kind == "fused-inplace"
    backward = "prism.cross_entropy_backward_" if inplace else "prism.cross_entropy_backward"
    loss_rows = [r for r in rows if r[0].startswith("prism.cross_entropy")]
    assert [r[0] for r in loss_rows] == ["prism.cross_entropy", backward]
    (_, fwd_read, fwd_written), (_, bwd_read, bwd_written) = loss_rows
    per_token = TOKENS * 8  # int64 labels, float32 logsumexp and label logit
    assert fwd_read == LOGITS_BYTES + per_token and fwd_written == 2 * TOKENS * 4
    assert bwd_read == LOGITS_BYTES + 4 * TOKENS + per_token + 4 * TOKENS
    assert bwd_written == LOGITS_BYTES
    # no op touches a float32 [tokens, vocab] matrix
    assert max(max(read, written) for _, read, written in rows) < 2 * LOGITS_BYTES
    big = [size for size in allocs if size >= LOGITS_BYTES]
    # the logits (x * 1.0) and the leaf's .grad; the out-of-place backward adds its gradient,
    # the in-place one writes over the logits
    assert big == [LOGITS_BYTES] * (2 if kind == "fused-inplace" else 3)


def test_unfused_loss_keeps_float32_copies_the_fused_one_does_not():
    _, allocs = _capture("unfused-fp32")
    assert sum(size >= 2 * LOGITS_BYTES for size in allocs) >= 2


def _most_float32_logits_live(kind, tp=2):
    """The most float32 [TOKENS, BIG_VOCAB / tp] buffers live at once in the loss's forward and
    backward, captured on rank 0 of a virtual world of `tp` ranks (vocab-sharded logits)."""
    register_workload_ops()
    init_virtual_world(0, tp)
    try:
        tp_mesh = init_device_mesh("cpu", (tp,))
        local_vocab = BIG_VOCAB // tp
        with FakeTensorMode():
            logits = torch.empty(1, TOKENS, local_vocab, dtype=torch.bfloat16, requires_grad=True)
            labels = torch.zeros(1, TOKENS, dtype=torch.long)
            recorder = OpRecorder()
            with recorder, loss_context(kind, tp_mesh):
                cross_entropy(kind, logits * 1.0, labels, tp_mesh, BIG_VOCAB).backward()
    finally:
        destroy_virtual_world()
    trace = recorder.trace()
    c = trace.columns
    size = TOKENS * local_vocab * 4
    live, most = set(), 0
    for i in range(len(trace)):
        if c["kind"][i] == ALLOC and c["size_bytes"][i] == size:
            live.add(int(c["storage"][i]))
        elif c["kind"][i] == FREE:
            live.discard(int(c["storage"][i]))
        most = max(most, len(live))
    return most


def test_loss_parallel_holds_one_more_float32_logits_copy_than_megatrons_formula():
    # torch's loss_parallel backward: the saved log-probabilities, the zeros-with-minus-one
    # scatter, exp of the log-probabilities and their sum live together; Megatron's keeps
    # the softmax, its clone and the scaled gradient (the forward's upcast, shifted logits and
    # exp peak at three in both)
    assert _most_float32_logits_live("unfused-fp32") == 3
    assert _most_float32_logits_live("loss-parallel") == 4
