"""Check the expandable-segments allocator model on a real GPU (issue 16; torchtitan's launcher
sets `expandable_segments:True`, and its peaks are scored under both settings).

    python3 results/fidelity/expandable_gpu.py --out DIR [CASE...]       (on a CUDA machine)
    python results/fidelity/expandable_gpu.py --compare DIR/expandable_gpu.json [...]  (anywhere)

On the GPU: each CASE (default CASES; a shared job, from its recorded baseline on this GPU)
trains for real twice (`prismbench.record` on cuda, 3 warm-up and 2 timed iterations), under
torch's default allocator and under PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (set in
the environment `record`'s rank processes inherit, before CUDA starts there);
DIR/expandable_gpu.json holds both steady peaks (allocated, reserved) per case. --compare
replays each case's capture under both settings (`emulator.memory.replay_memory`) and prints
predicted against measured, the error (predicted - measured) / measured; given several files
(runs of different cases, as the H100's of 2026-11-28, whose fourth case ran in a second call),
it takes their rows in order, and a case on one GPU in two of them is refused.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "results"))
from shared_gpu import local_gpu_preset, recorded_baseline_path, recorded_job  # noqa: E402

CASES = ("gpt3-125m-s2048-mb8-none", "gpt3-1.3b-s2048-mb4-full-ga2",
         "llama2-7b-l4-s4096-mb1-sel", "llama3-8b-l2-s8192-mb2-none")  # fmt: skip
SETTINGS = {"default": "", "expandable": "expandable_segments:True"}


def measure(cases: list[str], gpu: str, out: Path) -> None:
    from prismbench.record import record

    rows = []
    for case in cases:
        row = {"case": case, "gpu": gpu}
        for name, conf in SETTINGS.items():
            os.environ["PYTORCH_CUDA_ALLOC_CONF"] = conf
            recording = record(recorded_job(case, gpu), iterations=2, warmup=3, device="cuda")
            row[name] = recording.peak_steady
            print(f"{case} {name}: {recording.peak_steady}", flush=True)
        rows.append(row)
        (out / "expandable_gpu.json").write_text(json.dumps(rows, indent=2) + "\n")
    os.environ.pop("PYTORCH_CUDA_ALLOC_CONF")


def measured_rows(paths: list[Path]) -> list[dict]:
    """The rows of every expandable_gpu.json in `paths`, in order. A case measured on one GPU
    in two of them is refused: the table would score it twice, each time against another run."""
    rows, seen = [], {}
    for path in paths:
        for row in json.loads(path.read_text()):
            key = (row["case"], row["gpu"])
            if key in seen:
                raise ValueError(f"{row['case']} on {row['gpu']} is in both {seen[key]} and {path}")
            seen[key] = path
            rows.append(row)
    return rows


def compare(paths: list[Path]) -> list[str]:
    from emulator.hardware import gpu_preset
    from emulator.memory import replay_memory
    from prismbench.capture import capture_job

    lines = ["| case | allocator | allocated, measured | error | reserved, measured | error |",
             "|---|---|--:|--:|--:|--:|"]  # fmt: skip
    for row in measured_rows(paths):
        trace = capture_job(recorded_job(row["case"], row["gpu"])).traces[0]
        for name, conf in SETTINGS.items():
            m = replay_memory(trace, gpu=gpu_preset(row["gpu"]), alloc_conf=conf, stage=0)
            real = row[name]
            lines.append(
                f"| {row['case']} | {name} | {real['allocated']:,} B | "
                f"{100 * (m.peak_allocated_bytes / real['allocated'] - 1):+.3f} % | "
                f"{real['reserved']:,} B | {100 * (m.peak_reserved_bytes / real['reserved'] - 1):+.3f} % |"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", metavar="CASE")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--compare", type=Path, nargs="+", metavar="JSON")
    args = parser.parse_args(argv)
    if args.compare:
        try:
            lines = compare(args.compare)
        except ValueError as err:
            parser.error(f"--compare: {err}")
        print("\n".join(lines))
        return 0
    if args.out is None:
        parser.error("--out or --compare is required")
    gpu = local_gpu_preset()
    cases = args.cases or list(CASES)
    missing = [c for c in cases if not recorded_baseline_path(c, gpu).is_file()]
    if missing:
        parser.error(f"CASE {missing}: no recorded baseline on {gpu}")
    args.out.mkdir(parents=True, exist_ok=True)
    measure(cases, gpu, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
