"""Time many iterations of shared jobs on this machine's GPU: the repeated runs issue 18 scores on.

    python3 results/fidelity/repeat_gpu.py --out DIR [--iterations 40] CASE...   (on a CUDA machine)

For each CASE (a shared job, e.g. gpt3-125m-s2048-mb8-none): the recorded baseline measured on
this GPU (results/baselines/recorded/<prefix>__CASE.toml; the GPU is detected and must be one
of the measured ones, `shared_gpu.local_gpu_preset`; an unknown CASE exits 2 before anything
runs) trains for real (`prismbench.record.record` on cuda, 3 warm-up iterations, then
ITERATIONS timed ones), and DIR/repeat_CASE.json holds the
recording (`Recording.to_dict`: every iteration's seconds, the allocator's peaks, the machine).
The variability model's KS goal is scored against these distributions
(`results/fidelity/variability_repeats.py`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "results"))
from shared_gpu import local_gpu_preset, recorded_baseline_path  # noqa: E402

WARMUP = 3


def recorded_path(case: str, gpu: str) -> Path:
    """The recorded baseline of `case` measured on `gpu`."""
    path = recorded_baseline_path(case, gpu)
    if not path.is_file():
        raise ValueError(f"CASE {case!r}: no recorded baseline {path.name} for {gpu}")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="+", metavar="CASE")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--iterations", type=int, default=40)
    args = parser.parse_args(argv)
    if args.iterations < 2:
        parser.error(f"--iterations={args.iterations}: at least 2 (a distribution)")
    gpu = local_gpu_preset()
    try:
        paths = [recorded_path(case, gpu) for case in args.cases]  # all before any run
    except ValueError as bad:
        parser.error(str(bad))
    from prismbench.baselines import load_baseline
    from prismbench.record import record

    args.out.mkdir(parents=True, exist_ok=True)
    for case, path in zip(args.cases, paths, strict=True):
        recording = record(
            load_baseline(path).job, iterations=args.iterations, warmup=WARMUP, device="cuda"
        )
        (args.out / f"repeat_{case}.json").write_text(json.dumps(recording.to_dict(), indent=1))
        print(f"{case}: median {recording.iteration_s_median:.4f} s over "
              f"{len(recording.iteration_s)} iterations ({gpu})", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
