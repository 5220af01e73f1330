"""Which kernels Inductor makes of one compiled graph's rows: its lowering and scheduler as
`emulator.capture.compile_fusion` models them (that module's rules 3-6 and 8 say what, and why).

Given a run of rows of one compiled graph (their storage ids in `OpEvent.flows`):
AOTAutograd's common-subexpression elimination (`common_subexpressions`) and the graph's
dead-code elimination (`dead_code`), the repeats to keep because Inductor stores a copy
for each reader (`copied_per_reader`), the pointwise values
Inductor's lowering inlines into their readers instead of storing (`_inlined`), the remaining
rows as nodes with their data dependences (`_nodes`), the pairwise fusion of compatible nodes
that forms no cycle (`Fusion`, `fused_groups`), and an order the data allows (`schedule`).
"""

from __future__ import annotations

import functools
import heapq
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from emulator.capture.trace import PHASES, OpEvent, renamed_storages
from emulator.costs.ops import GEMM_OPS

FUSIBLE = ("elementwise", "norm", "softmax", "reduction", "copy")
MAX_FUSION_SIZE = 64  # torch._inductor.config.max_fusion_size
MAX_FUSION_ROUNDS = 10  # Scheduler.fuse_nodes's rounds
# torch._inductor.config.score_fusion_memory_threshold: the bytes two kernels that do not
# depend on each other must share to fuse (InductorChoices.can_fuse_horizontal)
SCORE_FUSION_MEMORY_THRESHOLD = 10
# Scheduler.are_long_distant_nodes: two kernels that do not depend on each other and lie further
# apart than this in the graph's node order do not fuse (it would lengthen live ranges)
MAX_HORIZONTAL_DISTANCE = 64
# a reduction to one value over more elements than this is split into a partial and a final
# reduction, two scheduler nodes (Reduction.num_splits; the splits of 131 072 elements seen in
# Inductor's nodes for a Llama 3 8B block's fp8 amaxes)
SPLIT_REDUCTION_NUMEL = 131072
REALIZE_READS_THRESHOLD = 4  # torch._inductor.config.realize_reads_threshold
# extern ops Inductor lowers itself without asking for realised inputs (not in lowering.py's
# `needs_realized_inputs`, which holds aten.mm, aten.bmm and every fallback kernel): each one
# that reads a value not yet stored realises its own copy of it
COPIES_UNREALIZED_INPUT = frozenset({"aten._scaled_mm"})
_RECOMPUTE = PHASES.index("recompute")
_CSE_UNARY = frozenset(
    f"aten.{op}" for op in ("abs", "neg", "reciprocal", "rsqrt", "sqrt", "exp", "silu", "sigmoid")
)


@functools.cache
def _itemsize(dtype: str) -> int:
    return getattr(torch, dtype).itemsize


def nbytes(tensor: tuple) -> int:
    shape, dtype, _ = tensor
    return math.prod(shape) * _itemsize(dtype)


def written_storages(e: OpEvent) -> set[int]:
    return {u for u, (_, _, is_out) in zip(e.flows, e.tensors, strict=True) if is_out and u >= 0}


def read_storages(e: OpEvent) -> set[int]:
    return {u for u, (_, _, is_out) in zip(e.flows, e.tensors, strict=True) if not is_out}


def accumulates_gradient(e: OpEvent, eager_storages: frozenset[int]) -> bool:
    """Rule 1's exception: a row that adds into a gradient in place (eager code)."""
    return bool(written_storages(e) & read_storages(e) & eager_storages)


def _reduces_rows(e: OpEvent) -> bool:
    """A reduction over the innermost dimensions (a norm's row statistics), whose result a
    consumer over the input's range can read in the same kernel; not a reduction to one
    element or over the outer dimensions (rule 6)."""
    outs = [shape for shape, _, is_out in e.tensors if is_out]
    ins = [shape for shape, _, is_out in e.tensors if not is_out]
    if not outs or not ins:
        return False
    out, inp = max(outs, key=math.prod), max(ins, key=math.prod)
    kept = list(out)
    while kept and kept[-1] == 1:
        kept.pop()
    return math.prod(out) > 1 and tuple(kept) == tuple(inp[: len(kept)])


