"""A collective is waited where the program first uses its output, and the replay honours it.

Tensor-parallel collectives sit on the critical path (the residual add reads the row-parallel
reduce-scatter, the next GEMMs read the sequence-parallel all-gather: Korthikanti et al. 2022);
work that does not read a collective's output (FSDP2's prefetched all-gathers) still overlaps.
These capture small jobs, build their execution graph and replay it on the H100 preset.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from emulator.capture.rank import capture_rank
from emulator.capture.trace import COMM, COMPUTE
from emulator.costs.collectives import collective_time_s
from emulator.costs.pricing import CostContext
from emulator.graph.build import build_graph
from emulator.graph.execution_graph import COLLECTIVE, SEGMENT
from emulator.graph.replay import replay
from emulator.world.comm_events import CommEvent, current_recorder
from prismbench.capture import capture_job, world_of
from prismbench.emulate import kernel_gap_for, kernel_table_for, topology_of
from prismbench.program import rank_program
from tests.prismbench.capture_cases import debug_job


def _replayed(job, traces):
    # priced as `emulate` prices (the table, the stream's idle time between kernels), no host
    cost = CostContext(
        topology=topology_of(job),
        table=kernel_table_for(job.cluster.gpu),
        kernel_gap_s=kernel_gap_for(),
    )
    graph = build_graph(traces, world_of(job), cost)
    return graph, replay(graph)


def _comm_times_s(job, trace) -> list[float]:
    """Each collective of the trace priced on its own, from its row alone."""
    c, groups, topology = trace.columns, trace.groups(), topology_of(job)
    return [
        collective_time_s(
            trace.strings[c["name"][row]],
            float(c["size_bytes"][row]),
            groups[trace.strings[c["group"][row]]],
            topology,
        )
        for row in np.flatnonzero(c["kind"] == COMM)
    ]


@pytest.mark.integration
@pytest.mark.parametrize("sequence_parallel", [True, False], ids=["sp", "no-sp"])
def test_every_tp_collective_is_exposed_when_nothing_else_can_run(tmp_path, sequence_parallel):
    # tp=2 alone: each collective's output is read by the next op, so the iteration is the
    # compute plus every collective, one after the other
    job = debug_job({"tp": 2, "sequence_parallel": sequence_parallel}, seq_len=128)
    trace = capture_job(job, workers=1, cache_dir=tmp_path).traces[0]
    tp_s = sum(_comm_times_s(job, trace))
    _, result = _replayed(job, {0: trace})
    figures = result.per_class[0]
    assert tp_s > 0
    assert figures.comm_s_by_group == {"tp": pytest.approx(tp_s)}
    assert figures.exposed_comm_s == pytest.approx(tp_s)
    assert result.iteration_time_s == pytest.approx(figures.compute_s + tp_s)
    on_path = [e for e in result.critical_path if e.kind == "collective"]
    assert len(on_path) == int((trace["kind"] == COMM).sum())
    assert sum(e.duration_s for e in on_path) == pytest.approx(tp_s)


@pytest.mark.integration
def test_fsdp_still_hides_its_prefetched_all_gathers(tmp_path):
    job = debug_job({"dp": 2, "zero": 3}, seq_len=128)
    trace = capture_job(job, workers=1, cache_dir=tmp_path).traces[0]
    graph, result = _replayed(job, {0: trace})
    g, timeline = graph.classes[0], result.timelines[0]
    gathers = np.flatnonzero((g["kind"] == COLLECTIVE) & (np.array(g.text("name")) == "all_gather"))
    compute = np.flatnonzero((g["kind"] == SEGMENT) & (g["stream"] == g.streams.index("compute 0")))
    busy = list(zip(timeline.start_s[compute], timeline.end_s[compute], strict=True))
    hidden = [
        sum(max(0.0, min(e, end) - max(s, start)) for s, e in busy) / (end - start)
        for start, end in zip(timeline.start_s[gathers], timeline.end_s[gathers], strict=True)
    ]
    # FSDP2 all-gathers a block's parameters on its own stream while the block before it (in
    # forward; after it, in backward) computes: in each pass all but the first two are hidden
    # (the root unit's has nothing before it, the first block's only the embedding or the
    # output layer). The step's first all-gather is fully exposed.
    passes: dict[tuple[int, int], list[float]] = {}
    for n, h in zip(gathers, hidden, strict=True):
        passes.setdefault((int(g["phase"][n]), int(g["micro_batch"][n])), []).append(h)
    assert len(passes) == 2 * job.num_microbatches
    assert all(len(h) >= job.model.layers for h in passes.values())
    assert min(h for per_pass in passes.values() for h in per_pass[2:]) > 0.99
    assert hidden[0] < 0.01
    assert result.per_class[0].exposed_comm_s < 0.5 * g["duration_s"][gathers].sum()


class _Reads(TorchDispatchMode):
    """Which compute events read a storage that a functional collective wrote (a test probe
    above the op recorder: it sees each op, then the events the recorders appended for it)."""

    def __init__(self, op_events: list):
        super().__init__()
        self.op_events = op_events
        self.writer: dict[int, int] = {}  # id(storage) -> seq of the collective that wrote it
        self.storages: list = []  # keeps ids from being reused
        self.reads: list[tuple[int, int]] = []  # (compute seq, collective seq)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(t not in (torch.Tensor, FakeTensor) for t in types):
            return NotImplemented  # DTensor and AsyncCollectiveTensor unwrap first
        comm = current_recorder()
        n_ops, n_comm = len(self.op_events), len(comm.events)
        out = func(*args, **(kwargs or {}))
        issued = [e.seq for e in comm.events[n_comm:] if isinstance(e, CommEvent)]
        if issued and func.namespace == "_c10d_functional":
            for t in tree_leaves(out):
                self.storages.append(t.untyped_storage())
                self.writer[id(self.storages[-1])] = issued[-1]
        read = {
            self.writer[id(t.untyped_storage())]
            for t in tree_leaves((args, kwargs))
            if isinstance(t, torch.Tensor) and id(t.untyped_storage()) in self.writer
        }
        for event in self.op_events[n_ops:]:
            if event.kind == COMPUTE:
                self.reads += [(event.seq, comm_seq) for comm_seq in read]
        return out


def _captured_with_reads(job):
    """The trace of rank 0 and the (compute seq, collective seq) pairs of its data flow."""
    program = rank_program(job)
    probe: list[_Reads] = []

    def step(state, phase):
        probe.append(_Reads(phase.__self__.events))  # phase is the op recorder's method
        with probe[0]:
            program.step(state, phase)

    trace = capture_rank(0, job.world_size, dataclasses.replace(program, step=step))
    return trace, probe[0].reads


def _node_of_rows(g, trace) -> dict[int, int]:
    """Trace row -> graph node, for compute rows (their segment) and comm rows."""
    c = trace.columns
    node_of = {}
    for n in np.flatnonzero(g["kind"] == SEGMENT):
        stream = int(g.streams[g["stream"][n]].removeprefix("compute "))
        rows = np.flatnonzero((c["kind"] == COMPUTE) & (c["stream"] == stream))
        first = int(np.searchsorted(rows, g["first_row"][n]))
        node_of |= dict.fromkeys(rows[first : first + g["rows"][n]].tolist(), int(n))
    for n in np.flatnonzero(g["kind"] == COLLECTIVE):
        node_of[int(g["first_row"][n])] = int(n)
    return node_of


@pytest.mark.integration
@pytest.mark.parametrize("sequence_parallel", [True, False], ids=["sp", "no-sp"])
def test_no_op_reading_a_collective_output_starts_before_the_collective_ends(sequence_parallel):
    job = debug_job({"tp": 2, "sequence_parallel": sequence_parallel}, seq_len=128)
    trace, reads = _captured_with_reads(job)
    graph, result = _replayed(job, {0: trace})
    row_of_seq = {int(s): r for r, s in enumerate(trace["seq"].tolist())}
    node_of = _node_of_rows(graph.classes[0], trace)
    timeline = result.timelines[0]
    forward_collectives = 4 if sequence_parallel else 2  # per layer (Korthikanti et al. 2022)
    assert len({comm for _, comm in reads}) >= forward_collectives * job.model.layers
    early = [
        (compute, comm)
        for compute, comm in reads
        if timeline.start_s[node_of[row_of_seq[compute]]]
        < timeline.end_s[node_of[row_of_seq[comm]]] - 1e-15
    ]
    assert early == []
