"""Megatron's 1F1B with per-transfer receive buffers (workloads/megatron_schedule.py), run for real.

One spawn of 4 gloo processes trains every case 3 iterations (test_parallel_parity's
harness: fp32, lr 1e-2); the mean loss over ranks that hold the last stage must equal
the single-process loss, and, where torch's Schedule1F1B (ScheduleInterleaved1F1B) also
runs the job, its losses. A pipeline of 4 stages with 2 micro-batches runs here; torch's
schedule refuses it. The interleaved cases run workloads/megatron_interleaved.py.
"""

from __future__ import annotations

import pytest

from prismbench.launch import run_ranks
from prismbench.spec import job_spec_from_dict
from tests.cases import case_params, selected_cases
from tests.workloads.test_parallel_parity import (
    SEQ_LEN,
    reference_job,
    single_process_run,
    train_losses,
)
from workloads.config import SpecError

WORLD = 4
INTERLEAVED = {"pp": 2, "vpp": 2, "schedule": "interleaved-1f1b"}

# name: (model, parallel, global batch, kernels.pipeline_recv[, kernels.framework]); None: the
# framework's choice. Tied GPT cases are pp2
# only: the embedding group of a tied pp4 case (ranks 0 and 3) made with local
# synchronization after one of pp2 hangs gloo's group creation in a shared spawn.
CASES = {
    "pp4-m2-llama": ({"name": "llama-debug"}, {"pp": 4}, 2, "per-transfer"),
    "pp4-m8-llama": ({"name": "llama-debug"}, {"pp": 4}, 8, "per-transfer"),
    # Megatron's preset: per-transfer, its vocabulary padding and loss
    "pp4-m6-llama-megatron": ({"name": "llama-debug"}, {"pp": 4}, 6, None, "megatron"),
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
    # Megatron's interleaved 1F1B: 4 virtual stages of one layer; 2 micro-batches per dp rank
    # are pp of them (every forward in the warm-up), 4 run the steady state
    "pp2-vpp2-dp2-m2-llama": (
        {"name": "llama-debug"},
        {**INTERLEAVED, "dp": 2, "zero": 1},
        4,
        "per-transfer",
    ),
    "pp2-vpp2-dp2-m4-llama": ({"name": "llama-debug"}, {**INTERLEAVED, "dp": 2}, 8, "per-transfer"),
    "pp2-vpp2-dp2-m4-llama-torch": (
        {"name": "llama-debug"},
        {**INTERLEAVED, "dp": 2},
        8,
        "per-microbatch",
    ),
    # Megatron's scatter-gather transfers (kernels.pipeline_transfer): tp2 without sequence
    # parallelism, each rank sends half of every activation and gradient and all-gathers
    "pp2-tp2-nosp-m4-llama-megatron": (
        {"name": "llama-debug"},
        {"pp": 2, "tp": 2, "sequence_parallel": False},
        4,
        None,
        "megatron",
    ),
    "pp2-vpp2-tp2-nosp-m4-gpt-megatron": (
        {"name": "gpt-debug"},
        {**INTERLEAVED, "tp": 2, "sequence_parallel": False},
        4,
        None,
        "megatron",
    ),
    "pp2-vpp2-tp2-m6-gpt-tied": (
        {"name": "gpt-debug"},
        {**INTERLEAVED, "tp": 2},
        6,
        None,
        "megatron",
    ),
}

# cases CI leaves out (the suite's 10-minute budget; the spawn trains only selected cases): a
# longer run of a pipeline CI runs short (pp4 with 8 micro-batches beside 2 and 6, and torch's
# schedule on the same job, which the interleaved pair compares), the tied GPT under zero 1 beside
# zero 3, and the interleaved scatter-gather beside the plain one
SLOW_CASES = {
    "pp4-m8-llama",
    "pp4-m8-llama-torch",
    "pp2-dp2-zero1-gpt-tied",
    "pp2-vpp2-tp2-nosp-m4-gpt-megatron",
}


