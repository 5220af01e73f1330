"""Inductor's kernels in a profile given to the custom ops that launched them
(prismbench.compiled_calls, through profile_ingest.align_profile and compare).

A tiny Llama with the workloads' compiled custom ops (RoPE, the fused loss) is captured; its
profile is what a GPU run lists (as the H200 reprofile did): an aten::op per aten row, and for
each custom-op row the launches of its Inductor kernels, named and shaped as the H200's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from emulator.capture.opmap import READS_NO_INPUT
from emulator.capture.trace import COMPUTE
from emulator.costs.pricing import CostContext
from prismbench.capture import capture_job
from prismbench.compare import compare_ops
from prismbench.compiled_calls import calls
from prismbench.emulate import cost_context
from prismbench.profile_ingest import align_profile, profile_key
from prismbench.profile_readers import INDUCTOR_KERNEL, ProfiledOp, read_ops_jsonl
from prismbench.spec import job_spec_from_dict

H200_MPT = (
    Path(__file__).resolve().parents[2]
    / "results/gpu_runs/h200-2026-11-30/reprofile/mpt-7b-l4-s2048-mb4-none.ops.jsonl.gz"
)
TINY_LLAMA = {
    "model": {"name": "llama-debug"},
    "batch": {"seq_len": 64, "global_batch": 2},
    "kernels": {"framework": "torchtitan", "loss": "fused"},
}
# the H200's kernel names (results/gpu_runs/h200-2026-11-30/reprofile/)
ROPE = (
    "triton_poi_fused__to_copy_add_arange_cos_div_mul_neg_pow_select_sin_stack_sub_unsqueeze_view_0"
)
LSE = "triton_red_fused__to_copy_logsumexp_0"
TARGET = "triton_poi_fused__to_copy_bitwise_and_bitwise_not_clamp_gather_ge_lt_masked_fill_squeeze_sub_unsqueeze_1"
GRADIENT = "triton_poi_fused__to_copy_arange_bitwise_and_clamp_eq_exp_ge_lt_mul_sub_unsqueeze_0"
MASK = "triton_poi_fused_new_zeros_1"  # FlexAttention's block mask: no capture row


@pytest.fixture(scope="module")
def trace():
    return capture_job(job_spec_from_dict(TINY_LLAMA)).traces[0]


def _kernel(name: str, shapes: list, us: float) -> ProfiledOp:
    return ProfiledOp(name, tuple(tuple(s) for s in shapes), ((name, us),), 0.0)


def _launches(trace, row: int) -> list[ProfiledOp]:
    """What a GPU run's profile lists for one compute row (the kernels' times made up)."""
    aten = trace.strings[trace.columns["aten"][row]]
    tensors = trace.tensors(row)
    inputs = [s for s, _, out in tensors if not out and s and aten not in READS_NO_INPUT]
    if aten == "prism.rope":
        x, positions = inputs
        return [_kernel(ROPE, [x, positions, x, []], 97.0)]
    if aten == "prism.cross_entropy":
        logits, labels = inputs
        return [_kernel(LSE, [labels, logits, [], []], 457.0),
                _kernel(TARGET, [labels, logits, labels, []], 2.0)]  # fmt: skip
    if aten == "prism.cross_entropy_backward":
        logits, tokens = inputs[1], inputs[0]
        return [_kernel(GRADIENT, [logits, tokens, tokens, tokens, logits, []], 536.0)]
    shapes = inputs or [s for s, _, out in tensors if out]
    return [ProfiledOp(aten.replace(".", "::", 1), tuple(shapes), (("k", 1.0),), 0.0)]


def _profile(trace) -> list[ProfiledOp]:
    rows = [int(r) for r in np.flatnonzero(trace.columns["kind"] == COMPUTE)]
    ops = [op for r in rows for op in _launches(trace, r)]
    return [_kernel(MASK, [[1, 1, 16, 17], []], 0.7), *ops]


def _custom_rows(trace, aligned) -> dict[int, str]:
    c = trace.columns
    rows = {j: trace.strings[c["aten"][r]] for j, r in enumerate(aligned.compute_rows)}
    return {j: packet for j, packet in rows.items() if packet.startswith("prism.")}


def test_a_call_ends_where_its_graphs_kernel_numbers_start_again():
    ops = [_kernel(ROPE, [], 1.0), _kernel(ROPE, [], 1.0), _kernel(LSE, [], 1.0),
           _kernel(TARGET, [], 1.0), ProfiledOp("aten::mm", (), (("k", 1.0),), 0.0),
           _kernel(GRADIENT, [], 1.0)]  # fmt: skip
    # RoPE on q, then on k; the loss's two kernels; an aten op; the loss's backward
    assert calls(ops) == [[0], [1], [2, 3], [4], [5]]


def test_every_custom_op_row_gets_the_kernels_its_compiled_code_launched(trace):
    aligned = align_profile(_profile(trace), trace)
    assert len(aligned.pairs) == len(aligned.compute_rows)  # every row matched
    custom = _custom_rows(trace, aligned)
    assert {"prism.rope", "prism.cross_entropy", "prism.cross_entropy_backward"} <= set(
        custom.values()
    )
    op_of_row = {j: aligned.ops[i] for i, j in aligned.pairs}
    for j, packet in custom.items():
        op = op_of_row[j]
        assert op.op == packet.replace(".", "::", 1)
        expected = {"prism.rope": [ROPE], "prism.cross_entropy": [LSE, TARGET],
                    "prism.cross_entropy_backward": [GRADIENT]}[packet]  # fmt: skip
        assert [name for name, _ in op.kernels] == expected
    # the block mask's kernel matches nothing
    unmatched = [op.op for i, op in enumerate(aligned.ops) if i not in aligned.matched_ops]
    assert unmatched == [MASK]


def test_in_a_chrome_trace_the_kernels_nested_in_a_custom_op_go_to_it(trace):
    # Chrome traces record nesting: the launches sit in the custom op's own event
    rows = [int(r) for r in np.flatnonzero(trace.columns["kind"] == COMPUTE)]
    ops = []
    for r in rows:
        packet = trace.strings[trace.columns["aten"][r]]
        launched = _launches(trace, r)
        if packet.startswith("prism."):
            inputs = tuple(s for s, _, out in trace.tensors(r) if not out)
            parent = (packet.replace(".", "::", 1), float(r), inputs)
            launched = [
                ProfiledOp(op.op, op.shapes, op.kernels, r + 0.5, (parent,)) for op in launched
            ]
        ops += launched
    aligned = align_profile(ops, trace)
    assert len(aligned.pairs) == len(aligned.compute_rows)
    op_of_row = {j: aligned.ops[i] for i, j in aligned.pairs}
    for j, packet in _custom_rows(trace, aligned).items():
        assert op_of_row[j].op == packet.replace(".", "::", 1)
        assert op_of_row[j].kernel_us > 0


def test_compare_measures_the_custom_ops_and_keeps_a_gpu_only_kernel_apart(trace):
    job = job_spec_from_dict(TINY_LLAMA)
    cost: CostContext = cost_context(job, None, kernel_gap_s=0.0)
    classes = {(c.op, c.aten): c for c in compare_ops(_profile(trace), trace, cost)}
    forward = classes[("cross_entropy", "prism.cross_entropy")]
    assert forward.matched == forward.trace_ops == forward.profile_ops == 2  # two micro-batches
    assert forward.measured_s == pytest.approx(2 * 459e-6)
    assert classes[("cross_entropy", "prism.cross_entropy_backward")].measured_s == pytest.approx(
        2 * 536e-6
    )
    rope = classes[("elementwise", "prism.rope")]
    assert rope.matched == rope.trace_ops and rope.measured_s == pytest.approx(
        rope.trace_ops * 97e-6
    )
    mask = classes[("triton", MASK)]
    assert (mask.trace_ops, mask.profile_ops, mask.measured_s) == (0, 1, pytest.approx(0.7e-6))


def test_a_custom_op_is_keyed_by_the_name_its_capture_gives_it():
    # the op map knows a program's custom ops only in the process that captured it
    op = ProfiledOp("mylib::fused_softmax", ((8, 16),), (("k", 1.0),), 0.0)
    assert profile_key(op) == ("elementwise", (8, 16))
    assert profile_key(op, {"mylib.fused_softmax": "softmax"}) == ("softmax", (8, 16))


def test_the_h200_profile_s_inductor_kernels_are_read_and_cut_into_calls():
    ops = read_ops_jsonl(H200_MPT)
    inductor = [op for op in ops if INDUCTOR_KERNEL.match(op.op)]
    # FlexAttention (and its block mask) and the fused loss: 9.4 ms, once left out of `compare`
    assert sum(op.kernel_us for op in inductor) == pytest.approx(9417.8, abs=0.1)
    by_first = {}
    for call in calls(ops):
        if INDUCTOR_KERNEL.match(ops[call[0]].op):
            by_first.setdefault(ops[call[0]].op, []).append(len(call))
    assert by_first[LSE] == [2]  # logsumexp and the label's logit: one call
    assert by_first[GRADIENT] == [1]
    assert by_first["triton_tem_fused_flex_attention_0"] == [1] * 4  # one per layer
    assert by_first["triton_red_fused_flex_attention_backward_0"] == [2] * 4
