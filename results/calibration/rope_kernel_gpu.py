"""Why `prism::rope`'s compiled CUDA kernel runs 4.5-5x its price: three variants timed.

    python3 results/calibration/rope_kernel_gpu.py --out DIR      (on a CUDA machine)
    python3 results/calibration/rope_kernel_gpu.py --check        (anywhere: the variants agree)

The H200 profiles of 2026-11-30 (results/calibration/README.md, reprofile_h200.md) time the
RoPE op's kernel, Inductor's compilation of `workloads.models.rope_ops.rotate`, at 97 us a call
on Llama 2 7B (2.32 ms an iteration) against 0.5 ms priced as a memory-bound op, and 0.48-0.52
ms a block forward on the compiled torchtitan block. Two causes are possible and this script
separates them, kernel time only (`emulator.costs.kernel_timing.time_kernels_us`, CUPTI
records), per shape of the shared Llama jobs:
- `compiled`: the op as the workloads run it (angles, pow and sin/cos recomputed for every
  element of [b, s, h, d]);
- `compiled, transposed input`: the same on the [b, h, s, d]-strided gradient backward hands
  it under some attention paths;
- `table`: the angles' cos and sin made once per call as [s, d/2] tables (one small kernel),
  then a compiled rotation reading them, as fused RoPE kernels that take precomputed angles do
  (Transformer Engine's `fused_rope` takes `freqs`; torchtitan multiplies by a precomputed
  `freqs_cis`);
- `copy`: `x.clone()`, the memory-bound floor for the bytes the op reads and writes.
DIR/rope_kernel_gpu.json holds the figures and DIR/rope_kernel_gpu.md a table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

# (name, micro-batch, sequence, heads, head dim): q of the shared Llama jobs
SHAPES = (
    ("llama2-7b-l4-s4096-mb1-sel q", 1, 4096, 32, 128),
    ("llama3-8b-l2-s8192-mb2-none q", 2, 8192, 32, 128),
)
THETA = 10000.0
REPETITIONS, WARMUP = 20, 5


def angle_tables(positions, head_dim: int, theta: float):
    """(cos, sin) of the rotation angles, [s, d/2] float32: `rotate`'s angles, made once."""
    import torch

    exponents = torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32)
    angles = positions.float()[:, None] * theta ** (-exponents / head_dim)[None, :]
    return angles.cos(), angles.sin()


def rotate_by_tables(x, cos, sin):
    """x [b, s, h, d] rotated by the tables' angles, in float32, returned in x's dtype."""
    import torch

    pairs = x.float().unflatten(-1, (-1, 2))
    even, odd = pairs[..., 0], pairs[..., 1]
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
    return rotated.flatten(-2).to(x.dtype)


def variants(x, positions) -> dict:
    """name -> a function making one call of that variant on x."""
    import torch

    from workloads.models.rope_ops import rope

    rotate_compiled = torch.compile(rotate_by_tables, fullgraph=True, dynamic=False)
    transposed = x.transpose(1, 2).contiguous().transpose(1, 2)  # same values, [b, h, s, d] strides

    def table():
        cos, sin = angle_tables(positions, x.shape[-1], THETA)
        return rotate_compiled(x, cos, sin)

    return {
        "compiled": lambda: rope(x, positions, THETA, False),
        "compiled, transposed input": lambda: rope(transposed, positions, THETA, False),
        "table": table,
        "copy": lambda: x.clone(),
    }


def check() -> None:
    """On any device: every variant but the copy gives `rope`'s values."""
    import torch

    torch.manual_seed(0)
    x = torch.randn(2, 16, 4, 8, dtype=torch.bfloat16)
    positions = torch.arange(16)
    found = {name: fn() for name, fn in variants(x, positions).items() if name != "copy"}
    reference = found.pop("compiled")
    for name, got in found.items():
        torch.testing.assert_close(got, reference, rtol=1e-2, atol=1e-2, msg=name)
    print(f"{', '.join(found)}: as `rope` on {tuple(x.shape)}")


def measure(out: Path) -> None:
    import torch

    from emulator.costs.kernel_timing import time_kernels_us

    rows = []
    for name, b, s, heads, d in SHAPES:
        x = torch.randn(b, s, heads, d, device="cuda", dtype=torch.bfloat16)
        positions = torch.arange(s, device="cuda")
        for variant, fn in variants(x, positions).items():
            median, std, kernels = time_kernels_us(fn, REPETITIONS, WARMUP)
            rows.append({"shape": name, "variant": variant, "median_us": median, "std_us": std,
                         "kernels": kernels, "bytes": 2 * x.numel() * x.element_size()})  # fmt: skip
            print(f"{name} {variant}: {median:.1f} us ({kernels} kernels)", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rope_kernel_gpu.json").write_text(json.dumps(
        {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, indent=1
    ))  # fmt: skip
    lines = [f"{torch.cuda.get_device_name()}, torch {torch.__version__}; kernel time per call.", "",
             "| shape | variant | median (us) | std (us) | kernels | GB/s (read + write) |",
             "|---|---|--:|--:|--:|--:|"]  # fmt: skip
    for r in rows:
        rate = r["bytes"] / r["median_us"] / 1e3
        lines.append(f"| {r['shape']} | {r['variant']} | {r['median_us']:.1f} | "
                     f"{r['std_us']:.1f} | {r['kernels']} | {rate:.0f} |")  # fmt: skip
    (out / "rope_kernel_gpu.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].strip())
    parser.add_argument("--out", type=Path, help="folder for rope_kernel_gpu.json and .md (CUDA)")
    parser.add_argument("--check", action="store_true", help="check the variants agree, any device")
    args = parser.parse_args()
    if args.check:
        check()
    elif args.out is None:
        parser.error("give --out DIR (on a CUDA machine) or --check")
    else:
        measure(args.out)


if __name__ == "__main__":
    main()
