"""emulator.capture.compile_saved: a compiled block keeps for backward only what backward reads."""

import collections
import dataclasses
import functools

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

import emulator.capture.rank
from emulator.capture.compile_fusion import block_region
from emulator.capture.compile_saved import free_unread_saved, unread_saved
from emulator.capture.trace import ALLOC, COMPUTE, FREE, PHASES, OpEvent
from emulator.world.comm_events import CommEvent, WaitEvent
from tests.prismbench.capture_cases import capture, debug_job
from workloads.kernels import KernelsSpec

FORWARD, BACKWARD = PHASES.index("forward"), PHASES.index("backward")
REGION = block_region("layers")
BLOCK = "Net.layers.0"
ACT = ((4, 8), "bfloat16", False)


def _events(*rows):
    """OpEvents from (kind, phase, module, storage or (reads, writes)) rows, seq 10, 20, ..."""
    out = []
    for n, (kind, phase, module, what) in enumerate(rows):
        seq = 10 * (n + 1)
        if kind == COMPUTE:
            reads, writes = what
            tensors = (ACT,) * len(reads) + (ACT[:2] + (True,),) * len(writes)
            out.append(OpEvent(seq, COMPUTE, "mm", "aten.mm", 0, module, phase, 0,
                               tensors=tensors, flows=(*reads, *writes)))  # fmt: skip
        else:
            out.append(OpEvent(seq, kind, "", "", 0, module, phase, 0, size_bytes=64,
                               storage=what, category="activation"))  # fmt: skip
    return out


def test_a_saved_output_the_backward_never_reads_is_freed_after_its_last_forward_read():
    events = _events(
        (ALLOC, FORWARD, BLOCK, 1),
        (COMPUTE, FORWARD, BLOCK, ((), (1,))),  # the last GEMM writes 1
        (ALLOC, FORWARD, BLOCK, 2),
        (COMPUTE, FORWARD, BLOCK, ((1,), (2,))),  # the residual add reads it
        (ALLOC, FORWARD, BLOCK, 3),
        (COMPUTE, FORWARD, BLOCK, ((2,), (3,))),
        (COMPUTE, BACKWARD, BLOCK, ((3,), ())),  # backward reads 3, never 1
        (FREE, BACKWARD, BLOCK, 1),  # SAC's cache lets go of 1 only now
        (FREE, BACKWARD, BLOCK, 3),
        (FREE, BACKWARD, "Net.head", 2),  # allocated in the block, freed elsewhere: unread too
    )
    assert unread_saved(events, REGION) == {7: 3, 9: 5}
    waits = [CommEvent(seq=15, kind="all_reduce", group_id="g", group_size=2, op="SUM",
                       dtype="bfloat16", numel=1, nbytes=2, async_op=True),
             WaitEvent(seq=75, comm_seq=15)]  # fmt: skip
    moved, comm = free_unread_saved(events, waits, REGION)
    order = [(e.kind, e.storage) for e in moved if e.kind != COMPUTE]
    assert order == [(ALLOC, 1), (ALLOC, 2), (FREE, 1), (ALLOC, 3), (FREE, 2), (FREE, 3)]
    seqs = [e.seq for e in moved]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    scale = moved[0].seq // 10
    assert [(c.seq, getattr(c, "comm_seq", None)) for c in comm] == [
        (15 * scale, None),
        (75 * scale, 15 * scale),
    ]


def test_what_backward_reads_and_what_lives_outside_a_compiled_block_stay():
    events = _events(
        (ALLOC, FORWARD, BLOCK, 1),
        (COMPUTE, FORWARD, BLOCK, ((), (1,))),
        (ALLOC, FORWARD, "Net.head", 2),  # outside every compiled region
        (COMPUTE, FORWARD, "Net.head", ((1,), (2,))),
        (FREE, BACKWARD, BLOCK, 1),
        (COMPUTE, BACKWARD, BLOCK, ((1,), ())),  # a fused row read 1 after its chain freed it
        (FREE, BACKWARD, "Net.head", 2),
    )
    assert unread_saved(events, REGION) == {}
    assert free_unread_saved(events, [], REGION) == (events, [])


def test_a_row_without_storage_ids_stops_the_rule():
    events = _events(
        (ALLOC, FORWARD, BLOCK, 1),
        (COMPUTE, FORWARD, BLOCK, ((), (1,))),
        (FREE, BACKWARD, BLOCK, 1),
    )
    events.insert(2, events[1]._replace(seq=25, phase=BACKWARD, flows=()))  # reads unknown
    assert unread_saved(events, REGION) == {}


