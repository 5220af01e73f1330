"""The golden jobs: every parallelism and both model families, small enough to capture in seconds.

`tests/test_goldens.py` emulates each and compares with the figures, class traces and memory
timelines recorded under `tests/goldens/data/` (made by `python -m tests.goldens.make`).
They pin behaviour across refactors: a commit that means to change a prediction regenerates
them and says why.
"""

from __future__ import annotations

from prismbench.spec import job_spec_from_dict


def _job(model, parallel, *, global_batch, train=None, cluster=None, seq_len=64):
    return job_spec_from_dict(
        {
            "model": model,
            "parallel": parallel,
            "batch": {"seq_len": seq_len, "micro_batch": 1, "global_batch": global_batch},
            "train": train or {},
            "cluster": cluster or {},
        }
    )


GPT = {"name": "gpt-debug"}
GPT_ALIBI = {"name": "gpt-debug", "positions": "alibi"}
LLAMA = {"name": "llama-debug"}
TWO_PER_NODE = {"gpus_per_node": 2}

GOLDEN_JOBS = {
    "gpt_ddp_dp2": _job(GPT, {"dp": 2}, global_batch=4),
    "gpt_tp2_sp_pp2_two_nodes": _job(GPT, {"tp": 2, "pp": 2}, global_batch=4, cluster=TWO_PER_NODE),
    "gpt_alibi_zero1_selective": _job(
        GPT_ALIBI, {"dp": 2, "zero": 1}, global_batch=2, train={"recompute": "selective"}
    ),
    "gpt_zero_bubble_pp2": _job(GPT, {"pp": 2, "schedule": "zero-bubble"}, global_batch=4),
    "llama_tp2_nosp_cp2": _job(
        LLAMA, {"tp": 2, "sequence_parallel": False, "cp": 2}, global_batch=1
    ),
    "llama_fsdp_full_recompute": _job(
        LLAMA, {"dp": 2, "zero": 3}, global_batch=2, train={"recompute": "full"}
    ),
    "llama_zero2_fp8": _job(
        LLAMA, {"dp": 2, "zero": 2}, global_batch=2, train={"precision": "fp8"}
    ),
    "llama_interleaved_vpp2": _job(
        LLAMA, {"pp": 2, "vpp": 2, "schedule": "interleaved-1f1b"}, global_batch=4
    ),
    "llama_4d_gpipe": _job(
        LLAMA,
        {"dp": 2, "pp": 2, "cp": 2, "tp": 2, "zero": 1, "schedule": "gpipe"},
        global_batch=4,
        cluster=TWO_PER_NODE,
    ),
    "gpt_fp16_a100": _job(
        GPT,
        {"dp": 2, "tp": 2},
        global_batch=2,
        train={"precision": "fp16"},
        cluster={"gpu": "a100-sxm-80g", "intra_node": "nvlink3", "inter_node": "ib-hdr-8x200"},
    ),
}
