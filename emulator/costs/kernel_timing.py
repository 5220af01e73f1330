"""Kernel-only GPU times from torch.profiler: what kernel tables and profiles are made of.

Timing a kernel with CUDA events around a Python call counts the host's dispatch time
whenever the GPU waits for it: on the shared H100 (`../shared/data/gpu/h100-sxm-80g/README.md`)
a GEMM of a few microseconds reads ~44 us that way; Phantora moved from CUDA events to CUPTI
records for the same reason. Every time here is the sum of the durations of the kernels an
op launched, as the profiler's CUPTI kernel records give them: torch attributes each kernel
to the CPU op that launched it by correlation id (`FunctionEvent.kernels`, with nested ops
in `cpu_children`; torch/autograd/profiler_util.py, `device_time_total`).

- `range_times_us(events, label)`: per `record_function(label)` range, in order, the device
  time of every kernel launched inside it; `range_kernel_counts` how many kernels that was
  (a kernel table states it per row: every kernel pays the stream's idle time before it,
  `costs.pricing`);
- `op_records(events)`: per op that launched kernels itself, in program order: op name,
  input shapes, its kernels and their summed time, in the format of the shared profiles
  (`profiles/*.ops.jsonl.gz`: op, shapes, self_cuda_us, kernels, cpu_start_us);
- `time_kernels_us(fn, repetitions, warmup)`: `fn` repeated under the profiler: the median
  and spread of its kernel time, and the kernels it launches (GPU only);
- `profile_iterations(step, iterations, warmup)`: `iterations` calls of `step` (training
  iterations) under one profiler session after `warmup` calls: each call's op records, told
  apart by the host range each call runs in (`ITERATION_RANGE`, `split_by_ranges`);
  `profile_iteration` is the first of one.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable

_RANGE = "prismbench.repetition"
# The host range each profiled training iteration runs in: an op belongs to the iteration whose
# range holds its start. Chrome traces of `profile_iterations` carry it as a user annotation
# (`prismbench.profile_readers` splits them by it).
ITERATION_RANGE = "prismbench.iteration"


class KernelsNotRecorded(RuntimeError):
    """The profiler's records lack the kernels a GPU run launches: a build without CUPTI, or a
    run on a device that launches none. The machine cannot measure, whatever the input."""


def _ranges(events: Iterable, label: str) -> list:
    """The host-side `record_function(label)` ranges. On CUDA the profiler also reports each
    range as a `gpu_user_annotation` event on the device's timeline, under the same name (seen
    with torch 2.11 on an H200: 10 events for 5 ranges); that one holds no kernels."""
    from torch.autograd import DeviceType

    return [e for e in events if e.name == label and e.device_type == DeviceType.CPU]


def range_times_us(events: Iterable, label: str) -> list[float]:
    """Device time (us) of the kernels launched inside each `record_function(label)` range."""
    return [float(e.device_time_total) for e in _ranges(events, label)]


def range_kernel_counts(events: Iterable, label: str) -> list[int]:
    """Kernels launched inside each `record_function(label)` range: the range's own and those
    of the ops under it (torch attaches a kernel to the innermost op that launched it)."""

    def launched(event) -> int:
        return len(event.kernels) + sum(launched(child) for child in event.cpu_children)

    return [launched(e) for e in _ranges(events, label)]


def op_records(events: Iterable) -> list[dict]:
    """One record per CPU op that launched kernels itself, ordered by its start (us)."""
    from torch.autograd import DeviceType

    records = []
    for e in events:
        if not e.kernels or e.device_type != DeviceType.CPU:
            continue
        kernels = [[k.name, float(k.duration)] for k in e.kernels]
        records.append(
            {
                "op": e.name,
                "shapes": [list(s) for s in (e.input_shapes or [])],
                "self_cuda_us": sum(us for _, us in kernels),
                "kernels": kernels,
                "cpu_start_us": float(e.time_range.start),
            }
        )
    return sorted(records, key=lambda r: r["cpu_start_us"])


def time_kernels_us(
    fn: Callable[[], object], repetitions: int, warmup: int
) -> tuple[float, float, int]:
    """(median, population std) of the kernel time of `fn` over `repetitions` calls (us), and
    the kernels one call launches (the median over the calls)."""
    import torch
    from torch.autograd.profiler import record_function
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(repetitions):
            with record_function(_RANGE):
                fn()
        torch.cuda.synchronize()
    events = prof.events()
    samples = range_times_us(events, _RANGE)
    if len(samples) != repetitions or not all(samples):
        raise KernelsNotRecorded(
            f"the profiler saw {len(samples)} of {repetitions} repetitions with kernels: "
            f"{samples[:4]}... (is this a CUDA build with CUPTI?)"
        )
    kernels = round(statistics.median(range_kernel_counts(events, _RANGE)))
    return statistics.median(samples), statistics.pstdev(samples), kernels


def split_by_ranges(
    items: list, ranges: list[tuple[float, float]], start_of: Callable[[object], float]
) -> list[list]:
    """Per [start, end) host range, in the order given, the items whose start (`start_of`, us)
    lies in it: half-open, so an item on the boundary of two adjacent ranges (torch.profiler's
    ProfilerStep#n ends where #n+1 begins) is in the later one alone; an item in no range
    (between iterations) is in none. On CUDA the autograd engine runs the backward on a thread
    of its own, so an op is placed by its start, not by which range encloses it on its thread.
    Op records (`op_records`) and `profile_readers.ProfiledOp`s are both placed so."""
    return [[x for x in items if start <= start_of(x) < end] for start, end in ranges]


def profile_iterations(
    step: Callable[[], object], *, iterations: int, warmup: int = 3, cuda: bool = True
) -> list[list[dict]]:
    """`step` called `warmup` times, then `iterations` times under one profiler session (with
    record_shapes), each call inside a `record_function(ITERATION_RANGE)` range: per call, in
    order, its op records. `cuda=False` profiles CPU activity only (no kernels: tests)."""
    import torch
    from torch.autograd.profiler import record_function
    from torch.profiler import ProfilerActivity, profile

    if iterations < 1:
        raise ValueError(f"iterations={iterations}: profile at least 1 iteration")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    for _ in range(warmup):
        step()
    if cuda:
        torch.cuda.synchronize()
    with profile(activities=activities, record_shapes=True) as prof:
        for _ in range(iterations):
            with record_function(ITERATION_RANGE):
                step()
        if cuda:
            torch.cuda.synchronize()
    events = prof.events()
    ranges = [(e.time_range.start, e.time_range.end) for e in _ranges(events, ITERATION_RANGE)]
    if len(ranges) != iterations:
        raise KernelsNotRecorded(
            f"the profiler saw {len(ranges)} of {iterations} {ITERATION_RANGE!r} ranges"
        )
    # a range is no op: a kernel launched under it outside any op (torch attributes it to the
    # range) has no op to be a record of
    ops = [e for e in events if e.name != ITERATION_RANGE]
    per_iteration = split_by_ranges(op_records(ops), ranges, lambda r: r["cpu_start_us"])
    empty = [i for i, records in enumerate(per_iteration) if not records]
    if cuda and empty:  # refused here, before a caller writes a recording without its profile
        raise KernelsNotRecorded(
            f"the profiler saw no kernel in iteration(s) {empty} of {iterations} (is this a CUDA "
            "build with CUPTI?)"
        )
    return per_iteration


def profile_iteration(
    step: Callable[[], object], *, warmup: int = 3, cuda: bool = True
) -> list[dict]:
    """The op records of one call of `step` after `warmup` calls (`profile_iterations`)."""
    return profile_iterations(step, iterations=1, warmup=warmup, cuda=cuda)[0]
