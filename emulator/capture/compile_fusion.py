"""torch.compile's kernel fusion as a capture rule: the memory-bound ops of a compiled graph become
the kernels Inductor's scheduler would make of them.

The capture runs the program eagerly, one kernel per aten op. Under `torch.compile` Inductor
lowers a compiled module's graph and its scheduler fuses nodes before generating code
(torch/_inductor/scheduler.py, `Scheduler.fuse_nodes`): pairs of nodes that share a buffer,
best-scoring first (`score_fusion`: the bytes they share), merged when `can_fuse` accepts them
and the merge forms no cycle through another node (`will_fusion_create_cycle`), for up to ten
rounds. It fuses by data dependence, not program order: pointwise nodes with their consumers
and with siblings that read the same buffers, and pointwise producers and consumers with a
reduction over the same ranges (a norm: its row reduction and the normalisation are one
kernel). GEMMs and attention stay extern kernels (cuBLAS, flash: `ExternKernel` nodes, which
`can_fuse` refuses; Inductor only fuses into GEMM templates under max-autotune, which
torchtitan does not turn on), and so do collectives, waits and custom ops Inductor cannot
lower. Kernels are then emitted in an order the data allows, so an extern kernel that reads no
fused kernel's output can run before it. A buffer that only lives inside a fused kernel is
never allocated.

Rule, applied to the recorded events of one rank (`fuse_compiled_regions`; the grouping and
order of rules 3-6 and 8 are `emulator.capture.inductor_scheduler`'s):
1. A compute row belongs to a compiled graph when it runs inside a compiled module
   (`region_of(module)` is not ""; torchtitan compiles each TransformerBlock), has storage ids
   (`OpEvent.flows`, recorded when `OpRecorder.record_flows` is set) and is not a custom op of
   an extern namespace (`EXTERN_NAMESPACES`: FSDP2's copy-in/copy-out ops run eager around the
   block). The graph is the block's forward, or its backward with the checkpoint's
   recomputation (AOTAutograd puts the recomputation into the backward graph). Such a row is
   fusible when it is of a memory-bound class (`FUSIBLE`: elementwise, norm, softmax,
   reduction, copy) and does not add into a gradient in place: autograd's AccumulateGrad and
   gradient hooks (the accumulation into a main-grad buffer, for one) run eagerly outside the
   compiled graph, though the capture sees them inside the block's module (`eager_storages`:
   the trace's gradient storages). Every other row of the graph (GEMM, attention, a gradient
   accumulation) is an extern node.
2. A run is a maximal sequence of rows of one region, stream, graph and micro-batch with
   nothing in between but allocations, frees and phase markers; any other row (a row of
   another graph, a stream record/wait, a marker) or a collective or wait (`boundary_seqs`)
   ends it.
3. Within a run, a row that repeats an earlier one (the same aten op over the same tensors of
   the same storages, none written in between, its outputs dying within the run) is dropped
   and its readers read the earlier row's outputs: AOTAutograd's common-subexpression
   elimination (torchao's float8 linears cast one input once per GEMM that reads it, q, k and
   v; the graph does it once). Only ops whose arguments the row shows in full count
   (reductions, casts, ops of two or more tensors, `_CSE_UNARY`): rows do not record scalars.
   An aten row of the recomputation (a GEMM too) whose outputs no later row of the run reads,
   and that are freed before its last row, is dropped with its allocation and free, and so is
   a row only such rows read: the graph's dead-code elimination (op-level SAC reruns the
   float8 cast before a GEMM whose output the checkpoint kept; full checkpointing reruns a
   block's last float8 GEMM, whose output the backward does not read; the compiled backward
   runs neither). Only the recomputation's rows are judged.
   A backward row (not the recomputation's) that repeats a reduction of the block's forward
   graph for the same micro-batch (`saved_reduction_key`: outputs at most a quarter of its
   inputs), over storages no compiled row wrote since, is dropped and its readers read its
   output as a value the graph was given: AOTAutograd's CSE runs on the joint graph, and the
   partitioner saves such a reduction (or, under full checkpointing, the backward graph
   recomputes it once: a reduction the run's recomputation computes too is left to the CSE
   above, so the backward reads the recomputed value). torchao casts a weight again for the
   input gradient, with its amax;
   Inductor's backward runs the cast alone, and fuses it with the recomputation's cast of
   the same weight (one read, both layouts written).
4. A pointwise row (an aten elementwise op or copy, not in place) whose outputs die within the
   run and are read by fusible rows only is inlined into each row that reads it, when one row
   reads it or it reads at most `REALIZE_READS_THRESHOLD` storages: Inductor's lowering
   computes such a value inside every consumer instead of storing it
   (`StorageBox.should_realize_on_reuse`, as on a GPU). Its reads and FLOPs join each
   consumer's; its storage is never allocated. (A norm feeding both a tensorwise amax and the
   cast that needs the amax is computed in both kernels, not stored.) Such a value that
   several `_scaled_mm` read through a view, and nothing else, is not stored once either:
   each GEMM realises its own copy (`COPIES_UNREALIZED_INPUT`), so the repeats rule 3 found of
   it are kept, and rule 5 fuses them into one kernel that reads once and writes a copy per
   GEMM (attention's normed input, cast for wq, wk and wv: three copies, as Inductor writes).
5. The remaining nodes depend on each other through the storages they read and write (read after
   write, write after read, write after write). Fusible nodes are merged pairwise, in each round
   two reductions or two pointwise nodes first (a merged node is a reduction when one of its
   nodes is: `InductorChoices.score_fusion`), then the pairs that share the most bytes, then the
   nearest in the graph (Inductor's proximity score, in the order below; a normed input's amax
   shares as many bytes with the recomputed row statistics as with the norm backward's row sum
   at 2 048 tokens, and joins the statistics), until no merge is left (at most
   `MAX_FUSION_ROUNDS` rounds, `MAX_FUSION_SIZE` nodes a kernel), when the merge is compatible
   (rule 6) and leaves no path from one group to the other through a third node (an extern GEMM
   that reads one and is read by the other keeps them apart). A storage that one node reads
   through its transpose (`OpEvent.transposed_reads`: torchao's transposed fp8 cast of an output
   gradient) and another reads in order is not shared between them: Inductor's memory score
   compares index expressions, and its loop reordering does not align a transposed read over two
   loop variables with an in-order one over one. Two nodes of which neither depends on the other
   fuse only when they share `SCORE_FUSION_MEMORY_THRESHOLD` bytes or more (a scalar scale is
   not enough: `InductorChoices.can_fuse_horizontal`) and lie at most `MAX_HORIZONTAL_DISTANCE`
   scheduler nodes apart (`Scheduler.are_long_distant_nodes`), in the order AOTAutograd gives
   the graph: a recomputed node just before the first backward node that needs it
   (`graph_order`). Under full checkpointing a weight's recomputed cast is needed at the start
   of the backward and its input gradient's cast near the end: two kernels, each reading the
   weight.
6. Compatible: every node iterates over one range (elements of its output; a reduction, of
   its input), or, with a reduction, over its input's or its output's range; two reductions
   only with the same ranges. A node over the input's range may read a reduction's result in
   the same kernel only when the reduction is over the innermost dimensions (a norm's row
   statistics); after a reduction to one element (a tensorwise fp8 amax) or over the outer
   dimensions (a weight gradient's column sum) it cannot: it needs the finished value. A
   large reduction to one element whose inlined recipe reads a row reduction's result over
   the same elements runs that reduction's loop (Inductor splits it along those ranges:
   `inductor_scheduler._split_ranges`), so a normed input's amax is one kernel with the
   norm's row statistics.
7. A group of two or more rows (its nodes and what they inline) is one kernel (`FUSED_ATEN`,
   priced as an "elementwise" op by the bytes it moves): it reads each storage the group
   reads before writing it, once (the bytes of its views, at most the storage's size:
   `_moved_bytes`), and writes each storage the group writes that another node reads or that
   outlives the run, likewise. A storage written by the group, read by no other node and
   allocated and freed within the run is an intermediate: its allocation and free rows are
   dropped (not materialised). FLOPs add up.
8. The run's kernels (fused groups, extern and unfused rows) are ordered topologically, the
   one whose first row came first when several are ready, gradient accumulations after the
   graph's kernels (eager code, rule 1). An allocation goes before the first kernel that
   writes the storage, a free after the last kernel that touches it and no earlier than eager
   code freed it, a phase marker before the first kernel of a row that followed it; the
   span's rows take its seqs again in their new order.

What the rule leaves out: fusion into GEMM epilogues (max-autotune only), AOTAutograd's
min-cut partitioner recomputing cheap pointwise ops in the backward instead of saving them
(saved activations are kept as recorded, less what no backward row reads:
emulator.capture.compile_saved), the second kernel of Inductor's split of a large reduction
(it reads only the partial results; the rule's reduction is one kernel), and its other
reasons to refuse a fusion (index patterns it cannot tile together, a kernel's register
pressure). Against Inductor's own
scheduler for Triton on one Llama 3 8B block (`results/fidelity/compile_vs_inductor.py`,
torch 2.13): the same bytes in bf16, 0.95-1.00 x in fp8 (`compile_vs_inductor.md` says
which commit). On CPU Inductor generates C++ and
fuses by the same scheduler but with other heuristics, so a CPU kernel count is a proxy; the
`gpu` tests count kernels of a CUDA profile.
"""

