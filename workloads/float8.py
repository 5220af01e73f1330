"""Float8 training of linear layers, as torchtitan's Float8 (torchao `Float8Linear`) does it.

Tensorwise dynamic scaling: each matmul operand gets one scale, computed from its
current absolute maximum (scale = fp8_max / amax). Forward casts the input and the
weight to e4m3; backward casts the output gradient to e5m2 (more range, as torchao's
default recipe); all three GEMMs run as `aten._scaled_mm` with float32 scales and
the high-precision output dtype, so capture sees them as fp8 GEMMs. `_scaled_mm`
runs on CPU in torch 2.13, so the numerics here are those of a real fp8 GEMM.

`convert_linears_to_float8(model)` swaps `nn.Linear` modules for `Float8Linear`, an
`nn.Linear` subclass sharing the same parameter objects, so meta-built, tied and
state-dict names are unchanged and tensor-parallel plans (which match nn.Linear by
name) still apply. Convert BEFORE parallelize/recompute, as torchtitan's model
converters do: a swap after parallelize_module would drop the hooks it installed.
With plain Colwise/RowwiseParallel the all-gathers stay in high precision
(torchtitan's Float8ColwiseParallel, which gathers fp8, is not modelled).
Linears with a dimension not divisible by 16 are left alone (`_scaled_mm` on GPUs
needs multiples of 16; torchtitan skips them too), as is the output projection.
"""

from __future__ import annotations

import torch
from torch import nn

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2
_AMAX_EPS = 1e-12  # torchao float8_utils EPS: avoids a zero amax giving an infinite scale
_GEMM_MULTIPLE = 16  # cuBLASLt fp8 GEMM needs dims divisible by 16


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


def _eligible(fqn: str, module: nn.Module, skip: tuple[str, ...]) -> bool:
    if type(module) is not nn.Linear:
        return False
    if fqn in skip or fqn.rsplit(".", 1)[-1] in skip:
        return False
    return module.in_features % _GEMM_MULTIPLE == 0 and module.out_features % _GEMM_MULTIPLE == 0


def convert_linears_to_float8(model: nn.Module, skip: tuple[str, ...] = ("output",)) -> nn.Module:
    """Swap eligible nn.Linear modules (not named in `skip`) for Float8Linear, in place."""
    targets = [(fqn, m) for fqn, m in model.named_modules() if _eligible(fqn, m, skip)]
    for fqn, linear in targets:
        parent_name, _, child = fqn.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, Float8Linear.from_linear(linear))
    return model
