"""Test helper: RankTraces of one pipeline stage written as a short program.

    s = Stage(world, pp=0)
    s.compute(1.0)                             # 1 s of compute on stream 0
    h = s.collective("all_reduce", "dp", async_op=True)
    s.compute(2.0, phase="backward")
    s.wait(h)
    s.send(to_pp=1); s.recv(from_pp=1)
    graph = build(world, [s, ...])              # explicit compute durations, free comm by default

Groups are the representative's mesh groups (`world.group_of`), named by their axes.
"""

from __future__ import annotations

import numpy as np

from emulator.capture.trace import COMPUTE, PHASES, OpEvent, build_trace
from emulator.graph.build import build_graph
from emulator.graph.execution_graph import COLLECTIVE
from emulator.world.comm_events import CommEvent, WaitEvent


class Stage:
    def __init__(self, world, pp: int):
        self.world, self.pp = world, pp
        self.rep = world.representative(pp)
        self.ops, self.comms, self.groups, self.durations = [], [], {}, {}
        self.dispatch: dict[int, float] = {}  # seq -> host seconds issuing it (build(host=True))
        self.seq = 0
        self.mb = -1
        self.phase = "forward"

    def _next(self) -> int:
        self.seq += 1
        return self.seq

    def compute(
        self,
        duration_s: float,
        *,
        name="mm",
        stream=0,
        phase=None,
        mb=None,
        flops=0,
        tensors=(),
        dispatch_s=0.0,
        module="",
        causal=False,
        read_bytes=0,
        write_bytes=0,
    ):
        phase = self.phase if phase is None else phase
        seq = self._next()
        self.dispatch[seq] = dispatch_s
        self.ops.append(
            OpEvent(
                seq,
                COMPUTE,
                name,
                f"aten.{name}",
                stream,
                module,
                PHASES.index(phase),
                self.mb if mb is None else mb,
                flops=flops,
                read_bytes=read_bytes,
                write_bytes=write_bytes,
                tensors=tensors,
                causal=causal,
            )
        )
        self.durations[seq] = duration_s
        return seq

    def collective(
        self,
        kind: str,
        axis,
        *,
        duration_s=0.0,
        nbytes=1 << 20,
        async_op=False,
        ranks=None,
        dispatch_s=0.0,
        op="SUM",
        dtype="bfloat16",
    ) -> int:
        ranks = self.world.group_of(self.rep, axis) if ranks is None else np.asarray(ranks)
        gid = "pg:" + ("+".join(axis) if not isinstance(axis, str) else axis)
        self.groups[gid] = ranks
        seq = self._next()
        self.dispatch[seq] = dispatch_s
        self.comms.append(
            CommEvent(
                seq=seq,
                kind=kind,
                group_id=gid,
                group_size=len(ranks),
                op=op,
                dtype=dtype,
                numel=nbytes // 2,
                nbytes=nbytes,
                async_op=async_op,
            )
        )
        self.durations[seq] = duration_s
        if not async_op:  # torch waits on blocking calls itself (virtual_pg docstring)
            self.wait(seq)
        return seq

    def wait(self, comm_seq: int) -> None:
        self.comms.append(WaitEvent(seq=self._next(), comm_seq=comm_seq))

    def _p2p(self, kind: str, other_pp: int, nbytes: int, wait: bool) -> int:
        peer = self.world.representative(other_pp)
        gid = f"p2p:{min(self.pp, other_pp)}-{max(self.pp, other_pp)}"
        self.groups[gid] = np.array(sorted((self.rep, peer)))
        seq = self._next()
        self.comms.append(
            CommEvent(
                seq=seq,
                kind=kind,
                group_id=gid,
                group_size=2,
                op=None,
                dtype="bfloat16",
                numel=nbytes // 2,
                nbytes=nbytes,
                async_op=True,
                peer=peer,
            )
        )
        if wait:
            self.wait(seq)
        return seq

    def send(self, to_pp: int, *, nbytes: int = 1 << 20, wait=False) -> int:
        return self._p2p("send", to_pp, nbytes, wait)

    def recv(self, from_pp: int, *, nbytes: int = 1 << 20, wait=True) -> int:
        return self._p2p("recv", from_pp, nbytes, wait)

    def trace(self):
        trace = build_trace(op_events=self.ops, comm_events=self.comms, groups=self.groups)
        seqs = trace["seq"].tolist()
        return trace, np.array([self.durations.get(s, 0.0) for s in seqs])