from __future__ import annotations

import bisect
import functools
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence

from emulator.capture.inductor_scheduler import (
    Node,
    common_subexpressions,
    copied_per_reader,
    dead_code,
    fused_groups,
    nbytes,
    saved_reduction_key,
    schedule,
    written_storages,
)
from emulator.capture.trace import (
    ALLOC,
    COMPUTE,
    FREE,
    MARKER,
    PHASES,
    OpEvent,
    renamed_storages,
)

EXTERN_NAMESPACES = ("fsdp",)  # torch.distributed.fsdp's custom ops (torch.ops.fsdp.*)
FUSED_ATEN = "inductor.fused"
FUSED_NAME = "elementwise"
_STORAGE_ROWS = (ALLOC, FREE)
# one compiled graph each: the forward, and the backward with the checkpoint's recomputation
_BACKWARD = PHASES.index("backward")
_RECOMPUTE = PHASES.index("recompute")
_GRAPH_OF_PHASE = {
    PHASES.index("forward"): "forward",
    PHASES.index("recompute"): "backward",
    PHASES.index("backward"): "backward",
}


def _graph_key(e: OpEvent, region_of: Callable[[str], str]) -> tuple | None:
    """(region, stream, compiled graph, micro-batch) of a row that belongs to a compiled
    block's graph (rule 1), else None."""
    if e.kind != COMPUTE or len(e.flows) != len(e.tensors):
        return None
    if e.aten.split(".", 1)[0] in EXTERN_NAMESPACES:
        return None
    region = region_of(e.module)
    graph = _GRAPH_OF_PHASE.get(e.phase)
    return (region, e.stream, graph, e.micro_batch) if region and graph else None


