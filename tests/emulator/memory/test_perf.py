"""Invariants of the allocator replay on synthetic traces (results/perf/memory_replay_bench.py).

Its speed is measured by a benchmark (`-m slow`, pytest-benchmark), not asserted.
"""

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from emulator.hardware import gpu_preset
from emulator.memory import replay_memory
from emulator.memory.outside import OutsideMemory

sys.path.insert(0, str(Path(__file__).parents[3] / "results" / "perf"))
from memory_replay_bench import synthetic_trace  # noqa: E402

CONFS = ["", "expandable_segments:True", "max_split_size_mb:64", "roundup_power2_divisions:4"]


# no CUDA context or NCCL buffers: the capacity is the allocator's alone
NOTHING_OUTSIDE = OutsideMemory(
    cuda_context_bytes=0,
    nccl_setup_bytes=0,
    nccl_buffer_bytes=0,
    nccl_communicators=0,
    nccl_channels=0,
)


@pytest.mark.parametrize("conf", CONFS)
def test_reserved_never_below_allocated_and_allocated_never_below_requested(conf):
    t = replay_memory(synthetic_trace(4000, seed=1), alloc_conf=conf).timeline
    assert np.all(t.reserved >= t.allocated) and np.all(t.allocated >= t.requested)
    assert np.all(t.reserved % (2 << 20) == 0)  # segments and pages are multiples of 2 MiB


def test_a_capacity_40MiB_below_the_unlimited_reserved_peak_retries_then_reports_oom():
    trace = synthetic_trace(4000, seed=2)
    free_run = replay_memory(trace, gpu="h100-sxm-80g", workspaces=False)
    need = free_run.peak_reserved_bytes
    tight = replace(gpu_preset("h100-sxm-80g"), usable_capacity_bytes=need - (40 << 20))
    result = replay_memory(trace, gpu=tight, workspaces=False, outside=NOTHING_OUTSIDE)
    # Split segments cannot be released (release_cached_blocks frees unsplit ones only): the
    # retry after emptying the cache still fails.
    assert result.alloc_retries >= 1 and result.oom is not None
    assert result.oom.reserved_bytes + result.oom.request_bytes > tight.usable_capacity_bytes


@pytest.mark.slow
def test_benchmark_replay_of_1e5_events(benchmark):
    trace = synthetic_trace(100_000)
    result = benchmark(replay_memory, trace, gpu="h100-sxm-80g")
    assert result.events == 100_000


def test_retries_that_every_step_repeats_are_the_steady_ones():

    def at_capacity_below_need(seed: int, below_mib: int):
        trace = synthetic_trace(4000, seed=seed)
        need = replay_memory(trace, gpu="h100-sxm-80g", workspaces=False).peak_reserved_bytes
        tight = replace(gpu_preset("h100-sxm-80g"), usable_capacity_bytes=need - (below_mib << 20))
        return replay_memory(trace, gpu=tight, workspaces=False, outside=NOTHING_OUTSIDE)

    # freeing the cache once rearranges the segments for good: a total, not a steady cost
    once = at_capacity_below_need(2, 36)
    assert once.oom is None and once.steady_converged
    assert once.alloc_retries >= 1 and once.steady_alloc_retries == 0
    # here every steady iteration frees the cache again: what each later step would pay
    every_step = at_capacity_below_need(3, 36)
    assert every_step.oom is None and every_step.steady_alloc_retries >= 1
    assert every_step.alloc_retries > every_step.steady_alloc_retries
