"""torch.compile's fusion rule (emulator.capture.compile_fusion): the memory-bound rows of a
compiled graph become the kernels Inductor's scheduler makes of them, fused by data dependence
around the extern GEMMs, each moving its group's external bytes, their intermediates never
allocated; checked on hand-written rows, on a recorded block, on a captured job, and against
Inductor's own kernel count (on CPU as a proxy, on CUDA from a profile)."""

import dataclasses
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from emulator.capture.compile_fusion import FUSED_ATEN, block_region, fuse_compiled_regions
from emulator.capture.inductor_scheduler import FUSIBLE
from emulator.capture.op_recorder import OpRecorder
from emulator.capture.trace import ALLOC, COMPUTE, FREE, PHASES
from tests.emulator.capture.hand_rows import D, N, Rows, as_classes
from tests.prismbench.capture_cases import capture, debug_job
from workloads.kernels import KernelsSpec

REGION = block_region("layers")


def _compute(events):
    return [e for e in events if e.kind == COMPUTE]


def test_a_pointwise_chain_between_gemms_is_one_kernel_reading_and_writing_its_ends():
    rows = Rows()
    rows.chain(0)
    events = as_classes(rows.events)
    fused = fuse_compiled_regions(events, (), REGION)
    kernels = _compute(fused)
    assert [e.name for e in kernels] == ["mm", "elementwise", "mm"]
    one = kernels[1]
    assert one.aten == FUSED_ATEN and one.seq == _compute(events)[3].seq  # relu's place
    assert (one.read_bytes, one.write_bytes) == (4 * N * D, 4 * N * D)  # y in, z out
    eager = sum(e.read_bytes + e.write_bytes for e in _compute(events)[1:4])
    assert eager == 6 * 4 * N * D
    allocated = [e.storage for e in fused if e.kind == ALLOC]
    assert allocated == [2, 5, 6]  # y, z, o: the temporaries t1, t2 are never allocated
    assert not [e for e in fused if e.kind == FREE]


def test_a_collective_between_two_rows_keeps_them_apart():
    rows = Rows()
    rows.chain(0)
    events = as_classes(rows.events)
    add = _compute(events)[2]
    kernels = _compute(fuse_compiled_regions(events, [add.seq - 1], REGION))
    # mul alone, then add+relu fused
    assert [e.aten for e in kernels] == ["aten.mm", "aten.mul", FUSED_ATEN, "aten.mm"]


def test_rows_outside_compiled_blocks_do_not_fuse():
    rows = Rows()
    rows.chain(0, module="Net.output")
    events = as_classes(rows.events)
    assert fuse_compiled_regions(events, (), REGION) == events


def test_what_reads_a_reduction_to_one_element_is_another_kernel():
    rows = Rows()
    rows.alloc(1)
    rows.op("abs", (0,), (1,))
    rows.alloc(2, 4)
    rows.op("amax", (1,), (2,), out_shape=())  # a tensorwise fp8 amax
    rows.free(1)
    rows.op("mul", (0, 2), (3,), in_shapes=[(N, D), ()])
    rows.op("clamp", (3,), (4,))
    events = as_classes(rows.events, {"amax": "reduction"})
    kernels = _compute(fuse_compiled_regions(events, (), REGION))
    assert [e.aten for e in kernels] == [FUSED_ATEN, FUSED_ATEN]
    # the first reads the operand and writes the scalar; the second reads both
    assert (kernels[0].read_bytes, kernels[0].write_bytes) == (4 * N * D, 4)
    assert kernels[1].read_bytes == 4 * N * D + 4


def test_a_gemm_that_does_not_read_the_pointwise_ops_does_not_keep_them_apart():
    rows = Rows()  # silu(x @ w1) * (x @ w3) @ w2
    rows.op("mm", (0, 1), (2,))
    rows.alloc(3)
    rows.op("silu", (2,), (3,))
    rows.op("mm", (0, 4), (5,))
    rows.op("mul", (3, 5), (6,))
    rows.free(3)
    rows.op("mm", (6, 7), (8,))
    kernels = _compute(fuse_compiled_regions(as_classes(rows.events), (), REGION))
    assert [e.aten for e in kernels] == ["aten.mm", "aten.mm", FUSED_ATEN, "aten.mm"]
    assert kernels[2].read_bytes == 2 * 4 * N * D and kernels[2].write_bytes == 4 * N * D


