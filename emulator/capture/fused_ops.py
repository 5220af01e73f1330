"""Capture-time routing of torch calls that a CUDA build runs as one fused kernel.

Capture runs on device `cpu` (NOTES.md), where some torch functions take a composite path
that a CUDA build does not: `torch.rms_norm` on a CUDA tensor calls `aten._fused_rms_norm`
(one kernel; its backward `aten._fused_rms_norm_backward`, one op), while on CPU the same
op is CompositeImplicitAutograd and decomposes into eight forward and ~19 backward kernels
that upcast to float32 and save float32 intermediates for backward. Recording the CPU path
would price kernels a GPU never launches and count activation memory it never holds.

`gpu_fused_ops()` makes `torch.nn.functional.rms_norm` (what `nn.RMSNorm` calls) dispatch
the fused op pair below autograd, exactly as torch 2.13's `rms_norm_symint` and
derivatives.yaml do on CUDA: the forward saves input, weight and the float32 rstd; the
backward is one `_fused_rms_norm_backward`. The conditions under which CUDA falls back to
the composite (weight dtype != input dtype, complex input) fall back here too. DTensor
has sharding strategies for both ops, so sequence-parallel norms keep their placements.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from emulator import torch_compat

_aten = torch.ops.aten


class _FusedRMSNorm(torch.autograd.Function):
    """`aten._fused_rms_norm` with the backward derivatives.yaml gives it (grad mode off)."""

    @staticmethod
    def forward(ctx, x, normalized_shape, weight, eps):
        with torch_compat.below_autograd():
            out, rstd = _aten._fused_rms_norm(x, normalized_shape, weight, eps)
        ctx.normalized_shape = normalized_shape
        ctx.save_for_backward(x, rstd, weight)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, rstd, weight = ctx.saved_tensors
        mask = [ctx.needs_input_grad[0], weight is not None and ctx.needs_input_grad[2]]
        with torch_compat.below_autograd():
            grad_x, grad_weight = _aten._fused_rms_norm_backward(
                grad_out, x, ctx.normalized_shape, rstd, weight, mask
            )
        return (grad_x if mask[0] else None), None, (grad_weight if mask[1] else None), None


def _takes_fused_path(x: torch.Tensor, weight: torch.Tensor | None) -> bool:
    # rms_norm_symint's composite fallbacks: complex input, weight of another dtype
    return not x.is_complex() and (weight is None or weight.dtype == x.dtype)


@contextlib.contextmanager
def gpu_fused_ops() -> Iterator[None]:
    """Route `F.rms_norm` to the fused op pair a CUDA build runs (see module docstring)."""

    def fused(composite):
        def rms_norm(x, normalized_shape, weight=None, eps=None):
            if not _takes_fused_path(x, weight):
                return composite(x, normalized_shape, weight, eps)
            return _FusedRMSNorm.apply(x, list(normalized_shape), weight, eps)

        return rms_norm

    with torch_compat.patched("torch.nn.functional.rms_norm", fused):
        yield
