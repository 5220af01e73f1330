"""Real multi-process CPU runs (gloo) of the parallel workloads match a single-process run.

One spawn of 4 processes runs every case in turn (each builds its own mesh on the
same process group); each case trains 3 iterations of a debug flavor and the mean
loss over ranks of each iteration must equal the single-process loss of the same
model, seed and global batch (fp32, rtol 1e-5). AdamW's update does not depend on
the scale of the gradient, so the learning rate is large (1e-2) to make a wrong
gradient direction show up in the later losses.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from prismbench.spec import job_spec_from_dict
from tests.workloads.mp import run_ranks

WORLD = 4
STEPS = 3
SEQ_LEN = 32
GLOBAL_BATCH = 8
LR = 1e-2

# name: (model table, parallel table)
CASES = {
    "tp2-sp-dp2-zero0-llama": ({"name": "llama-debug"}, {"tp": 2, "dp": 2, "zero": 0}),
    "tp2-sp-dp2-zero1-gpt-tied": ({"name": "gpt-debug"}, {"tp": 2, "dp": 2, "zero": 1}),
    "tp2-nosp-dp2-zero1-gpt": (
        {"name": "gpt-debug"},
        {"tp": 2, "sequence_parallel": False, "dp": 2, "zero": 1},
    ),
    "pp2-1f1b-dp2-zero1-llama": ({"name": "llama-debug"}, {"pp": 2, "dp": 2, "zero": 1}),
    "pp2-gpipe-tp2-gpt-tied": ({"name": "gpt-debug"}, {"pp": 2, "schedule": "gpipe", "tp": 2}),
    "pp2-1f1b-dp2-zero3-gpt-tied": ({"name": "gpt-debug"}, {"pp": 2, "dp": 2, "zero": 3}),
    "pp2-interleaved-tp2-llama": (
        {"name": "llama-debug"},
        {"pp": 2, "vpp": 2, "schedule": "interleaved-1f1b", "tp": 2},
    ),
    "pp2-zero-bubble-dp2-llama": (
        {"name": "llama-debug"},
        {"pp": 2, "vpp": 2, "schedule": "zero-bubble", "dp": 2},
    ),
    "fsdp-zero3-dp2-tp2-llama": ({"name": "llama-debug"}, {"dp": 2, "tp": 2, "zero": 3}),
    "fsdp-zero2-dp4-gpt-tied": ({"name": "gpt-debug"}, {"dp": 4, "zero": 2}),
    "fsdp-zero3-pp2-dp2-llama": ({"name": "llama-debug"}, {"pp": 2, "dp": 2, "zero": 3}),
    "cp2-tp2-llama": ({"name": "llama-debug"}, {"cp": 2, "tp": 2}),
    "cp2-dp2-zero3-gpt-alibi": (
        {"name": "gpt-debug", "positions": "alibi"},
        {"cp": 2, "dp": 2, "zero": 3},
    ),
}


def make_job(model: dict, parallel: dict):
    return job_spec_from_dict(
        {
            "model": model,
            "parallel": parallel,
            "batch": {"seq_len": SEQ_LEN, "micro_batch": 1, "global_batch": GLOBAL_BATCH},
            "train": {"precision": "fp32"},
        }
    )


def global_batch(job) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1234)
    shape = (job.batch.global_batch, job.batch.seq_len)
    tokens = torch.randint(job.model.vocab, shape, generator=gen)
    labels = torch.randint(job.model.vocab, shape, generator=gen)
    return tokens, labels


def train_losses(job, mesh) -> list[float | None]:
    from workloads import build_training, train_step

    state = build_training(job, mesh, seed=7, lr=LR)
    tokens, labels = global_batch(job)
    if mesh is not None:
        dp, dp_rank = job.parallel.dp, mesh["dp"].get_local_rank()
        tokens, labels = tokens.chunk(dp)[dp_rank], labels.chunk(dp)[dp_rank]
    return [train_step(job, state, tokens, labels) for _ in range(STEPS)]


def _run_cases(names: list[str]) -> dict[str, list[float | None]]:
    from workloads import make_mesh

    results = {}
    for name in names:
        job = make_job(*CASES[name])
        results[name] = train_losses(job, make_mesh(job))
    return results


def reference_job(job):
    single = dataclasses.replace(
        job.parallel,
        tp=1,
        sequence_parallel=False,
        pp=1,
        vpp=1,
        schedule="1f1b",
        cp=1,
        dp=1,
        zero=0,
    )
    return dataclasses.replace(job, parallel=single)


@pytest.fixture(scope="module")
def parallel_losses() -> dict[str, list[float]]:
    per_rank = run_ranks(WORLD, _run_cases, list(CASES))
    merged = {}
    for name in CASES:
        rows = [r[name] for r in per_rank if r[name][0] is not None]
        merged[name] = [sum(step) / len(rows) for step in zip(*rows, strict=True)]
    return merged


@pytest.mark.integration
@pytest.mark.parametrize("name", list(CASES))
def test_parallel_loss_matches_single_process(name, parallel_losses):
    job = make_job(*CASES[name])
    expected = train_losses(reference_job(job), None)
    assert parallel_losses[name] == pytest.approx(expected, rel=1e-5)
    assert expected[-1] < expected[0]  # training moved the loss: the comparison means something