def test_a_gradient_accumulation_neither_fuses_nor_keeps_the_rows_around_it_apart():
    rows = Rows()  # silu(x @ w1) * (x @ w3), the weight gradient g added into main_grad m
    rows.op("mm", (0, 1), (2,))
    rows.alloc(3)
    rows.op("silu", (2,), (3,))
    rows.op("mm", (0, 4), (5,))
    rows.op("add_", (9, 5), (9,))  # main_grad += grad: autograd's hook, eager
    rows.op("mul", (3, 5), (6,))
    rows.free(3)
    events = as_classes(rows.events)
    kernels = _compute(fuse_compiled_regions(events, (), REGION, eager_storages={9}))
    # the hook runs once the compiled graph has returned
    assert [e.aten for e in kernels] == ["aten.mm", "aten.mm", FUSED_ATEN, "aten.add_"]
    # without the gradient's storage named, the accumulation fuses with the block's rows
    kernels = _compute(fuse_compiled_regions(events, (), REGION))
    assert [e.aten for e in kernels] == ["aten.mm", "aten.mm", FUSED_ATEN]


def test_an_input_eager_code_frees_between_fused_rows_is_freed_after_the_fused_kernel():
    rows = Rows()  # y = mm(x, w); del x; ...: a = y * 2; b = a + 1, y freed after the mul
    rows.alloc(2)
    rows.op("mm", (0, 1), (2,))
    rows.alloc(3)
    rows.op("mul", (2,), (3,))
    rows.free(2)  # eager frees y here; the fused kernel still reads it
    rows.alloc(4)
    rows.op("add", (3,), (4,))
    rows.free(3)
    fused = fuse_compiled_regions(as_classes(rows.events), (), REGION)
    order = [(e.kind, e.storage) if e.kind != COMPUTE else e.aten for e in fused]
    assert order == [(ALLOC, 2), "aten.mm", (ALLOC, 4), FUSED_ATEN, (FREE, 2)]
    seqs = [e.seq for e in fused]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


def _phase(name):
    return PHASES.index(name)


def test_a_recomputed_product_and_its_gradient_are_one_kernel_after_the_gemm_it_needs():
    """SwiGLU under checkpointing: the backward graph recomputes p = silu(a) * b, a weight
    gradient's GEMM reads p, another GEMM makes dp, and dp's pointwise gradients follow. Eager
    order interleaves them; by data dependence they are one kernel of six passes (reads a, b,
    dp; writes p, db, da), after dp's GEMM and before the weight gradient's."""
    a, b, g, w2, s, p, dw2, dp, ds, db, da = range(11)
    rows = Rows()
    rec, bwd = _phase("recompute"), _phase("backward")
    rows.new("silu", (a,), s, phase=rec)
    rows.new("mul", (s, b), p, phase=rec)
    rows.new("mm", (g, p), dw2, phase=bwd)
    rows.free(p)
    rows.new("mm", (g, w2), dp, phase=bwd)
    rows.new("mul", (dp, b), ds, phase=bwd)
    rows.new("mul", (dp, s), db, phase=bwd)
    rows.free(s)
    rows.new("silu_backward", (ds, a), da, phase=bwd)
    rows.free(ds)
    rows.free(dp)
    events = as_classes(rows.events)
    fused = fuse_compiled_regions(events, (), REGION)
    kernels = _compute(fused)
    assert [(e.aten, e.flows[-1]) for e in kernels] == [
        ("aten.mm", dp), (FUSED_ATEN, da), ("aten.mm", dw2),
    ]  # fmt: skip
    one = kernels[1]
    assert (one.read_bytes, one.write_bytes) == (3 * 4 * N * D, 3 * 4 * N * D)
    assert sorted(one.flows) == sorted((a, b, dp, p, db, da))
    eager = sum(e.read_bytes + e.write_bytes for e in _compute(events) if e.name != "mm")
    assert eager == 14 * 4 * N * D
    # s and ds are never allocated; p lives until the weight gradient's GEMM has read it
    assert {e.storage for e in fused if e.kind == ALLOC} == {p, dw2, dp, db, da}
    order = [(e.kind, e.storage) if e.kind != COMPUTE else e.aten for e in fused]
    assert order.index((FREE, p)) > order.index("aten.mm", 2)
    seqs = [e.seq for e in fused]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