def _adjacent(bounds: list[int], earlier: int, later: int) -> bool:
    """No boundary seq falls between two seqs."""
    return bisect.bisect_right(bounds, earlier) == bisect.bisect_left(bounds, later)


def graph_runs(
    events: Sequence[OpEvent], boundary_seqs: Iterable[int], region_of: Callable[[str], str]
) -> list[list[int]]:
    """Rule 2: indices into `events` of the compute rows of each run of one compiled graph,
    two or more rows long. `boundary_seqs`: seqs of rows kept elsewhere that end a run (the
    backend's collectives and waits)."""
    bounds = sorted(boundary_seqs)
    region_of = functools.lru_cache(maxsize=None)(region_of)  # a few hundred module names
    found: list[list[int]] = []
    run: list[int] = []
    key = None
    for i, e in enumerate(events):
        if e.kind in _STORAGE_ROWS or (e.kind == MARKER and e.name.startswith("phase:")):
            continue
        k = _graph_key(e, region_of)
        if run and k is not None and k == key and _adjacent(bounds, events[run[-1]].seq, e.seq):
            run.append(i)
            continue
        if len(run) > 1:
            found.append(run)
        run, key = ([i], k) if k is not None else ([], None)
    if len(run) > 1:
        found.append(run)
    return found


def _span(events: Sequence[OpEvent], run: list[int], bounds: list[int]) -> range:
    """The run's rows with the allocations and frees around them, up to a row that is neither
    or a boundary's seq."""
    lo, hi = run[0], run[-1]
    while (
        lo > 0
        and events[lo - 1].kind in _STORAGE_ROWS
        and _adjacent(bounds, events[lo - 1].seq, events[lo].seq)
    ):
        lo -= 1
    while (
        hi + 1 < len(events)
        and events[hi + 1].kind in _STORAGE_ROWS
        and _adjacent(bounds, events[hi].seq, events[hi + 1].seq)
    ):
        hi += 1
    return range(lo, hi + 1)


