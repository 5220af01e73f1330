"""workloads.zero: gradient buckets reduced during backward, on a toy model.

Most tests stand a spy in for `torch.distributed` inside workloads.zero (rank 0 of a
group of identical ranks, collectives logged and completed at once), so they run in
one process without a process group; one test runs zero=1 on two real gloo ranks.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from prismbench.launch import run_ranks
from workloads import zero
from workloads.zero import DistributedOptimizer, default_bucket_bytes, plan_buckets

WIDTH = 8
ADAMW = {"lr": 1e-2, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
COLLECTIVES = {"all_reduce", "reduce_scatter"}


class _Done:
    def wait(self) -> bool:
        return True


class SpyDist:
    """torch.distributed as workloads.zero sees it: rank 0 of `size` identical ranks."""

    def __init__(self, size: int, events: list) -> None:
        self.size = size
        self.events = events

    def get_world_size(self, group=None) -> int:
        return self.size

    def get_rank(self, group=None) -> int:
        return 0

    def all_reduce(self, tensor, group=None, async_op=False):
        self.events.append(("all_reduce", tensor.numel()))
        tensor.mul_(self.size)
        return _Done()

    def reduce_scatter_tensor(self, out, inp, group=None, async_op=False):
        self.events.append(("reduce_scatter", inp.numel()))
        out.copy_(inp[: out.numel()] * self.size)
        return _Done()

    def all_gather_into_tensor(self, out, inp, group=None, async_op=False):
        self.events.append(("all_gather", out.numel()))
        out.copy_(inp.repeat(self.size))
        return _Done()


@pytest.fixture
def events(monkeypatch) -> list:
    log: list = []
    monkeypatch.setattr(zero, "dist", SpyDist(2, log))
    return log


def toy_model(layers: int = 6) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(layers)])


def make_optimizer(model, *, shard=False, microbatches=1, bucket_bytes=512, dp=True, **kwargs):
    return DistributedOptimizer(
        [list(model.parameters())],
        dp_group="dp" if dp else None,
        shard=shard,
        tp_size=1,
        max_norm=1.0,
        adamw=ADAMW,
        microbatches=microbatches,
        bucket_bytes=bucket_bytes,
        **kwargs,
    )


def backward(model, seed: int = 0) -> None:
    backward_in(model, seed, torch.float32)


def backward_in(model, seed: int, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(seed)
    model(torch.randn(4, WIDTH, generator=gen, dtype=dtype)).square().mean().backward()


def collectives(events: list) -> list:
    return [e for e in events if isinstance(e, tuple) and e[0] in COLLECTIVES]


def test_buckets_hold_parameters_in_reverse_order_up_to_the_cap():
    a, b, c, d = (nn.Parameter(torch.empty(n)) for n in (4, 4, 4, 9))
    assert plan_buckets([[a, b, c, d]], cap_numel=8) == [[d], [c, b], [a]]


def test_buckets_never_span_two_chunks_and_a_shared_embedding_is_alone():
    emb, w1, w2, w3 = (nn.Parameter(torch.empty(2)) for _ in range(4))
    emb.is_shared_embedding = True
    buckets = plan_buckets([[emb, w1, w2], [w3]], cap_numel=100)
    assert buckets == [[w2, w1], [emb], [w3]]


def test_default_bucket_sizes_are_ddp_and_megatron_defaults():
    assert default_bucket_bytes(shard=False, dp_size=8) == 25 * 2**20
    assert default_bucket_bytes(shard=True, dp_size=8) == 40_000_000 * 4
    assert default_bucket_bytes(shard=True, dp_size=64) == 64_000_000 * 4
    # Megatron's bucket counts parameters, DDP's bytes
    assert default_bucket_bytes(shard=True, dp_size=8, grad_bytes=2) == 40_000_000 * 2
    assert default_bucket_bytes(shard=False, dp_size=8, grad_bytes=2) == 25 * 2**20


def test_first_bucket_is_reduced_before_the_first_layer_runs_backward(events):
    model = toy_model()
    make_optimizer(model)  # 6 weights of 256 bytes, 512-byte buckets: 3 buckets

    def mark_layer0_backward(_module, _inputs, out) -> None:
        out.register_hook(lambda _grad: events.append("layer 0 backward"))

    model[0].register_forward_hook(mark_layer0_backward)
    backward(model)
    assert events == [
        ("all_reduce", 128),  # layers 5, 4
        ("all_reduce", 128),  # layers 3, 2
        "layer 0 backward",
        ("all_reduce", 128),  # layers 1, 0
    ]


@pytest.mark.parametrize(("shard", "kind"), [(False, "all_reduce"), (True, "reduce_scatter")])
def test_one_collective_per_bucket_after_the_last_microbatch(events, shard, kind):
    model = toy_model()
    opt = make_optimizer(model, shard=shard, microbatches=3, bucket_bytes=3 * 256)
    for _ in range(2):
        backward(model, seed=1)
        backward(model, seed=2)
        assert collectives(events) == []  # earlier micro-batches only accumulate
        backward(model, seed=3)
        expected = math.ceil(6 * 256 / (3 * 256))
        assert collectives(events) == [(kind, 3 * 64)] * expected
        opt.step()
        opt.zero_grad()
        assert opt.late_buckets == 0
        events.clear()


@pytest.mark.parametrize(("shard", "kind"), [(False, "all_reduce"), (True, "reduce_scatter")])
def test_without_overlap_the_whole_buffer_is_reduced_once_after_backward(events, shard, kind):
    # Megatron-LM's local DDP: allreduce_gradients() after forward_backward_func
    model = toy_model()
    opt = DistributedOptimizer([list(model.parameters())], dp_group="dp", shard=shard,
                               tp_size=1, max_norm=1.0, adamw=ADAMW, microbatches=2,
                               bucket_bytes=512, overlap=False)  # fmt: skip
    backward(model, seed=1)
    backward(model, seed=2)
    assert collectives(events) == []  # nothing during backward, whatever bucket_bytes says
    opt.step()
    # one collective over all 6 weights' fp32 gradients (6 x 64 elements); sharded, the step
    # then all-reduces the gradient norm of its shards
    assert collectives(events) == [(kind, 6 * 64)] + ([("all_reduce", 1)] if shard else [])
    assert opt.late_buckets == 0  # reducing after backward is the plan, not a late bucket


def test_zero1_all_reducing_the_buffer_steps_the_same_share_as_reduce_scatter(events):
    # DeepSpeed's BF16 optimizer (BLOOM): every rank receives all the sums, steps its share
    stepped = {}
    for reduce_scatter, kind in ((True, "reduce_scatter"), (False, "all_reduce")):
        model = toy_model()
        opt = make_optimizer(model, shard=True, microbatches=2, bucket_bytes=512,
                             reduce_scatter=reduce_scatter, overlap=False)  # fmt: skip
        backward(model, seed=1)
        backward(model, seed=2)
        opt.step()
        assert collectives(events)[0] == (kind, 6 * 64)  # the whole buffer, either way
        stepped[kind] = opt.master.detach().clone()
        events.clear()
    assert torch.equal(stepped["reduce_scatter"], stepped["all_reduce"])


def test_grads_accumulate_into_one_persistent_fp32_buffer_and_are_freed():
    model = toy_model()
    opt = make_optimizer(model, microbatches=2, dp=False)
    buffer_ptr = opt.grad_buffer.data_ptr()
    expected = [torch.zeros_like(p) for p in model.parameters()]
    for seed in (1, 2):
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(4, WIDTH, generator=gen)
        grads = torch.autograd.grad(model(x).square().mean(), list(model.parameters()))
        expected = [e + g for e, g in zip(expected, grads, strict=True)]
        backward(model, seed)
        assert all(p.grad is None for p in model.parameters())
    for param, grad in zip(model.parameters(), expected, strict=True):
        torch.testing.assert_close(opt.main_grad(param), grad)
    opt.step()
    opt.zero_grad()
    assert opt.grad_buffer.data_ptr() == buffer_ptr
    assert opt.grad_buffer.dtype == torch.float32
    assert not opt.grad_buffer.any()


def test_grads_in_the_model_dtype_accumulate_and_reduce_there_and_step_in_fp32(events):
    # Megatron-LM's fp16 runs: the main_grad buffer has the parameters' dtype, each
    # micro-batch's gradient is added there and the all-reduce runs on it; the step casts the
    # buffer to float32 (one temporary of the master's size)
    model = toy_model().to(torch.bfloat16)
    opt = make_optimizer(model, microbatches=2, bucket_bytes=2 * 64, grads_in_model_dtype=True)
    assert opt.grad_buffer.dtype == torch.bfloat16
    assert [len(b.params) for b in opt.buckets] == [1] * 6  # 64 bf16 gradients a bucket
    expected = [torch.zeros_like(p) for p in model.parameters()]
    for seed in (1, 2):
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(4, WIDTH, generator=gen, dtype=torch.bfloat16)
        grads = torch.autograd.grad(model(x).square().mean(), list(model.parameters()))
        expected = [e + g for e, g in zip(expected, grads, strict=True)]
        backward_in(model, seed, torch.bfloat16)
    assert collectives(events) == [("all_reduce", 64)] * 6
    for param, grad in zip(model.parameters(), expected, strict=True):
        torch.testing.assert_close(opt.main_grad(param), grad)  # summed over 2 identical ranks / 2
    with _OpLog() as ops:
        opt.step()
    casts = [n for n, numel in ops.outputs if numel == opt.master.numel() and n == "_to_copy"]
    assert casts == ["_to_copy"]
    assert opt.master.dtype == torch.float32


def test_sharded_buckets_are_padded_to_a_multiple_of_the_dp_size(monkeypatch):
    monkeypatch.setattr(zero, "dist", SpyDist(4, []))
    model = nn.Sequential(nn.Linear(5, 3), nn.Linear(3, 7))  # 15, 3, 21, 7 elements
    opt = make_optimizer(model, shard=True, bucket_bytes=4 * 24)
    assert [len(b.params) for b in opt.buckets] == [1, 2, 1]  # [7], [21, 3], [15]
    assert [b.numel for b in opt.buckets] == [8, 24, 16]
    assert opt.grad_buffer.numel() == 48
    assert opt.master.numel() == 48 // 4


def test_runs_under_fake_tensor_mode(events):
    with FakeTensorMode():
        model = toy_model()
        opt = make_optimizer(model, shard=True, microbatches=2)
        for _ in range(2):
            backward(model)
            backward(model)
            opt.step()
            opt.zero_grad()
    kinds = [e[0] for e in events]
    assert kinds.count("reduce_scatter") == kinds.count("all_gather") == 2 * 3


def _odd_model() -> nn.Sequential:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(5, 3), nn.Tanh(), nn.Linear(3, 7))


def _train_odd_model(dp_group, shard: bool, dtype=torch.float32) -> list[list[float]]:
    """Two steps of two micro-batches; every rank sees the same data. In bf16 the gradients
    accumulate and reduce in bf16 (`grads_in_model_dtype`)."""
    model = _odd_model().to(dtype)
    opt = DistributedOptimizer(
        [list(model.parameters())],
        dp_group=dp_group,
        shard=shard,
        tp_size=1,
        max_norm=1.0,
        adamw=ADAMW,
        microbatches=2,
        bucket_bytes=dtype.itemsize * 24,
        grads_in_model_dtype=dtype != torch.float32,
    )
    gen = torch.Generator().manual_seed(5)
    for _ in range(2):
        for _ in range(2):
            x = torch.randn(4, 5, generator=gen, dtype=dtype)
            (model(x).square().mean() / 2).backward()
        opt.step()
        opt.zero_grad()
    return [
        p.detach().float().reshape(-1).tolist() for p in model.parameters()
    ]  # a queue can't hold tensors


def _zero1_on_gloo() -> list[list[float]]:
    import torch.distributed as dist

    return _train_odd_model(dist.group.WORLD, shard=True)


def _zero1_on_gloo_bf16_grads() -> list[list[float]]:
    import torch.distributed as dist

    return _train_odd_model(dist.group.WORLD, shard=True, dtype=torch.bfloat16)


@pytest.mark.integration
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_padded_zero1_buckets_on_two_ranks_match_one_process(dtype):
    # identical ranks: the bf16 sum of two equal gradients, halved, is exact
    expected = _train_odd_model(None, shard=False, dtype=dtype)
    ranks = _zero1_on_gloo if dtype == torch.float32 else _zero1_on_gloo_bf16_grads
    for params in run_ranks(2, ranks):
        for got, want in zip(params, expected, strict=True):
            assert got == pytest.approx(want, rel=1e-5, abs=1e-6)


class _OpLog(TorchDispatchMode):
    """Each op's name, and the element counts of the tensors it returns (views aside)."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []
        self.outputs: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        self.names.append(name)
        outs = out if isinstance(out, (list, tuple)) else [out]
        if not func.is_view:
            self.outputs += [(name, t.numel()) for t in outs if isinstance(t, torch.Tensor)]
        return out


def test_adamw_steps_the_foreach_way_a_gpu_does_on_fake_tensors_too(events):
    # torch's default is foreach on a GPU, but only for plain tensors: a FakeTensor master
    # copy would get the per-tensor loop, with two more temporaries of its full size
    with FakeTensorMode():
        model = toy_model()
        opt = make_optimizer(model)
        backward(model)
        with _OpLog() as ops:
            opt.step()
    assert "_foreach_addcdiv_" in ops.names and "addcdiv_" not in ops.names


def test_the_step_makes_one_temporary_the_size_of_the_master_copy(events):
    # foreach AdamW's sqrt of the second moment; the grad norm and the copy back into the
    # parameters work range by range, as Megatron's multi-tensor kernels do
    model = toy_model()
    opt = make_optimizer(model)
    backward(model)
    opt.step()  # the first step makes AdamW's state
    opt.zero_grad()
    backward(model)
    with _OpLog() as ops:
        opt.step()
    total = opt.master.numel()
    new_full_size = [
        name for name, numel in ops.outputs if numel == total and not name.endswith("_")
    ]
    assert new_full_size == ["_foreach_sqrt"]