def test_a_cast_repeated_for_each_gemm_of_one_input_is_computed_once():
    """torchao casts an input once per linear that reads it (q, k, v); AOTAutograd's CSE
    keeps one amax and one cast, and the second GEMM reads the first cast."""
    x, w1, w2, s1, c1, y1, s2, c2, y2 = range(9)
    rows = Rows()
    for scale, cast, w, y in ((s1, c1, w1, y1), (s2, c2, w2, y2)):
        rows.alloc(scale, 4)
        rows.op("amax", (x,), (scale,), out_shape=())
        rows.alloc(cast)
        rows.op("_to_copy", (x, scale), (cast,), in_shapes=[(N, D), ()])
        rows.op("mm", (cast, w), (y,))
        rows.free(cast)
        rows.free(scale, 4)
    events = as_classes(rows.events, {"amax": "reduction", "_to_copy": "copy"})
    fused = fuse_compiled_regions(events, (), REGION)
    kernels = _compute(fused)
    assert [e.aten for e in kernels] == ["aten.amax", "aten._to_copy", "aten.mm", "aten.mm"]
    assert kernels[3].flows == (c1, w2, y2)
    assert {e.storage for e in fused if e.kind == ALLOC} == {s1, c1}
    order = [(e.kind, e.storage) if e.kind != COMPUTE else e.aten for e in fused]
    assert order == [
        (ALLOC, s1), "aten.amax", (ALLOC, c1), "aten._to_copy", "aten.mm", (FREE, s1),
        "aten.mm", (FREE, c1),
    ]  # fmt: skip


def _casts_of_one_input(gemm: str, reader_shape: tuple, recipe_reads: int):
    """torchao's casts of attention's normed input, one per linear (q, k, v): the norm
    (reading `recipe_reads` - 1 storages) inlined into each cast, which reads its scale too;
    each cast's output, of shape (1, N, D), read by one `gemm` as `reader_shape`."""
    x, w, stats, extra, scale, n = range(6)
    casts, weights, outputs = (6, 7, 8), (9, 10, 11), (12, 13, 14)
    rows = Rows()
    rows.alloc(n)
    rows.op("mul", (x, w, stats, extra)[: recipe_reads - 1], (n,))
    for cast, weight, y in zip(casts, weights, outputs, strict=True):
        rows.alloc(cast)
        rows.op("_to_copy", (n, scale), (cast,), in_shapes=[(N, D), ()], out_shape=(1, N, D))
        rows.op(gemm, (cast, weight), (y,), in_shapes=[reader_shape, (D, D)])
        rows.free(cast)
    rows.free(n)
    events = as_classes(rows.events, {"_scaled_mm": "scaled_mm", "_to_copy": "copy"})
    return _compute(fuse_compiled_regions(events, (), REGION)), casts


def test_a_cast_every_scaled_mm_reads_through_a_view_is_one_kernel_writing_a_copy_for_each():
    """Inductor does not store a pointwise value that reads four buffers or fewer when
    several read it; each `_scaled_mm` reading it through a view realises its own copy, and
    the three copies are one kernel's writes (Inductor's forward of a Llama 3 8B block)."""
    kernels, casts = _casts_of_one_input("_scaled_mm", (N, D), recipe_reads=4)
    assert [e.aten for e in kernels] == [FUSED_ATEN] + ["aten._scaled_mm"] * 3
    assert kernels[0].write_bytes == 3 * 4 * N * D and kernels[0].read_bytes == 4 * (3 * N * D + 1)
    assert [e.flows[0] for e in kernels[1:]] == list(casts)


@pytest.mark.parametrize(
    "gemm, reader_shape, recipe_reads, why",
    [
        ("_scaled_mm", (N, D), 5, "a recipe of five reads is stored on reuse"),
        ("_scaled_mm", (1, N, D), 4, "read whole, not through a view: realised once"),
        ("mm", (N, D), 4, "aten.mm asks for realised inputs: stored once"),
    ],
)
def test_a_cast_is_stored_once_otherwise(gemm, reader_shape, recipe_reads, why):
    kernels, casts = _casts_of_one_input(gemm, reader_shape, recipe_reads)
    assert [e.aten for e in kernels] == [FUSED_ATEN] + [f"aten.{gemm}"] * 3, why
    assert kernels[0].write_bytes == 4 * N * D, why
    assert [e.flows[0] for e in kernels[1:]] == [casts[0]] * 3, why


