"""What Inductor makes of the fused loss's forward on a GPU: two passes over each row of logits.

    python -m venv --system-site-packages VENV && VENV/bin/pip install triton
    PYTHONPATH=. VENV/bin/python results/calibration/loss_kernel_code.py [--out FILE]

On CUDA `prism::cross_entropy` runs `workloads.loss._stats` compiled by Inductor
(`workloads/models/cuda_kernels.py`); an H200 ran it as `triton_red_fused__to_copy_logsumexp_0`
(0.46 ms) and `triton_poi_fused_..._gather_..._1` (2 us) for MPT-7B's 8 192 x 50 368 bf16
logits (results/gpu_runs/h200-2026-11-30/reprofile/), where one read of them at the preset's
achieved HBM bandwidth takes 0.21 ms. Two checks, on a machine without a GPU:

1. Inductor's post-grad pass that turns max-then-sum-of-exp into one online-softmax
   reduction (torch/_inductor/fx_passes/post_grad.py, `prepare_softmax_pattern`; CUDA and XPU
   only) is run on graphs traced with Inductor's decompositions on fake CUDA tensors: it
   rewrites softmax, and leaves logsumexp alone, whose decomposition (torch/_refs
   `logsumexp`) puts a `where` (infinite maxes to 0) between the max and the subtraction.
2. Inductor's Triton code for `_stats` at that shape, generated for Triton's CPU target (the
   backend hash stubbed: there is no GPU driver; the kernels are printed as Inductor names
   them, never compiled): the H200's two kernel names. The reduction kernel is a looped one (`triton_red`, as on
   the H200) with the max and the sum of exp in two loops over the row, each loading it.

So the compiled forward reads the logits twice (the second pass hits L2 only where the row
stayed there). It is the workloads' stand-in for flash-attn's `cross_entropy_fwd_kernel`
(flash_attn/ops/triton/cross_entropy.py), which llm-foundry's `fused` loss runs: an online
softmax, one pass over the row. The emulator prices that kernel (one read); the H200's 2x is
this stand-in's second pass, not a miss of the framework's kernel.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOKENS, VOCAB = 8192, 50368  # MPT-7B, micro-batch 4 x 2 048, as the H200 reprofile ran it


def online_softmax_rewrites() -> list[str]:
    """Lines: per function, its decomposed ops and how many online-softmax rewrites apply."""
    import torch
    from torch._inductor.decomposition import select_decomp_table
    from torch._inductor.fx_passes import post_grad
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    post_grad.lazy_init()
    lines = []
    functions = {
        "softmax": lambda x: torch.softmax(x.float(), dim=-1),
        "logsumexp (workloads.loss._stats)": lambda x: torch.logsumexp(x.float(), dim=-1),
    }
    for name, fn in functions.items():
        with FakeTensorMode(allow_non_fake_inputs=True):
            x = torch.empty(TOKENS, VOCAB, dtype=torch.bfloat16, device="cuda")
            graph = make_fx(fn, decomposition_table=select_decomp_table())(x)
            ops = [str(n.target) for n in graph.graph.nodes if n.op == "call_function"]
            count = post_grad.pass_patterns[1].apply(graph.graph)
        lines.append(f"- {name}: {', '.join(ops)}; online-softmax rewrites: {count}")
    return lines


def triton_sources() -> list[str]:
    """Inductor's Triton kernels for `_stats` (Triton's CPU target, never compiled)."""
    import torch
    import torch._inductor.codegen.triton as triton_codegen
    import torch._inductor.config as inductor_config

    from workloads.loss import _stats

    inductor_config.cpu_backend = "triton"
    torch.utils._triton.triton_hash_with_backend = lambda: "no-driver"
    define = triton_codegen.TritonScheduling.define_kernel
    sources = []

    def keep(self, src_code, node_schedule, kernel):
        name = define(self, src_code, node_schedule, kernel)
        source = src_code[src_code.index("@triton.jit") :]
        sources.append(source.replace("Placeholder.KERNEL_NAME", name))
        return name

    triton_codegen.TritonScheduling.define_kernel = keep
    logits = torch.empty(TOKENS, VOCAB, dtype=torch.bfloat16)
    labels = torch.zeros(TOKENS, dtype=torch.int64)
    try:
        torch.compile(_stats, fullgraph=True, dynamic=False)(logits, labels, 0)
    except Exception:  # noqa: BLE001 - compiling for a CPU target without its backend fails
        pass
    return sources


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the report here (default: stdout)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    sources = triton_sources()
    if not sources:
        print("no Triton code generated: is triton installed?", file=sys.stderr)
        return 2
    import torch
    import triton

    lines = [
        f"`results/calibration/loss_kernel_code.py` (torch {torch.__version__}, triton "
        f"{triton.__version__}); its docstring says what this shows.",
        "",
        "Online-softmax rewrite (Inductor post-grad pass, fake CUDA tensors):",
        "",
    ]
    lines += online_softmax_rewrites()
    lines += ["", f"Inductor's Triton kernels for `_stats` ({TOKENS} x {VOCAB} bf16):"]
    for source in sources:
        lines += ["", "```python", source.rstrip(), "```"]
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
