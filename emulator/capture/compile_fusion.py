"""torch.compile's kernel fusion as a capture rule: chains of memory-bound ops become one kernel.

The capture runs the program eagerly, one kernel per aten op. Under `torch.compile` Inductor
lowers a compiled module's graph and its scheduler fuses nodes before generating code
(torch/_inductor/scheduler.py: `Scheduler.fuse_nodes` merges pairs that `can_fuse` accepts,
until nothing changes): pointwise nodes into their pointwise consumers (vertical fusion) and
siblings that read the same buffers (horizontal fusion), and pointwise producers and
consumers into a reduction over the same ranges (a norm: its row reduction and the
normalisation become one kernel). GEMMs and attention stay extern kernels (cuBLAS, flash:
`ExternKernel` nodes, which `can_fuse` refuses; Inductor only fuses into GEMM templates under
max-autotune, which torchtitan does not turn on), and so do collectives, waits and custom ops
Inductor cannot lower. A buffer that only lives inside a fused kernel is never allocated.

Rule, applied to the recorded events of one rank (`fuse_compiled_chains`):
1. A row can fuse when it is a compute row of a memory-bound class (`FUSIBLE`: elementwise,
   norm, softmax, reduction, copy) run inside a compiled module (`region_of(module)` is not
   ""; torchtitan compiles each TransformerBlock), not a custom op of an extern namespace
   (`EXTERN_NAMESPACES`: FSDP2's copy-in/copy-out ops run eager around the block), and does
   not add into a gradient in place: autograd's AccumulateGrad and gradient hooks (the
   accumulation into a main-grad buffer, for one) run eagerly outside the compiled
   graph, though the capture sees them inside the block's module (`eager_storages`: the
   trace's gradient storages).
2. A chain is a maximal run of such rows of one region, stream, phase and micro-batch with
   nothing in between but allocations and frees, GEMM or attention rows of the same
   block that read nothing the chain wrote (the scheduler orders nodes by data dependence,
   so `silu(x @ w1) * (x @ w3)` is one kernel after both GEMMs), and gradient accumulations
   (rule 1) that read nothing it wrote (they run once the compiled backward has returned its
   gradients, where eager autograd interleaves them); any other row (a GEMM or attention that
   reads the chain, a collective or wait, a stream record/wait, a marker) ends it.
3. A chain also ends after a reduction to a single element (a tensorwise fp8 amax): the
   pointwise ops that read its result need the finished value, so Inductor cannot fuse them
   into it (a reduction takes consumers only over its output's ranges).
4. A chain of two or more rows is one kernel (`FUSED_ATEN`, priced as an "elementwise" op by
   the bytes it moves): it reads each storage the chain reads before writing it, once (the
   bytes of its views, at most the storage's size: `_moved_bytes`), and writes each storage
   the chain writes that outlives the chain, likewise. A storage written
   by the chain and freed before the next row that is not an allocation or free is an
   intermediate: its allocation and free rows are dropped (not materialised). FLOPs add up.
The fused row takes the chain's last row's place (its module, phase), after every
allocation of the chain's outputs and before the free of any storage it reads that eager code
freed inside the chain (the kernel reads it to the end). Rows need storage ids
(`OpEvent.flows`, recorded when `OpRecorder.record_flows` is set); a row without them does
not fuse.

What the rule leaves out: horizontal fusion of independent chains separated by a row that
ends a chain (counted as separate kernels), fusion into GEMM epilogues (max-autotune only),
AOTAutograd's min-cut partitioner recomputing cheap pointwise ops in the backward instead of
saving them (saved activations are kept as recorded, less what no backward row reads:
emulator.capture.compile_saved), and
Inductor splitting a chain it cannot fuse (mismatched iteration ranges other than rule 3).
On CPU Inductor generates C++ and fuses by the same scheduler but with other heuristics, so a
CPU kernel count is a proxy; the `gpu` tests count kernels of a CUDA profile.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Callable, Iterable, Sequence

import torch

from emulator.capture.trace import ALLOC, COMPUTE, FREE, OpEvent
from emulator.costs.ops import ATTENTION_OPS, GEMM_OPS

FUSIBLE = ("elementwise", "norm", "softmax", "reduction", "copy")
EXTERN_COMPUTE = (*GEMM_OPS, *ATTENTION_OPS)  # Inductor's extern kernels (cuBLAS, flash)
EXTERN_NAMESPACES = ("fsdp",)  # torch.distributed.fsdp's custom ops (torch.ops.fsdp.*)
FUSED_ATEN = "inductor.fused"
FUSED_NAME = "elementwise"
_STORAGE_ROWS = (ALLOC, FREE)


@functools.cache
def _itemsize(dtype: str) -> int:
    return getattr(torch, dtype).itemsize


def _nbytes(tensor: tuple) -> int:
    shape, dtype, _ = tensor
    return math.prod(shape) * _itemsize(dtype)


def _chain_key(
    e: OpEvent, region_of: Callable[[str], str], eager_storages: frozenset[int] = frozenset()
) -> tuple | None:
    """(region, stream, phase, micro-batch) of a row that can fuse (rule 1), else None."""
    if e.kind != COMPUTE or e.name not in FUSIBLE or len(e.flows) != len(e.tensors):
        return None
    if e.aten.split(".", 1)[0] in EXTERN_NAMESPACES:
        return None
    if _accumulates_gradient(e, eager_storages):
        return None
    region = region_of(e.module)
    return (region, e.stream, e.phase, e.micro_batch) if region else None


def _accumulates_gradient(e: OpEvent, eager_storages: frozenset[int]) -> bool:
    """Rule 1's exception: a row that adds into a gradient in place (eager code)."""
    return e.kind == COMPUTE and bool(_outputs(e) & _reads(e) & eager_storages)


