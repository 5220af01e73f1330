"""Llama's RMSNorm: torch's fused kernel, or torchtitan's float32 eager math of Dec 2024.

`kernels.norm` (workloads.kernels) says which runs. `torch`: `nn.RMSNorm`, which a CUDA build
runs as one `_fused_rms_norm` kernel each way (emulator.capture.fused_ops records that pair).
`eager-fp32`: the RMSNorm class of torchtitan's `torchtitan/models/norms.py` at 9dec370 (the
code of its Dec 2024 benchmarks; torchtitan moved to `nn.RMSNorm` in Mar 2025, #985): the
input upcast to float32, squared, averaged, its reciprocal square root taken and multiplied
in, cast back, then scaled by the weight, each an eager kernel, autograd keeping the float32
intermediates its backward needs. The two compute the same function; they differ in the
kernels a GPU launches and the memory they keep.
"""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.RMSNorm):
    """`nn.RMSNorm` that runs torchtitan's eager float32 math when `eager_fp32` is set
    (by `workloads.parallelize.set_kernels`, before any sharding)."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype | None = None) -> None:
        super().__init__(dim, eps=eps, dtype=dtype)
        self.eager_fp32 = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.eager_fp32:
            return super().forward(x)
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight
