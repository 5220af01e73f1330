"""Interference between overlapping compute and communication kernels on one GPU.

NCCL runs one CUDA block per channel, each occupying an SM for the collective's duration (NCCL
docs, environment variables NCCL_MIN_NCHANNELS / NCCL_MAX_NCHANNELS: "the number of channels ...
each channel uses one CUDA block"), and its copies read and write HBM. A compute kernel that
overlaps a collective therefore runs on fewer SMs and shares HBM bandwidth:
- compute-bound: slowdown = SMs / (SMs - channels)
- memory-bound:  slowdown = 1 + comm_GBps * 2 / (hbm_GBps * hbm_efficiency)  (each byte moved
  is read from and written to HBM once by the NCCL kernel)
comm_GBps is the traffic of the collectives running beside the kernel, not the link's rating:
a collective moves its bus bytes (nccl-tests' busbw x time: the buffer x the kind's bus factor)
in its duration, at most at the intra-node link's rate (`traffic_bytes`); the replay averages
the bytes over the time the overlapping collectives run (emulator.graph.replay). So a
latency-bound all-reduce of a few KiB hardly slows the kernels beside it. A faster link moves
the same bytes in less time: kernels that outlast the collective are slowed less in all, while
a kernel that runs wholly inside it is slowed more (the same bytes, denser), which can cost the
iteration a little where that kernel is on the critical path and the collective is not.
The model has no fitted constant; it ignores L2 and power interaction (docs/MODELS.md).

Async tensor parallelism (`async_tp_exposed_s`): torch's micro-pipelined TP ops
(torch/distributed/_symmetric_memory/__init__.py: `fused_all_gather_matmul` runs
`_pipelined_all_gather_and_consume`, `fused_matmul_reduce_scatter` runs
`_pipelined_produce_and_all2all`) split the collective into tp chunks, one per rank of the
group, over CUDA symmetric memory: the all-gather's GEMM starts on the local shard while the
next shard is copied in, and each chunk's transfer overlaps the previous chunk's GEMM (the
reduce-scatter the same way round: each chunk's partial product is sent while the next one is
computed). Rule: the fused op takes max(comm, gemm) + min(comm, gemm) / tp, the longer of the
two plus one chunk of the shorter (the pipeline's fill or drain); the comm time left exposed
beside the GEMM is that minus the GEMM's time. The copies run on copy engines or a few SMs,
so the GEMM's own slowdown beside them is the one above, unchanged.

Megatron's asynchronous input-gradient collective (`weight_grad_overlap_exposed_s`): in the
backward of a column-parallel linear, Megatron-LM launches the tensor-parallel all-reduce
(reduce-scatter under sequence parallelism) of the input gradient right after the GEMM that
computes it and runs the weight-gradient GEMM while it is in flight
(`LinearWithGradAccumulationAndAsyncCommunication.backward`, megatron/mpu/layers.py at
bbab79f869). Two streams, no pipelining: while the collective runs (comm seconds) the GEMMs run
slowed by the factor above, so they get through comm / slowdown of their work; the collective
then stays exposed for comm - min(gemm, comm / slowdown) beyond the GEMMs.
"""

from __future__ import annotations

from emulator.hardware import GpuPreset


def compute_slowdown(
    gpu: GpuPreset, *, comm_channels: int, comm_GBps: float, memory_bound: bool
) -> float:
    """Factor (>= 1) by which a kernel overlapping a collective is slowed."""
    if not 0 <= comm_channels < gpu.sm_count:
        raise ValueError(f"comm_channels={comm_channels} must be in [0, sm_count={gpu.sm_count})")
    if comm_GBps < 0:
        raise ValueError(f"comm_GBps={comm_GBps} must be >= 0")
    if memory_bound:
        return 1.0 + comm_GBps * 1e9 * memory_slowdown_per_Bps(gpu)
    return gpu.sm_count / (gpu.sm_count - comm_channels)


def memory_slowdown_per_Bps(gpu: GpuPreset) -> float:
    """What a memory-bound kernel's slowdown grows by per byte/s of collective traffic beside
    it: 2 / (HBM bytes/s x its efficiency) (module docstring)."""
    return 2.0 / (gpu.hbm_bandwidth_GBps * 1e9 * gpu.hbm_efficiency)


def traffic_bytes(nbytes: float, bus_factor: float, duration_s: float, link_GBps: float) -> float:
    """Bytes a member of a collective moves through HBM's side of its links during the call:
    its bus bytes (`nbytes` x the kind's nccl-tests bus factor), at most what the intra-node
    link carries in `duration_s` (NVLink SHARP's all-reduce has a busbw above the link's rate:
    the switch reduces, so the GPU moves less than the bus factor counts)."""
    if nbytes < 0 or bus_factor < 0 or duration_s < 0 or link_GBps < 0:
        raise ValueError(
            f"nbytes={nbytes}, bus_factor={bus_factor}, duration_s={duration_s} and "
            f"link_GBps={link_GBps} must be >= 0"
        )
    return min(nbytes * bus_factor, link_GBps * 1e9 * duration_s)


def async_tp_exposed_s(comm_s: float, gemm_s: float, tp: int) -> float:
    """Time the fused collective + GEMM of async TP takes beyond the GEMM (module docstring):
    max(comm, gemm) + min(comm, gemm) / tp - gemm, never negative."""
    if tp < 2:
        raise ValueError(f"tp={tp}: async TP pipelines over a group of 2 ranks at least")
    if comm_s < 0 or gemm_s < 0:
        raise ValueError(f"comm_s={comm_s} and gemm_s={gemm_s} must be >= 0")
    return max(comm_s, gemm_s) + min(comm_s, gemm_s) / tp - gemm_s


def weight_grad_overlap_exposed_s(comm_s: float, gemm_s: float, slowdown: float) -> float:
    """Time a collective overlapped with weight-gradient GEMMs of `gemm_s` seconds (alone) adds
    beyond them, the GEMMs slowed by `slowdown` while it runs (module docstring):
    comm - min(gemm, comm / slowdown)."""
    if comm_s < 0 or gemm_s < 0:
        raise ValueError(f"comm_s={comm_s} and gemm_s={gemm_s} must be >= 0")
    if slowdown < 1:
        raise ValueError(f"slowdown={slowdown} must be >= 1")
    return comm_s - min(gemm_s, comm_s / slowdown)
