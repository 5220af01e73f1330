"""Tests for the "prism" virtual-world backend (emulator/world/virtual_pg.py, fake_collectives.py)."""

import sys

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from emulator.world.comm_events import CommEvent, Recorder, WaitEvent, recording
from emulator.world.virtual_world import destroy_virtual_world, init_virtual_world, register_backend


@pytest.fixture
def world(request):
    rank, world_size = request.param
    init_virtual_world(rank, world_size)
    yield rank, world_size
    destroy_virtual_world()


def comms(rec: Recorder) -> list[CommEvent]:
    return [e for e in rec.events if isinstance(e, CommEvent)]


def group_ranks(rec: Recorder, event: CommEvent) -> list[int]:
    return rec.groups[event.group_id].tolist()


def test_register_backend_is_idempotent():
    register_backend()
    register_backend()
    assert "PRISM" in dist.Backend._plugins


def test_a_virtual_world_leaves_the_process_s_excepthook_as_it_was():
    # torch's init_process_group wraps it to prefix tracebacks with the rank, once per world
    before = sys.excepthook
    for rank in range(2):
        init_virtual_world(rank, 2)
        destroy_virtual_world()
    assert sys.excepthook is before


@pytest.mark.parametrize("world", [(70_001, 131_072)], indirect=True)
def test_init_and_4d_mesh_at_131072_ranks(world):
    mesh = init_device_mesh("cpu", (128, 16, 8, 8), mesh_dim_names=("dp", "pp", "cp", "tp"))
    # rank 70001 = 68*1024 + 369: its dp group is {369 + 1024*i}, its tp group 70000..70007
    assert dist.get_process_group_ranks(mesh["tp"].get_group()) == list(range(70_000, 70_008))
    assert dist.get_process_group_ranks(mesh["dp"].get_group()) == list(range(369, 131_072, 1024))


@pytest.mark.filterwarnings("ignore::FutureWarning")  # the pre-2.13 names, which torch 2.11 has
@pytest.mark.parametrize("world", [(3, 8)], indirect=True)
def test_real_all_gather_fills_every_slot_with_local_input(world):
    out = torch.full((8, 2), float("nan"))
    dist.all_gather_into_tensor(out, torch.tensor([1.0, 2.0]))
    assert torch.equal(out, torch.tensor([[1.0, 2.0]] * 8))


@pytest.mark.filterwarnings("ignore::FutureWarning")  # the pre-2.13 names, which torch 2.11 has
@pytest.mark.parametrize("world", [(3, 8)], indirect=True)
def test_real_reduce_scatter_takes_this_ranks_chunk_and_all_reduce_keeps_value(world):
    out = torch.empty(2)
    dist.reduce_scatter_tensor(out, torch.arange(16.0))
    assert out.tolist() == [6.0, 7.0]
    x = torch.tensor([5.0])
    dist.all_reduce(x)
    assert x.item() == 5.0


@pytest.mark.parametrize("world", [(3, 8)], indirect=True)
def test_blocking_call_records_wait_right_after_it(world):
    rec = Recorder()
    with recording(rec):
        dist.all_reduce(torch.ones(4, dtype=torch.bfloat16), op=dist.ReduceOp.MAX)
    event, wait = rec.events
    assert (event.kind, event.op, event.dtype, event.numel, event.nbytes) == (
        "all_reduce",
        "MAX",
        "bfloat16",
        4,
        8,
    )
    assert event.async_op is False
    assert isinstance(wait, WaitEvent) and wait.comm_seq == event.seq
    assert group_ranks(rec, event) == list(range(8))


@pytest.mark.parametrize("world", [(3, 8)], indirect=True)
def test_async_wait_is_recorded_when_waited(world):
    rec = Recorder()
    with recording(rec):
        work = dist.all_reduce(torch.ones(4), async_op=True)
        assert len(rec.events) == 1 and rec.events[0].async_op is True
        work.wait()
        work.wait()
    assert [type(e) for e in rec.events] == [CommEvent, WaitEvent]