def _full_reduction(e: OpEvent) -> bool:
    """Rule 3: a reduction whose outputs hold one element each."""
    outs = [shape for shape, _, is_out in e.tensors if is_out]
    return e.name == "reduction" and bool(outs) and all(math.prod(s) == 1 for s in outs)


def _outputs(e: OpEvent) -> set[int]:
    return {u for u, (_, _, is_out) in zip(e.flows, e.tensors, strict=True) if is_out and u >= 0}


def _reads(e: OpEvent) -> set[int]:
    return {u for u, (_, _, is_out) in zip(e.flows, e.tensors, strict=True) if not is_out}


def _independent_extern(e: OpEvent, key, written: set[int], region_of) -> bool:
    """Rule 2's exception: a GEMM or attention row of the chain's block that reads nothing the
    chain wrote; Inductor schedules by data dependence, so the chain fuses across it."""
    if e.kind != COMPUTE or e.name not in EXTERN_COMPUTE or len(e.flows) != len(e.tensors):
        return False
    if (region_of(e.module), e.stream, e.phase, e.micro_batch) != key:
        return False
    return not _reads(e) & written


def chains(
    events: Sequence[OpEvent],
    boundary_seqs: Iterable[int],
    region_of: Callable[[str], str],
    eager_storages: Iterable[int] = (),
) -> list[list[int]]:
    """Indices into `events` of every chain of two or more rows (rules 1-3). `boundary_seqs`:
    seqs of rows kept elsewhere that end a chain (the backend's collectives and waits);
    `eager_storages`: storage ids only eager code writes in place (rule 1)."""
    eager_storages = frozenset(eager_storages)
    bounds = sorted(boundary_seqs)
    region_of = functools.lru_cache(maxsize=None)(region_of)  # a few hundred module names
    found: list[list[int]] = []
    chain: list[int] = []
    key, written, cut = None, set(), False
    for i, e in enumerate(events):
        if e.kind in _STORAGE_ROWS:
            continue
        k = _chain_key(e, region_of, eager_storages)
        if (
            chain
            and not cut
            and bisect.bisect_right(bounds, events[chain[-1]].seq)
            == bisect.bisect_left(bounds, e.seq)
        ):
            if k is not None and k == key:
                chain.append(i)
                written |= _outputs(e)
                cut = _full_reduction(e)
                continue
            if _independent_extern(e, key, written, region_of):
                continue
            if _accumulates_gradient(e, eager_storages) and not _reads(e) & written:
                continue  # runs after the compiled backward returns its gradients (rule 2)
        if len(chain) > 1:
            found.append(chain)
        chain, key, written, cut = [], None, set(), False
        if k is not None:
            chain, key, written, cut = [i], k, _outputs(e), _full_reduction(e)
    if len(chain) > 1:
        found.append(chain)
    return found


def _span(events: Sequence[OpEvent], chain: list[int]) -> range:
    """The chain's rows with the allocations and frees around them (up to the rows before
    and after that are neither)."""
    lo, hi = chain[0], chain[-1]
    while lo > 0 and events[lo - 1].kind in _STORAGE_ROWS:
        lo -= 1
    while hi + 1 < len(events) and events[hi + 1].kind in _STORAGE_ROWS:
        hi += 1
    return range(lo, hi + 1)


def _intermediates(events: Sequence[OpEvent], chain: list[int]) -> tuple[set[int], set[int]]:
    """(storage ids written by the chain and allocated and freed within its span, the span's
    rows of their allocations and frees)."""
    written = set().union(*(_outputs(events[i]) for i in chain))
    span = _span(events, chain)
    allocated = {events[j].storage: j for j in span if events[j].kind == ALLOC}
    freed = {events[j].storage: j for j in span if events[j].kind == FREE}
    inner = written & allocated.keys() & freed.keys()
    return inner, {allocated[u] for u in inner} | {freed[u] for u in inner}