def test_a_pointwise_value_two_kernels_read_is_recomputed_in_each_not_stored():
    """norm -> amax and norm -> cast: the cast needs the finished amax, so they are two
    kernels, and Inductor's lowering inlines the normalisation into both."""
    x, w, n, s, c, y = range(6)
    rows = Rows()
    rows.alloc(n)
    rows.op("mul", (x, w), (n,))
    rows.alloc(s, 4)
    rows.op("amax", (n,), (s,), out_shape=())
    rows.alloc(c)
    rows.op("_to_copy", (n, s), (c,), in_shapes=[(N, D), ()])
    rows.free(n)
    rows.op("mm", (c, w), (y,))
    events = as_classes(rows.events, {"amax": "reduction"})
    fused = fuse_compiled_regions(events, (), REGION)
    kernels = _compute(fused)
    assert [e.aten for e in kernels] == [FUSED_ATEN, FUSED_ATEN, "aten.mm"]
    assert sorted(kernels[0].flows) == [x, w, s] and sorted(kernels[1].flows) == [x, w, s, c]
    assert kernels[0].flops == kernels[1].flops - events[5].flops
    assert n not in {e.storage for e in fused if e.kind == ALLOC}


def test_rows_over_different_ranges_are_separate_kernels():
    rows = Rows()  # y = x * 2 over [N, D]; z = x.repeat(1, 2) over [N, 2D]
    rows.op("mul", (0,), (1,))
    rows.op("repeat", (0,), (2,), out_shape=(N, 2 * D))
    rows.op("mm", (1, 2), (3,))
    events = as_classes(rows.events)
    assert _compute(fuse_compiled_regions(events, (), REGION)) == _compute(events)


def test_two_rows_a_gemm_stands_between_by_data_stay_apart():
    rows = Rows()  # a = relu(x); h = a @ w; b = h + x: fusing a and b would need h first
    rows.op("relu", (0,), (1,))
    rows.op("mm", (1, 2), (3,))
    rows.op("add", (3, 0), (4,))
    events = as_classes(rows.events)
    assert _compute(fuse_compiled_regions(events, (), REGION)) == _compute(events)


# ---- a recorded block ----------------------------------------------------------------------


def _rope(x, cos, sin):
    x1, x2 = x.chunk(2, -1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1)


class Block(nn.Module):
    """A Llama block as torchtitan writes it: plain torch ops, RMSNorm, RoPE, SDPA, SwiGLU."""

    def __init__(self, dim=64, heads=4, ffn=128):
        super().__init__()
        self.heads = heads
        self.attention_norm, self.ffn_norm = nn.RMSNorm(dim), nn.RMSNorm(dim)
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.w1, self.w3 = nn.Linear(dim, ffn, bias=False), nn.Linear(dim, ffn, bias=False)
        self.w2 = nn.Linear(ffn, dim, bias=False)

    def forward(self, x, cos, sin):
        b, s, d = x.shape
        h = self.attention_norm(x)
        q, k, v = (
            w(h).view(b, s, self.heads, d // self.heads) for w in (self.wq, self.wk, self.wv)
        )
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        o = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=True)
        x = x + self.wo(o.transpose(1, 2).reshape(b, s, d))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Block()])

    def forward(self, x, cos, sin):
        return self.layers[0](x, cos, sin)


def _inputs(device="cpu", dtype=torch.float32, b=2, s=32, dim=64, heads=4):
    half = dim // heads // 2
    angles = torch.arange(s, device=device)[:, None] * torch.ones(half, device=device)[None]
    cos, sin = (f(angles)[None, :, None, :].to(dtype) for f in (torch.cos, torch.sin))
    return torch.randn(b, s, dim, device=device, dtype=dtype), cos, sin


def _recorded_forward():
    with FakeTensorMode():
        net = Net()
        rec = OpRecorder()
        rec.record_flows = True
        with torch.no_grad(), rec:
            inputs = _inputs()  # recorded, so that their storages have sizes
            rec.mark("inputs made")
            net(*inputs)
    return rec.events


def _memory_kernels(events):
    return [e for e in _compute(events) if e.name in FUSIBLE]


def _live_peak(events):
    live = peak = 0
    for e in events:
        live += e.size_bytes if e.kind == ALLOC else -e.size_bytes if e.kind == FREE else 0
        peak = max(peak, live)
    return peak


