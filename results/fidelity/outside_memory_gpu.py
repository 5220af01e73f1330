"""GPU memory outside torch's caching allocator, on this machine's GPU, as a `record` run holds it.

    python3 results/fidelity/outside_memory_gpu.py --out DIR          (on a CUDA machine)

cudaMemGetInfo's used bytes minus the allocator's reserved bytes (what nvidia-smi adds to
`reserved`, `emulator.memory.outside`), read three times in one process:
1. `context`: after a bf16 GEMM, SDPA forward and backward and a cross-entropy ran (the CUDA
   context with the modules a training step loads; `results/fidelity/memory_gpu_check.py`
   reads the same on the H100: 804 061 184 B);
2. `nccl_one_rank`: then a one-rank NCCL process group, set up as `prismbench.launch` does for
   `record` (set_device, init_process_group), after a barrier and an all-reduce;
3. the total capacity cudaMemGetInfo reports (the preset's `usable_capacity_bytes`).
DIR/outside_memory_gpu.json holds the bytes.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F


def outside_bytes() -> int:
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return total - free - torch.cuda.memory_reserved()


def training_kernels() -> None:
    """A GEMM, SDPA forward and backward and a cross-entropy: the modules a step loads."""
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    (a @ a).sum().item()
    q, k, v = (torch.randn(2, 16, 2048, 128, device="cuda", dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))  # fmt: skip
    F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
    logits = torch.randn(4096, 50257, device="cuda", requires_grad=True)
    F.cross_entropy(logits, torch.randint(0, 50257, (4096,), device="cuda")).backward()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    torch.cuda.set_device(0)
    training_kernels()
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "context": outside_bytes()}  # fmt: skip
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    dist.init_process_group("nccl", rank=0, world_size=1)
    dist.barrier()
    dist.all_reduce(torch.ones(1024, device="cuda"))
    result["nccl_one_rank"] = outside_bytes()
    result["total_capacity"] = torch.cuda.mem_get_info()[1]
    dist.destroy_process_group()
    print(json.dumps(result))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "outside_memory_gpu.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
