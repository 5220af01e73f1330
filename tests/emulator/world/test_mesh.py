"""Tests for emulator/world/mesh.py: mesh coordinates, groups, classes and the class claim."""

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from emulator.world.comm_events import Recorder, recording
from emulator.world.mesh import World, normalise_trace
from emulator.world.virtual_world import destroy_virtual_world, init_virtual_world

BIG = World(dp=128, pp=16, cp=8, tp=8)


def test_rank_formula_matches_contract():
    ranks = np.array([0, 1, 8, 64, 1024, 131_071, 70_001])
    c = BIG.coords(ranks)
    assert np.array_equal(((c[:, 0] * 16 + c[:, 1]) * 8 + c[:, 2]) * 8 + c[:, 3], ranks)
    assert np.array_equal(BIG.rank_of(dp=c[:, 0], pp=c[:, 1], cp=c[:, 2], tp=c[:, 3]), ranks)
    assert BIG.rank_of(dp=68, pp=5, cp=6, tp=1) == 70_001


def test_groups_partition_the_world_and_match_group_of():
    for axis in ("dp", "pp", "cp", "tp", ("dp", "cp")):
        g = BIG.groups(axis)
        assert np.array_equal(np.sort(g.ravel()), np.arange(BIG.world_size))
        row = g[np.nonzero(g == 70_001)[0][0]]
        assert np.array_equal(row, BIG.group_of(70_001, axis))
    assert BIG.groups(("cp", "dp")).shape == (16 * 8, 128 * 8)
    assert BIG.group_of(70_001, "pp").tolist() == [68 * 1024 + p * 64 + 49 for p in range(16)]


def test_nodes_and_validation():
    assert BIG.node_of(70_001) == 8750
    assert BIG.node_of([7, 8]).tolist() == [0, 1]
    with pytest.raises(ValueError, match=r"tp\(0\) must be an int >= 1"):
        World(dp=1, pp=1, cp=1, tp=0)
    with pytest.raises(ValueError, match="ranks must be in"):
        BIG.coords([131_072])
    with pytest.raises(ValueError, match="axis"):
        BIG.groups("ep")


def test_classes_are_pipeline_ranks_with_their_virtual_stages():
    w = World(dp=2, pp=4, cp=1, tp=2, vpp=2)
    classes = w.classes()
    assert list(classes) == [0, 1, 2, 3]
    assert classes[1] == (2, 4, (1, 5))
    assert w.class_of(np.arange(16)).tolist() == [0, 0, 1, 1, 2, 2, 3, 3] * 2
    assert w.representative(3) == 6


SMALL = World(dp=4, pp=2, cp=2, tp=2)


class Block(nn.Module):
    def __init__(self, dim: int = 16):
        super().__init__()
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def stage_program_trace(rank: int) -> list[tuple]:
    """A pipeline-stage-shaped program: TP block + FSDP over dp*cp + p2p to neighbours."""
    init_virtual_world(rank, SMALL.world_size)
    try:
        mesh = init_device_mesh("cpu", SMALL.shape, mesh_dim_names=("dp", "pp", "cp", "tp"))
        fsdp_mesh, tp_mesh, pp_group = (
            mesh["dp", "cp"]._flatten("dp_cp"),
            mesh["tp"],
            mesh["pp"].get_group(),
        )
        stage = SMALL.class_of(rank)
        rec = Recorder()
        with recording(rec):
            with torch.device("meta"):
                block = Block()
            parallelize_module(block, tp_mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
            fully_shard(block, mesh=fsdp_mesh)
            with FakeTensorMode(allow_non_fake_inputs=True):
                block.to_empty(device="cpu")
                x = torch.randn(4, 16, requires_grad=True)
                if stage > 0:
                    dist.recv(x, group=pp_group, group_src=stage - 1)
                y = block(x)
                if stage < SMALL.pp - 1:
                    dist.send(y, group=pp_group, group_dst=stage + 1)
                y.sum().backward()
        return normalise_trace(rec.events, rec.groups, SMALL, rank)
    finally:
        destroy_virtual_world()


def test_members_of_one_class_record_the_same_trace():
    a = SMALL.rank_of(dp=0, pp=0, cp=0, tp=0)
    b = SMALL.rank_of(dp=3, pp=0, cp=1, tp=1)
    trace = stage_program_trace(a)
    assert any(kind == "CommEvent" for kind, _ in trace)
    assert trace == stage_program_trace(b)


def test_ranks_of_different_classes_record_different_traces():
    a = SMALL.rank_of(dp=1, pp=0, cp=0, tp=1)
    b = SMALL.rank_of(dp=1, pp=1, cp=0, tp=1)
    assert stage_program_trace(a) != stage_program_trace(b)


def test_lanes_and_pipeline_index_come_from_the_named_axes():
    from emulator.world.mesh import AXES, LANE_AXES, PIPELINE_AXIS

    assert LANE_AXES == tuple(a for a in AXES if a != PIPELINE_AXIS)
    world = World(dp=2, pp=3, cp=2, tp=4)
    rank = world.rank_of(dp=1, pp=2, cp=0, tp=3)
    assert world.pipeline_index(rank) == 2
    assert world.lane_of(rank) == (1, 0, 3)  # (dp, cp, tp): the class's lane shape order