@dataclass
class Node:
    """One compute row of a run that Inductor would make a buffer of, with the rows inlined
    into it: its storages, its iteration range, its neighbours."""

    row: int
    rows: list[int]  # its own row last, after the pointwise rows inlined into it (rule 4)
    fusible: bool
    eager: bool  # adds into a gradient in place: eager code after the compiled graph (rule 1)
    reads: set[int]
    writes: set[int]
    accessed: dict[int, int]  # storage id -> bytes of its largest access
    transposed: set[int]  # storages of `accessed` it reads through their transpose
    numel: int  # the elements it iterates over (a reduction: its input's)
    out_numel: int  # a reduction's output elements (else numel)
    reduction: bool
    row_reduction: bool
    succ: set[int] = field(default_factory=set)
    # (output, input) elements of the loop a reduction's kernel runs: a split reduction's
    # partial one when Inductor splits it along a row reduction's ranges (`_split_ranges`)
    ranges: tuple[int, int] = (0, 0)


def _accesses(e: OpEvent) -> dict[int, int]:
    accessed: dict[int, int] = {}
    for u, t in zip(e.flows, e.tensors, strict=True):
        if u >= 0:
            accessed[u] = max(accessed.get(u, 0), nbytes(t))
    return accessed


def common_subexpressions(
    events: Sequence[OpEvent], run: list[int], transient: frozenset[int]
) -> tuple[set[int], dict[int, int]]:
    """Rule 3, AOTAutograd's common-subexpression elimination on the graph: (rows
    that repeat an earlier row of the run, each of their output storages -> the earlier row's).
    A repeat is the same aten op over the same tensors of the same storages, none written in
    between, its outputs dying within the run; only ops whose arguments the row shows in full
    (reductions, casts, ops of two or more tensors, `_CSE_UNARY`), not a scalar it does not
    record. torchao's float8 linears cast one input once per GEMM that reads it (q, k and v;
    w1 and w3), which the graph computes once."""
    written_by: dict[int, int] = defaultdict(int)
    for i in run:
        for u in written_storages(events[i]):
            written_by[u] += 1
    first: dict[tuple, list[int]] = {}
    alias: dict[int, int] = {}
    version: dict[int, int] = defaultdict(int)  # storage -> writes so far
    repeated: set[int] = set()
    for i in run:
        e = events[i]
        flows = [alias.get(u, u) for u in e.flows]
        ins = [u for u, t in zip(flows, e.tensors, strict=True) if not t[2]]
        outs = [u for u, t in zip(flows, e.tensors, strict=True) if t[2]]
        if (
            e.name in FUSIBLE
            and e.aten.startswith("aten.")
            and (e.name in ("reduction", "copy") or len(ins) >= 2 or e.aten in _CSE_UNARY)
            and ins
            and outs
            and min(flows) >= 0
            and not set(ins) & set(outs)
            and all(written_by[u] == 1 for u in outs)
        ):
            key = (e.aten, e.tensors, tuple(ins), tuple(version[u] for u in ins),
                   e.transposed_reads)  # fmt: skip
            if key in first and set(outs) <= transient:
                repeated.add(i)
                alias.update(zip(outs, first[key], strict=True))
                continue
            first.setdefault(key, outs)
        for u in outs:
            version[u] += 1
    return repeated, alias


def saved_reduction_key(e: OpEvent) -> tuple | None:
    """(aten op, tensors, input storages) of a reduction whose outputs are at most a quarter
    of its inputs' bytes, the ones AOTAutograd's partitioner saves for backward rather than
    recompute (`ban_recompute_reductions`; a float8 cast's amax); None for any other row."""
    if e.name != "reduction" or not e.aten.startswith("aten.") or min(e.flows, default=-1) < 0:
        return None
    ins = [(u, t) for u, t in zip(e.flows, e.tensors, strict=True) if not t[2]]
    out_bytes = sum(nbytes(t) for t in e.tensors if t[2])
    if not ins or not out_bytes or 4 * out_bytes > sum(nbytes(t) for _, t in ins):
        return None
    return (e.aten, e.tensors, tuple(u for u, _ in ins))


