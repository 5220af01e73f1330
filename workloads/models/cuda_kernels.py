"""CUDA kernels for the workloads' custom ops: each op's reference math compiled by Inductor.

A `prism::` custom op (RoPE, the fused cross-entropy, Megatron's masked softmax) stands for one
fused kernel each way: the capture prices it as one memory-bound op and sizes only its outputs.
Its reference math, run eagerly on a GPU, is a chain of kernels that keeps float32 copies of
its input (a real H100 run of the MPT and Llama jobs showed RoPE as cat / sub / cos / sin /
neg / mul kernels, 9-10 ms against 0.5 ms priced, and the loss's float32 copies of the
[tokens, vocab] logits as 8 % more reserved memory: results/calibration/README.md, "The eight
jobs with production kernels"). So on CUDA each op runs its reference math through
`torch.compile(fullgraph=True, dynamic=False)`: Inductor fuses the pointwise chain and the
reductions into generated Triton kernels that read the input and write the output once, with
the float32 math in registers, which is what the fused kernels of the production stacks do
(Transformer Engine's and apex's fused RoPE, flash-attn's cross-entropy, Megatron's
`scaled_upper_triang_masked_softmax`). The CPU kernel stays the eager reference (loss parity,
the tests), and the capture uses each op's fake kernel, so neither depends on this module.

One compiled function per op, built on first use; `dynamic=False` specialises it to each
shape it sees (a training run sees a few: q and k heads, micro-batch shapes).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch


def register_compiled_cuda_kernel(op, reference: Callable) -> None:
    """Make `op` (a torch.library custom op) run `reference` compiled by Inductor on CUDA."""

    @functools.cache
    def compiled():
        return torch.compile(reference, fullgraph=True, dynamic=False)

    def kernel(*args):
        return compiled()(*args)

    op.register_kernel("cuda", kernel)