def _moved_bytes(views: list[int], size: int | None) -> int:
    """Bytes a kernel moves for one storage it reads (or writes) through `views` (bytes of
    each access): each byte once, i.e. all the views' bytes up to the storage's size (two
    chunks of one tensor are the whole tensor, a tensor read twice is read once); without the
    size (a storage allocated before the trace), the largest view."""
    return max(views) if size is None else min(sum(views), size)


def fused_event(
    events: Sequence[OpEvent], rows: list[int], inner: set[int], sizes: dict[int, int]
) -> OpEvent:
    """The one kernel of a group of rows in program order (rule 7), given its intermediate
    storage ids and the sizes of the storages the trace allocates."""
    reads: dict[int, list] = {}  # storage id (or a negative key when unknown) -> accesses
    writes: dict[int, list] = {}
    produced: set[int] = set()
    unknown = -1
    for i in rows:
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
            _moved_bytes([nbytes(t) for t in ts], sizes.get(u)) for u, ts in accesses.items()
        )

    last = events[rows[-1]]
    largest = lambda ts: max(ts, key=nbytes)  # noqa: E731  one tensor per storage, for dtype
    return last._replace(
        name=FUSED_NAME,
        aten=FUSED_ATEN,
        flops=sum(events[i].flops for i in rows),
        read_bytes=moved(reads),
        write_bytes=moved(writes),
        tensors=(*map(largest, reads.values()), *map(largest, writes.values())),
        flows=(*(max(u, -1) for u in reads), *writes),
        workspace_bytes=0,
        causal=False,
    )


