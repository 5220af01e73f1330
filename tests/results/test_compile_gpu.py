"""A compiled torchtitan block on a GPU (results/fidelity/compile_gpu.py): the one-block job,
the split of a profile's kernels into Inductor's and extern ones, and the block itself run
compiled on CPU (the plumbing the GPU run uses)."""

import dataclasses

import pytest

from prismbench.baselines import load_baseline
from tests.results.conftest import ROOT

ROW = ROOT / "results" / "baselines" / "torchtitan2024__llama3.1-8b__8g__r034.toml"


def test_the_one_block_job_keeps_the_rows_micro_batch_and_drops_every_other_layer(
    compile_vs_inductor,
):
    job = load_baseline(ROW).job
    fsdp = compile_vs_inductor.one_layer_job(job, fsdp=True)
    alone = compile_vs_inductor.one_layer_job(job, fsdp=False)
    assert (fsdp.model.layers, fsdp.parallel.dp, fsdp.parallel.zero) == (1, 2, 3)
    assert (alone.parallel.dp, alone.parallel.zero, alone.train.recompute) == (1, 0, "none")
    for cut in (fsdp, alone):
        assert (cut.batch.seq_len, cut.batch.micro_batch) == (job.batch.seq_len, 2)
        assert cut.num_microbatches == 1


def test_generated_triton_kernels_are_inductors_and_the_rest_extern(compile_gpu):
    records = [
        {"kernels": [["triton_per_fused_add_mean_mul_pow_rsqrt_0", 10.0], ["nvjet_hsh_256x128", 90.0]]},
        {"kernels": [["triton_poi_fused_mul_silu_1", 5.5]]},
        {"kernels": [["flash_fwd_kernel", 40.0]]},
    ]  # fmt: skip
    assert compile_gpu.kernel_kinds(records) == {
        "inductor": {"kernels": 2, "us": 15.5},
        "extern": {"kernels": 2, "us": 130.0},
    }


@pytest.mark.slow
def test_a_small_block_runs_checkpointed_and_compiled_forward_and_backward_on_cpu(compile_gpu):
    job = load_baseline(ROW).job
    small = dataclasses.replace(
        job.model, hidden=64, ffn_hidden=128, heads=4, kv_heads=2, vocab=256, max_seq_len=64
    )
    job = dataclasses.replace(
        job, model=small, batch=dataclasses.replace(job.batch, seq_len=32, micro_batch=2)
    )
    import torch
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    forward, backward = compile_gpu.compiled_block(job, "cpu")
    for _ in range(2):
        forward()
        grad = backward()
        assert grad.shape == (2, 32, 64)
        assert bool(grad.isfinite().all()) and bool(grad.abs().sum() > 0)
    assert compile_gpu.dynamo_record() == {"graphs": 1, "breaks": {}}  # one compiled block


def test_a_call_dynamo_will_not_trace_inside_a_checkpoint_leaves_no_graph_at_all(compile_gpu):
    """What the first H200 run measured: `is_fake` (the workloads' CUDA flash branch) in a
    checkpointed region, under torch.compile, and the region runs eagerly, whole."""
    import torch
    from torch._dynamo.utils import counters
    from torch._subclasses.fake_tensor import is_fake
    from torch.utils.checkpoint import checkpoint

    def region(x):
        y = x.sin()
        return y * 2 if not is_fake(y) else y

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(lambda x: checkpoint(region, x, use_reentrant=False))
    compiled(torch.randn(4, requires_grad=True)).sum().backward()
    record = compile_gpu.dynamo_record()
    assert record["graphs"] == 0
    assert any("skipped" in reason for reason in record["breaks"]), record


def test_the_comparison_says_whether_each_block_was_compiled(compile_gpu):
    rows = {
        "t__r034": {},
        "t__r035": {"dynamo": {"graphs": 0, "breaks": {"Attempted to call skipped": 2}}},
        "t__r036": {"dynamo": {"graphs": 1, "breaks": {}}},
    }
    old, eager, compiled = compile_gpu.dynamo_lines({"rows": rows})
    assert old.startswith("- r034: the JSON does not record what Dynamo compiled")
    assert "**not one compiled block**: 0 graph(s)" in eager and "skipped (2x)" in eager
    assert compiled == "- r036: 1 graph(s) compiled, no graph break."
