"""The compile rule against Inductor's scheduler (results/fidelity/compile_vs_inductor.py): what
counts as a memory-bound kernel of Inductor's, bytes split into a part a token and a part a
layer, and the kernel-by-kernel listing. The comparison itself needs triton and is run by
hand."""

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


def test_attention_under_full_checkpointing_is_not_a_memory_bound_kernel(compile_vs_inductor):
    """torch.utils.checkpoint wraps the random attention op in rng-state operators, under
    whose names Inductor's extern nodes then run it."""
    forward = [("ExternKernelSchedulerNode", "run_and_save_rng_state", 20_980_000)]
    backward = [
        ("ExternKernelSchedulerNode", "run_with_rng_state", 21_110_000),  # its recomputation
        ("SchedulerNode", "", 100),
    ]
    totals = compile_vs_inductor.inductor_bytes([forward, backward])
    assert totals == {"forward": (0, 0), "backward": (1, 100)}


def test_bytes_split_into_a_part_a_token_and_a_part_a_layer(compile_vs_inductor):
    # 3 bytes a token and 500 a layer (a weight cast) at 1 024 and 2 048 tokens
    per_token, per_layer = compile_vs_inductor.per_token_and_layer({2048: 6644, 1024: 3572})
    assert (per_token, per_layer) == pytest.approx((3.0, 500.0))


def test_the_listing_shows_both_sides_kernel_by_kernel(compile_vs_inductor):
    rule = [(8_388_608, 8_388_608, "backward", "inductor.fused", "Net.layers.0.feed_forward.w2")]
    inductor = [
        ["SchedulerNode", "", 8_388_608, ["tangents_1:8.39"], ["buf1:0.00"]],
        ["ExternKernelSchedulerNode", "aten._scaled_mm.out", 92_270_000, ["buf3:4.19"], ["buf6:29.36"]],
    ]  # fmt: skip
    lines = compile_vs_inductor.listing(rule, inductor).splitlines()
    assert lines[1].split() == [
        "16.78", "r", "8.39", "w", "8.39", "backward", "inductor.fused",
        "Net.layers.0.feed_forward.w2",
    ]  # fmt: skip
    assert "total 16.78 MB in 1 rows" in lines[2]
    assert lines[4].split() == ["8.39", "generated:", "tangents_1:8.39", "->", "buf1:0.00"]
    assert "extern aten._scaled_mm.out: buf3:4.19 -> buf6:29.36" in lines[5]