@pytest.mark.parametrize("world", [(3, 8)], indirect=True)
def test_waiting_the_future_of_a_work_is_waiting_the_work(world):
    rec = Recorder()
    with recording(rec):
        future = dist.all_reduce(torch.ones(4), async_op=True).get_future()
        assert len(rec.events) == 1
        assert future.wait()[0].tolist() == [1.0] * 4
    assert [type(e) for e in rec.events] == [CommEvent, WaitEvent]
    assert rec.events[1].comm_seq == rec.events[0].seq


@pytest.mark.parametrize("world", [(13, 16)], indirect=True)
def test_p2p_records_global_peer(world):
    group = dist.new_group([1, 5, 9, 13])
    rec = Recorder()
    with recording(rec):
        buf = torch.full((3,), float("nan"))
        ops = [
            dist.P2POp(dist.isend, torch.ones(3), group=group, group_peer=0),
            dist.P2POp(dist.irecv, buf, group=group, group_peer=2),
        ]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    send, recv = comms(rec)
    assert (send.kind, send.peer, recv.kind, recv.peer) == ("send", 1, "recv", 9)
    assert torch.equal(buf, torch.zeros(3))
    assert len(rec.events) == 4


@pytest.mark.filterwarnings("ignore::FutureWarning")  # the pre-2.13 names, which torch 2.11 has
@pytest.mark.parametrize("world", [(5, 64)], indirect=True)
def test_functional_collectives_recorded_on_real_and_fake_tensors(world):
    mesh = init_device_mesh("cpu", (8, 8), mesh_dim_names=("dp", "tp"))
    for mode in (None, FakeTensorMode()):
        rec = Recorder()
        with recording(rec), mode or torch.device("cpu"):
            gathered = funcol.all_gather_tensor(torch.ones(2, 3), 0, mesh["tp"])
            reduced = funcol.reduce_scatter_tensor(torch.ones(16, 3), "sum", 0, mesh["tp"])
            summed = funcol.all_reduce(torch.ones(3), "avg", mesh["dp"])
            shapes = [
                tuple((gathered + 1).shape),
                tuple((reduced + 1).shape),
                tuple((summed + 1).shape),
            ]
        assert shapes == [(16, 3), (2, 3), (3,)]
        kinds = [(e.kind, e.numel, len(rec.groups[e.group_id])) for e in comms(rec)]
        assert kinds == [("all_gather", 48, 8), ("reduce_scatter", 48, 8), ("all_reduce", 3, 8)]
        waits = [e.comm_seq for e in rec.events if isinstance(e, WaitEvent)]
        assert sorted(waits) == [e.seq for e in comms(rec)]


class MLP(nn.Module):
    def __init__(self, dim: int = 16):
        super().__init__()
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


@pytest.mark.parametrize("world", [(4097, 8192)], indirect=True)
def test_sequence_parallel_mlp_under_fake_mode_records_tp_gathers_and_scatters(world):
    tp_mesh = init_device_mesh("cpu", (1024, 8), mesh_dim_names=("dp", "tp"))["tp"]
    rec = Recorder()
    with recording(rec), FakeTensorMode():
        mlp = MLP()
        parallelize_module(
            mlp,
            tp_mesh,
            {
                "up": ColwiseParallel(input_layouts=Shard(0)),
                "down": RowwiseParallel(output_layouts=Shard(0)),
            },
        )
        start = len(rec.events)
        x = torch.randn(4, 16, requires_grad=True)  # this rank's sequence shard
        mlp(x).sum().backward()
    events = comms(rec)[sum(isinstance(e, CommEvent) for e in rec.events[:start]) :]
    assert [e.kind for e in events] == [
        "all_gather",
        "reduce_scatter",
        "all_gather",
        "reduce_scatter",
    ]
    assert all(group_ranks(rec, e) == list(range(4096, 4104)) for e in events)
    assert events[0].numel == 8 * 4 * 16


