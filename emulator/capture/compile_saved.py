"""torch.compile's saved activations as a capture rule: a compiled block keeps for its backward
only what its backward reads.

Eagerly, a tensor lives as long as something refers to it. Under op-level selective activation
checkpointing that includes every output the policy marks MUST_SAVE: SAC's caching dispatch
mode (torch/utils/checkpoint.py, `_CachingTorchDispatchMode`) stores it for the recompute and
keeps it until the block's backward is over, whether or not the backward reads it. The block's
last GEMM is the case: its output only enters the residual add, whose backward needs no input,
and the non-reentrant checkpoint stops recomputing once every tensor the backward needs exists,
before that GEMM. A compiled block's forward graph returns, besides its outputs, only the
tensors its backward graph takes (AOTAutograd's partition of the joint graph,
torch/_functorch/partitioners.py); every other value dies inside the graph at its last use.
`tests/emulator/capture/test_compile_saved.py` runs that partition on a torchtitan-like block
under torchtitan's policy on CPU: it saves the last GEMM's output no more, and nothing else
SAC keeps goes missing.

Rule (`free_unread_saved`, applied after compile_fusion's): a storage allocated in the forward
inside a compiled region (category "activation"), freed after the forward, and read by no
backward or recompute compute row is freed right after its last forward row instead. Rows need
storage ids (`OpEvent.flows`, as compile_fusion); if one compute row has none, nothing moves.
To make room for the moved frees, every seq (the comm events' `seq` and `comm_seq` too) is
multiplied by one more than the most frees moved behind one row.

Left out: the partitioner's other choices (recomputing cheap ops rather than saving them, saving
a GEMM's input rather than its output). Reads by collectives the rule cannot see: a program
where a backward collective reads a forward activation no kernel reads (Megatron's
`sp_regather`) says so (`RankProgram.collectives_read_activations`), and the capture does not
apply the rule to it.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable, Sequence

from emulator.capture.trace import ALLOC, BACKWARD_PHASES, COMPUTE, FREE, PHASES, OpEvent

_FORWARD = PHASES.index("forward")


def unread_saved(events: Sequence[OpEvent], region_of: Callable[[str], str]) -> dict[int, int]:
    """Index of each free the rule moves -> index of the row it is moved behind."""
    last_forward = {  # candidate storage id -> index of its last forward row (its allocation)
        e.storage: i
        for i, e in enumerate(events)
        if e.kind == ALLOC
        and e.phase == _FORWARD
        and e.category == "activation"
        and region_of(e.module)
    }
    read_after: set[int] = set()
    for i, e in enumerate(events):
        if e.kind != COMPUTE:
            continue
        if len(e.flows) != len(e.tensors):
            return {}  # a row whose reads are unknown: nothing can be said unread
        for u, (_, _, is_out) in zip(e.flows, e.tensors, strict=True):
            if u not in last_forward:
                continue
            if e.phase == _FORWARD:
                last_forward[u] = max(last_forward[u], i)
            elif e.phase in BACKWARD_PHASES and not is_out:
                # in any order: a fused row stands where its chain ends, which can be after
                # the free of a storage its chain's first op read (compile_fusion)
                read_after.add(u)
    return {
        i: last_forward[e.storage]
        for i, e in enumerate(events)
        if e.kind == FREE
        and e.storage in last_forward
        and e.phase != _FORWARD
        and e.storage not in read_after
        and last_forward[e.storage] < i
    }


def free_unread_saved(
    events: Sequence[OpEvent], comm_events: Sequence, region_of: Callable[[str], str]
) -> tuple[list[OpEvent], list]:
    """(`events`, `comm_events`) with the rule's frees moved and every seq rescaled (unchanged
    when nothing moves)."""
    moves = unread_saved(events, region_of)
    if not moves:
        return list(events), list(comm_events)
    behind: dict[int, list[int]] = defaultdict(list)
    for free, anchor in sorted(moves.items()):
        behind[anchor].append(free)
    scale = 1 + max(len(frees) for frees in behind.values())
    out: list[OpEvent] = []
    for i, e in enumerate(events):
        if i in moves:
            continue
        out.append(e._replace(seq=e.seq * scale))
        for k, free in enumerate(behind.get(i, ()), start=1):
            out.append(events[free]._replace(seq=e.seq * scale + k))
    comm = [_rescaled(c, scale) for c in comm_events]
    return out, comm


def _rescaled(event, scale: int):
    fields = {"seq": event.seq * scale}
    if hasattr(event, "comm_seq"):
        fields["comm_seq"] = event.comm_seq * scale
    return dataclasses.replace(event, **fields)
