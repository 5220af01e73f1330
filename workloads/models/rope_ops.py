"""Rotary position embedding as one custom op, as the fused RoPE kernels of training stacks run it.

Megatron-LM applies RoPE with one fused kernel unless told `--no-rope-fusion`
(`apply_rope_fusion`: Transformer Engine's or apex's `fused_rope`), forward and backward each reading the
tensor once and writing it once, with the angles computed in float32 inside the kernel.
Written with plain torch ops the rotation is ~17 forward and ~13 backward kernels per
tensor (angles, float32 upcast, four products, stack, downcast) that also keep float32
copies alive for backward: neither what a GPU runs nor what it costs. So `prism::rope` is a
custom op: its CPU implementation is the reference math, its CUDA implementation the same math
compiled into one fused kernel (`workloads.models.cuda_kernels`), its fake implementation
allocates only the output (contiguous, as both kernels return it: see `rope`), and its backward is the same op rotating by the opposite angle (a rotation's
transpose is its inverse), saving only the positions.

Layout: x [b, s, h, d]; pairs (2i, 2i+1) of the last dim rotate by positions * theta^(-2i/d)
(Meta's Llama layout, the interleaved pairs its complex-number view uses); `positions` [s]
are absolute, so context-parallel chunks get their own angles.
"""

from __future__ import annotations

import torch
from torch import Tensor

from workloads.models.cuda_kernels import register_compiled_cuda_kernel


def rotate(x: Tensor, positions: Tensor, theta: float, inverse: bool) -> Tensor:
    """The reference math: x rotated by positions * theta^(-2i/d) (the opposite angle when
    `inverse`), in float32 for bf16/fp16 inputs, returned in x's dtype."""
    head_dim = x.shape[-1]
    opmath = torch.promote_types(x.dtype, torch.float32)  # bf16/fp16 compute in float32
    exponents = torch.arange(0, head_dim, 2, device=x.device, dtype=opmath) / head_dim
    angles = positions.to(opmath)[:, None] * theta ** (-exponents)[None, :]  # [s, d/2]
    cos = angles.cos()[None, :, None, :]
    sin = angles.sin()[None, :, None, :]
    if inverse:
        sin = -sin
    pairs = x.to(opmath).unflatten(-1, (-1, 2))
    even, odd = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
    return rotated.flatten(-2).to(x.dtype)


@torch.library.custom_op("prism::rope", mutates_args=())
def rope(x: Tensor, positions: Tensor, theta: float, inverse: bool) -> Tensor:
    """x rotated (`rotate`), returned contiguous whatever x's layout.

    Contiguous because that is what the CUDA kernel returns: Inductor compiles `rotate` keeping
    its eager output strides (`keep_output_stride`, on by default), and `rotate` ends in a
    `torch.stack`, which allocates contiguous. Backward hands this op a transposed gradient
    under unfused attention and torch's ring attention; a fake kernel that kept that layout
    made the capture copy it back (a clone per q and k per layer in backward) where the GPU
    does not."""
    return rotate(x, positions, theta, inverse)


@rope.register_fake
def _(x, positions, theta, inverse):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


register_compiled_cuda_kernel(rope, rotate)


def _setup_context(ctx, inputs, output) -> None:
    _, positions, theta, inverse = inputs
    ctx.save_for_backward(positions)
    ctx.theta, ctx.inverse = theta, inverse


def _backward(ctx, grad_out):
    (positions,) = ctx.saved_tensors
    return rope(grad_out, positions, ctx.theta, not ctx.inverse), None, None, None


rope.register_autograd(_backward, setup_context=_setup_context)