def _moved_bytes(views: list[int], size: int | None) -> int:
    """Bytes a kernel moves for one storage it reads (or writes) through `views` (bytes of
    each access): each byte once, i.e. all the views' bytes up to the storage's size (two
    chunks of one tensor are the whole tensor, a tensor read twice is read once); without the
    size (a storage allocated before the trace), the largest view."""
    return max(views) if size is None else min(sum(views), size)


def fused_event(
    events: Sequence[OpEvent], chain: list[int], inner: set[int], sizes: dict[int, int]
) -> OpEvent:
    """The one kernel of a chain (rule 4), given its intermediate storage ids and the sizes of
    the storages the trace allocates."""
    reads: dict[int, list] = {}  # storage id (or a negative key when unknown) -> accesses
    writes: dict[int, list] = {}
    produced: set[int] = set()
    unknown = -1
    for i in chain:
        e = events[i]
        pairs = list(zip(e.flows, e.tensors, strict=True))
        for u, tensor in pairs:
            if not tensor[2] and u not in produced:
                if u < 0:
                    u, unknown = unknown, unknown - 1
                reads.setdefault(u, []).append(tensor)
        for u, tensor in pairs:
            if tensor[2] and u >= 0:
                produced.add(u)
                if u not in inner:
                    writes.setdefault(u, []).append(tensor)

    def moved(accesses: dict[int, list]) -> int:
        return sum(
            _moved_bytes([_nbytes(t) for t in ts], sizes.get(u)) for u, ts in accesses.items()
        )

    last = events[chain[-1]]
    largest = lambda ts: max(ts, key=_nbytes)  # noqa: E731  one tensor per storage, for dtype
    return last._replace(
        name=FUSED_NAME,
        aten=FUSED_ATEN,
        flops=sum(events[i].flops for i in chain),
        read_bytes=moved(reads),
        write_bytes=moved(writes),
        tensors=(*map(largest, reads.values()), *map(largest, writes.values())),
        flows=(*(max(u, -1) for u in reads), *writes),
        workspace_bytes=0,
        causal=False,
    )


def fuse_compiled_chains(
    events: Sequence[OpEvent],
    boundary_seqs: Iterable[int],
    region_of: Callable[[str], str],
    eager_storages: Iterable[int] = (),
) -> list[OpEvent]:
    """`events` with every chain (rules 1-3) replaced by its fused kernel and its
    intermediates' allocation and free rows dropped (rule 4). A storage the fused kernel reads
    and eager code freed before the chain's last row is freed after the fused kernel (it runs
    where the chain ends); the rows of the chain's place take its seqs again in their new
    order. `eager_storages`: the storage ids of gradients (rule 1)."""
    events = list(events)
    sizes = {e.storage: e.size_bytes for e in events if e.kind == ALLOC}
    found = [
        (chain, *_intermediates(events, chain))
        for chain in chains(events, boundary_seqs, region_of, eager_storages)
    ]
    drop: set[int] = set()
    for chain, _, storage_rows in found:
        drop.update(chain[:-1])
        drop.update(storage_rows)
    placed: dict[int, tuple[int, list[OpEvent]]] = {}  # first row -> (last row, new rows)
    for chain, inner, _ in found:
        fused = fused_event(events, chain, inner, sizes)
        reads = _reads(fused)
        kept = [j for j in range(chain[0], chain[-1]) if j not in drop]
        late = {j for j in kept if events[j].kind == FREE and events[j].storage in reads}
        rows = [events[j] for j in kept if j not in late] + [fused]
        rows += [events[j] for j in kept if j in late]
        seqs = sorted(e.seq for e in rows)
        placed[chain[0]] = (chain[-1], [e._replace(seq=q) for e, q in zip(rows, seqs, strict=True)])
    out: list[OpEvent] = []
    i = 0
    while i < len(events):
        if i in placed:
            i, rows = placed[i]
            out += rows
        elif i not in drop:
            out.append(events[i])
        i += 1
    return out


def block_region(container: str = "layers") -> Callable[[str], str]:
    """A `region_of` for models whose compiled blocks sit in a ModuleList/ModuleDict named
    `container` (torchtitan's `model.layers`, compiled block by block): the module path up to
    `<container>.<index>`, "" outside every block."""

    def region_of(module: str) -> str:
        parts = module.split(".")
        for j in range(len(parts) - 1):
            if parts[j] == container and parts[j + 1].isdigit():
                return ".".join(parts[: j + 2])
        return ""

    return region_of
