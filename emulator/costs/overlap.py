"""Interference between overlapping compute and communication kernels on one GPU.

NCCL runs one CUDA block per channel, each occupying an SM for the collective's duration (NCCL
docs, environment variables NCCL_MIN_NCHANNELS / NCCL_MAX_NCHANNELS: "the number of channels ...
each channel uses one CUDA block"), and its copies read and write HBM. A compute kernel that
overlaps a collective therefore runs on fewer SMs and shares HBM bandwidth:
- compute-bound: slowdown = SMs / (SMs - channels)
- memory-bound:  slowdown = 1 + comm_GBps * 2 / (hbm_GBps * hbm_efficiency)  (each byte moved
  is read from and written to HBM once by the NCCL kernel)
The model has no fitted constant; it ignores L2 and power interaction (docs/MODELS.md).
"""

from __future__ import annotations

from emulator.hardware import GpuPreset


def compute_slowdown(gpu: GpuPreset, *, comm_channels: int, comm_GBps: float, memory_bound: bool) -> float:
    """Factor (>= 1) by which a kernel overlapping a collective is slowed."""
    if not 0 <= comm_channels < gpu.sm_count:
        raise ValueError(f"comm_channels={comm_channels} must be in [0, sm_count={gpu.sm_count})")
    if comm_GBps < 0:
        raise ValueError(f"comm_GBps={comm_GBps} must be >= 0")
    if memory_bound:
        return 1.0 + 2.0 * comm_GBps / (gpu.hbm_bandwidth_GBps * gpu.hbm_efficiency)
    return gpu.sm_count / (gpu.sm_count - comm_channels)
