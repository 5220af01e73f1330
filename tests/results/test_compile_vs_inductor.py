"""The compile rule against Inductor's scheduler (results/fidelity/compile_vs_inductor.py): what
counts as a memory-bound kernel of Inductor's, and bytes split into a part a token and a part a
layer. The comparison itself needs triton and is run by hand."""

import pytest


def test_inductor_kernels_count_generated_kernels_and_custom_ops_but_not_gemms_or_views(
    compile_vs_inductor,
):
    forward = [
        ("FusedSchedulerNode", "", 300),  # a norm fused with its casts
        ("ExternKernelSchedulerNode", "aten.mm.default", 5_000),
        ("ExternKernelSchedulerNode", "extern_kernels.mm", 5_000),
        ("ExternKernelSchedulerNode", "prism.rope.default", 40),  # a custom op: memory-bound
        ("ExternKernelSchedulerNode", "", 0),  # a view of a multi-output op
    ]
    backward = [
        ("SchedulerNode", "", 100),
        ("ExternKernelSchedulerNode", "aten._scaled_dot_product_flash_attention_backward", 9),
    ]
    totals = compile_vs_inductor.inductor_bytes([forward, backward])
    assert totals == {"forward": (2, 340), "backward": (1, 100)}


def test_bytes_split_into_a_part_a_token_and_a_part_a_layer(compile_vs_inductor):
    # 3 bytes a token and 500 a layer (a weight cast) at 1 024 and 2 048 tokens
    per_token, per_layer = compile_vs_inductor.per_token_and_layer({2048: 6644, 1024: 3572})
    assert (per_token, per_layer) == pytest.approx((3.0, 500.0))
