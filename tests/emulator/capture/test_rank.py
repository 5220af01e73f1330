"""Tests for emulator/capture/rank.py: capture_rank and its torch-level adaptations, on a tiny program."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch._subclasses.fake_tensor import DynamicOutputShapeException, FakeTensorMode
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.pipelining import schedules

from emulator.capture.rank import (
    RankProgram,
    capture_rank,
    real_mesh_tensors,
    static_pipeline_warmup,
)
from emulator.capture.trace import COMM, COMPUTE, PHASES
from emulator.world.virtual_world import destroy_virtual_world, init_virtual_world

MICRO_BATCHES = 3


def _program(hook_comm: bool = True) -> RankProgram:
    """A linear layer stepped with SGD over MICRO_BATCHES micro-batches; the root's own
    prepended pre-forward hook all-reduces (as FSDP2's parameter all-gather does)."""

    def setup():
        return dist.group.WORLD

    def build(group):
        model = nn.Linear(8, 8)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        dist.all_reduce(torch.zeros(4), group=group)  # build-time traffic: not recorded
        if hook_comm:
            model.register_forward_pre_hook(
                lambda module, args: dist.all_reduce(torch.zeros(2), group=group), prepend=True
            )
        return model, optimizer

    def step(state, phase):
        model, optimizer = state
        for _ in range(MICRO_BATCHES):
            model(torch.ones(2, 8)).sum().backward()
        optimizer.step()

    return RankProgram(
        setup=setup,
        build=build,
        declare=lambda state: {"parameter": list(state[0].parameters())},
        step=step,
        roots=lambda state: [state[0]],
    )


@pytest.fixture(scope="module")
def trace():
    return capture_rank(3, 8, _program())


def test_build_time_communication_is_not_in_the_trace(trace):
    sizes = trace["numel"][trace["kind"] == COMM]
    assert sizes.tolist() == [2] * MICRO_BATCHES  # the hook's all-reduces, not build's 4


def test_root_pre_forward_communication_belongs_to_its_micro_batch(trace):
    comm = trace["kind"] == COMM
    assert trace["micro_batch"][comm].tolist() == list(range(MICRO_BATCHES))


def test_each_micro_batch_computes_forward_and_backward(trace):
    compute = trace["kind"] == COMPUTE
    for mb in range(MICRO_BATCHES):
        phases = set(trace["phase"][compute & (trace["micro_batch"] == mb)].tolist())
        assert {PHASES.index("forward"), PHASES.index("backward")} <= phases


def test_optimizer_step_is_recorded_in_the_optimizer_phase(trace):
    compute = trace["kind"] == COMPUTE
    last = trace["phase"][compute][-1]
    assert PHASES[last] == "optimizer"
    assert (trace["phase"][compute] == PHASES.index("optimizer")).sum() >= 2  # weight and bias


def test_declared_parameters_are_tagged(trace):
    categories = set(trace.text("category"))
    assert {"parameter", "gradient"} <= categories


def test_capture_leaves_the_world_and_torch_as_it_found_them():
    warmup = schedules._PipelineSchedule._warmup_p2p
    mesh_property = DeviceMesh.__dict__["mesh"]
    capture_rank(0, 2, _program(hook_comm=False))
    assert not dist.is_initialized()
    assert schedules._PipelineSchedule._warmup_p2p is warmup
    assert DeviceMesh.__dict__["mesh"] is mesh_property
    with static_pipeline_warmup():
        assert schedules._PipelineSchedule._warmup_p2p is not warmup
    assert schedules._PipelineSchedule._warmup_p2p is warmup


def test_meshes_made_inside_fake_mode_need_real_mesh_tensors():
    # FSDP2 over a TP-sharded parameter concatenates the dp and tp meshes during build
    init_virtual_world(5, 8)
    try:
        mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
        with FakeTensorMode(allow_non_fake_inputs=True):
            with pytest.raises(DynamicOutputShapeException):
                DeviceMesh._concatenate([mesh["dp"], mesh["tp"]])
            with real_mesh_tensors():
                joined = DeviceMesh._concatenate([mesh["dp"], mesh["tp"]])
                assert joined.mesh.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
                assert tuple(joined.get_coordinate()) == (1, 1)
    finally:
        destroy_virtual_world()
