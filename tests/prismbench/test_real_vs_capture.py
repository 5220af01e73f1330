"""The capture against a real CPU run: one training step recorded both ways, op class by op class.

The emulator prices the program `capture_rank` records on fake tensors. Recording the same
train_step on real CPU tensors with the same OpRecorder shows whether the fake kernels stand
in for the real ones: every op class (aten name, phase) must run as often, with as many FLOPs
and as many bytes read and written, both ways. A fake kernel whose output has other strides
than the real kernel's shows here as copies one side makes and the other does not.

One routing is the capture's own: `gpu_fused_ops` runs RMSNorm as CUDA's fused op pair
(`emulator.capture.fused_ops`), whose backward has no CPU kernel. The real run takes the same
routing, `tests.prismbench.real_steps.fused_rms_norm_on_cpu` giving that backward a CPU kernel,
so the norm's rows compare too (their bytes come from the real tensors' shapes), not its CUDA
kernel's code.
"""

from __future__ import annotations

import pytest
import torch

from emulator.capture.fused_ops import gpu_fused_ops
from emulator.capture.op_recorder import OpRecorder
from emulator.capture.rank import capture_rank
from prismbench.program import rank_program
from tests.prismbench import real_steps
from tests.prismbench.capture_cases import debug_job
from tests.prismbench.real_steps import differing, op_classes
from workloads import build_training, train_step
from workloads.kernels import FRAMEWORKS


@pytest.fixture(scope="module")
def one_thread():
    """Run the real steps on one CPU thread: on these tiny tensors two threads' handoffs cost
    more than the work (15x slower where pytest-xdist gives each core a worker)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def fused_rms_norm_on_cpu():
    """`aten::_fused_rms_norm_backward` runnable on CPU while the module's tests run."""
    with real_steps.fused_rms_norm_on_cpu():
        yield


def real_cpu_step(job):
    """The trace of job's second train_step on real CPU tensors (the first creates the
    optimizer state, which the captured iteration already has)."""
    state = build_training(job, None, device="cpu", seed=0)
    tokens = torch.randint(job.model.vocab, (job.local_batch_rows, job.batch.seq_len))
    with gpu_fused_ops():
        train_step(job, state, tokens, tokens)
        recorder = OpRecorder()
        with recorder:
            train_step(job, state, tokens, tokens, phase=recorder.phase)
    return recorder.trace()


MODELS = {
    "llama": {"model": "llama-debug"},
    "gpt-alibi": {"model": "gpt-debug", "positions": "alibi"},
}


def _case(framework: str, model: str, precision: str = "bf16", **more):
    """`more`: `kernels` overrides and `recompute`, named in the id after the precision."""
    extra = "".join(f"-{value}" for value in more.values())
    name = f"{framework}-{model}-{precision}{extra}"
    marks = pytest.mark.slow if name in SLOW_CASES else ()
    return pytest.param(framework, model, precision, more, id=name, marks=marks)


# CI runs each framework with one of the two models (each model with three frameworks) and
# the other model under `slow` (~5 s a case on CI's 2 cores); of the choices below, the
# rowwise recipe's variant with a high-precision weight gradient and torchtitan's full
# recomputation (Megatron's full case and torchtitan's selective one run in CI)
SLOW_CASES = {
    "prism-86a4f47-llama-bf16",
    "megatron-gpt-alibi-bf16",
    "nemo-llama-bf16",
    "llm-foundry-gpt-alibi-bf16",
    "torchtitan-gpt-alibi-bf16",
    "llm.c-llama-bf16",
    "torchtitan-llama-fp8-rowwise_with_gw_hp",
    "torchtitan-llama-bf16-full",
}


CASES = [_case(framework, model) for framework in FRAMEWORKS for model in MODELS]
CASES.append(_case("torchtitan", "llama", "fp8"))  # torchtitan's fp8 recipe: tensorwise
# The kernels choices that act only in other precisions or with recomputation (the fp8 casts'
# `fused` and `transformer-engine` rewrite the capture by rule, tests/emulator/capture/
# test_fp8_casts.py, so their real run is unfused): the other fp8 recipes, Megatron's fp16
# gradient buffer (grad_accumulation = "model-dtype"), each selective policy and both rerun
# extents.
CASES += [
    _case("torchtitan", "llama", "fp8", fp8_recipe="rowwise"),
    _case("torchtitan", "llama", "fp8", fp8_recipe="rowwise_with_gw_hp"),
    _case("prism-86a4f47", "llama", "fp8"),  # its own float8 linears (fp8_recipe)
    _case("megatron", "llama", "fp16"),
    _case("megatron", "gpt-alibi", recompute="selective"),  # core-attention, reruns all
    _case("megatron", "llama", recompute="full"),  # reruns all
    _case("torchtitan", "llama", recompute="selective"),  # op
    _case("torchtitan", "llama", recompute="full"),  # reruns needed
    _case("prism-86a4f47", "llama", recompute="selective"),  # op-prism-86a4f47
]


@pytest.mark.parametrize(("framework", "model", "precision", "more"), CASES)
def test_a_real_cpu_step_runs_the_ops_the_capture_records(
    one_thread, fused_rms_norm_on_cpu, framework, model, precision, more
):
    more = dict(more)
    train = {"precision": precision, "recompute": more.pop("recompute", "none")}
    kernels = {"framework": framework, **more}
    # CPU float8 GEMMs are torch's reference loop (~20 ms for 32x64 @ 64x256): fp8 cases run
    # two of the four layers, each layer the same program
    dims = {"layers": 2} if precision == "fp8" else {}
    job = debug_job(kernels=kernels, train=train, **MODELS[model], **dims)
    captured = capture_rank(0, 1, rank_program(job), reuse_chunks=False)
    real = real_cpu_step(job)
    assert differing(op_classes(real), op_classes(captured)) == {}
