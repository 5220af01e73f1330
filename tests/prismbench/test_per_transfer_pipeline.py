"""Emulating Megatron's 1F1B (kernels.pipeline_recv = "per-transfer"): its bubble and its buffers.

The capture sees the executor's batch_isend_irecv as send/recv on the virtual world, as it
sees torch's pipelining, and every receive buffer as an allocation of its own.
"""

import pytest

from prismbench.emulate import emulate
from prismbench.spec import job_spec_from_dict

SEQ_LEN = 256
HIDDEN = 64  # llama-debug


def make_job(*, pp: int, global_batch: int, pipeline_recv: str):
    return job_spec_from_dict(
        {
            "model": {"name": "llama-debug"},
            "parallel": {"pp": pp},
            "batch": {"seq_len": SEQ_LEN, "global_batch": global_batch},
            "train": {"precision": "bf16"},
            "kernels": {"pipeline_recv": pipeline_recv},
        }
    )


@pytest.mark.integration
def test_two_micro_batches_on_four_stages_pay_the_larger_bubble():
    # the host binds nothing: with its dispatch time this debug model is launch-bound, each
    # stage's host issues its work regardless of the others and hides the bubble
    few, many = (
        emulate(
            make_job(pp=4, global_batch=m, pipeline_recv="per-transfer"),
            workers=1,
            host_dispatch=None,
        )
        for m in (2, 8)
    )
    # 1F1B takes (m + pp - 1) micro-batch slots: 5 / 2 per micro-batch at m=2 against
    # 11 / 8 at m=8, 1.82 x; communication and the optimizer step blur it a little
    per_micro_batch = (few.iteration_time_s / 2) / (many.iteration_time_s / 8)
    assert per_micro_batch > 1.5
    share = [r.breakdown["bubble_s"] / r.iteration_time_s for r in (few, many)]
    assert share[0] > share[1]


@pytest.mark.integration
def test_first_stage_frees_each_received_gradient():
    m, pp = 16, 2
    activation_bytes = SEQ_LEN * HIDDEN * 2  # one bf16 micro-batch between stages
    peaks = {
        recv: emulate(make_job(pp=pp, global_batch=m, pipeline_recv=recv), workers=1)
        .per_class[0]
        .peak_memory_allocated_bytes
        for recv in ("per-transfer", "per-microbatch")
    }
    # torch's stage keeps m gradient buffers; Megatron's holds the one in flight
    assert peaks["per-microbatch"] - peaks["per-transfer"] >= (m - pp) * activation_bytes


@pytest.mark.integration
def test_last_stage_frees_each_received_activation():
    # the capture used to keep them: the module tracker's multi-grad hooks formed a cycle
    # through autograd's C++ graph that held every received leaf (emulator/torch_compat.py)
    m, pp = 16, 2
    activation_bytes = SEQ_LEN * HIDDEN * 2
    peaks = {
        recv: emulate(make_job(pp=pp, global_batch=m, pipeline_recv=recv), workers=1)
        .per_class[1]
        .peak_memory_allocated_bytes
        for recv in ("per-transfer", "per-microbatch")
    }
    assert peaks["per-microbatch"] - peaks["per-transfer"] >= (m - pp) * activation_bytes


@pytest.mark.slow  # 20-35 s on 2 cores (two emulations of 16 micro-batches on 4 stages)
@pytest.mark.integration
def test_interleaved_stages_hold_only_the_buffers_in_flight():
    # Megatron's interleaved 1F1B (workloads/megatron_interleaved.py) over a ring of 4 ranks:
    # it replays (the ring's sends precede its receives, no cycle) and the first stage, which
    # torch's stages give 2 buffers per micro-batch and chunk, holds the ones in flight
    m, pp, vpp = 16, 4, 2
    activation_bytes = SEQ_LEN * HIDDEN * 2
    peaks = {}
    for recv in ("per-transfer", "per-microbatch"):
        job = job_spec_from_dict(
            {
                "model": {"name": "llama-debug", "layers": pp * vpp},
                "parallel": {"pp": pp, "vpp": vpp, "schedule": "interleaved-1f1b"},
                "batch": {"seq_len": SEQ_LEN, "global_batch": m},
                "train": {"precision": "bf16"},
                "kernels": {"pipeline_recv": recv},
            }
        )
        peaks[recv] = emulate(job, workers=1).per_class[0].peak_memory_allocated_bytes
    assert peaks["per-microbatch"] - peaks["per-transfer"] >= m * activation_bytes
