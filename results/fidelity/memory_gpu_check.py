"""Check emulator.memory against the real CUDA caching allocator on one GPU.

Run on a CUDA machine from the repository root:  python results/fidelity/memory_gpu_check.py
Without a GPU it still captures and replays (prediction only), so it can be tried anywhere.

For each case (a small GPT, sizes x activation recompute) it
1. runs one training step for real on cuda:0 in a fresh process and reads
   torch.cuda.memory_stats() (allocated / reserved / requested peaks) and cudaMemGetInfo;
2. captures the same program on CPU under FakeTensorMode with the op recorder;
3. replays the trace through the allocator model for the detected GPU preset;
and prints measured vs predicted with the relative error (pred - meas) / meas.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

CASES = [  # (dim, heads, layers, batch, seq, recompute)
    (512, 8, 4, 8, 512, False),
    (512, 8, 4, 8, 512, True),
    (1024, 16, 8, 4, 1024, False),
    (2048, 16, 4, 2, 2048, False),
]
VOCAB = 32000


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.norm1, self.qkv, self.proj = (
            nn.LayerNorm(dim),
            nn.Linear(dim, 3 * dim),
            nn.Linear(dim, dim),
        )
        self.norm2, self.up, self.down = (
            nn.LayerNorm(dim),
            nn.Linear(dim, 4 * dim),
            nn.Linear(4 * dim, dim),
        )

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = (
            t.view(b, s, self.heads, d // self.heads).transpose(1, 2)
            for t in self.qkv(self.norm1(x)).split(d, -1)
        )
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class GPT(nn.Module):
    def __init__(self, dim, heads, layers, recompute):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, dim)
        self.layers = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.head = nn.Linear(dim, VOCAB, bias=False)
        self.recompute = recompute

    def forward(self, idx):
        x = self.emb(idx)
        for layer in self.layers:
            x = checkpoint(layer, x, use_reentrant=False) if self.recompute else layer(x)
        return F.cross_entropy(self.head(x).flatten(0, 1).float(), idx.flatten())


def step(case, device, recorder=None):
    dim, heads, layers, batch, seq, recompute = case
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # not model.to(): it fails under FakeTensorMode
    try:
        with torch.device(device):
            model = GPT(dim, heads, layers, recompute)
            opt = torch.optim.AdamW(model.parameters(), foreach=True)
            idx = torch.randint(0, VOCAB, (batch, seq))
    finally:
        torch.set_default_dtype(default)
    if recorder is not None:
        recorder.tag(model, "parameter")
        recorder.tag(idx, "other")
        recorder.__enter__()
    loss = model(idx)
    loss.backward()
    del loss
    if recorder is not None:
        with recorder.phase("optimizer"):
            opt.step()
    else:
        opt.step()
    opt.zero_grad()
    if recorder is not None:
        recorder.__exit__(None, None, None)


def measure(case) -> dict:
    """One real step on cuda:0 (called in a fresh subprocess: the allocator starts empty)."""
    step(case, "cuda")
    torch.cuda.synchronize()
    stats = torch.cuda.memory_stats()
    free, total = torch.cuda.mem_get_info()
    return {
        "allocated": stats["allocated_bytes.all.peak"],
        "reserved": stats["reserved_bytes.all.peak"],
        "requested": stats["requested_bytes.all.peak"],
        "device_used_now": total - free,
        "reserved_now": stats["reserved_bytes.all.current"],
        "gpu_name": torch.cuda.get_device_name(0),
        "total": total,
    }


def predict(case, gpu: str) -> dict:
    from torch._subclasses.fake_tensor import FakeTensorMode

    from emulator.capture.op_recorder import OpRecorder
    from emulator.memory import replay_memory

    rec = OpRecorder()
    with FakeTensorMode():
        step(case, "cpu", rec)
    result = replay_memory(rec.trace(), gpu=gpu)
    return {
        "allocated": result.peak_allocated_bytes,
        "reserved": result.peak_reserved_bytes,
        "requested": result.peak_requested_bytes,
        "outside": result.outside.total_bytes,
    }


def preset_for(name: str) -> str:
    if "H200" in name:
        return "h200-141g"
    if "H100" in name:
        return "h100-sxm-80g"
    return "a100-sxm-80g" if "80GB" in name else "a100-sxm-40g"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measure", type=int, choices=range(len(CASES)), metavar="CASE",
                        help="internal: one real step of CASES[CASE], printed as JSON")  # fmt: skip
    args = parser.parse_args()
    if args.measure is not None:
        print(json.dumps(measure(CASES[args.measure])))
        return
    cuda = torch.cuda.is_available()
    for i, case in enumerate(CASES):
        meas = None
        if cuda:
            out = subprocess.run(
                [sys.executable, __file__, "--measure", str(i)],
                capture_output=True,
                text=True,
                check=True,
            )
            meas = json.loads(out.stdout.strip().splitlines()[-1])
        gpu = preset_for(meas["gpu_name"]) if meas else "h100-sxm-80g"
        pred = predict(case, gpu)
        line = f"case {case} on {gpu}:"
        for key in ("allocated", "reserved", "requested"):
            p = pred[key]
            if meas:
                err = (p - meas[key]) / meas[key] * 100
                line += f"\n  {key:9s} pred {p:>14,d}  meas {meas[key]:>14,d}  err {err:+.3f} %"
            else:
                line += f"\n  {key:9s} pred {p:>14,d}  (no GPU: not measured)"
        if meas:
            outside = meas["device_used_now"] - meas["reserved_now"]
            line += f"\n  outside allocator: pred {pred['outside']:,d}  meas (used - reserved) {outside:,d}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