def make_job(
    model: dict,
    parallel: dict,
    global_batch: int,
    pipeline_recv: str | None,
    framework: str = "prism-86a4f47",
):
    kernels = {"framework": framework}
    if pipeline_recv is not None:
        kernels["pipeline_recv"] = pipeline_recv
    return job_spec_from_dict(
        {
            "model": model,
            "parallel": parallel,
            "batch": {"seq_len": SEQ_LEN, "micro_batch": 1, "global_batch": global_batch},
            "train": {"precision": "fp32"},
            "kernels": kernels,
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
def losses(request) -> dict[str, list[float]]:
    selected = selected_cases(request.session, __file__, CASES)
    # with each case, torch's schedule on its job (test_loss_matches_torchs_schedule's pairs)
    wanted = [n for n in CASES if n in selected or n.removesuffix("-torch") in selected]
    per_rank = run_ranks(WORLD, _run_cases, wanted)
    merged = {}
    for name in wanted:
        rows = [r[name] for r in per_rank if r[name][0] is not None]
        merged[name] = [sum(step) / len(rows) for step in zip(*rows, strict=True)]
    return merged


@pytest.mark.integration
@pytest.mark.parametrize("name", case_params(CASES, SLOW_CASES))
def test_loss_matches_single_process(name, losses):
    expected = single_process_run(reference_job(make_job(*CASES[name]))).losses
    assert losses[name] == pytest.approx(expected, rel=1e-5)
    assert expected[-1] < expected[0]  # training moved the loss: the comparison means something


@pytest.mark.integration
@pytest.mark.parametrize("name", case_params(["pp4-m8-llama", "pp2-vpp2-dp2-m4-llama"], SLOW_CASES))
def test_loss_matches_torchs_schedule(name, losses):
    assert losses[name] == pytest.approx(losses[f"{name}-torch"], rel=1e-6)


def test_fewer_micro_batches_than_stages_need_per_transfer():
    job = make_job({"name": "llama-debug"}, {"pp": 4}, 2, "per-transfer")
    assert job.num_microbatches == 2
    with pytest.raises(SpecError, match="kernels.pipeline_recv='per-transfer'"):
        make_job({"name": "llama-debug"}, {"pp": 4}, 2, "per-microbatch")


@pytest.mark.parametrize("framework", ["megatron", "nemo"])
def test_megatron_frameworks_receive_per_transfer_where_the_executor_runs(framework):
    # workloads/kernels.py: Megatron-core allocates per transfer in both of its 1F1B schedules;
    # a pipeline our executor cannot run keeps torch's pipelining
    def job(parallel: dict, global_batch: int = 4):
        return make_job({"name": "llama-debug"}, parallel, global_batch, None, framework)

    assert job({"pp": 4}).kernels.pipeline_recv == "per-transfer"
    assert job({"pp": 4}, global_batch=2).num_microbatches == 2  # fewer than the stages
    assert job(INTERLEAVED).kernels.pipeline_recv == "per-transfer"
    # Megatron's interleaved schedule needs a multiple of pp micro-batches; torch's runs 3
    assert job(INTERLEAVED, global_batch=3).kernels.pipeline_recv == "per-microbatch"
    assert job({"pp": 2, "schedule": "gpipe"}).kernels.pipeline_recv == "per-microbatch"


def test_a_receive_policy_given_in_the_spec_is_kept_and_checked():
    with pytest.raises(SpecError, match="kernels.pipeline_recv.*parallel.schedule"):
        make_job({"name": "llama-debug"}, {"pp": 2, "schedule": "gpipe"}, 8, "per-transfer", "nemo")
    job = make_job({"name": "llama-debug"}, {"pp": 2}, 8, "per-microbatch", "megatron")
    assert job.kernels.pipeline_recv == "per-microbatch"


@pytest.mark.parametrize(
    "parallel",
    [{"pp": 2, "schedule": "gpipe"}, {"pp": 2, "schedule": "zero-bubble"}],
)
def test_per_transfer_refuses_other_schedules_naming_both_fields(parallel):
    with pytest.raises(SpecError, match="kernels.pipeline_recv.*parallel.schedule"):
        make_job({"name": "llama-debug"}, parallel, 8, "per-transfer")


def test_per_transfer_interleaving_needs_a_multiple_of_pp_micro_batches():
    with pytest.raises(SpecError, match=r"micro-batches per iteration\(3\).*pp\(2\)"):
        make_job({"name": "llama-debug"}, INTERLEAVED, 3, "per-transfer")


def megatron_job(parallel: dict, **kernels):
    return job_spec_from_dict(
        {
            "model": {"name": "llama-debug"},
            "parallel": parallel,
            "batch": {"seq_len": SEQ_LEN, "micro_batch": 1, "global_batch": 4},
            "kernels": {"framework": "megatron", **kernels},
        }
    )


def test_megatron_splits_pipeline_transfers_over_tp_only_where_its_executor_runs():
    assert megatron_job({"pp": 2}).kernels.pipeline_transfer == "scatter-gather"
    # torch's pipelining sends whole stage outputs: the framework's choice gives way with it
    gpipe = megatron_job({"pp": 2, "schedule": "gpipe"})
    assert gpipe.kernels.pipeline_transfer == "whole"
    torch_recv = megatron_job({"pp": 2}, pipeline_recv="per-microbatch")
    assert torch_recv.kernels.pipeline_transfer == "whole"
    with pytest.raises(SpecError, match="kernels.pipeline_transfer.*kernels.pipeline_recv"):
        megatron_job({"pp": 2}, pipeline_recv="per-microbatch", pipeline_transfer="scatter-gather")