def test_a_recorded_block_keeps_its_gemms_and_attention_and_fuses_the_rest():
    eager = _recorded_forward()
    fused = fuse_compiled_regions(eager, (), REGION)
    extern = [(e.name, e.tensors) for e in _compute(eager) if e.name not in FUSIBLE]
    assert extern == [(e.name, e.tensors) for e in _compute(fused) if e.name not in FUSIBLE]
    assert len(extern) == 8  # 7 GEMMs and attention
    block = lambda events: [e for e in _memory_kernels(events) if REGION(e.module)]  # noqa: E731
    # norm | rope of q and k | residual + norm | silu * up | residual: five kernels where eager
    # torch runs 30 (the attention output's transpose and reshape are views on CPU and CUDA)
    assert (len(block(fused)), len(block(eager))) == (5, 30)
    moved = sum(e.read_bytes + e.write_bytes for e in _memory_kernels(fused))
    assert moved < sum(e.read_bytes + e.write_bytes for e in _memory_kernels(eager)) / 2
    assert len([e for e in fused if e.kind == ALLOC]) < len([e for e in eager if e.kind == ALLOC])
    assert _live_peak(fused) <= _live_peak(eager)


# ---- a captured job ------------------------------------------------------------------------


def _rows(trace):
    rows = np.flatnonzero(trace["kind"] == COMPUTE)
    names, atens = trace.text("name"), trace.text("aten")
    return [(names[i], atens[i], trace.tensors(i)) for i in rows], rows


def test_a_compiled_job_captures_the_same_gemms_fewer_kernels_and_no_more_memory():
    eager_job = debug_job(global_batch=2)
    compiled_job = dataclasses.replace(eager_job, kernels=KernelsSpec(compile=True))
    eager = capture(eager_job).traces[0]
    compiled = capture(compiled_job).traces[0]
    (eager_rows, e_idx), (compiled_rows, c_idx) = _rows(eager), _rows(compiled)
    extern = [r for r in eager_rows if r[0] not in FUSIBLE]
    assert extern == [r for r in compiled_rows if r[0] not in FUSIBLE]
    assert sum(r[1] == FUSED_ATEN for r in compiled_rows) > 0
    assert len(compiled_rows) < len(eager_rows)
    moved = lambda t, idx: int((t["read_bytes"][idx] + t["write_bytes"][idx]).sum())  # noqa: E731
    assert moved(compiled, c_idx) < moved(eager, e_idx)
    assert compiled.summary().peak_live_bytes <= eager.summary().peak_live_bytes
    assert compiled.summary().flops == eager.summary().flops


# ---- Inductor's own count ------------------------------------------------------------------


def _rule_count() -> int:
    """The rule's memory-bound kernels of the block's forward."""
    fused = fuse_compiled_regions(_recorded_forward(), (), REGION)
    return len([e for e in _memory_kernels(fused) if REGION(e.module)])


@pytest.mark.slow
def test_inductor_on_cpu_generates_as_many_kernels_as_the_rule_counts():
    """A proxy: Inductor's C++ backend fuses by the same scheduler with other heuristics. For
    this block it writes five C++ kernels (norm; rope of q and k; residual + norm; silu * up;
    residual) around the extern GEMMs and attention, the rule's five."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    with torch.no_grad():
        _, code = run_and_get_code(torch.compile(Net()), *_inputs())
    kernels = set(re.findall(r"^(cpp_fused_\w+) = async_compile", "\n".join(code), re.M))
    assert len(kernels) == _rule_count() == 5, sorted(kernels)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_compiled_block_on_cuda_runs_as_many_fused_kernels_as_the_rule_counts_give_or_take_2():
    """Inductor's Triton kernels in a CUDA profile of the compiled block's forward, against the
    rule's memory-bound kernels of the same block captured on CPU."""
    from torch.profiler import ProfilerActivity, profile

    torch._dynamo.reset()
    net = Net().cuda().to(torch.bfloat16)
    inputs = _inputs("cuda", torch.bfloat16)
    compiled = torch.compile(net)
    with torch.no_grad():
        compiled(*inputs)  # compile and warm up outside the profile
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            compiled(*inputs)
            torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    triton = [k for k in kernels if k.startswith("triton_")]
    assert triton, kernels
    assert abs(len(triton) - _rule_count()) <= 2, kernels