def build(world, stages, cost=None, *, temporal_cv=0.0, host=False):
    """ExecutionGraph from Stage programs (one per pp index) with their explicit durations.

    Collectives get the `duration_s` they were written with unless `cost` prices them; every
    compute op's duration has a standard deviation of `temporal_cv` x its duration. host=True:
    the host issues each op in the `dispatch_s` it was written with."""
    traces, durations, dispatch = {}, {}, {}
    for s in stages:
        traces[s.pp], durations[s.pp] = s.trace()
        seqs = traces[s.pp]["seq"].tolist()
        dispatch[s.pp] = np.array([s.dispatch.get(q, 0.0) for q in seqs])
    spreads = {p: temporal_cv * d for p, d in durations.items()}
    graph = build_graph(
        traces,
        world,
        cost,
        durations_s=durations,
        spreads_s=spreads,
        dispatch_s=dispatch if host else None,
    )
    if cost is None:
        for g in graph.classes:
            comm = g["kind"] == COLLECTIVE
            g["duration_s"][comm] = durations[g.pp][g["first_row"][comm]]
    return graph


def node_of(graph, pp: int, stage: Stage, seq: int) -> int:
    """Graph node of class pp holding the trace event `seq`."""
    trace, _ = stage.trace()
    row = int(np.flatnonzero(trace["seq"] == seq)[0])
    g = graph.classes[pp]
    return int(np.flatnonzero(g["first_row"] <= row)[-1])


def pipeline(world, m: int, f: float, b: float, schedule: str, *, optimizer_s=0.0):
    """Stages running `schedule` ("gpipe", "1f1b", "interleaved") over m micro-batches.

    fwd/bwd of a whole stage take f/b; with vpp = v each chunk takes f/v, b/v. Interleaved is
    Megatron-LM's order (schedules.py, forward_backward_pipelining_with_interleaving):
    k-th forward runs chunk (k // p) % v of micro-batch (k // (p v)) p + k % p, backwards run
    the chunks in reverse, warm-up = 2 (p - r - 1) + (v - 1) p."""
    p, v = world.pp, world.vpp
    stages = []
    for r in range(p):
        st = Stage(world, r)
        if schedule == "interleaved":
            _interleaved(st, m, f / v, b / v)
        else:
            warmup = m if schedule == "gpipe" else min(p - r - 1, m)
            for i in range(warmup):
                _fwd(st, i, f, vs=r, last=p - 1)
            for i in range(m - warmup):
                _fwd(st, warmup + i, f, vs=r, last=p - 1)
                _bwd(st, i, b, vs=r, last=p - 1)
            for i in range(m - warmup, m):
                _bwd(st, i, b, vs=r, last=p - 1)
        st.compute(optimizer_s, phase="optimizer", mb=-1)
        stages.append(st)
    return stages


def _fwd(st, mb, f, *, vs, last):
    p = st.world.pp
    if vs > 0:
        st.recv((st.pp - 1) % p)
    st.compute(f, phase="forward", mb=mb)
    if vs < last:
        st.send((st.pp + 1) % p)


def _bwd(st, mb, b, *, vs, last):
    p = st.world.pp
    if vs < last:
        st.recv((st.pp + 1) % p)
    st.compute(b, phase="backward", mb=mb)
    if vs > 0:
        st.send((st.pp - 1) % p)


def _interleaved(st, m, f, b):
    p, v, r = st.world.pp, st.world.vpp, st.pp
    total = m * v
    warmup = min(2 * (p - r - 1) + (v - 1) * p, total)

    def chunk_mb(k, backward):
        j = (k // p) % v
        return (v - 1 - j if backward else j), (k // (p * v)) * p + k % p

    def run(k, backward):
        j, mb = chunk_mb(k, backward)
        (_bwd if backward else _fwd)(st, mb, b if backward else f, vs=j * p + r, last=p * v - 1)

    for k in range(warmup):
        run(k, False)
    for i in range(total - warmup):
        run(warmup + i, False)
        run(i, True)
    for k in range(total - warmup, total):
        run(k, True)