def dead_code(
    events: Sequence[OpEvent],
    run: list[int],
    eager_storages: frozenset[int],
    freed_inside: frozenset[int],
) -> set[int]:
    """Rule 3, the graph's dead-code elimination, for what a recomputation reruns: the aten
    rows of the recompute phase, GEMMs included, whose outputs nothing reads (no later row of
    the run, and `freed_inside` it), found backwards so a row read only by dead rows is dead
    too. Eagerly they run; the compiled graph drops them (the partitioner recomputes only what
    the backward reads). Op-level SAC reruns an op whose only reader's output comes from the
    checkpoint's store (a float8 cast before a GEMM whose output is kept); full checkpointing
    reruns a block's last float8 GEMM, whose output nothing reads (torchao's float8 linear
    saves its inputs after its GEMM runs, so torch's early stop cannot end the recomputation
    before it). Only the recomputation's rows are judged: that is where eager code runs what
    the compiled graph would not."""
    read_later: set[int] = set()
    dead: set[int] = set()
    for i in reversed(run):
        e = events[i]
        outs = written_storages(e)
        if (
            e.phase == _RECOMPUTE
            and e.aten.startswith("aten.")
            and outs
            and outs <= freed_inside
            and not outs & eager_storages
            and not outs & read_later
        ):
            dead.add(i)
            continue
        read_later |= read_storages(e)
    return dead


def _readers(
    events: Mapping[int, OpEvent] | Sequence[OpEvent], run: list[int]
) -> dict[int, list[int]]:
    """storage id -> the rows of the run that read it, in program order."""
    readers: dict[int, list[int]] = defaultdict(list)
    for i in run:
        for u in read_storages(events[i]):
            if u >= 0:
                readers[u].append(i)
    return readers


def _pointwise_value(e: OpEvent, eager_storages: frozenset[int], transient: frozenset[int]) -> bool:
    """An aten elementwise op or copy, not in place, whose outputs die within the run: a
    value Inductor's lowering may compute inside its readers instead of storing (rule 4)."""
    outs = written_storages(e)
    return (
        e.name in ("elementwise", "copy")
        and e.aten.startswith("aten.")
        and bool(outs)
        and not outs & read_storages(e)
        and outs <= transient
        and not outs & eager_storages
    )


def _recipe(
    i: int, e: OpEvent, inlined: dict[int, tuple[list[int], set[int]]], produced_by: dict[int, int]
) -> tuple[list[int], set[int]]:
    """(the rows row `i` stands for, the storages it reads) once the values of `inlined` rows
    (`produced_by`: storage id -> its inlined row) are computed inside it (rule 4)."""
    rows, reads = [i], set()
    for u in read_storages(e):
        if u in produced_by:  # an inlined row's value: read what it reads
            rows = inlined[produced_by[u]][0] + rows
            reads |= inlined[produced_by[u]][1]
        elif u >= 0:
            reads.add(u)
    return rows, reads


def _inlined(
    events: Mapping[int, OpEvent] | Sequence[OpEvent],
    run: list[int],
    eager_storages: frozenset[int],
    transient: frozenset[int],
    readers: Mapping[int, list[int]],
) -> dict[int, tuple[list[int], set[int]]]:
    """Rule 4: row -> (the rows it stands for, the storages it reads) of each pointwise row
    Inductor's lowering inlines into its consumers instead of storing its value: a
    `_pointwise_value` whose outputs only fusible rows of the run read, read once or reading
    at most `REALIZE_READS_THRESHOLD` storages (`StorageBox.should_realize_on_reuse`).
    `readers`: the run's `_readers`."""
    inlined: dict[int, tuple[list[int], set[int]]] = {}
    produced_by: dict[int, int] = {}
    for i in run:
        e = events[i]
        outs = written_storages(e)
        rows, reads = _recipe(i, e, inlined, produced_by)
        if (
            _pointwise_value(e, eager_storages, transient)
            and all(readers.get(u) for u in outs)
            and all(
                events[r].name in FUSIBLE and not accumulates_gradient(events[r], eager_storages)
                for u in outs
                for r in readers[u]
            )
            and (
                len({r for u in outs for r in readers[u]}) == 1
                or len(reads) <= REALIZE_READS_THRESHOLD
            )
        ):
            inlined[i] = (sorted(set(rows)), reads)
            produced_by.update(dict.fromkeys(outs, i))
    return inlined


