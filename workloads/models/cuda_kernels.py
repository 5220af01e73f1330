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
import warnings
from collections.abc import Callable

import torch


def compiled_kernel(name: str, reference: Callable, compile: Callable = torch.compile) -> Callable:
    """`reference` compiled by Inductor (`compile`) on first call. Where compiling fails (no
    Triton for this GPU, say), it warns once, naming the op `name` and the error, and runs the
    eager reference from then on: the same values, not the fused kernel's time or memory. Out
    of memory is not a compiler failure: it propagates."""

    @functools.cache
    def compiled():
        return compile(reference, fullgraph=True, dynamic=False)

    eager = []  # set once compiling failed

    def kernel(*args):
        if not eager:
            try:
                return compiled()(*args)
            except torch.OutOfMemoryError:
                raise
            except Exception as error:  # noqa: BLE001 - any compiler failure: fall back, loudly
                warnings.warn(
                    f"{name}: its compiled CUDA kernel failed ({type(error).__name__}: {error}); "
                    "running its eager reference math instead (same values, not the fused "
                    "kernel's time and memory)",
                    stacklevel=2,
                )
                eager.append(True)
        return reference(*args)

    return kernel


def register_compiled_cuda_kernel(op, reference: Callable) -> None:
    """Make `op` (a torch.library custom op) run `reference` compiled by Inductor on CUDA
    (`compiled_kernel`)."""
    op.register_kernel("cuda", compiled_kernel(op._qualname, reference))
