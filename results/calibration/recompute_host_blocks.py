"""Host time per transformer block in the shared profiles, by recompute mode (a diagnosis).

    python results/calibration/recompute_host_blocks.py [--gpu h200-141g] [--out FILE]
                                                    (from the repository root; ~10 s)

The host-dispatch model (`emulator.costs.host_dispatch`) gives every op of a phase class one
figure, the median over the profiles. The 760M job (op-level selective recompute) is the one
shared job that it misses by far (results/calibration/README.md). This table asks whether a
figure per recompute mode would carry it: for each profile (`prismbench.host_timing` reads the
launching ops and their host intervals), the forward's blocks, each from one norm op to the
one two norms later, with the launching ops per block and the host microseconds per block and
per launching op (medians over the blocks). Blocks of the same family run the same ops, so a
difference between recompute modes is the recompute's own host cost: the non-reentrant
checkpoint's saved-tensor hooks ("full") or selective checkpointing's Python dispatch mode
("selective", which sees every aten op, except those inside a custom op: at 86a4f47 RoPE was
one).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "results"))
from shared_gpu import cases_from_cli, report, shared_dir  # noqa: E402

from prismbench.host_timing import read_launch_gaps  # noqa: E402
from prismbench.spec import load_job_spec  # noqa: E402

NORMS = ("aten::native_layer_norm", "aten::_fused_rms_norm")


def forward_blocks(path: Path) -> tuple[list[int], list[float]]:
    """Launching ops and host microseconds of each forward block of one profile."""
    gaps = read_launch_gaps(path)
    norms = [
        i for i, (op, cls) in enumerate(zip(gaps.ops, gaps.classes, strict=True))
        if op in NORMS and cls == "forward"
    ]  # fmt: skip
    starts = norms[::2]  # two norms per block
    ops = [b - a for a, b in zip(starts[:-1], starts[1:], strict=True)]
    host = [float(gaps.gap_us[a:b].sum()) for a, b in zip(starts[:-1], starts[1:], strict=True)]
    return ops, host


def main() -> None:
    args, cases, measured = cases_from_cli(__doc__.splitlines()[0])
    shared = shared_dir(args.gpu)
    folder = shared / "profiles"
    lines = [
        "| case | recompute | blocks | launching ops / block | host us / block | host us / op "
        "| unprofiled iteration min .. max (s) |",
        "|---|---|--:|--:|--:|--:|--:|",
    ]
    for case in cases:
        ops, host = forward_blocks(folder / f"{case}.ops.jsonl.gz")
        recompute = load_job_spec(shared / "specs" / f"{case}.toml").train.recompute
        per_block = float(np.median(host))
        run = measured[case]
        lines.append(
            f"| {case} | {recompute} | {len(ops)} | {int(np.median(ops))} | {per_block:.0f} "
            f"| {per_block / np.median(ops):.0f} "
            f"| {run['iteration_s_min']:.4f} .. {run['iteration_s_max']:.4f} |"
        )
    gpu = "" if args.gpu == "h100-sxm-80g" else f" --gpu {args.gpu}"
    report(f"python results/calibration/recompute_host_blocks.py{gpu}", lines, args.out)


if __name__ == "__main__":
    main()
