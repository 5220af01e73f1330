"""emulator.costs.kernel_timing on profiler events whose kernels are written here (a fake
clock: torch's own FunctionEvent, with kernel durations we choose), and on a CPU profile."""

import statistics
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import torch
from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent

from emulator.costs.kernel_timing import (
    KernelsNotRecorded,
    op_records,
    profile_iteration,
    profile_iterations,
    range_kernel_counts,
    range_times_us,
    split_by_ranges,
    time_kernels_us,
)


def _op(name, start_us, end_us, kernels=(), children=(), shapes=None, device=DeviceType.CPU):
    event = FunctionEvent(
        id=start_us, name=name, thread=0, start_us=start_us, end_us=end_us,
        input_shapes=shapes, use_device="cuda", device_type=device,
    )  # fmt: skip
    for kernel, us in kernels:
        event.append_kernel(kernel, 0, us)
    for child in children:
        event.append_cpu_child(child)
    return event


def test_a_repetition_is_the_time_of_its_kernels_not_of_its_host_range():
    # two repetitions of 50 us on the host each; their kernels ran 5 us and 6 us
    rep = [
        _op("prismbench.repetition", 0, 50, children=[_op("aten::mm", 1, 49, [("gemm", 5.0)])]),
        _op("prismbench.repetition", 60, 110, children=[_op("aten::mm", 61, 109, [("gemm", 6.0)])]),
    ]
    assert range_times_us(rep, "prismbench.repetition") == [5.0, 6.0]


def test_a_repetition_s_annotation_on_the_gpu_timeline_is_not_a_second_repetition():
    host = _op("prismbench.repetition", 0, 50, children=[_op("aten::mm", 1, 49, [("gemm", 5.0)])])
    on_gpu = _op("prismbench.repetition", 20, 26, device=DeviceType.CUDA)  # gpu_user_annotation
    assert range_times_us([host, on_gpu], "prismbench.repetition") == [5.0]
    assert range_kernel_counts([host, on_gpu], "prismbench.repetition") == [1]


def test_a_repetition_counts_every_kernel_launched_under_it():
    # SDPA's backward: a memset and three kernels, launched by ops two levels down
    bwd = _op("aten::_efficient_attention_backward", 3, 40,
              [("Memset (Device)", 0.5), ("bprop", 30.0), ("dot_do_o", 3.0), ("convert_dq", 2.0)])  # fmt: skip
    sdpa = _op("aten::_scaled_dot_product_efficient_attention_backward", 2, 41, children=[bwd])
    add = _op("aten::add", 42, 44, [("add_kernel", 1.0)])
    rep = _op("prismbench.repetition", 0, 50, children=[sdpa, add])
    assert range_kernel_counts([rep, sdpa, bwd, add], "prismbench.repetition") == [5]
    assert range_times_us([rep], "prismbench.repetition") == [36.5]


def test_op_records_keep_ops_that_launch_kernels_in_program_order():
    addmm = _op("aten::addmm", 12, 20, [("gemm_a", 3.0), ("splitk_reduce", 0.5)], shapes=[[8, 4]])
    linear = _op("aten::linear", 10, 22, children=[addmm])  # launches nothing itself
    norm = _op("aten::native_layer_norm", 2, 5, [("layer_norm_kernel", 1.25)], shapes=[[8, 4]])
    records = op_records([linear, addmm, norm])
    assert [r["op"] for r in records] == ["aten::native_layer_norm", "aten::addmm"]
    assert records[1]["self_cuda_us"] == 3.5
    assert records[1]["kernels"] == [["gemm_a", 3.0], ["splitk_reduce", 0.5]]
    assert records[1]["shapes"] == [[8, 4]] and records[1]["cpu_start_us"] == 12.0


def test_profiling_an_iteration_on_cpu_runs_it_and_finds_no_kernels():
    calls = []
    model = torch.nn.Linear(4, 4)

    def step():
        calls.append(1)
        model(torch.ones(2, 4)).sum().backward()

    assert profile_iteration(step, warmup=2, cuda=False) == []
    assert len(calls) == 3


def test_profiling_iterations_on_cpu_runs_each_under_one_session():
    calls = []
    model = torch.nn.Linear(4, 4)

    def step():
        calls.append(1)
        model(torch.ones(2, 4)).sum().backward()

    assert profile_iterations(step, iterations=3, warmup=1, cuda=False) == [[], [], []]
    assert len(calls) == 4


def test_profile_iterations_refuses_fewer_than_one_iteration():
    with pytest.raises(ValueError, match=r"iterations=0: profile at least 1 iteration"):
        profile_iterations(lambda: None, iterations=0, cuda=False)


def _record(op, start_us):
    return {"op": op, "shapes": [], "self_cuda_us": 1.0, "kernels": [["k", 1.0]],
            "cpu_start_us": start_us}  # fmt: skip


def _start(record: dict) -> float:
    return record["cpu_start_us"]


