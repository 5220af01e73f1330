"""Tests for emulator/capture/op_recorder.py on a small causal GPT built here (fake and real CPU)."""

import contextlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode

from emulator.capture.op_recorder import OpRecorder
from emulator.capture.trace import ALLOC, COMPUTE, FREE, PHASES

VOCAB, DIM, HEADS, LAYERS, BATCH, SEQ = 64, 32, 4, 2, 2, 16


class Block(nn.Module):
    def __init__(self, norm, act):
        super().__init__()
        self.attn_norm, self.qkv, self.proj = (
            norm(DIM),
            nn.Linear(DIM, 3 * DIM),
            nn.Linear(DIM, DIM),
        )
        self.mlp_norm, self.up, self.down = (
            norm(DIM),
            nn.Linear(DIM, 4 * DIM),
            nn.Linear(4 * DIM, DIM),
        )
        self.act = act

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = (
            t.view(b, s, HEADS, d // HEADS).transpose(1, 2)
            for t in self.qkv(self.attn_norm(x)).split(d, -1)
        )
        x = x + self.proj(
            F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, d)
        )
        return x + self.down(self.act(self.up(self.mlp_norm(x))))


class GPT(nn.Module):
    def __init__(self, recompute=False):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList([Block(nn.LayerNorm, nn.GELU()), Block(nn.RMSNorm, nn.SiLU())])
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.recompute = recompute

    def forward(self, idx):
        x = self.emb(idx)
        for layer in self.layers:
            x = checkpoint(layer, x, use_reentrant=False) if self.recompute else layer(x)
        return F.cross_entropy(self.head(x).flatten(0, 1), idx.flatten())


def matmul_params(model):
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))


def run_step(model, opt, idx, recorder, extra_modes=(), micro_batches=0):
    """Forward, backward (per micro-batch when `micro_batches`, marked), optimizer step."""
    for mode in extra_modes:
        mode.__enter__()
    try:
        with recorder:
            for mb in range(micro_batches or 1):
                with recorder.micro_batch(mb) if micro_batches else contextlib.nullcontext():
                    loss = model(idx)
                    loss.backward()
                    del loss
            with recorder.phase("optimizer"):
                opt.step()
            opt.zero_grad()
    finally:
        for mode in reversed(extra_modes):
            mode.__exit__(None, None, None)


@pytest.fixture
def fake_step():
    """A fake-mode GPT step: (trace, recorder, model)."""
    with FakeTensorMode():
        model = GPT()
        opt = torch.optim.AdamW(model.parameters(), foreach=True)
        idx = torch.randint(0, VOCAB, (BATCH, SEQ))
        rec = OpRecorder()
        rec.tag(model, "parameter")
        rec.tag(idx, "other")
        run_step(model, opt, idx, rec)
    return rec.trace(), rec, model


def compute_rows(trace, name=None):
    rows = trace["kind"] == COMPUTE
    if name is not None:
        rows &= trace["name"] == trace.strings.index(name)
    return rows