def test_a_backward_reduction_repeating_the_forwards_takes_its_value_not_a_kernel():
    """torchao casts a weight in forward and again in backward, each cast with its amax:
    AOTAutograd's CSE on the joint graph makes the backward's the forward's value (saved),
    so the backward graph runs the cast alone. A reduction over a storage the graph wrote
    in between is computed again."""
    forward, backward = PHASES.index("forward"), PHASES.index("backward")
    w, s1, c1, s2, c2, x, s3, s4 = range(8)
    rows = Rows()
    rows.op("amax", (w,), (s1,), out_shape=(), phase=forward)
    rows.op("_to_copy", (w, s1), (c1,), in_shapes=[(N, D), ()], phase=forward)
    rows.op("amax", (x,), (s3,), out_shape=(), phase=forward)
    rows.op("add_", (x, x), (x,), phase=backward)  # x changes in the backward graph
    rows.op("amax", (w,), (s2,), out_shape=(), phase=backward)
    rows.op("_to_copy", (w, s2), (c2,), in_shapes=[(N, D), ()], phase=backward)
    rows.op("amax", (x,), (s4,), out_shape=(), phase=backward)
    classes = {"amax": "reduction", "_to_copy": "copy"}
    fused = fuse_compiled_regions(as_classes(rows.events, classes), (), REGION)
    written = {
        phase: {
            u
            for e in fused
            if e.kind == COMPUTE and e.phase == phase
            for u, (_, _, is_out) in zip(e.flows, e.tensors, strict=True)
            if is_out
        }
        for phase in (forward, backward)
    }
    assert {s1, s3} <= written[forward]
    assert s2 not in written[backward]  # the forward's value: no kernel computes it
    assert {c2, s4} <= written[backward]  # x's, written in between, is computed again


def test_a_backward_reduction_the_recomputation_also_computes_reads_the_recomputations():
    """Under full checkpointing the backward graph recomputes a weight's amax; when the
    recomputed cast and GEMM that read it are dead (nothing in the backward reads the GEMM's
    output), the backward's own cast of the weight still needs that amax: the recomputed
    reduction stays, the backward's repeat of it goes."""
    forward, recompute = PHASES.index("forward"), PHASES.index("recompute")
    backward = PHASES.index("backward")
    w, x, s1, c1, y1, s2, c2, y2, g, s3, c3, dx = range(12)
    rows = Rows()
    rows.op("amax", (w,), (s1,), out_shape=(), phase=forward)
    rows.op("_to_copy", (w, s1), (c1,), in_shapes=[(N, D), ()], phase=forward)
    rows.op("mm", (x, c1), (y1,), phase=forward)
    rows.alloc(s2)
    rows.op("amax", (w,), (s2,), out_shape=(), phase=recompute)
    rows.alloc(c2)
    rows.op("_to_copy", (w, s2), (c2,), in_shapes=[(N, D), ()], phase=recompute)
    rows.alloc(y2)
    rows.op("mm", (x, c2), (y2,), phase=recompute)
    rows.free(c2)
    rows.free(y2)  # the recomputed output: read by nothing
    rows.alloc(s3)
    rows.op("amax", (w,), (s3,), out_shape=(), phase=backward)
    rows.alloc(c3)
    rows.op("_to_copy", (w, s3), (c3,), in_shapes=[(N, D), ()], out_shape=(D, N), phase=backward)
    rows.op("mm", (g, c3), (dx,), phase=backward)
    for u in (s2, s3, c3):
        rows.free(u)
    classes = {"amax": "reduction", "_to_copy": "copy"}
    fused = fuse_compiled_regions(as_classes(rows.events, classes), (), REGION)
    kernels = [(e.phase, e.aten, e.flows) for e in _compute(fused) if e.phase != forward]
    assert kernels == [
        (recompute, "aten.amax", (w, s2)),
        (backward, "aten._to_copy", (w, s2, c3)),
        (backward, "aten.mm", (g, c3, dx)),
    ]


def test_a_run_whose_rows_are_all_dropped_keeps_the_frees_of_values_made_before_it():
    """Rule 3 can drop every row of a run of the recomputation (a cast nothing reads and a
    repeat of it): its kernels go, the free of a value made before the run stays (a lost
    free would hold that memory for good)."""
    recompute = PHASES.index("recompute")
    x, w, c, c2 = range(4)
    rows = Rows()
    rows.alloc(x)
    rows.op("mul", (w,), (x,))  # x is made in the forward graph
    rows.new("_to_copy", (x,), c, phase=recompute)  # read by nothing
    rows.free(c)
    rows.new("_to_copy", (x,), c2, phase=recompute)  # a repeat of it
    rows.free(c2)
    rows.free(x)
    events = as_classes(rows.events, {"_to_copy": "copy"})
    fused = fuse_compiled_regions(events, (), REGION)
    assert [e.aten for e in fused if e.kind == COMPUTE] == ["aten.mul"]
    assert [e.storage for e in fused if e.kind == FREE] == [x]
