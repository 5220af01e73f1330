"""The compile rule against Inductor's scheduler (results/fidelity/compile_vs_inductor.py): what
counts as a memory-bound kernel on Inductor's side, and the kernel-by-kernel listing."""

GRAPHS = [
    [["SchedulerNode", "", 12_582_916, ["tangents_1:8.39"], ["buf3:4.19"]]],
    [
        ["SchedulerNode", "", 8_388_608, ["tangents_1:8.39"], ["buf1:0.00"]],
        ["ExternKernelSchedulerNode", "aten._scaled_mm.out", 92_270_000, ["buf3:4.19"], ["buf6:29.36"]],
        ["ExternKernelSchedulerNode", "prism.rope", 16_790_000, ["mm:8.39"], ["buf9:8.39"]],
        ["ExternKernelSchedulerNode", "aten.view", 0, ["buf9:8.39"], ["buf10:8.39"]],
    ],
]  # fmt: skip


def test_inductors_memory_bound_kernels_are_its_generated_ones_and_custom_ops(
    compile_vs_inductor,
):
    totals = compile_vs_inductor.inductor_bytes(GRAPHS)
    # the GEMM and the view of a multi-output op are left out; the RoPE custom op counts
    assert totals == {"forward": (1, 12_582_916), "backward": (2, 8_388_608 + 16_790_000)}


def test_the_listing_shows_both_sides_kernel_by_kernel(compile_vs_inductor):
    rule = [(8_388_608, 8_388_608, "backward", "inductor.fused", "Net.layers.0.feed_forward.w2")]
    text = compile_vs_inductor.listing(rule, GRAPHS[1])
    lines = text.splitlines()
    assert lines[1].split() == [
        "16.78", "r", "8.39", "w", "8.39", "backward", "inductor.fused",
        "Net.layers.0.feed_forward.w2",
    ]  # fmt: skip
    assert "total 16.78 MB in 1 rows" in lines[2]
    assert lines[4].split() == ["8.39", "generated:", "tangents_1:8.39", "->", "buf1:0.00"]
    assert "extern aten._scaled_mm.out: buf3:4.19 -> buf6:29.36" in lines[5]
