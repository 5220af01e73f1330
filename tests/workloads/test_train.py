"""build_training / train_step in one process, and the vocab-parallel loss formula."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from prismbench.spec import job_spec_from_dict
from workloads import build_training, train_step


def make_job(model="llama-debug", **train):
    return job_spec_from_dict(
        {
            "model": {"name": model},
            "batch": {"seq_len": 16, "micro_batch": 2, "global_batch": 4},
            "train": {"precision": "fp32", **train},
        }
    )


def batch(job, seed=0):
    gen = torch.Generator().manual_seed(seed)
    shape = (job.batch.global_batch, job.batch.seq_len)
    return (
        torch.randint(job.model.vocab, shape, generator=gen),
        torch.randint(job.model.vocab, shape, generator=gen),
    )


def test_train_step_lowers_the_loss_on_a_repeated_batch():
    job = make_job()
    state = build_training(job, None, seed=0, lr=1e-2)
    tokens, labels = batch(job)
    losses = [train_step(job, state, tokens, labels) for _ in range(3)]
    assert losses[0] == pytest.approx(torch.log(torch.tensor(256.0)).item(), rel=0.02)
    assert losses[2] < losses[0]


def test_train_step_accumulates_microbatches_like_one_big_batch():
    job = make_job()
    whole = dataclasses.replace(job, batch=dataclasses.replace(job.batch, micro_batch=4))
    tokens, labels = batch(job)
    split = [train_step(job, build_training(job, None, seed=1, lr=1e-2), tokens, labels)]
    one = [train_step(whole, build_training(whole, None, seed=1, lr=1e-2), tokens, labels)]
    assert split == pytest.approx(one, rel=1e-5)


def test_gradient_clipping_bounds_the_norm_to_one():
    job = make_job()
    state = build_training(job, None, seed=0)
    train_step(job, state, *batch(job))
    assert state.optimizer.last_grad_norm is not None
    assert all(p.grad is None for p in state.parts[0].parameters())


@pytest.mark.parametrize(
    ("model", "train"),
    [
        ("gpt-debug", {"precision": "bf16", "recompute": "full"}),
        ("llama-debug", {"precision": "fp8", "recompute": "selective"}),
    ],
)
def test_train_step_runs_in_low_precision_with_recompute(model, train):
    job = make_job(model, **train)
    state = build_training(job, None, seed=0)
    assert next(state.parts[0].parameters()).dtype == torch.bfloat16
    assert state.optimizer.master.dtype == torch.float32
    loss = train_step(job, state, *batch(job))
    assert 4.0 < loss < 7.0


def test_gradients_accumulated_in_bf16_train_like_fp32_accumulation():
    # kernels.grad_accumulation = "model-dtype" (Megatron-LM's fp16 runs): the same program
    # with a bf16 grad buffer; two micro-batches a step
    runs = {}
    for where in ("fp32", "model-dtype"):
        job = job_spec_from_dict(
            {
                "model": {"name": "gpt-debug"},
                "batch": {"seq_len": 16, "micro_batch": 2, "global_batch": 4},
                "train": {"precision": "bf16"},
                "kernels": {"grad_accumulation": where},
            }
        )
        state = build_training(job, None, seed=0, lr=1e-2)
        tokens, labels = batch(job)
        runs[where] = [train_step(job, state, tokens, labels) for _ in range(3)]
        buffer_dtype = torch.float32 if where == "fp32" else torch.bfloat16
        assert state.optimizer.grad_buffer.dtype == buffer_dtype
    assert runs["model-dtype"] == pytest.approx(runs["fp32"], rel=1e-2)
    assert runs["model-dtype"][2] < runs["model-dtype"][0]


def test_meta_init_builds_the_same_shapes():
    job = make_job("gpt-debug")
    state = build_training(job, None, device="cpu", init_device="meta", seed=0)
    model = state.parts[0]
    assert model.output.weight is model.tok_embeddings.weight  # to_empty keeps the tie
    assert not any(p.is_meta for p in model.parameters())
    assert train_step(job, state, *batch(job)) > 0
