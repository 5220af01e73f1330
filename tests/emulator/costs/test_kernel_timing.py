"""emulator.costs.kernel_timing on profiler events whose kernels are written here (a fake
clock: torch's own FunctionEvent, with kernel durations we choose), and on a CPU profile."""

import torch
from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent

from emulator.costs.kernel_timing import (
    op_records,
    profile_iteration,
    range_kernel_counts,
    range_times_us,
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
