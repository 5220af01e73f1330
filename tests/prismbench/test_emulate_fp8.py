"""The FP8 goal of issue 15: a GEMM-dominated job (hidden 4096 on an H100) with fused casts
is predicted faster than the same job in bf16; with eager (unfused) casts it is not held to it."""

from prismbench.emulate import emulate
from prismbench.spec import job_spec_from_dict


def _llama3_8b_layers(precision, fp8_casts="unfused"):
    return job_spec_from_dict(
        {
            "model": {"name": "llama3-8b", "layers": 2},
            "batch": {"seq_len": 8192, "micro_batch": 1, "global_batch": 1},
            "train": {"precision": precision, "recompute": "none"},
            # torchao's float8 (torchtitan's), whose casts the fused rule rewrites
            "kernels": {"framework": "torchtitan", "fp8_casts": fp8_casts},
            "cluster": {"gpu": "h100-sxm-80g", "gpus_per_node": 8},
        }
    )


def test_fp8_with_fused_casts_is_predicted_faster_than_bf16():
    bf16 = emulate(_llama3_8b_layers("bf16"), use_cache=False).iteration_time_s
    unfused = emulate(_llama3_8b_layers("fp8"), use_cache=False).iteration_time_s
    fused = emulate(_llama3_8b_layers("fp8", "fused"), use_cache=False).iteration_time_s
    assert fused < unfused
    assert fused < bf16, (bf16, unfused, fused)
