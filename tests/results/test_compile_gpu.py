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
    forward, backward = compile_gpu.compiled_block(job, "cpu")
    for _ in range(2):
        forward()
        grad = backward()
        assert grad.shape == (2, 32, 64)
        assert bool(grad.isfinite().all()) and bool(grad.abs().sum() > 0)