def copied_per_reader(
    events: Sequence[OpEvent],
    run: list[int],
    repeated: set[int],
    alias: dict[int, int],
    eager_storages: Iterable[int] = (),
    transient: Iterable[int] = (),
) -> set[int]:
    """Rule 4's other side: the rows of `repeated` (rule 3's, with its `alias`) to keep, because
    Inductor realises the value they repeat once per reader. The value of a
    `_pointwise_value` read by two or more rows is stored once when it reads more than
    `REALIZE_READS_THRESHOLD` storages (`StorageBox.mark_reuse`) or when a reader asks for
    realised inputs (`GraphLowering.run_node`'s `realize_hint`: aten.mm, aten.bmm, fallback
    kernels); when every reader is a `COPIES_UNREALIZED_INPUT` op that reads it through a view
    (another shape) it is never stored, and each reader realises a copy of the view (the
    stride constraint on its input copies a view of an unrealised value), all written by one
    kernel; read whole (a scale's reciprocal), it is stored once. torchao casts attention's
    normed input once for each of wq, wk and wv, and the CSE takes the three for one; Inductor
    writes three copies, from one read (its recipe reads four buffers: the block input, the
    norm weight, the row statistics, the scale), where the FFN's input cast reads five and is
    stored once."""
    eager_storages, transient = frozenset(eager_storages), frozenset(transient)
    if not any(_pointwise_value(events[i], eager_storages, transient) for i in repeated):
        return set()  # no repeated value to keep: spare the run a second pass of rule 4
    kept_run = [i for i in run if i not in repeated]
    merged = {i: renamed_storages(events[i], alias) for i in kept_run}
    readers = _readers(merged, kept_run)
    inlined = _inlined(merged, kept_run, eager_storages, transient, readers)
    inlined_by = {u: j for j in inlined for u in written_storages(merged[j])}
    copied: set[int] = set()  # the storages of the values realised once per reader
    for i in kept_run:
        e = merged[i]
        if i in inlined or not _pointwise_value(e, eager_storages, transient):
            continue
        outs = written_storages(e)
        value_readers = {r for u in outs for r in readers[u]}
        _, reads = _recipe(i, e, inlined, inlined_by)
        shapes = {u: t[0] for u, t in zip(e.flows, e.tensors, strict=True) if t[2]}
        if (
            len(value_readers) > 1
            and len(reads) <= REALIZE_READS_THRESHOLD
            and all(
                merged[r].aten in COPIES_UNREALIZED_INPUT
                and all(
                    t[0] != shapes[u]
                    for u, t in zip(merged[r].flows, merged[r].tensors, strict=True)
                    if u in outs and not t[2]
                )
                for r in value_readers
            )
        ):
            copied |= outs
    return {i for i in repeated if {alias.get(u) for u in written_storages(events[i])} & copied}


