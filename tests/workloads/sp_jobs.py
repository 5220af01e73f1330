"""A small sequence-parallel job (tp 2, two GPT layers, two micro-batches) captured on a virtual
world: the subject of the sp_collectives and sp_regather tests."""

from prismbench.capture import capture_job
from prismbench.spec import job_spec_from_dict

LAYERS = 2
MICRO_BATCHES = 2


def sp_job(kernels: dict, *, micro_batch: int, recompute="none", sequence_parallel=True):
    return job_spec_from_dict(
        {
            "model": {"name": "gpt-debug", "layers": LAYERS},
            "parallel": {"tp": 2, "sequence_parallel": sequence_parallel},
            "batch": {
                "seq_len": 64,
                "micro_batch": micro_batch,
                "global_batch": micro_batch * MICRO_BATCHES,
            },
            "train": {"precision": "bf16", "recompute": recompute},
            "kernels": kernels,
        }
    )


def capture(spec):
    """Class 0's trace, captured afresh."""
    return capture_job(spec, use_cache=False, workers=1).traces[0]