@pytest.mark.parametrize("world", [(4097, 8192)], indirect=True)
def test_fsdp2_two_layers_and_adamw_under_fake_mode(world):
    mesh = init_device_mesh("cpu", (1024, 8), mesh_dim_names=("dp", "tp"))
    rec = Recorder()
    with recording(rec):
        with torch.device("meta"):
            model = nn.Sequential(MLP(), MLP())
        for layer in model:
            fully_shard(layer, mesh=mesh["dp"], reshard_after_forward=True)
        fully_shard(model, mesh=mesh["dp"])
        with FakeTensorMode(allow_non_fake_inputs=True):
            model.to_empty(device="cpu")
            optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
            marks = [len(rec.events)]
            loss = model(torch.randn(4, 16)).sum()
            marks.append(len(rec.events))
            loss.backward()
            marks.append(len(rec.events))
            optim.step()
    fwd, bwd = (
        [e for e in rec.events[a:b] if isinstance(e, CommEvent)]
        for a, b in zip(marks[:-1], marks[1:], strict=True)
    )
    # FSDP pads each parameter's dim 0 to 1024 rows: a rank holds one row of each of
    # up.weight (16), up.bias (1), down.weight (64), down.bias (1) per layer
    gathered = 1024 * (16 + 1 + 64 + 1)
    assert [e.kind for e in fwd] == ["all_gather", "all_gather"]
    assert [e.kind for e in bwd].count("reduce_scatter") == 2
    assert all(e.numel == gathered for e in fwd + bwd)
    assert group_ranks(rec, fwd[0]) == list(range(1, 8192, 8))


@pytest.mark.parametrize("world", [(9, 16)], indirect=True)
def test_real_tensor_tp_loss_is_finite(world):
    tp_mesh = init_device_mesh("cpu", (2, 8), mesh_dim_names=("dp", "tp"))["tp"]
    torch.manual_seed(0)
    mlp = MLP()
    parallelize_module(mlp, tp_mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    loss = mlp(torch.randn(4, 16)).pow(2).mean()
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(mlp.parameters(), 1.0)
    assert torch.isfinite(loss) and torch.isfinite(grad_norm.full_tensor())


@pytest.mark.parametrize("world", [(0, 2)], indirect=True)
def test_a_send_work_does_not_keep_the_sent_tensor_alive(world):
    # as NCCL's coalesced batch_isend_irecv work, which lets go once the send completes:
    # the storage is freed when the program drops the tensor, not when it drops the work
    import weakref

    activation = torch.ones(4)
    alive = weakref.ref(activation)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, activation, 1)])
    del activation
    assert alive() is None
    for work in works:
        work.wait()


@pytest.mark.parametrize("world", [(2, 4)], indirect=True)
def test_an_all_to_all_to_one_peer_is_recorded_as_a_permutation(world):
    group = dist.new_group(list(range(4)))
    rec = Recorder()
    with recording(rec):
        out = torch.empty(6)
        dist.all_to_all_single(out, torch.ones(6), [0, 0, 0, 6], [0, 6, 0, 0], group=group)
        dist.all_to_all_single(torch.empty(8), torch.ones(8), group=group)  # even splits
        funcol.permute_tensor(torch.ones(6), [1, 2, 3, 0], group) + 1  # the ring's rotation
    assert [e.kind for e in comms(rec)] == ["permute", "all_to_all", "permute"]


@pytest.mark.filterwarnings("ignore::FutureWarning")  # the pre-2.13 names, which torch 2.11 has
@pytest.mark.parametrize("world", [(3, 8)], indirect=True)
def test_an_all_gather_s_output_names_its_collective_in_its_recording_only(world):
    from emulator.world.comm_events import gathered_by

    out = torch.empty(8, 2)
    with recording(Recorder()) as rec:
        dist.all_gather_into_tensor(out, torch.tensor([1.0, 2.0]))
        (gather,) = comms(rec)
        assert gathered_by(out.view(16)) == gather.seq  # any view of the gathered storage
        assert gathered_by(torch.empty(16)) is None
    with recording(Recorder()):
        assert gathered_by(out) is None  # another recording's seq means nothing here