def _nodes(
    events: Sequence[OpEvent],
    run: list[int],
    eager_storages: frozenset[int],
    transient: frozenset[int],
) -> list[Node]:
    """The run's nodes in program order (its rows less the inlined ones), with their data
    dependences. `transient`: storages allocated and freed within the run's span."""
    inlined = _inlined(events, run, eager_storages, transient, _readers(events, run))
    inlined_by = {u: i for i in inlined for u in written_storages(events[i])}  # storage -> its row
    inlined_outputs = set(inlined_by)
    nodes = []
    for i in run:
        if i in inlined:
            continue
        e = events[i]
        rows, accessed = [i], _accesses(e)
        transposed = set(e.transposed_reads)
        for u in read_storages(e) & inlined_outputs:
            del accessed[u]
        for j in {inlined_by[u] for u in read_storages(e) & inlined_outputs}:
            rows = inlined[j][0] + rows
            for r in inlined[j][0]:
                transposed.update(events[r].transposed_reads)
                for u, nbytes in _accesses(events[r]).items():
                    if u not in inlined_outputs:
                        accessed[u] = max(accessed.get(u, 0), nbytes)
        outs = [math.prod(t[0]) for t in e.tensors if t[2]] or [0]
        ins = [math.prod(t[0]) for t in e.tensors if not t[2]] or [0]
        reduction = e.name == "reduction"
        writes = written_storages(e)
        eager = accumulates_gradient(e, eager_storages)
        nodes.append(
            Node(
                row=i,
                rows=sorted(set(rows)),
                fusible=e.name in FUSIBLE and not eager,
                eager=eager,
                reads=set(accessed) - writes | (set(accessed) & read_storages(e)),
                writes=writes,
                accessed=accessed,
                transposed=transposed & set(accessed),
                numel=max(ins) if reduction else max(outs),
                out_numel=max(outs),
                reduction=reduction,
                row_reduction=reduction and _reduces_rows(e),
            )
        )
    last_writer: dict[int, int] = {}
    readers: dict[int, list[int]] = defaultdict(list)
    for j, n in enumerate(nodes):
        n.ranges = _split_ranges(nodes, last_writer, n) or (n.out_numel, n.numel)
        for u in n.reads:
            if u in last_writer:
                nodes[last_writer[u]].succ.add(j)
            readers[u].append(j)
        for u in n.writes:
            if u in last_writer:
                nodes[last_writer[u]].succ.add(j)  # write after write
            for r in readers.pop(u, ()):
                if r != j:
                    nodes[r].succ.add(j)  # write after read (an in-place op)
            last_writer[u] = j
    return nodes


def _split_ranges(
    nodes: list[Node], last_writer: dict[int, int], n: Node
) -> tuple[int, int] | None:
    """The ranges Inductor splits a reduction to one element along, when it takes them from a
    row reduction (`Reduction.num_splits` with `extract_input_node_reduction_ranges`): the
    reduction reads a value it inlines (rule 4), and the nearest reductions its recipe reads,
    through stored pointwise values, all run one loop over its elements to more than one
    output (a norm's row statistics). Then its partial reduction runs that loop, and the two
    fuse: a tensorwise fp8 amax of a normed input is one kernel with the norm's row
    statistics. Otherwise (a weight's amax, an attention output's) it splits by a size of its
    own."""
    if not (
        n.reduction and n.out_numel == 1 and n.numel > SPLIT_REDUCTION_NUMEL and len(n.rows) > 1
    ):
        return None
    level, seen = set(n.reads), set()
    while level:
        seen |= level
        found, upstream = set(), set()
        for u in level:
            if u not in last_writer:
                continue
            w = nodes[last_writer[u]]
            if w.reduction:
                found.add((w.out_numel, w.numel))
            elif w.fusible:
                upstream |= w.reads
        if len(found) > 1:  # reductions over other ranges: Inductor takes none of them
            return None
        if found:
            ((out_numel, numel),) = found
            return (out_numel, numel) if numel == n.numel and out_numel > 1 else None
        level = upstream - seen
    return None


def _scheduler_nodes(e: OpEvent, n: Node) -> int:
    """How many of Inductor's scheduler nodes `n` stands for, as its node order counts them: a
    large reduction to one value is two (split); an extern op other than a GEMM is a fallback
    kernel and a MultiOutput node per output; eager code is not in the graph."""
    if n.eager:
        return 0
    if n.reduction and n.out_numel == 1 and n.numel > SPLIT_REDUCTION_NUMEL:
        return 2
    if not n.fusible and e.name not in GEMM_OPS:
        return 1 + sum(1 for t in e.tensors if t[2])
    return 1


