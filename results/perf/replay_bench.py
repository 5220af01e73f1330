"""Replay speed on synthetic 405B-like jobs; writes results/perf/replay.md.

Synthetic class traces (16 pipeline stages, 1F1B, 8 layers per stage): per layer and
micro-batch, FWD_OPS compute ops (one GEMM in five, the rest memory-bound) around two
blocking sequence-parallel tp collectives, BWD_OPS compute ops around three, and in the last
micro-batch an async dp reduce-scatter per layer waited before the optimizer step. Durations
are modelled (h100-sxm-80g, nvlink4, ib-ndr-8x400). Run: python results/perf/replay_bench.py
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from emulator.capture.trace import COMPUTE, OpEvent, build_trace
from emulator.costs.collectives import Topology
from emulator.costs.pricing import CostContext
from emulator.graph.build import build_graph
from emulator.graph.replay import replay
from emulator.hardware import gpu_preset, inter_node_network, intra_node_link
from emulator.world.comm_events import CommEvent, WaitEvent
from emulator.world.mesh import World

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # results/: shared_gpu
from shared_gpu import commit_label  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # results/perf/: machine
from machine import machine_line  # noqa: E402

PP, TP, LAYERS = 16, 8, 8
FWD_OPS, BWD_OPS = 100, 200
TOPO = Topology(
    gpu=gpu_preset("h100-sxm-80g"),
    gpus_per_node=8,
    link=intra_node_link("nvlink4"),
    network=inter_node_network("ib-ndr-8x400"),
)
_GEMM = (((4096, 16384), "bfloat16", False), ((16384, 2048), "bfloat16", False))


class _Program:
    def __init__(self, world: World, pp: int):
        self.world, self.pp, self.rep = world, pp, world.representative(pp)
        self.ops, self.comms, self.groups, self.seq = [], [], {}, 0

    def next(self) -> int:
        self.seq += 1
        return self.seq

    def compute(self, n: int, phase: int, mb: int) -> None:
        for j in range(n):
            gemm = j % 5 == 0
            self.ops.append(
                OpEvent(self.next(), COMPUTE, "mm" if gemm else "elementwise",
                        "aten.mm" if gemm else "aten.add", 0, "layer", phase, mb,
                        flops=2 * 4096 * 16384 * 2048 if gemm else 0,
                        read_bytes=1 << 24, write_bytes=1 << 24, tensors=_GEMM if gemm else ())
            )  # fmt: skip

    def comm(self, kind: str, axis, nbytes: int, async_op=False, peer=None) -> int:
        ranks = (
            self.world.group_of(self.rep, axis)
            if peer is None
            else np.array(sorted((self.rep, peer)))
        )
        gid = (
            f"{kind}:{axis}" if peer is None else f"p2p:{min(self.rep, peer)}-{max(self.rep, peer)}"
        )
        self.groups[gid] = ranks
        seq = self.next()
        self.comms.append(
            CommEvent(seq=seq, kind=kind, group_id=gid, group_size=len(ranks), op=None,
                      dtype="bfloat16", numel=nbytes // 2, nbytes=nbytes, async_op=async_op,
                      peer=peer)
        )  # fmt: skip
        if not async_op:
            self.wait(seq)
        return seq

    def wait(self, seq: int) -> None:
        self.comms.append(WaitEvent(seq=self.next(), comm_seq=seq))


def _stage_trace(world: World, pp: int, m: int):
    p = _Program(world, pp)
    stride = world.size("cp") * world.size("tp")
    act = 2 * 4096 * 16384

    def fwd(mb):
        if pp > 0:
            p.comm("recv", None, act, async_op=False, peer=p.rep - stride)
        for _ in range(LAYERS):
            p.compute(FWD_OPS // 3, 0, mb)
            p.comm("all_gather", "tp", act)
            p.compute(FWD_OPS // 3, 0, mb)
            p.comm("reduce_scatter", "tp", act)
            p.compute(FWD_OPS - 2 * (FWD_OPS // 3), 0, mb)
        if pp < PP - 1:
            p.comm("send", None, act, async_op=True, peer=p.rep + stride)

    def bwd(mb, last):
        if pp < PP - 1:
            p.comm("recv", None, act, async_op=False, peer=p.rep + stride)
        pending = []
        for _ in range(LAYERS):
            for kind in ("all_gather", "reduce_scatter", "all_gather"):
                p.compute(BWD_OPS // 3, 1, mb)
                p.comm(kind, "tp", act)
            if last:
                pending.append(p.comm("reduce_scatter", "dp", 1 << 28, async_op=True))
        if pp > 0:
            p.comm("send", None, act, async_op=True, peer=p.rep - stride)
        return pending

    warmup = min(PP - pp - 1, m)
    order = [("f", i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [("f", warmup + i), ("b", i)]
    order += [("b", i) for i in range(m - warmup, m)]
    pending = []
    for kind, mb in order:
        if kind == "f":
            fwd(mb)
        else:
            pending += bwd(mb, mb == m - 1)
    for seq in pending:
        p.wait(seq)
    p.compute(4, 3, -1)
    return build_trace(op_events=p.ops, comm_events=p.comms, groups=p.groups)


def _timed(fn, repeat=3):
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    lines = [
        "# Replay speed (emulator/graph/replay.py)",
        "",
        f"{machine_line()} Generated by `python results/perf/replay_bench.py` "
        f"(best of 3 replays; build is one run) at commit {commit_label()}, {time.strftime('%Y-%m-%d')}.",
        "",
        "## 405B-like job: 16 classes, dp=64, tp=8 (8 192 GPUs), 1F1B, 32 micro-batches",
        "",
    ]
    world = World.grid(dp=64, pp=PP, cp=1, tp=TP)
    t0 = time.perf_counter()
    traces = {p: _stage_trace(world, p, 32) for p in range(PP)}
    t_trace = time.perf_counter() - t0
    events = sum(len(t) for t in traces.values())
    t0 = time.perf_counter()
    graph = build_graph(traces, world, CostContext(topology=TOPO))
    t_build = time.perf_counter() - t0
    t_replay, result = _timed(lambda: replay(graph))
    lines += [
        "| trace events (16 classes) | graph nodes | synth traces s | build_graph s | replay s | iteration s |",
        "|---|---|---|---|---|---|",
        f"| {events} | {graph.nodes} | {t_trace:.1f} | {t_build:.2f} | {t_replay:.3f} | "
        f"{result.iteration_time_s:.3f} |",
        "",
        "## Replay cost vs world size (16 classes, 8 micro-batches; tp=8, dp grows)",
        "",
        "| world | dp | lanes/class | nodes | uniform replay s | per-rank factors replay s |",
        "|---|---|---|---|---|---|",
    ]
    for ws in (1024, 4096, 16384, 65536, 131072):
        dp = ws // (PP * TP)
        world = World.grid(dp=dp, pp=PP, cp=1, tp=TP)
        graph = build_graph(
            {p: _stage_trace(world, p, 8) for p in range(PP)}, world, CostContext(topology=TOPO)
        )
        t_uniform, _ = _timed(lambda g=graph: replay(g))
        factors = np.ones(world.shape)
        factors[0, 0, 0, 0] = 1.2
        t_factors, _ = _timed(lambda g=graph, f=factors: replay(g, speed_factors=f), repeat=1)
        lines.append(
            f"| {ws} | {dp} | {dp * TP} | {graph.nodes} | {t_uniform:.3f} | {t_factors:.2f} |"
        )
        print(lines[-1], flush=True)
    out = Path(__file__).with_name("replay.md")
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
