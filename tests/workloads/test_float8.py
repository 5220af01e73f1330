"""Float8 linears (torchao): module swap, fp8 GEMMs in forward and backward, loss close to high
precision for every recipe."""

import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass_type
from torchao.float8.float8_linear import Float8Linear

from workloads.flavors import get_flavor
from workloads.float8 import convert_linears_to_float8
from workloads.kernels import FP8_RECIPES
from workloads.models import build_model


def _model(name, fp8, dtype=torch.float32, recipe="tensorwise"):
    model = build_model(get_flavor(name))
    model.init_weights(0)
    model.to(dtype)
    return convert_linears_to_float8(model, recipe) if fp8 else model


def _loss(model, tokens):
    logits = model(tokens[:, :-1]).float()
    return F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())


def _tokens():
    return torch.randint(0, 256, (2, 33), generator=torch.Generator().manual_seed(3))


def test_swap_keeps_parameters_and_skips_output():
    model = _model("gpt-debug", fp8=False)
    before = dict(model.named_parameters())
    convert_linears_to_float8(model)
    assert isinstance(model.layers["0"].attention.wq, Float8Linear)
    assert isinstance(model.layers["3"].feed_forward.w2, Float8Linear)
    assert type(model.output) is nn.Linear
    after = dict(model.named_parameters())
    assert after.keys() == before.keys() and all(after[k] is before[k] for k in before)


def test_the_86a4f47_recipe_swaps_in_the_workloads_own_float8_linears():
    from workloads import prism_float8

    model = _model("llama-debug", fp8=True, recipe="prism-86a4f47")
    assert type(model.layers["0"].attention.wq) is prism_float8.Float8Linear
    assert type(model.output) is nn.Linear


def test_linears_with_dims_not_divisible_by_16_stay_high_precision():
    model = nn.Sequential(nn.Linear(64, 24), nn.Linear(24, 64))
    convert_linears_to_float8(model)
    assert all(type(m) is nn.Linear for m in model)


@pytest.mark.parametrize("recipe", FP8_RECIPES)
@pytest.mark.parametrize("name", ["gpt-debug", "llama-debug"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_loss_close_to_high_precision_and_backward_runs(name, dtype, recipe):
    tokens = _tokens()
    reference = _loss(_model(name, fp8=False, dtype=dtype), tokens)
    model = _model(name, fp8=True, dtype=dtype, recipe=recipe)
    loss = _loss(model, tokens)
    loss.backward()
    assert loss.item() == pytest.approx(reference.item(), rel=0.01)
    grad = model.layers["0"].feed_forward.w1.weight.grad
    assert grad is not None and grad.dtype == dtype and torch.isfinite(grad).all()


@pytest.mark.parametrize("recipe", FP8_RECIPES)
def test_gradients_close_to_high_precision_single_linear(recipe):
    torch.manual_seed(0)
    linear = nn.Linear(64, 128)
    fp8 = convert_linears_to_float8(nn.Sequential(nn.Linear(64, 128)), recipe)[0]
    fp8.load_state_dict(linear.state_dict())
    x = torch.randn(256, 64, requires_grad=True)
    x8 = x.detach().clone().requires_grad_()
    grad_out = torch.randn(256, 128)
    linear(x).backward(grad_out)
    fp8(x8).backward(grad_out)

    def rel(a, b):
        return ((a - b).norm() / a.norm()).item()

    # e4m3 operands forward, e5m2 (tensorwise) or e4m3 (rowwise) output gradient: a few
    # percent relative error
    assert rel(x.grad, x8.grad) < 0.1
    assert rel(linear.weight.grad, fp8.weight.grad) < 0.1


class _OpLog(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(is_traceable_wrapper_subclass_type(t) for t in types):
            return NotImplemented  # torchao's Float8TrainingTensor: see the ops it runs
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_forward_and_backward_gemms_are_scaled_mm(recipe):
    linear = convert_linears_to_float8(nn.Sequential(nn.Linear(32, 48, bias=False)), recipe)[0]
    x = torch.randn(4, 8, 32, requires_grad=True)
    with _OpLog() as log:
        linear(x).sum().backward()
    assert log.ops.count(torch.ops.aten._scaled_mm.default) == 3
    assert torch.ops.aten.mm.default not in log.ops


@pytest.mark.integration
def test_tensor_parallel_float8_model_runs():
    # a separate process: the fake process group must not leak into other tests
    script = textwrap.dedent(
        """
        import torch, torch.distributed as dist
        from torch.testing._internal.distributed.fake_pg import FakeStore
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import (
            ColwiseParallel, RowwiseParallel, parallelize_module)
        from workloads.flavors import get_flavor
        from workloads.float8 import convert_linears_to_float8
        from workloads.models import build_model
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
        mesh = init_device_mesh("cpu", (2,))
        model = convert_linears_to_float8(build_model(get_flavor("llama-debug")))
        plan = {"attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
                "attention.wv": ColwiseParallel(), "attention.wo": RowwiseParallel(),
                "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
                "feed_forward.w2": RowwiseParallel()}
        for block in model.layers.values():
            parallelize_module(block, mesh, plan)
        model(torch.randint(0, 256, (2, 32))).sum().backward()
        weight = model.layers["0"].feed_forward.w1.weight
        assert type(weight).__name__ == "DTensor" and weight.grad.to_local().shape == (128, 64)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


def test_importing_torchao_for_a_job_logs_nothing_about_torchao_itself():
    # a fresh process: torchao logs at its first import only (its CUDA extensions on a CPU
    # torch, and torch's deprecation notice for torchao's register_constant of an Enum)
    code = "from workloads.float8 import _torchao_float8; _torchao_float8()"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "KernelPreference" not in done.stderr
    if not torch.cuda.is_available():  # where the extensions cannot load
        assert "Failed to load" not in done.stderr
