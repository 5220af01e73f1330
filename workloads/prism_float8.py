"""The workloads' own float8 linears of commit 86a4f47 (`kernels.fp8_recipe = "prism-86a4f47"`).

The shared H100 profile of `llama3-8b-l4-s8192-mb1-fp8-none` measured this program, not
torchao's: tensorwise dynamic scaling written as plain torch ops, so each operand's cast is
abs, max, an fp32 upcast, a multiply, a clamp and the fp8 copy, and its scale a few scalar
kernels; forward casts the input and the weight to e4m3, backward the output gradient to
e5m2, and all three GEMMs of a linear run as `aten._scaled_mm` with float32 scales. torchao's
eager recipe (`workloads.float8`, what torchtitan runs) issues about 46 % more ops for the
same GEMMs, so the `prism-86a4f47` framework keeps this one to stay comparable with the
profile; every other framework runs torchao's.

`convert_linears_to_float8` swaps eligible `nn.Linear` modules (same rule as torchao's path)
for `Float8Linear`, an `nn.Linear` subclass sharing the same parameter objects.
"""

from __future__ import annotations

import torch
from torch import nn

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2
_AMAX_EPS = 1e-12  # torchao float8_utils EPS: avoids a zero amax giving an infinite scale


def to_float8(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Tensorwise cast: returns (x * scale saturated to dtype's range, 1 / scale) in float32."""
    fp8_max = torch.finfo(dtype).max
    amax = x.detach().abs().max().to(torch.float32).clamp(min=_AMAX_EPS)
    scale = fp8_max / amax
    x_fp8 = (x.to(torch.float32) * scale).clamp(-fp8_max, fp8_max).to(dtype)
    return x_fp8, scale.reciprocal()


def _column_major(t: torch.Tensor) -> torch.Tensor:
    return t.t().contiguous().t()


def _scaled_mm(a, a_inv_scale, b, b_inv_scale, out_dtype):
    """a @ b for fp8 a [M, K] and b [K, N]; _scaled_mm wants a row-major and b column-major."""
    return torch._scaled_mm(
        a.contiguous(), _column_major(b), scale_a=a_inv_scale, scale_b=b_inv_scale,
        out_dtype=out_dtype,
    )  # fmt: skip


class _Float8Matmul(torch.autograd.Function):
    """x [M, K] @ weight [N, K]^T with e4m3 operands forward and e5m2 gradients backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        x_fp8, x_inv = to_float8(x, E4M3)
        w_fp8, w_inv = to_float8(weight, E4M3)
        ctx.save_for_backward(x_fp8, x_inv, w_fp8, w_inv)
        ctx.dtypes = (x.dtype, weight.dtype)
        return _scaled_mm(x_fp8, x_inv, w_fp8.t(), w_inv, x.dtype)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        x_fp8, x_inv, w_fp8, w_inv = ctx.saved_tensors
        x_dtype, w_dtype = ctx.dtypes
        g_fp8, g_inv = to_float8(grad_out, E5M2)
        grad_x = _scaled_mm(g_fp8, g_inv, w_fp8, w_inv, x_dtype)
        grad_w = _scaled_mm(g_fp8.t(), g_inv, x_fp8, x_inv, w_dtype)
        return grad_x, grad_w


class Float8Linear(nn.Linear):
    """nn.Linear whose matmul runs in float8 (bias added in the input's precision)."""

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Float8Linear:
        with torch.device("meta"):
            new = cls(linear.in_features, linear.out_features, bias=False)
        new.weight = linear.weight
        new.bias = linear.bias
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = _Float8Matmul.apply(x.reshape(-1, x.shape[-1]), self.weight)
        out = out.view(*x.shape[:-1], out.shape[-1])
        return out if self.bias is None else out + self.bias.to(out.dtype)


def convert_linears_to_float8(model: nn.Module, eligible) -> nn.Module:
    """Swap the nn.Linear modules `eligible(module, fqn)` accepts for Float8Linear, in place."""
    targets = [(fqn, m) for fqn, m in model.named_modules() if eligible(m, fqn)]
    for fqn, linear in targets:
        parent_name, _, child = fqn.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, Float8Linear.from_linear(linear))
    return model
