"""Peak GPU memory of a captured rank: a model of PyTorch's CUDA caching allocator.

API (sizes in bytes):

    result = replay_memory(trace, gpu="h100-sxm-80g", alloc_conf="expandable_segments:True")
    result.peak_allocated_bytes, result.peak_reserved_bytes, result.peak_requested_bytes  # steady
    result.first_iteration_peak_reserved_bytes  # (and _allocated, _requested): the first one
    result.fragmentation_at_peak_bytes          # reserved - allocated where allocated peaks
    result.peak                                 # MemoryEvent: stage / phase / micro_batch / module
    result.live_at_peak_by_category / _by_module
    result.outside                              # OutsideMemory: CUDA context, NCCL buffers
    result.device_total_estimate_bytes          # reserved peak + outside: comparable to nvidia-smi
    result.oom                                  # None, or OomReport (iteration, where, what was live)
    result.to_dict()                            # JSON-ready

`replay_memory(trace, *, gpu=None, alloc_conf="", memory_fraction=None, stage=None,
top_modules=10, workspaces=True, outside=None)`: `gpu` is a preset name or GpuPreset
(None: unlimited memory, no outside-allocator figures); `alloc_conf` a PYTORCH_ALLOC_CONF string
or an AllocatorConfig; `memory_fraction` as torch.cuda.set_per_process_memory_fraction (it is
what enables garbage_collection_threshold, as in torch); `stage` is copied into the event
reports; `workspaces` injects what the caching allocator hands out that a CPU trace does not
hold: torch's cuBLAS and cuBLASLt workspaces and each kernel's own scratch (events.py). An OOM
is data, never an exception: after the first allocation that does not fit, the replay goes on
as on an unlimited device so every figure is still given.

The replay runs a first iteration and then steady ones (iterations.py). Exports:
`prismbench.plots.plot_memory_timeline(result, path, title, trace=, event_times_s=,
first_event_times_s=)` (PNG, with the harness) and
`write_snapshot(trace, path, ...)` (a pickle in torch.cuda.memory._snapshot()'s format, which
pytorch.org/memory_viz opens) and `history_by_iteration(trace, gpu=, steady_iterations=)` (the
allocator's events cut where a process's are: build and declared state, first iteration, each
steady one, with each part's peaks reset at its start;
`results/fidelity/fake_pg_memory.py --compare` lays a GPU's history beside them).
The allocator itself is `CachingAllocator` (allocator.py); rules and their sources are listed
there and in docs/MEMORY.md.
"""

from emulator.memory.allocator import CachingAllocator
from emulator.memory.blocks import allocation_size, round_size
from emulator.memory.config import AllocatorConfig, parse_alloc_conf
from emulator.memory.outside import OutsideMemory, nccl_buffer_bytes, outside_memory
from emulator.memory.replay import (
    MemoryEvent,
    MemoryResult,
    MemoryTimeline,
    OomReport,
    replay_memory,
)

__all__ = [
    "AllocatorConfig",
    "CachingAllocator",
    "MemoryEvent",
    "MemoryResult",
    "MemoryTimeline",
    "OomReport",
    "OutsideMemory",
    "allocation_size",
    "nccl_buffer_bytes",
    "outside_memory",
    "parse_alloc_conf",
    "replay_memory",
    "round_size",
]