def graph_order(events: Sequence[OpEvent], nodes: list[Node]) -> list[int]:
    """Each node's position in its graph as AOTAutograd orders a backward graph
    (`reordering_to_mimic_autograd_engine`): a recomputed node just before the first backward
    node that needs it, the rest in program order; counted in Inductor's scheduler nodes
    (`_scheduler_nodes`). Eagerly the checkpoint reruns its forward before the backward
    starts; the compiled graph computes each recomputed value where it is first needed."""
    first_use = list(range(len(nodes)))
    for j in reversed(range(len(nodes))):
        if events[nodes[j].row].phase == _RECOMPUTE:
            first_use[j] = min((first_use[s] for s in nodes[j].succ), default=j)
    ranked = sorted(
        range(len(nodes)),
        key=lambda j: (first_use[j], events[nodes[j].row].phase != _RECOMPUTE, j),
    )
    position, at = [0] * len(nodes), 0
    for j in ranked:
        position[j] = at
        at += _scheduler_nodes(events[nodes[j].row], nodes[j])
    return position


class Fusion:
    """Inductor's scheduler over one run's nodes: groups of fusible nodes, merged pairwise
    while no cycle forms through another node (rule 5). `order`: each node's position in the
    graph (`graph_order`; program order when not given)."""

    def __init__(self, nodes: list[Node], order: list[int] | None = None):
        self.nodes = nodes
        self.order = order if order is not None else list(range(len(nodes)))
        self.group = list(range(len(nodes)))
        self.members = {j: [j] for j in range(len(nodes))}
        self.bits = {j: 1 << j for j in range(len(nodes))}
        self.reach = [0] * len(nodes)  # bit set of the nodes each node reaches, itself too
        for j in reversed(range(len(nodes))):
            self.reach[j] = 1 << j
            for s in nodes[j].succ:
                self.reach[j] |= self.reach[s]

    def _compatible(self, members: list[int]) -> bool:
        """Rule 6: one iteration range, or a reduction's input and output ranges; nothing over
        the input's range after a reduction that is not over rows."""
        nodes = [self.nodes[m] for m in members]
        reductions = {n.ranges for n in nodes if n.reduction}
        if len(reductions) > 1:
            return False
        if not reductions:
            return len({n.numel for n in nodes}) == 1
        ((out, inp),) = reductions
        if any(n.numel not in (out, inp) for n in nodes if not n.reduction):
            return False
        inside = set(members)
        after: set[int] = set()  # members that read a non-row reduction's result
        stack = [m for m in members if self.nodes[m].reduction and not self.nodes[m].row_reduction]
        while stack:
            for s in self.nodes[stack.pop()].succ:
                if s in inside and s not in after:
                    after.add(s)
                    stack.append(s)
        return all(self.nodes[m].numel == out for m in after if not self.nodes[m].reduction) and (
            not any(self.nodes[m].reduction for m in after)
        )

    def depend(self, i: int, j: int) -> bool:
        """Whether the groups of nodes i and j depend on each other (a path from one to the
        other), as a vertical fusion's nodes do."""
        a, b = self.group[i], self.group[j]
        reach_a = reach_b = 0
        for m in self.members[a]:
            reach_a |= self.reach[m]
        for m in self.members[b]:
            reach_b |= self.reach[m]
        return bool(reach_a & self.bits[b] or reach_b & self.bits[a])

    def distance(self, i: int, j: int) -> int:
        """How far apart the groups of nodes i and j lie in the graph (Inductor's proximity:
        from either group's first node to the other's last)."""
        a = [self.order[m] for m in self.members[self.group[i]]]
        b = [self.order[m] for m in self.members[self.group[j]]]
        return max(abs(min(a) - max(b)), abs(min(b) - max(a)))

    def _creates_cycle(self, a: int, b: int) -> bool:
        for src, dst in ((a, b), (b, a)):
            for m in self.members[src]:
                for s in self.nodes[m].succ:
                    if self.group[s] not in (a, b) and self.reach[s] & self.bits[dst]:
                        return True
        return False

    def try_merge(self, i: int, j: int) -> bool:
        a, b = self.group[i], self.group[j]
        if a == b:
            return False
        merged = self.members[a] + self.members[b]
        if len(merged) > MAX_FUSION_SIZE or not self._compatible(merged):
            return False
        if self._creates_cycle(a, b):
            return False
        for m in self.members[b]:
            self.group[m] = a
        self.members[a] = sorted(merged)
        del self.members[b]
        self.bits[a] |= self.bits.pop(b)
        reached = 0
        for m in merged:
            reached |= self.reach[m]
        for n in range(len(self.nodes)):
            if self.reach[n] & self.bits[a]:
                self.reach[n] |= reached
        return True


