"""Llama's RMSNorm (workloads/models/norms.py): torch's fused kernel, or torchtitan's float32
eager math of Dec 2024, the same function as different kernels."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from emulator.capture.fused_ops import gpu_fused_ops
from tests.emulator.capture.recorded_rows import compute_rows
from workloads.config import SpecError
from workloads.flavors import get_flavor
from workloads.job import BatchSpec, TrainingJob
from workloads.kernels import KernelsSpec
from workloads.models.llama import Llama
from workloads.models.norms import RMSNorm
from workloads.parallelize import parallelize_stage

HIDDEN = 64


def _norm(eager_fp32: bool, dtype=torch.float32) -> RMSNorm:
    norm = RMSNorm(HIDDEN, eps=1e-5).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 1.5, HIDDEN))
    norm.eager_fp32 = eager_fp32
    return norm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_eager_fp32_computes_what_the_fused_norm_computes_both_ways(dtype):
    x = torch.randn(2, 8, HIDDEN, generator=torch.Generator().manual_seed(0)).to(dtype)
    grad = torch.randn(2, 8, HIDDEN, generator=torch.Generator().manual_seed(1)).to(dtype)
    results = []
    for eager in (False, True):
        norm, xi = _norm(eager, dtype), x.clone().requires_grad_()
        out = norm(xi)
        out.backward(grad)
        results.append((out, xi.grad, norm.weight.grad))
    tol = {} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    for fused, eager in zip(*results, strict=True):
        torch.testing.assert_close(eager, fused, **tol)


def _recorded(eager_fp32: bool) -> list[tuple[str, str]]:
    """(aten op, phase) of one norm's forward and backward on a bf16 activation, as captured."""
    with gpu_fused_ops(), FakeTensorMode():
        norm = RMSNorm(HIDDEN, eps=1e-5, dtype=torch.bfloat16)
        norm.eager_fp32 = eager_fp32
        x = torch.empty(2, 8, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
        return compute_rows(lambda: norm(x).sum().backward())


def test_the_capture_records_torchtitans_eight_forward_kernels_instead_of_one():
    assert [op for op, phase in _recorded(False) if phase == "forward"] == ["aten._fused_rms_norm"]
    forward = [op for op, phase in _recorded(True) if phase == "forward"]
    # upcast, square, mean, + eps, rsqrt, multiply, downcast, weight
    assert len(forward) == 8
    assert {"aten.pow", "aten.mean", "aten.rsqrt"} <= set(forward)
    assert "aten._fused_rms_norm" not in forward
    backward = [op for op, phase in _recorded(True) if phase == "backward"]
    assert len(backward) > len(forward)


def _job(family: str, kernels: dict) -> TrainingJob:
    flavor = "llama-debug" if family == "llama" else "gpt-debug"
    return TrainingJob(
        model=get_flavor(flavor), batch=BatchSpec(seq_len=16, global_batch=1),
        kernels=KernelsSpec(**kernels),
    )  # fmt: skip


def test_torchtitan_runs_its_eager_norm_on_llama_and_the_fused_layer_norm_on_gpt():
    assert _job("llama", {"framework": "torchtitan"}).kernels.norm == "eager-fp32"
    assert _job("gpt", {"framework": "torchtitan"}).kernels.norm == "torch"
    with pytest.raises(SpecError, match=r"kernels.norm='eager-fp32' needs model.family='llama'"):
        _job("gpt", {"norm": "eager-fp32"})


def test_the_kernels_setting_reaches_every_norm_of_the_model():
    job = _job("llama", {"norm": "eager-fp32"})
    model = Llama(job.built_model)
    parallelize_stage(model, None, job)
    norms = [m for m in model.modules() if isinstance(m, RMSNorm)]
    assert len(norms) == 2 * job.model.layers + 1 and all(n.eager_fp32 for n in norms)