# ---- a captured job ------------------------------------------------------------------------


def _moved_modules(recompute, tmp_path):
    """The modules that allocated the storages whose frees the rule moved in a compiled debug
    job."""
    moved = []

    def spy(events, comm, region_of):
        allocated_by = {e.storage: e.module for e in events if e.kind == ALLOC}
        moved.extend(allocated_by[events[i].storage] for i in unread_saved(events, region_of))
        return free_unread_saved(events, comm, region_of)

    job = debug_job(global_batch=2, seq_len=256, train={"recompute": recompute})
    job = dataclasses.replace(job, kernels=KernelsSpec(compile=True))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(emulator.capture.rank, "free_unread_saved", spy)
        capture(job, tmp_path)
    return moved


def test_under_op_level_sac_only_each_blocks_last_gemm_output_is_freed_early(tmp_path):
    moved = _moved_modules("selective", tmp_path)
    layers = debug_job().model.layers
    assert sorted(moved) == sorted(
        f"Llama.layers.{i}.feed_forward.w2" for i in range(layers) for _ in range(2)
    )  # two micro-batches
    assert _moved_modules("full", tmp_path) == _moved_modules("none", tmp_path) == []


# ---- what AOTAutograd saves ----------------------------------------------------------------


D, HEADS, TOKENS, FFN = 64, 4, 48, 160  # TOKENS differs from every weight dimension
_SAVE = {
    torch.ops.aten.mm.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
}


def _policy():
    counts = collections.defaultdict(int)  # torchtitan's: every second mm recomputed

    def policy(ctx, func, *args, **kwargs):
        key = "recompute" if ctx.is_recompute else "forward"
        counts[key] += func == torch.ops.aten.mm.default
        keep = func in _SAVE and not (func == torch.ops.aten.mm.default and counts[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(D, D, bias=False) for _ in range(4))
        self.w1, self.w3 = nn.Linear(D, FFN, bias=False), nn.Linear(D, FFN, bias=False)
        self.w2 = nn.Linear(FFN, D, bias=False)

    def inner(self, x):
        q, k, v = (
            w(x).view(1, TOKENS, HEADS, -1).transpose(1, 2) for w in (self.wq, self.wk, self.wv)
        )
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(x.shape)
        x = x + self.wo(a)
        return x + self.w2(F.silu(self.w1(x)) * self.w3(x))

    def forward(self, x):
        context = functools.partial(create_selective_checkpoint_contexts, _policy())
        return checkpoint(self.inner, x, use_reentrant=False, context_fn=context)


def test_aotautograd_saves_no_gemm_output_its_backward_does_not_read():
    """The partition Inductor uses, on CPU: of the four GEMM outputs SAC keeps (wq, wv, w1 and
    w2), the compiled forward returns three; w2's only enters the residual add."""
    from torch._functorch.aot_autograd import aot_module_simplified, make_boxed_func
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    saved = []

    def forward_compiler(gm, _):
        (outputs,) = [n.args[0] for n in gm.graph.nodes if n.op == "output"]
        saved.extend(tuple(o.meta["val"].shape) for o in outputs[1:] if o is not None)
        return make_boxed_func(gm)

    def backend(gm, inputs):
        return aot_module_simplified(gm, inputs, fw_compiler=forward_compiler,
                                     bw_compiler=lambda g, _: make_boxed_func(g),
                                     partition_fn=min_cut_rematerialization_partition)  # fmt: skip

    torch._dynamo.reset()
    x = torch.randn(1, TOKENS, D, requires_grad=True)
    torch.compile(_Block(), backend=backend, fullgraph=True)(x).sum().backward()
    gemm_outputs = collections.Counter(s for s in saved if s in ((1 * TOKENS, D), (TOKENS, FFN)))
    assert gemm_outputs == {(TOKENS, D): 2, (TOKENS, FFN): 1}


def test_a_program_whose_collectives_read_saved_activations_keeps_them(tmp_path):
    """Megatron's regather all-gathers a saved sequence shard in backward, a read the rule
    cannot see: the capture leaves such a program's activations as recorded."""
    parallel = {"tp": 2, "sequence_parallel": True}
    job = debug_job(parallel, global_batch=2, seq_len=256, train={"recompute": "selective"})
    called = []

    def spy(*args):
        called.append(args)
        return free_unread_saved(*args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(emulator.capture.rank, "free_unread_saved", spy)
        for regather in (True, False):
            kernels = KernelsSpec(compile=True, sp_regather=regather)
            capture(dataclasses.replace(job, kernels=kernels), tmp_path)
            assert bool(called) is not regather
