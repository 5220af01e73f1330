"""Tests for emulator.world.collectives: the one table every stage reads a collective from."""

import ast
from pathlib import Path

import numpy as np
import pytest

from emulator.costs.collectives import Topology, bus_bandwidth_factor, collective_time_s
from emulator.costs.pricing import CostContext
from emulator.graph.execution_graph import COLLECTIVE, RECV, SEND
from emulator.hardware import gpu_preset, inter_node_network, intra_node_link
from emulator.world import collectives
from emulator.world.collectives import (
    RECORDED_KINDS,
    TABLE,
    Collective,
    all_to_all_kind,
    collective,
)
from emulator.world.mesh import World
from tests.emulator.synthetic_traces import Stage, build

ROOT = Path(__file__).resolve().parents[3]
TOPO = Topology(
    gpu=gpu_preset("h100-sxm-80g"),
    gpus_per_node=8,
    link=intra_node_link("nvlink4"),
    network=inter_node_network("ib-ndr-8x400"),
)


def kinds_recorded_in(path: Path) -> set[str]:
    """String kinds passed first to a `.record(...)` call (the virtual world's recording API)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "record" and node.args:
            kind = node.args[0]
            for value in (kind.body, kind.orelse) if isinstance(kind, ast.IfExp) else (kind,):
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    found.add(value.value)
    return found


@pytest.mark.parametrize("module", ["virtual_pg.py", "fake_collectives.py"])
def test_every_kind_the_virtual_world_records_has_a_row(module):
    recorded = kinds_recorded_in(ROOT / "emulator" / "world" / module)
    assert recorded, "the recording calls were not found: update this test"
    assert recorded - RECORDED_KINDS == set()


@pytest.mark.parametrize("kind", sorted(k for k in RECORDED_KINDS if TABLE[k].joins == "group"))
def test_every_group_collective_is_priced_and_joined_by_the_graph(kind):
    ranks = np.arange(8)
    assert collective_time_s(collective(kind).cost_kind, 1 << 20, ranks, TOPO) > 0
    world = World.grid(dp=1, pp=1, cp=1, tp=8)
    stage = Stage(world, 0)
    stage.collective(kind, "tp", nbytes=1 << 20)
    graph = build(world, [stage], CostContext(topology=TOPO)).classes[0]
    assert graph["kind"][0] == COLLECTIVE  # then the wait of the blocking call
    assert graph["duration_s"][0] > 0


def test_peer_kinds_become_send_and_recv_nodes_priced_as_send_recv():
    world = World.grid(dp=1, pp=2, cp=1, tp=1)
    first, second = Stage(world, 0), Stage(world, 1)
    first.send(1)
    second.recv(0)
    graph = build(world, [first, second], CostContext(topology=TOPO))
    assert graph.classes[0]["kind"][0] == SEND and graph.classes[1]["kind"][0] == RECV
    assert {collective(k).cost_kind for k in ("send", "recv")} == {"send_recv"}
    assert graph.classes[0]["duration_s"][0] > 0


def test_an_all_to_all_that_sends_everything_to_one_other_rank_is_a_permutation():
    assert all_to_all_kind([0, 0, 96, 0], rank=1) == "permute"
    assert all_to_all_kind([24, 24, 24, 24], rank=1) == "all_to_all"
    assert all_to_all_kind([0, 96, 0, 0], rank=1) == "all_to_all"  # to itself: a local copy
    assert all_to_all_kind([], rank=0) == "all_to_all"  # no splits given: even


def test_a_permutation_costs_one_transfer_of_the_whole_buffer():
    nbytes = 1 << 30
    node, one_a_node = np.arange(8), np.arange(0, 64, 8)
    for ranks in (node, one_a_node):
        permute = collective_time_s(collective("permute").cost_kind, nbytes, ranks, TOPO)
        send = collective_time_s("send_recv", nbytes, ranks[:2], TOPO)
        even = collective_time_s("all_to_all", nbytes, ranks, TOPO)
        assert permute == pytest.approx(send)
        # an even all_to_all keeps 1/8 at home and spreads the rest: 7/8 of the bytes on the link
        assert permute > even


def test_bus_factors_are_nccl_tests():
    assert bus_bandwidth_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert bus_bandwidth_factor("all_gather", 8) == pytest.approx(7 / 8)
    with pytest.raises(ValueError, match="scatter"):
        bus_bandwidth_factor("scatter", 8)


def test_a_duplicate_or_dangling_row_is_refused():
    row = Collective(kind="all_reduce", bus_factor=lambda n: 1.0, nccl="tuned")
    with pytest.raises(ValueError, match="two rows"):
        collectives._index((row, row))
    with pytest.raises(ValueError, match="not a cost kind"):
        collectives._index((Collective(kind="gather", priced_as="all_gather"),))
    with pytest.raises(ValueError, match="not known"):
        collective("all_reduce_scatter")