def _fused_span(
    events: Sequence[OpEvent], span: range, nodes: list[Node], groups: list[list[int]],
    sizes: dict[int, int], allocated: dict[int, int], freed: dict[int, int],
    dropped_rows: set[int], unallocated: Iterable[int],
) -> list[OpEvent]:  # fmt: skip
    """The span's rows after fusion (rules 7 and 8), less the rows rule 3 dropped (repeated
    and dead) and the allocations and frees of the storages it left `unallocated` (their
    outputs). `allocated`, `freed`: storage id -> the span's row that allocates (frees) it."""
    if not nodes:  # rule 3 dropped every row: the span's storage and marker rows stay
        gone = {allocated[u] for u in unallocated} | {freed[u] for u in unallocated}
        return [events[r] for r in span if r not in dropped_rows and r not in gone]
    order, group_of = schedule(nodes, groups)
    position = [0] * len(groups)
    for p, g in enumerate(order):
        position[g] = p
    node_of_row = {n.row: j for j, n in enumerate(nodes)}
    inlined_rows = {r for n in nodes for r in n.rows} - node_of_row.keys()
    inlined_outputs = {u for r in inlined_rows for u in written_storages(events[r])}
    accessors: dict[int, list[int]] = defaultdict(list)
    writers: dict[int, list[int]] = defaultdict(list)
    for j, n in enumerate(nodes):
        for u in n.accessed:
            accessors[u].append(j)
        for u in n.writes:
            writers[u].append(j)
    gone = inlined_outputs | set(unallocated)
    dropped = {allocated[u] for u in gone} | {freed[u] for u in gone} | dropped_rows
    kernels: list[OpEvent] = []
    for g, members in enumerate(groups):
        rows = sorted({r for j in members for r in nodes[j].rows})
        if len(rows) == 1:
            kernels.append(events[rows[0]])
            continue
        inner = set(inlined_outputs)
        for u in set().union(*(nodes[j].writes for j in members)):
            if u in allocated and u in freed and all(group_of[a] == g for a in accessors[u]):
                inner.add(u)
                dropped.update((allocated[u], freed[u]))
        kernels.append(fused_event(events, rows, inner, sizes))
    before: dict[int, list[int]] = defaultdict(list)  # position -> rows placed before it
    after: dict[int, list[int]] = defaultdict(list)
    last = len(order) - 1
    seen = 0  # nodes before the row in program order
    for r in span:
        e = events[r]
        if r in node_of_row:
            seen = node_of_row[r] + 1
            continue
        if r in inlined_rows or r in dropped:
            continue
        if e.kind == ALLOC and writers[e.storage]:
            before[min(position[group_of[j]] for j in writers[e.storage])].append(r)
        elif e.kind == FREE:
            touching = [position[group_of[j]] for j in accessors[e.storage]]
            if seen:
                touching.append(position[group_of[seen - 1]])
            if touching:
                after[max(touching)].append(r)
            else:
                before[0].append(r)
        elif e.kind == ALLOC:
            if seen < len(nodes):
                before[position[group_of[seen]]].append(r)
            else:
                after[last].append(r)
        else:  # a phase marker: before the first kernel of a later row
            later = [p for p, g in enumerate(order) if groups[g][0] >= seen]
            if later:
                before[later[0]].append(r)
            else:
                after[last].append(r)
    rows: list[OpEvent] = []
    for p, g in enumerate(order):
        rows += [events[r] for r in before[p]]
        rows.append(kernels[g])
        rows += [events[r] for r in after[p]]
    seqs = sorted(e.seq for e in rows)
    return [e._replace(seq=q) for e, q in zip(rows, seqs, strict=True)]


def _forward_reductions(
    events: Sequence[OpEvent],
    run: list[int],
    known: dict[tuple, set[tuple]],
    readers: dict[int, set[tuple]],
    region_of: Callable[[str], str],
) -> set[int]:
    """Rule 3's joint-graph part: the backward rows of the run (not the recomputation's) that
    repeat a reduction the block's forward graph computed for the same micro-batch, over
    storages no compiled row wrote since (`saved_reduction_key`). AOTAutograd's CSE runs on
    the joint graph, so the backward takes the forward's value: saved (the partitioner does
    not recompute such reductions; op-level SAC kept `max`), or recomputed once in the
    backward graph under full checkpointing. torchao's backward casts a weight again for the
    input gradient, from the amax its forward cast computed. A reduction this graph's
    recomputation also computes is left to `common_subexpressions`: the backward reads the
    recomputation's value, which keeps that row alive when dead-code elimination would
    otherwise drop it with the recomputed cast and GEMM it fed. Updated here: `known`,
    (region, micro-batch) -> the keys of the forward's reductions; `readers`, storage id ->
    the (region, micro-batch, key) of each that read it."""
    region, _, graph, micro_batch = _graph_key(events[run[0]], region_of)
    repeats = set()
    recomputed: set[tuple] = set()
    for i in run:
        e = events[i]
        key = saved_reduction_key(e)
        if graph == "forward" and key is not None:
            known[region, micro_batch].add(key)
            for u in key[2]:
                readers[u].add((region, micro_batch, key))
        elif key is not None and e.phase == _RECOMPUTE:
            recomputed.add(key)
        elif key in known[region, micro_batch] and key not in recomputed and e.phase == _BACKWARD:
            repeats.add(i)
            continue
        for u in written_storages(e):
            for where in readers.pop(u, ()):
                known[where[:2]].discard(where[2])
    return repeats


