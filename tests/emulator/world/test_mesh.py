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
from emulator.world.mesh import JOB_AXES, World, group_axes, normalise_trace
from emulator.world.virtual_world import destroy_virtual_world, init_virtual_world

BIG = World.grid(dp=128, pp=16, cp=8, tp=8)


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
        World.grid(dp=1, pp=1, cp=1, tp=0)
    with pytest.raises(ValueError, match="ranks must be in"):
        BIG.coords([131_072])
    with pytest.raises(ValueError, match="axis"):
        BIG.groups("ep")


def test_classes_are_pipeline_ranks_with_their_virtual_stages():
    w = World.grid(dp=2, pp=4, cp=1, tp=2, vpp=2)
    classes = w.classes()
    assert list(classes) == [0, 1, 2, 3]
    assert classes[1] == (2, 4, (1, 5))
    assert w.class_of(np.arange(16)).tolist() == [0, 0, 1, 1, 2, 2, 3, 3] * 2
    assert w.representative(3) == 6


SMALL = World.grid(dp=4, pp=2, cp=2, tp=2)


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
    world = World.grid(dp=2, pp=3, cp=2, tp=4)
    assert world.names == JOB_AXES and world.lane_axes == ("dp", "cp", "tp")
    rank = world.rank_of(dp=1, pp=2, cp=0, tp=3)
    assert world.pipeline_index(rank) == 2
    assert world.lane_of(rank) == (1, 0, 3)  # (dp, cp, tp): the class's lane shape order
    assert world.lane_shape == (2, 2, 4)


# torchtitan's mesh: pp outermost, data parallel split into replicate x shard.
TITAN = World(axes=(("pp", 2), ("dp_replicate", 2), ("dp_shard", 4), ("cp", 2), ("tp", 2)))


def test_a_mesh_we_do_not_choose_has_its_own_names_order_and_classes():
    assert TITAN.world_size == 64 and TITAN.pp == 2
    assert TITAN.lane_axes == ("dp_replicate", "dp_shard", "cp", "tp")
    assert TITAN.representative(1) == 32  # pp is outermost here
    assert TITAN.class_of(np.arange(64)).tolist() == [0] * 32 + [1] * 32
    # torchtitan's flattened dp_shard_cp: one group over two named axes
    dp_shard_cp = TITAN.group_of(37, ("dp_shard", "cp"))
    assert len(dp_shard_cp) == 8 and set(TITAN.coords(dp_shard_cp)[:, 1]) == {0}
    assert group_axes(TITAN, 37, dp_shard_cp) == ("dp_shard", "cp")


def test_an_expert_group_carved_out_of_dp_x_cp_is_a_sub_grid_of_the_factored_world():
    """EP = 4 out of dp_shard x cp = 4 x 2: consecutive halves of the flattened dimension, no
    sub-grid of the named axes; factoring dp_shard (as torchtitan does) makes it one."""
    flat = TITAN.group_of(0, ("dp_shard", "cp"))
    ep_group = flat[:4]  # ranks 0, 2, 4, 6 -> dp_shard 0..1, cp 0..1
    assert group_axes(TITAN, 0, ep_group) is None
    moe = TITAN.factor("dp_shard", (("dp_shard_mod_ep", 2), ("dp_shard_in_ep", 2)))
    assert moe.world_size == TITAN.world_size
    assert np.array_equal(
        moe.coords(np.arange(64))[:, [0, 1, 4, 5]], TITAN.coords(np.arange(64))[:, [0, 1, 3, 4]]
    )
    assert group_axes(moe, 0, ep_group) == ("dp_shard_in_ep", "cp")
    assert np.array_equal(moe.group_of(0, ("dp_shard_in_ep", "cp")), ep_group)
    # every EP group is such a block, and together they partition the world
    ep = moe.groups(("dp_shard_in_ep", "cp"))
    assert ep.shape == (16, 4) and np.array_equal(np.sort(ep.ravel()), np.arange(64))
    with pytest.raises(ValueError, match="multiply to 4"):
        TITAN.factor("dp_shard", (("a", 3), ("b", 2)))


def test_a_world_without_a_pipeline_axis_is_one_class():
    world = World(axes=(("dp", 4), ("tp", 2)))
    assert world.pp == 1 and world.classes()[0] == (0, 8, (0,))
    assert world.class_of(np.arange(8)).tolist() == [0] * 8
    with pytest.raises(ValueError, match="distinct identifiers"):
        World(axes=(("dp", 4), ("dp", 2)))
    with pytest.raises(ValueError, match=r"not among the world's axes"):
        world.rank_of(pp=1)


def test_every_lane_holds_the_group_shifted_and_groups_across_two_nodes_are_told_apart():
    world = World.grid(dp=3, pp=2, cp=1, tp=3, gpus_per_node=8)
    tp = world.group_of(0, "tp")
    lanes = world.lane_groups(tp, ("tp",))
    assert lanes.tolist() == [[0, 1, 2], [6, 7, 8], [12, 13, 14]]  # the class of pp 0
    # [0, 1, 2] and [12, 13, 14] each sit on one node; [6, 7, 8] straddles nodes 0 and 1
    assert world.placements(lanes).tolist() == [[0, 1, 2], [6, 7, 8]]
    # a stage-to-stage pair is a group of no lane axis: one per lane
    assert len(world.lane_groups(np.array([0, 3]), ())) == 9
    tiled = World.grid(dp=2, pp=1, cp=1, tp=4, gpus_per_node=8)
    assert len(tiled.placements(tiled.lane_groups(tiled.group_of(0, "tp"), ("tp",)))) == 1
