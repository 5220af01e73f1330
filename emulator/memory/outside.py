"""GPU memory that torch's caching allocator does not count, with cited defaults.

- CUDA context and what a training process loads into it (kernel modules, library handles):
  Hopper: 804 061 184 B, measured on the shared H100 80GB HBM3 (torch 2.11, CUDA 13, one GPU,
  after GEMMs and attention ran: `../shared/data/gpu/h100-sxm-80g/memory_gpu_check.txt`,
  cudaMemGetInfo's used minus the allocator's reserved; the same in all four of its cases).
  Ampere: not measured; ~300 MiB with lazy module loading (CUDA >= 11.7), as measured and
  explained by a PyTorch maintainer in pytorch/pytorch#107667 (ptrblck, 2023-08-28: "the
  currently used ~300MB ... Before CUDA 11.7, *all* kernels were loaded into the context ...
  which took >1000MB"): the context alone, a floor (the H100 figure is 2.6 x that).
  `results/fidelity/memory_gpu_check.py` measures it on a real GPU.
- NCCL in the process: the first NCCL communicator adds 585 105 408 B outside the allocator on
  Hopper, measured on an H200 (torch 2.11.0+cu130 and its NCCL, one rank: 734 855 168 B outside
  after a GEMM, SDPA and a cross-entropy ran, 1 319 960 576 B after a one-rank process group's
  barrier and all-reduce; `results/fidelity/outside_memory_gpu.py`,
  `results/gpu_runs/h200-2026-11-27/outside/`). One rank has no peers, so this is not the ring
  buffers below; it is what NCCL loads and allocates at its setup. Every program the tool
  models runs under torch.distributed on NCCL (`record` launches even one rank on it, with a
  barrier around each iteration), so every rank pays it. A real llama2-7b run on that H200 held
  1.29 GiB outside when it ran out of memory: the two figures together, to within the OOM
  message's rounding. Whether a second communicator adds more than its buffers is not measured.
  Ampere: not measured, counted as 0 (a floor).
- NCCL buffers, per communicator: channels x receive connections per channel x (Simple + LL +
  LL128 buffer). NCCL src/init.cc: DEFAULT_BUFFSIZE = 4 MiB (NCCL_BUFFSIZE, documented in the
  NCCL user guide's environment variables page), DEFAULT_LL_BUFFSIZE = 8 lines x 512 threads x
  8 steps x 16 B = 512 KiB, DEFAULT_LL128_BUFFSIZE = 120 x 640 x 8 steps x 8 B = 4 800 KiB.
  One receive connection per channel is a ring; trees, p2p (send/recv) connections, NVLS and
  proxy buffers come on top: the figure is a floor. NCCL 2.19+ may also register buffers from
  the torch allocator; that is not modelled.
- cuBLAS workspace: aten/src/ATen/cuda/CublasHandlePool.cpp, parseChosenWorkspaceSize():
  4096 KiB x 8 = 32 MiB on sm90 (Hopper), else 4096 KiB x 2 + 16 KiB x 8 = 8 MiB + 128 KiB;
  one per (cuBLAS handle, stream), allocated *through the caching allocator* (getNewWorkspace),
  so `replay` injects it into the allocation sequence instead of adding it here.
- cuBLASLt workspace: the same file's getCUDABlasLtWorkspace() allocates a second workspace
  per (handle, stream) through the caching allocator at the first cuBLASLt matmul (addmm with
  a bias, _scaled_mm), unless TORCH_CUBLASLT_UNIFIED_WORKSPACE=1 makes it share the cuBLAS one;
  its size is parseCUDABlasLtWorkspaceSize(): CUBLASLT_WORKSPACE_SIZE, default 1024 KiB on CUDA
  (pytorch#73328). Injected by `replay` too. The shared H100 measurements agree: every job with
  addmm-with-bias or _scaled_mm had 1 MiB (2 MiB with its backward thread's) more allocated than
  predicted without it, and the Llama jobs, whose matmuls are all plain mm, none.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from emulator.capture.trace import COMM, RankTrace
from emulator.hardware.presets import NCCL_DEFAULT_CHANNELS
from emulator.units import MiB

CUDA_CONTEXT_BYTES = {"ampere": 300 * MiB, "hopper": 804_061_184}  # see the docstring
NCCL_SETUP_BYTES = {"ampere": 0, "hopper": 585_105_408}  # see the docstring
NCCL_SIMPLE_BUFFER_BYTES = 4 * MiB  # NCCL_BUFFSIZE default (src/init.cc DEFAULT_BUFFSIZE)
NCCL_LL_BUFFER_BYTES = 8 * 512 * 8 * 16  # DEFAULT_LL_BUFFSIZE
NCCL_LL128_BUFFER_BYTES = 120 * 640 * 8 * 8  # DEFAULT_LL128_BUFFSIZE
CUBLAS_WORKSPACE_BYTES = {
    "hopper": 4096 * 1024 * 8,  # CublasHandlePool.cpp: sm90 default ":4096:8"
    "ampere": 4096 * 1024 * 2 + 16 * 1024 * 8,  # default ":4096:2:16:8"
}
CUBLASLT_WORKSPACE_BYTES = MiB  # CublasHandlePool.cpp: CUBLASLT_WORKSPACE_SIZE default


@dataclass(frozen=True, kw_only=True)
class OutsideMemory:
    """Bytes held outside the caching allocator (what nvidia-smi adds to `reserved`)."""

    cuda_context_bytes: int
    nccl_setup_bytes: int
    nccl_buffer_bytes: int
    nccl_communicators: int
    nccl_channels: int

    def __post_init__(self) -> None:
        for name in (
            "cuda_context_bytes",
            "nccl_setup_bytes",
            "nccl_buffer_bytes",
            "nccl_communicators",
            "nccl_channels",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"OutsideMemory.{name}={getattr(self, name)} must be >= 0")

    @property
    def total_bytes(self) -> int:
        return self.cuda_context_bytes + self.nccl_setup_bytes + self.nccl_buffer_bytes

    def to_dict(self) -> dict:
        return asdict(self) | {"total_bytes": self.total_bytes}


def nccl_buffer_bytes(
    communicators: int, channels: int = NCCL_DEFAULT_CHANNELS, recv_peers: int = 1
) -> int:
    """communicators x channels x recv_peers x (Simple + LL + LL128) buffer bytes."""
    per_connection = NCCL_SIMPLE_BUFFER_BYTES + NCCL_LL_BUFFER_BYTES + NCCL_LL128_BUFFER_BYTES
    return communicators * channels * recv_peers * per_connection


def nccl_communicators(trace: RankTrace) -> int:
    """Process groups of more than one rank that this rank communicated in (each one is an NCCL
    communicator, created lazily at its first collective)."""
    c = trace.columns
    rows = (c["kind"] == COMM) & (c["group_size"] > 1)
    return len(set(c["group"][rows].tolist()))


def outside_memory(
    trace: RankTrace, arch: str | None, *, channels: int = NCCL_DEFAULT_CHANNELS
) -> OutsideMemory:
    """The cited defaults for one rank: no GPU arch (None) means no CUDA context either."""
    comms = nccl_communicators(trace)
    return OutsideMemory(
        cuda_context_bytes=CUDA_CONTEXT_BYTES[arch] if arch else 0,
        nccl_setup_bytes=NCCL_SETUP_BYTES[arch] if arch else 0,
        nccl_buffer_bytes=nccl_buffer_bytes(comms, channels) if arch else 0,
        nccl_communicators=comms,
        nccl_channels=channels,
    )