def test_fwd_bwd_flops_match_6NT_plus_causal_attention(fake_step):
    trace, _, model = fake_step
    tokens = BATCH * SEQ
    attention_fwd = 4 * BATCH * HEADS * SEQ * SEQ * (DIM // HEADS) // 2  # causal: half
    expected = 6 * matmul_params(model) * tokens + LAYERS * attention_fwd * 7 // 2  # fwd + 2.5x bwd
    assert trace.summary().flops == expected


def test_attention_ops_carry_closed_form_flops_and_causal_flag(fake_step):
    trace, _, _ = fake_step
    fwd, bwd = compute_rows(trace, "flash_attn_fwd"), compute_rows(trace, "flash_attn_bwd")
    closed_form = 4 * BATCH * HEADS * SEQ * SEQ * (DIM // HEADS) // 2
    assert trace["flops"][fwd].tolist() == [closed_form] * LAYERS
    assert trace["flops"][bwd].tolist() == [closed_form * 5 // 2] * LAYERS
    assert trace["causal"][fwd | bwd].all()
    assert set(trace.text("aten")[i] for i in fwd.nonzero()[0]) == {
        "aten._scaled_dot_product_flash_attention"
    }


def test_flop_counter_agrees_on_the_ops_it_covers():
    with FakeTensorMode():
        model = GPT()
        idx = torch.randint(0, VOCAB, (BATCH, SEQ))
        rec, counter = OpRecorder(), FlopCounterMode(display=False)
        with counter, rec:
            model(idx).backward()
    trace = rec.trace()
    gemm = (
        compute_rows(trace)
        & ~compute_rows(trace, "flash_attn_fwd")
        & ~compute_rows(trace, "flash_attn_bwd")
    )
    assert counter.get_total_flops() == trace["flops"][gemm].sum() > 0


def test_peak_live_bytes_equal_memtracker_peak():
    with FakeTensorMode():
        model = GPT()
        opt = torch.optim.AdamW(model.parameters(), foreach=True)
        idx = torch.randint(0, VOCAB, (BATCH, SEQ))
        tracker, rec = MemTracker(), OpRecorder()
        tracker.track_external(model, opt, idx)
        rec.tag(model, "parameter")
        rec.tag(idx, "other")
        run_step(model, opt, idx, rec, extra_modes=[tracker])
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
    assert rec.trace().summary().peak_live_bytes == peak


def test_deleting_a_tensor_records_its_free_before_the_next_op():
    rec = OpRecorder()
    with FakeTensorMode(), rec:
        a = torch.ones(256)
        b = a * 2
        del a
        _ = b + 1
    trace = rec.trace()
    kinds = trace["kind"].tolist()
    assert kinds.index(FREE) < max(i for i, k in enumerate(kinds) if k == COMPUTE)
    assert trace["size_bytes"][kinds.index(FREE)] == 1024


def test_views_are_not_compute_but_keep_their_storage_alive():
    rec = OpRecorder()
    with FakeTensorMode(), rec:
        a = torch.ones(64, 4)
        v = a.view(4, 64).t()
        del a
        frees_while_view_lives = (rec.trace()["kind"] == FREE).sum()
        del v
    trace = rec.trace()
    assert frees_while_view_lives == 0
    assert (trace["kind"] == FREE).sum() == 1
    assert set(trace.text("aten")[i] for i in compute_rows(trace).nonzero()[0]) == {"aten.ones"}


def test_phases_modules_and_gradient_category(fake_step):
    trace, rec, model = fake_step
    phases = {PHASES[p] for p in trace["phase"][compute_rows(trace)]}
    assert phases == {"forward", "backward", "optimizer"}
    mm_modules = {trace.strings[m] for m in trace["module"][compute_rows(trace, "addmm")]}
    assert "GPT.layers.0.qkv" in mm_modules
    grads = [uid for uid, c in rec.categories.items() if c == "gradient"]
    alloc = trace["kind"] == ALLOC
    grad_bytes = trace["size_bytes"][
        alloc & (trace["category"] == trace.strings.index("gradient"))
    ].sum()
    assert len(grads) == len(list(model.parameters()))
    assert grad_bytes == sum(p.numel() * 4 for p in model.parameters())


def test_optimizer_state_survives_and_its_temporaries_are_reclassified(fake_step):
    trace, _, model = fake_step
    alloc = trace["kind"] == ALLOC
    by_category = {
        c: trace["size_bytes"][alloc & (trace["category"] == trace.strings.index(c))].sum()
        for c in ("optimizer_state", "temporary")
    }
    param_bytes = sum(p.numel() * 4 for p in model.parameters())
    assert by_category["optimizer_state"] == 2 * param_bytes + 4 * len(
        list(model.parameters())
    )  # m, v, step
    assert by_category["temporary"] > 0


def test_checkpointed_forward_in_backward_is_recompute():
    with FakeTensorMode():
        model, idx, rec = GPT(recompute=True), torch.randint(0, VOCAB, (BATCH, SEQ)), OpRecorder()
        with rec:
            model(idx).backward()
    trace = rec.trace()
    recompute = compute_rows(trace, "flash_attn_fwd") & (
        trace["phase"] == PHASES.index("recompute")
    )
    assert recompute.sum() == LAYERS


def test_stream_and_micro_batch_are_recorded():
    rec = OpRecorder()
    with FakeTensorMode(), rec:
        with rec.micro_batch(3), rec.on_stream(2):
            buf = torch.empty(128)
    trace = rec.trace()
    alloc = (trace["kind"] == ALLOC).nonzero()[0][0]
    assert (trace["stream"][alloc], trace["micro_batch"][alloc]) == (2, 3)
    assert trace.text("category")[alloc] == "communication"
    del buf


def test_storage_resize_records_free_and_alloc():
    rec = OpRecorder()
    with FakeTensorMode(), rec:
        t = torch.empty(1024)
        t.untyped_storage().resize_(0)
        t.untyped_storage().resize_(4096)
    trace = rec.trace()
    rows = (trace["kind"] == ALLOC) | (trace["kind"] == FREE)
    assert list(
        zip(trace["kind"][rows].tolist(), trace["size_bytes"][rows].tolist(), strict=True)
    ) == [(ALLOC, 4096), (FREE, 4096), (ALLOC, 4096)]


def test_real_cpu_tensors_are_recorded_too():
    model, rec = GPT(), OpRecorder()
    with rec:
        model(torch.randint(0, VOCAB, (BATCH, SEQ))).backward()
    assert rec.trace().summary().flops > 0


@pytest.mark.slow
def test_benchmark_recorded_step(benchmark):
    """Speed of one recorded fwd+bwd of the test model (measured, not asserted)."""
    with FakeTensorMode():
        model = GPT()
        idx = torch.randint(0, VOCAB, (BATCH, SEQ))
        model(idx).backward()  # warm fake-mode caches

        def recorded_step():
            rec = OpRecorder()
            with rec:
                model(idx).backward()
            return rec

        rec = benchmark(recorded_step)
    assert int(compute_rows(rec.trace()).sum()) > 0


def test_a_declared_dtensor_counts_its_local_shard_only():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from emulator.world.virtual_world import destroy_virtual_world, init_virtual_world

    init_virtual_world(0, 4)
    try:
        mesh = init_device_mesh("cpu", (4,))
        sharded = distribute_tensor(torch.zeros(8, 4), mesh, [Shard(0)])  # local 2 x 4 fp32
        rec = OpRecorder()
        rec.tag(sharded, "parameter")
        trace = rec.trace()
        allocs = trace["size_bytes"][trace["kind"] == ALLOC]
        assert allocs.tolist() == [2 * 4 * 4]
    finally:
        destroy_virtual_world()


@pytest.mark.filterwarnings("ignore::FutureWarning")  # the pre-2.13 names, which torch 2.11 has
def test_a_collective_filling_its_outputs_records_no_compute_kernel():
    # the backend fills outputs so value-reading code runs; on a GPU the NCCL kernel writes
    # them, so the recorder sees the collective but no copy kernel next to it
    import torch.distributed as dist

    from emulator.world.virtual_world import destroy_virtual_world, init_virtual_world

    init_virtual_world(0, 4)
    try:
        with FakeTensorMode():
            shard, gathered = torch.ones(8), torch.empty(32)
            with OpRecorder() as rec:
                dist.all_gather_into_tensor(gathered, shard)
                dist.reduce_scatter_tensor(shard, gathered)
                dist.recv(shard, src=1)
                shard * 2
        assert [e.name for e in rec.events if e.kind == COMPUTE] == ["elementwise"]
    finally:
        destroy_virtual_world()


def test_paused_ops_run_unrecorded_and_in_place_adds_keep_their_checks():
    rec = OpRecorder()
    with FakeTensorMode():
        buffer, grad, other = torch.zeros(16), torch.ones(16, dtype=torch.bfloat16), torch.ones(3)
    with rec:
        with rec.paused():
            assert buffer.add_(grad) is buffer  # the fake kernel's answer, without the kernel
            with pytest.raises(RuntimeError):
                buffer.add_(other)  # a shape that does not broadcast still fails
            scaled = buffer * 2
        scaled + 1
    assert [e.name for e in rec.events if e.kind == COMPUTE] == ["elementwise"]


def test_a_functional_collective_is_waited_where_its_output_is_first_used():
    # DTensor returns an AsyncCollectiveTensor and waits at the first use of the result; the
    # recorder answers that wait_tensor itself under fake mode, and must still record the wait
    import torch.distributed._functional_collectives as funcol

    from emulator.capture.trace import EventSequence
    from emulator.world.comm_events import CommEvent, Recorder, WaitEvent, recording
    from emulator.world.virtual_world import destroy_virtual_world, init_virtual_world

    group = init_virtual_world(0, 4)
    try:
        sequence = EventSequence()
        comm = Recorder(_counter=sequence)
        with recording(comm), FakeTensorMode():
            x, w = torch.ones(8, 8), torch.ones(8, 8)
            with OpRecorder(sequence=sequence) as rec:
                reduced = funcol.all_reduce(x, "sum", group)
                independent = w @ w  # does not read the collective's output
                reduced + independent  # the first use
        (collective,), (wait,) = (
            [e for e in comm.events if isinstance(e, kind)] for kind in (CommEvent, WaitEvent)
        )
        matmul, add = (e for e in rec.events if e.kind == COMPUTE)
        assert wait.comm_seq == collective.seq
        assert collective.seq < matmul.seq < wait.seq < add.seq
    finally:
        destroy_virtual_world()


def test_ops_whose_cuda_kernel_zero_fills_its_output_record_the_fill_first(fake_step):
    """nll_loss_backward and embedding_dense_backward zero-fill their gradient on CUDA with a
    dispatched fill (a kernel of its own, nested in the profiles); on CPU under fake tensors it
    does not run, so the recorder records it: one fill_ row writing the output, just before."""
    trace, _, _ = fake_step
    rows = np.flatnonzero(trace["kind"] == COMPUTE)
    atens = trace.text("aten")
    filled = [
        i for i in rows if atens[i] in ("aten.nll_loss_backward", "aten.embedding_dense_backward")
    ]
    assert [atens[i] for i in filled] == ["aten.nll_loss_backward", "aten.embedding_dense_backward"]
    for i in filled:
        (output,) = [t for t in trace.tensors(i) if t[2]]
        assert atens[i - 1] == "aten.fill_" and trace.tensors(i - 1) == [output]
        assert (
            trace["write_bytes"][i - 1] == trace["write_bytes"][i]
            and trace["read_bytes"][i - 1] == 0
        )
    # a fill runs nowhere else in this program
    assert sum(a == "aten.fill_" for a in atens) == len(filled)


def test_ops_taking_a_tensor_for_its_dtype_only_read_nothing():
    """`x.new_zeros(())` fills one element and `zeros_like(x)` writes x's size: neither kernel
    reads x (ZeRO's gradient norm starts from `shard.new_zeros(())`)."""
    rec = OpRecorder()
    with FakeTensorMode(), rec:
        shard = torch.ones(1 << 20)
        _ = shard.new_zeros(())
        _ = torch.zeros_like(shard, dtype=torch.bfloat16)
        _ = shard * 2
    trace = rec.trace()
    rows = np.flatnonzero(trace["kind"] == COMPUTE)
    by_aten = {trace.text("aten")[i]: i for i in rows}
    new_zeros, zeros_like, mul = (
        by_aten[a] for a in ("aten.new_zeros", "aten.zeros_like", "aten.mul")
    )
    assert (trace["read_bytes"][new_zeros], trace["write_bytes"][new_zeros]) == (0, 4)
    assert (trace["read_bytes"][zeros_like], trace["write_bytes"][zeros_like]) == (0, 2 << 20)
    assert trace["read_bytes"][mul] == 4 << 20  # an op that reads its input still counts it


def test_masked_fill_records_the_clone_and_the_in_place_fill_a_gpu_runs():
    """ATen's out-of-place masked_fill clones self (broadcast against the mask) and fills the
    clone in place: a copy kernel and a fill kernel on a GPU (86a4f47's ALiBi bias on an H100:
    a 357 us copy of [32, 2 048, 2 048] fp32, then masked_fill_)."""
    rec = OpRecorder()
    with FakeTensorMode(), rec:
        bias = torch.ones(4, 64, 64)
        future = torch.ones(64, 64, dtype=torch.bool).triu(1)
        masked = bias.masked_fill(future, float("-inf"))
    trace = rec.trace()
    rows = np.flatnonzero(trace["kind"] == COMPUTE)
    atens = [trace.text("aten")[i] for i in rows]
    assert atens[-2:] == ["aten.clone", "aten.masked_fill_"]
    clone, fill = rows[-2:]
    assert trace.tensors(clone)[-1] == ((4, 64, 64), "float32", True)
    assert trace["write_bytes"][clone] == trace["write_bytes"][fill] == 4 * 64 * 64 * 4
    assert masked.shape == (4, 64, 64) and masked.is_contiguous()
    # one output allocated: the clone, filled in place
    assert (trace["kind"] == ALLOC).sum() == 4  # bias, the ones, their triu, the clone
