"""Record `_c10d_functional` collectives issued under FakeTensorMode.

On real tensors the C++ kernels of `torch.ops._c10d_functional.*` (what DTensor and
`torch.distributed._functional_collectives` call) reach `VirtualProcessGroup`'s Python
methods. Under FakeTensorMode they do not: fake mode runs their Meta kernels and the
process group is never called. This module hooks fake mode (`fake_impls.register_op_impl`,
consulted before the Meta kernel) for ops whose group is virtual: it lets fake mode build
the outputs through the Meta kernel, records the call on the group, and remembers the
output tensors so that `wait_tensor` on them records the wait, as the C++ work registry
does on real tensors.

Where the wait lands decides what overlaps: on a GPU a functional collective returns an
`AsyncCollectiveTensor` that waits at the first kernel reading it (the residual add after a
row-parallel reduce-scatter, the GEMM after a sequence-parallel all-gather), and the
execution graph makes the reading stream wait there. Under fake mode torch assumes graph
tracing (`_functional_collectives._are_we_tracing`) and calls `wait_tensor` right after the
collective, and its `_wrap_tensor_autograd` fake kernel would drop the wrapper anyway. So
the op recorder, which sees every kernel, answers `wait_tensor` with `take_wait(at_first_read=True)`: the output
is marked unread, and the wait is recorded when a kernel or a collective first reads its
storage (`comm_events.wait_for_reads`), never when nothing reads it. Without a recorder to
see the reads (or while it is paused) `wait_tensor` records the wait where it is called.
"""

from __future__ import annotations

import threading

import torch
from torch.utils.weak import WeakIdKeyDictionary

from emulator import torch_compat
from emulator.world import comm_events
from emulator.world.collectives import all_to_all_kind
from emulator.world.virtual_pg import VirtualProcessGroup
from emulator.world.work import VirtualWork

_NAMESPACE = "_c10d_functional"
_state = threading.local()
_pending: WeakIdKeyDictionary = WeakIdKeyDictionary()  # output tensor -> VirtualWork
_hook = None  # fake mode's (check, impl) entry while installed


def _resolve(group) -> VirtualProcessGroup | None:
    pg = torch_compat.resolve_process_group(group) if isinstance(group, str) else group
    return pg if isinstance(pg, VirtualProcessGroup) else None


def _as_list(x) -> list[torch.Tensor]:
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _record(pg: VirtualProcessGroup, name: str, args, out) -> list[VirtualWork]:
    """Record functional op `name`; the size convention is comm_events' (full buffer)."""
    a = args
    if name in ("all_reduce", "all_reduce_"):
        return [pg.record("all_reduce", [a[0]], op=a[1].upper())]
    if name in ("all_reduce_coalesced", "all_reduce_coalesced_"):
        return [pg.record("all_reduce_coalesced", a[0], op=a[1].upper(), coalesced=True)]
    if name in ("all_gather_into_tensor", "all_gather_into_tensor_out"):
        return [pg.record("all_gather", [out])]
    if name == "all_gather_into_tensor_coalesced":
        return [pg.record("all_gather_coalesced", out, coalesced=True)]
    if name in ("reduce_scatter_tensor", "reduce_scatter_tensor_out"):
        return [pg.record("reduce_scatter", [a[0]], op=a[1].upper())]
    if name == "reduce_scatter_tensor_coalesced":
        return [pg.record("reduce_scatter_coalesced", a[0], op=a[1].upper(), coalesced=True)]
    if name == "all_to_all_single":  # (input, output splits, input splits, group)
        return [pg.record(all_to_all_kind(a[2], pg.rank()), [a[0]])]
    if name in ("broadcast", "broadcast_"):
        return [pg.record("broadcast", [a[0]], root=pg.global_rank(a[1]))]
    if name in ("isend", "irecv"):  # functional p2p takes global peers
        return [pg.record("send" if name == "isend" else "recv", [a[0]], peer=a[1], tag=a[2])]
    if name == "batch_p2p_ops":
        return [
            pg.record("send" if op == "isend" else "recv", [t], peer=peer, tag=tag)
            for op, peer, tag, t in zip(a[0], a[1], a[2], a[3], strict=True)
        ]
    raise NotImplementedError(f"_c10d_functional.{name} is not handled by the virtual world")


_GROUP_ARG = {
    "batch_p2p_ops": 4,
    "isend": 3,
    "irecv": 3,
    "all_to_all_single": 3,
    "all_reduce": 2,
    "all_reduce_": 2,
    "all_reduce_coalesced": 2,
    "all_reduce_coalesced_": 2,
    "all_gather_into_tensor": 2,
    "all_gather_into_tensor_out": 2,
    "all_gather_into_tensor_coalesced": 2,
    "reduce_scatter_tensor": 3,
    "reduce_scatter_tensor_out": 3,
    "reduce_scatter_tensor_coalesced": 3,
    "broadcast": 2,
    "broadcast_": 2,
}


def _handles(func) -> bool:
    return func.namespace == _NAMESPACE and not getattr(_state, "inside", False)


def take_wait(tensor: torch.Tensor, *, at_first_read: bool) -> bool:
    """`wait_tensor(tensor)`: record the wait of the functional collective that produced
    `tensor` now, or at the first read of its storage (module docstring); False when no
    pending collective produced it."""
    work = _pending.pop(tensor, None)
    if work is None:
        return False
    if at_first_read:
        comm_events.mark_unread(tensor, work)
    else:
        work.wait()
    return True


def _fake_impl(fake_mode, func, *args, **kwargs):
    name = func._opname
    if name == "wait_tensor":
        return args[0] if take_wait(args[0], at_first_read=False) else NotImplemented
    if name not in _GROUP_ARG:
        return NotImplemented
    pg = _resolve(args[_GROUP_ARG[name]])
    if pg is None:
        return NotImplemented
    _state.inside = True
    try:
        with fake_mode:
            out = func(*args, **kwargs)
    finally:
        _state.inside = False
    works = _record(pg, name, args, out)
    outputs = _as_list(out)
    for i, tensor in enumerate(outputs):
        _pending[tensor] = works[min(i, len(works) - 1)]
    return out


def install() -> None:
    """Hook fake mode (module docstring); further calls do nothing until `uninstall`."""
    global _hook
    if _hook is None:
        _hook = torch_compat.add_fake_op_impl(_handles, _fake_impl)


def uninstall() -> None:
    """Take the hook out of fake mode (a destroyed virtual world leaves torch as it found it)."""
    global _hook
    if _hook is not None:
        torch_compat.remove_fake_op_impl(_hook)
        _hook = None
