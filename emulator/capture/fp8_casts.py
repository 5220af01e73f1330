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
memory (an overestimate of at most one fp32 copy of one operand); under torch.compile
(`compiled`) the storages the eager chain allocated and freed are dropped too, since Inductor
never materialises them.
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
from emulator.capture.trace import ALLOC, COMPUTE, FREE, OpEvent

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


def fused_kernels(
    first: OpEvent, last: OpEvent, hp: torch.Tensor, fp8, uid=None
) -> tuple[OpEvent, ...]:
    """The two kernels of the rule for casting `hp` to `fp8` (a Float8TrainingTensor, maybe
    inside a DTensor); `first`/`last` are the eager chain's first and last compute rows.
    `uid(tensor)`: its storage id, to give the rows their `flows` (None: no flows)."""
    hp, data = _local(hp), _local(fp8)
    scale = getattr(fp8, "_local_tensor", fp8)._scale
    ids = {} if uid is None else {"hp": uid(hp), "scale": uid(scale), "data": uid(data)}
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
        flows=(ids["hp"], ids["scale"]) if ids else (),
    )
    cast = last._replace(
        name=opmap.op_info(_CAST).name,
        aten=opmap.op_info(_CAST).aten,
        flops=0,
        read_bytes=hp.nbytes + scale.nbytes,
        write_bytes=data.nbytes,
        tensors=(hp_t, scale_in, (tuple(data.shape), _dtype_name(data), True)),
        workspace_bytes=0,
        flows=(ids["hp"], ids["scale"], ids["data"]) if ids else (),
    )
    return amax, cast


def _storage_uid(recorder):
    def uid(t: torch.Tensor) -> int:
        known = recorder.storages.live.get(id(t.untyped_storage()))
        return -1 if known is None else known.uid

    return uid


def _transient_rows(events: list, start: int) -> set[int]:
    """Rows from `start` on that allocate or free a storage allocated and freed there."""
    allocs = {e.storage: i for i, e in enumerate(events[start:], start) if e.kind == ALLOC}
    frees = {e.storage: i for i, e in enumerate(events[start:], start) if e.kind == FREE}
    transient = allocs.keys() & frees.keys()
    return {allocs[u] for u in transient} | {frees[u] for u in transient}


def _fuse_since(recorder, start: int, hp: torch.Tensor, fp8, compiled: bool) -> None:
    events = recorder.events
    chain = [i for i in range(start, len(events)) if events[i].kind == COMPUTE]
    if len(chain) < 2:
        return  # nothing recorded (paused, another fake mode): nothing to replace
    uid = _storage_uid(recorder) if recorder.record_flows else None
    amax, cast = fused_kernels(events[chain[0]], events[chain[-1]], hp, fp8, uid)
    events[chain[0]], events[chain[-1]] = amax, cast
    drop = set(chain[1:-1]) | (_transient_rows(events, start) if compiled else set())
    for i in sorted(drop, reverse=True):
        del events[i]


@contextlib.contextmanager
def fused_fp8_casts(recorder, compiled: bool = False) -> Iterator[None]:
    """Record torchao's dynamic fp8 casts as the rule's fused kernels (module docstring);
    `compiled` (the job runs torch.compile): the eager chain's transient storages are not
    allocated either (Inductor keeps them in registers)."""
    import torchao.float8.float8_scaling_utils as scaling

    eager = scaling.hp_tensor_to_float8_dynamic

    def cast(hp_tensor, *args, **kwargs):
        start = len(recorder.events)
        out = eager(hp_tensor, *args, **kwargs)
        _fuse_since(recorder, start, hp_tensor, out, compiled)
        return out

    with contextlib.ExitStack() as stack:
        for module in _CALLERS:
            stack.enter_context(mock.patch(f"{module}.hp_tensor_to_float8_dynamic", cast))
        yield