def test_records_go_to_the_range_their_start_lies_in():
    # iteration 0 runs over [0, 100) us, iteration 1 over [120, 200); the backward's ops of
    # iteration 0 run on autograd's own thread but start inside its host range (90); an op
    # at 110 ran between the iterations, in neither
    mm0, bwd0, between, mm1, last1 = (_record("aten::mm", 5), _record("aten::mm", 90),
                                      _record("aten::add", 110), _record("aten::mm", 120),
                                      _record("aten::sum", 199))  # fmt: skip
    records = [mm0, bwd0, between, mm1, last1]
    assert split_by_ranges(records, [(0, 100), (120, 200)], _start) == [[mm0, bwd0], [mm1, last1]]


def test_a_record_on_the_boundary_of_two_adjacent_ranges_is_in_the_later_one_alone():
    boundary = _record("aten::mm", 100)
    assert split_by_ranges([boundary], [(0, 100), (100, 200)], _start) == [[], [boundary]]


class _FakeGpu:
    """A CUDA device under the profiler, on a fake clock: each call of `step` launches the next
    of `launches` (its kernels' durations, us); a `record_function` range becomes a 50 us host
    event around an aten::mm holding the kernels launched inside it (both reported as events),
    as torch's profiler reports them. Calls
    outside a range (warm-up) are not recorded; `drop` ranges are lost (a profiler that saw
    fewer repetitions than were run)."""

    def __init__(self, launches, drop=0):
        self.launches, self.drop = iter(launches), drop
        self.events, self.open = [], None

    def step(self):
        kernels = next(self.launches)
        if self.open is not None:
            self.open += kernels

    @contextmanager
    def record_function(self, label):
        self.open = []
        yield
        start = 100 * len(self.events)
        mm = _op("aten::mm", start + 1, start + 49, [(f"k{i}", us) for i, us in enumerate(self.open)])
        if self.drop:
            self.drop -= 1
        else:
            self.events += [_op(label, start, start + 50, children=[mm]), mm]
        self.open = None

    @contextmanager
    def profile(self, activities, **options):
        yield SimpleNamespace(events=lambda: list(self.events))


@pytest.fixture
def fake_gpu(monkeypatch):
    def install(launches, drop=0):
        gpu = _FakeGpu(launches, drop)
        monkeypatch.setattr(torch.profiler, "profile", gpu.profile)
        monkeypatch.setattr(torch.autograd.profiler, "record_function", gpu.record_function)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
        return gpu

    return install


def test_time_kernels_us_is_the_median_and_spread_of_the_repetitions_kernels(fake_gpu):
    # a slow warm-up call (not timed), then three repetitions of 5, 7 and 6 us of kernels,
    # launched as 2, 2 and 3 kernels, each inside a host range of 50 us
    gpu = fake_gpu([[400.0], [2.0, 3.0], [3.0, 4.0], [1.0, 2.0, 3.0]])
    median, spread, kernels = time_kernels_us(gpu.step, repetitions=3, warmup=1)
    assert median == 6.0
    assert spread == pytest.approx(statistics.pstdev([5.0, 7.0, 6.0]))  # population, not sample
    assert kernels == 2  # the median call's count


def test_time_kernels_us_refuses_when_the_profiler_missed_repetitions(fake_gpu):
    gpu = fake_gpu([[5.0]] * 3, drop=1)
    with pytest.raises(KernelsNotRecorded, match=r"the profiler saw 2 of 3 repetitions with kernels"):
        time_kernels_us(gpu.step, repetitions=3, warmup=0)


def test_time_kernels_us_refuses_repetitions_that_launched_no_kernel(fake_gpu):
    gpu = fake_gpu([[5.0], [], [5.0]])  # a CPU build records ranges but no kernels
    with pytest.raises(KernelsNotRecorded, match=r"saw 3 of 3 repetitions with kernels: \[5.0, 0.0, 5.0\]"):
        time_kernels_us(gpu.step, repetitions=3, warmup=0)


def test_profile_iterations_gives_each_iteration_its_own_op_records(fake_gpu):
    # a warm-up call (not profiled), then two iterations of 5 us and 7 us of kernels
    gpu = fake_gpu([[400.0], [2.0, 3.0], [3.0, 4.0]])
    first, second = profile_iterations(gpu.step, iterations=2, warmup=1)
    assert [(r["op"], r["self_cuda_us"]) for r in first] == [("aten::mm", 5.0)]
    assert [(r["op"], r["self_cuda_us"]) for r in second] == [("aten::mm", 7.0)]


def test_profile_iterations_refuses_when_the_profiler_missed_an_iteration(fake_gpu):
    gpu = fake_gpu([[5.0]] * 2, drop=1)
    with pytest.raises(KernelsNotRecorded, match=r"saw 1 of 2 'prismbench.iteration' ranges"):
        profile_iterations(gpu.step, iterations=2, warmup=0)


def test_profile_iterations_refuses_an_iteration_that_launched_no_kernel(fake_gpu):
    # a CUDA build without CUPTI sees ranges but no kernels: refused before `record` writes a
    # recording whose profile is missing
    gpu = fake_gpu([[5.0], []])
    with pytest.raises(KernelsNotRecorded, match=r"no kernel in iteration\(s\) \[1\] of 2"):
        profile_iterations(gpu.step, iterations=2, warmup=0)