def fused_groups(
    events: Sequence[OpEvent],
    run: list[int],
    eager_storages: Iterable[int] = (),
    transient: Iterable[int] = (),
) -> tuple[list[Node], list[list[int]]]:
    """(the run's nodes, the groups of node indices Inductor's scheduler would make of them:
    every node in exactly one group, extern and unfused nodes alone). `transient`: storages
    allocated and freed within the run's span."""
    nodes = _nodes(events, run, frozenset(eager_storages), frozenset(transient))
    # a storage read through its transpose and one read in order share no index: Inductor's
    # memory score counts neither (rule 5)
    accessors: dict[tuple[int, bool], list[int]] = defaultdict(list)
    for j, n in enumerate(nodes):
        if n.fusible:
            for u in n.accessed:
                accessors[u, u in n.transposed].append(j)
    scores: dict[tuple[int, int], int] = defaultdict(int)
    for (u, _), js in accessors.items():
        for x in range(len(js)):
            for y in range(x + 1, len(js)):
                i, j = js[x], js[y]
                scores[i, j] += max(nodes[i].accessed[u], nodes[j].accessed[u])
    fusion = Fusion(nodes, graph_order(events, nodes))
    for _ in range(MAX_FUSION_ROUNDS):
        # InductorChoices.score_fusion, as each round's candidates are sorted: two reductions
        # or two pointwise kernels first (a fused kernel is a reduction when one of its nodes
        # is), then the bytes the two share, then the pair nearer in the graph (its proximity
        # score; rule 5)
        reduces = {g: any(nodes[m].reduction for m in ms) for g, ms in fusion.members.items()}
        pairs = sorted(
            scores,
            key=lambda p: (
                reduces[fusion.group[p[0]]] != reduces[fusion.group[p[1]]],
                -scores[p],
                fusion.distance(*p),
                p,
            ),
        )
        # a pair that shares enough and lies near enough needs no walk of the dependences
        merged = [
            fusion.try_merge(i, j)
            for i, j in pairs
            if (
                scores[i, j] >= SCORE_FUSION_MEMORY_THRESHOLD
                and fusion.distance(i, j) <= MAX_HORIZONTAL_DISTANCE
            )
            or fusion.depend(i, j)
        ]
        if not any(merged):
            break
    return nodes, [fusion.members[g] for g in sorted(fusion.members)]


def schedule(nodes: list[Node], groups: list[list[int]]) -> tuple[list[int], list[int]]:
    """(the groups in a topological order, each as early as the data allows in program order
    of its first row, gradient accumulations last: extern kernels that do not read a fused
    kernel's output move ahead of it; the group of each node)."""
    group_of = [0] * len(nodes)
    for g, members in enumerate(groups):
        for j in members:
            group_of[j] = g
    successors: list[set[int]] = [set() for _ in groups]
    for j, n in enumerate(nodes):
        successors[group_of[j]].update(group_of[s] for s in n.succ if group_of[s] != group_of[j])
    waiting = [0] * len(groups)
    for after in successors:
        for g in after:
            waiting[g] += 1
    # eager gradient accumulations once the graph's kernels are done, the rest in program order
    keys = [
        (any(nodes[j].eager for j in members), min(r for j in members for r in nodes[j].rows))
        for members in groups
    ]
    ready = [(keys[g], g) for g in range(len(groups)) if not waiting[g]]
    heapq.heapify(ready)
    order = []
    while ready:
        _, g = heapq.heappop(ready)
        order.append(g)
        for s in successors[g]:
            waiting[s] -= 1
            if not waiting[s]:
                heapq.heappush(ready, (keys[s], s))
    if len(order) != len(groups):
        raise AssertionError("compile fusion formed a cycle")  # Fusion refuses those merges
    return order, group_of
