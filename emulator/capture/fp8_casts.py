"""Fused fp8 casts: each fp8 GEMM operand's amax/scale/cast work recorded as the kernels
torch.compile or Transformer Engine run, instead of torchao's eager op chain.

Eager torchao (`hp_tensor_to_float8_dynamic`) casts an operand with ~10 separate kernels
(abs, max, scale arithmetic, an fp32 upcast, multiply, clamp, the fp8 copy), each reading
and writing the whole tensor, some in float32. Production fp8 does not run that chain:
- Transformer Engine's current (dynamic) scaling, `Float8CurrentScalingQuantizer::quantize`
  (transformer_engine/pytorch/csrc/quantizer.cpp), runs `nvte_compute_amax` (one pass over
  the input), an optional amax all-reduce, `nvte_compute_scale_from_amax` (a one-thread
  kernel on the scalar) and `nvte_quantize_v2` (one pass reading the input, writing fp8).
- torchtitan's float8 (torchao) needs `--training.compile` "to fuse the float8
  scaling/casting kernels" (torchtitan docs/float8.md); Inductor turns each cast into a
  reduction kernel (amax) and one pointwise kernel (scale, multiply, clamp, cast).

Rule (`fp8_casts = "fused"`), per operand cast, i.e. per call of
`hp_tensor_to_float8_dynamic`:
1. an amax reduction (`aten.amax`): reads the high-precision tensor, writes its scale(s);
2. a cast kernel (`aten._to_copy`): reads the high-precision tensor and the scale(s), writes
   the fp8 tensor. The scale arithmetic on the scalar (per-row) amax folds into it.
The eager chain's compute rows are replaced by these two (the first keeps the chain's first
sequence number, the second its last, so a TP amax all-reduce in between stays in between);
its allocations stay as recorded, so transient float32 copies are still counted in peak
memory (an overestimate of at most one fp32 copy of one operand).
What the rule leaves out, each making it conservative: TE's default delayed scaling computes
the amax inside the cast kernel (no separate pass); TE's cast-transpose writes both layouts
of an operand from one read, and Inductor may share one amax between an operand's two
casts (torchao casts input, weight and output gradient twice each per linear).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from unittest import mock

import torch

from emulator.capture import opmap
from emulator.capture.trace import COMPUTE, OpEvent

# torchao modules that call the dynamic cast (each imported it by name)
_CALLERS = (
    "torchao.float8.float8_linear",
    "torchao.float8.float8_tensor_parallel",
    "torchao.float8.fsdp_utils",
)
_AMAX = torch.ops.aten.amax.default
_CAST = torch.ops.aten._to_copy.default


def _local(t: torch.Tensor) -> torch.Tensor:
    """The rank's own tensor: a DTensor's local shard, a Float8TrainingTensor's fp8 data."""
    t = getattr(t, "_local_tensor", t)
    return getattr(t, "_data", t)


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def fused_kernels(first: OpEvent, last: OpEvent, hp: torch.Tensor, fp8) -> tuple[OpEvent, ...]:
    """The two kernels of the rule for casting `hp` to `fp8` (a Float8TrainingTensor, maybe
    inside a DTensor); `first`/`last` are the eager chain's first and last compute rows."""
    hp, data = _local(hp), _local(fp8)
    scale = getattr(fp8, "_local_tensor", fp8)._scale
    hp_t = (tuple(hp.shape), _dtype_name(hp), False)
    scale_in = (tuple(scale.shape), _dtype_name(scale), False)
    amax = first._replace(
        name=opmap.op_info(_AMAX).name,
        aten=opmap.op_info(_AMAX).aten,
        flops=0,
        read_bytes=hp.nbytes,
        write_bytes=scale.nbytes,
        tensors=(hp_t, (*scale_in[:2], True)),
        workspace_bytes=0,
    )
    cast = last._replace(
        name=opmap.op_info(_CAST).name,
        aten=opmap.op_info(_CAST).aten,
        flops=0,
        read_bytes=hp.nbytes + scale.nbytes,
        write_bytes=data.nbytes,
        tensors=(hp_t, scale_in, (tuple(data.shape), _dtype_name(data), True)),
        workspace_bytes=0,
    )
    return amax, cast


def _fuse_since(events: list, start: int, hp: torch.Tensor, fp8) -> None:
    chain = [i for i in range(start, len(events)) if events[i].kind == COMPUTE]
    if len(chain) < 2:
        return  # nothing recorded (paused, another fake mode): nothing to replace
    amax, cast = fused_kernels(events[chain[0]], events[chain[-1]], hp, fp8)
    events[chain[0]], events[chain[-1]] = amax, cast
    for i in reversed(chain[1:-1]):
        del events[i]


@contextlib.contextmanager
def fused_fp8_casts(recorder) -> Iterator[None]:
    """Record torchao's dynamic fp8 casts as the rule's fused kernels (module docstring)."""
    import torchao.float8.float8_scaling_utils as scaling

    eager = scaling.hp_tensor_to_float8_dynamic

    def cast(hp_tensor, *args, **kwargs):
        start = len(recorder.events)
        out = eager(hp_tensor, *args, **kwargs)
        _fuse_since(recorder.events, start, hp_tensor, out)
        return out

    with contextlib.ExitStack() as stack:
        for module in _CALLERS:
            stack.enter_context(mock.patch(f"{module}.hp_tensor_to_float8_dynamic", cast))
        yield