def fuse_compiled_regions(
    events: Sequence[OpEvent],
    boundary_seqs: Iterable[int],
    region_of: Callable[[str], str],
    eager_storages: Iterable[int] = (),
) -> list[OpEvent]:
    """`events` with each compiled graph's fusible rows fused as Inductor's scheduler would
    (rules 1-8): the fused kernels and the extern kernels in an order the data allows, the
    intermediates' allocation and free rows dropped. `boundary_seqs`: seqs of rows kept
    elsewhere that end a run (collectives, waits); `eager_storages`: the storage ids of
    gradients (rule 1)."""
    events = list(events)
    bounds = sorted(boundary_seqs)
    eager_storages = frozenset(eager_storages)
    sizes = {e.storage: e.size_bytes for e in events if e.kind == ALLOC}
    replaced: dict[int, tuple[int, list[OpEvent]]] = {}  # span start -> (span end, rows)
    reductions: dict[tuple, set[tuple]] = defaultdict(set)  # what _forward_reductions
    reduction_readers: dict[int, set[tuple]] = defaultdict(set)  # has seen so far
    for run in graph_runs(events, bounds, region_of):
        span, last_row = _span(events, run, bounds), run[-1]
        allocated = {events[r].storage: r for r in span if events[r].kind == ALLOC}
        freed = {events[r].storage: r for r in span if events[r].kind == FREE}
        transient = allocated.keys() & freed.keys()
        from_forward = _forward_reductions(events, run, reductions, reduction_readers, region_of)
        run = [r for r in run if r not in from_forward]
        repeated, alias = common_subexpressions(events, run, frozenset(transient))
        copied = copied_per_reader(events, run, repeated, alias, eager_storages, transient)
        repeated = (repeated - copied) | from_forward
        kept_outputs = {u for r in copied for u in written_storages(events[r])}
        alias = {u: v for u, v in alias.items() if u not in kept_outputs}
        for r in run:
            if r not in repeated and alias.keys() & set(events[r].flows):
                events[r] = renamed_storages(events[r], alias)
        run = [r for r in run if r not in repeated]
        # freed before the graph's last row: not a graph output its caller dropped
        freed_inside = frozenset(u for u in transient if freed[u] < last_row)
        dead = dead_code(events, run, eager_storages, freed_inside)
        run = [r for r in run if r not in dead]
        unused = {u for r in dead for u in written_storages(events[r])}
        unused -= {u for r in run for u in written_storages(events[r])}
        nodes, groups = fused_groups(events, run, eager_storages, transient - alias.keys())
        if len(groups) == len(run) and not repeated and not dead:
            continue
        dropped, gone = repeated | dead, unused | alias.keys()
        replaced[span.start] = (
            span.stop,
            _fused_span(events, span, nodes, groups, sizes, allocated, freed, dropped, gone),
        )
    out: list[OpEvent] = []
    i = 0
    while i < len(events):
        if i in replaced:
            i, rows = replaced[i]
            out += rows
        else:
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
