"""Megatron's 1F1B with per-transfer receive buffers (workloads/megatron_schedule.py), run for real.

One spawn of 4 gloo processes trains every case 3 iterations (test_parallel_parity's
harness: fp32, lr 1e-2); the mean loss over ranks that hold the last stage must equal
the single-process loss, and, where torch's Schedule1F1B also runs the job, its losses.
A pipeline of 4 stages with 2 micro-batches runs here; torch's schedule refuses it.
"""

from __future__ import annotations

import pytest

from prismbench.launch import run_ranks
from prismbench.spec import job_spec_from_dict
from tests.workloads.test_parallel_parity import SEQ_LEN, reference_job, train_losses
from workloads.config import SpecError

WORLD = 4

# name: (model, parallel, global batch, kernels.pipeline_recv). Tied GPT cases are pp2
# only: the embedding group of a tied pp4 case (ranks 0 and 3) made with local
# synchronization after one of pp2 hangs gloo's group creation in a shared spawn.
CASES = {
    "pp4-m2-llama": ({"name": "llama-debug"}, {"pp": 4}, 2, "per-transfer"),
    "pp4-m8-llama": ({"name": "llama-debug"}, {"pp": 4}, 8, "per-transfer"),
    "pp4-m8-llama-torch": ({"name": "llama-debug"}, {"pp": 4}, 8, "per-microbatch"),
    "pp2-dp2-zero1-gpt-tied": (
        {"name": "gpt-debug"},
        {"pp": 2, "dp": 2, "zero": 1},
        8,
        "per-transfer",
    ),
    "pp2-tp2-sp-llama": ({"name": "llama-debug"}, {"pp": 2, "tp": 2}, 8, "per-transfer"),
    "pp2-dp2-zero3-gpt-tied": (
        {"name": "gpt-debug"},
        {"pp": 2, "dp": 2, "zero": 3},
        8,
        "per-transfer",
    ),
    "pp2-cp2-llama": ({"name": "llama-debug"}, {"pp": 2, "cp": 2}, 4, "per-transfer"),
}


def make_job(model: dict, parallel: dict, global_batch: int, pipeline_recv: str):
    return job_spec_from_dict(
        {
            "model": model,
            "parallel": parallel,
            "batch": {"seq_len": SEQ_LEN, "micro_batch": 1, "global_batch": global_batch},
            "train": {"precision": "fp32"},
            "kernels": {"pipeline_recv": pipeline_recv},
        }
    )


def _run_cases(names: list[str]) -> dict[str, list]:
    from workloads import make_mesh

    results = {}
    for name in names:
        job = make_job(*CASES[name])
        results[name] = train_losses(job, make_mesh(job)).losses
    return results


@pytest.fixture(scope="module")
def losses() -> dict[str, list[float]]:
    per_rank = run_ranks(WORLD, _run_cases, list(CASES))
    merged = {}
    for name in CASES:
        rows = [r[name] for r in per_rank if r[name][0] is not None]
        merged[name] = [sum(step) / len(rows) for step in zip(*rows, strict=True)]
    return merged


@pytest.mark.integration
@pytest.mark.parametrize("name", list(CASES))
def test_loss_matches_single_process(name, losses):
    expected = train_losses(reference_job(make_job(*CASES[name])), None).losses
    assert losses[name] == pytest.approx(expected, rel=1e-5)
    assert expected[-1] < expected[0]  # training moved the loss: the comparison means something


@pytest.mark.integration
def test_loss_matches_torch_schedule_1f1b(losses):
    assert losses["pp4-m8-llama"] == pytest.approx(losses["pp4-m8-llama-torch"], rel=1e-6)


def test_fewer_micro_batches_than_stages_need_per_transfer():
    job = make_job({"name": "llama-debug"}, {"pp": 4}, 2, "per-transfer")
    assert job.num_microbatches == 2
    with pytest.raises(SpecError, match="kernels.pipeline_recv='per-transfer'"):
        make_job({"name": "llama-debug"}, {"pp": 4}, 2, "per-microbatch")


def test_megatron_framework_keeps_torchs_receive_buffers_until_per_transfer_covers_it():
    # workloads/kernels.py says why: interleaved Megatron baselines
    job = job_spec_from_dict(
        {
            "model": {"name": "llama-debug"},
            "parallel": {"pp": 4},
            "batch": {"seq_len": SEQ_LEN, "global_batch": 4},
            "kernels": {"framework": "megatron"},
        }
    )
    assert job.kernels.pipeline_recv == "per-microbatch"


@pytest.mark.parametrize(
    "parallel",
    [{"pp": 2, "vpp": 2, "schedule": "interleaved-1f1b"}, {"pp": 2, "schedule": "gpipe"}],
)
def test_per_transfer_refuses_other_schedules_naming_both_fields(parallel):
    with pytest.raises(SpecError, match="kernels.pipeline_recv.*parallel.schedule"):
        make_job({"name": "llama-debug"}, parallel, 8, "per-transfer")
