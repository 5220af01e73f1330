"""torchtitan's published peak memory against the prediction, under both allocator settings.

    python results/fidelity/torchtitan_peaks.py [--out results/fidelity/torchtitan_peaks.md]

torchtitan's Dec 2024 benchmark tables (results/baselines/torchtitan2024__*.toml) report the
largest `max_reserved` over GPUs. Which PYTORCH_CUDA_ALLOC_CONF the runs used is not stated:
torchtitan's launcher at the benchmark's commit (run_llama_train.sh, 9dec370) sets
`expandable_segments:True`, its multi-node slurm script of the same commit sets nothing. The
headline prediction (`validate`) keeps torch's default; this script replays each row's capture
(cached) under both, so the choice can be seen row by row. Error = (predicted - measured) /
measured, reserved bytes of the steady iteration.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "results"))
from shared_gpu import report  # noqa: E402

SETTINGS = {"default": "", "expandable": "expandable_segments:True"}


def predict(path: Path) -> tuple[float, dict[str, tuple[float, float]]]:
    """(measured GiB, {setting: (predicted allocated GiB, predicted reserved GiB)})."""
    from emulator.memory import replay_memory
    from emulator.units import GiB
    from prismbench.baselines import load_baseline
    from prismbench.capture import capture_job

    baseline = load_baseline(path)
    job = baseline.job
    capture = capture_job(job)
    figures = {}
    for setting, conf in SETTINGS.items():
        peaks = [
            replay_memory(trace, gpu=job.cluster.gpu, alloc_conf=conf, stage=stage)
            for stage, trace in capture.traces.items()
        ]
        top = max(peaks, key=lambda r: r.peak_reserved_bytes)
        figures[setting] = (top.peak_allocated_bytes / GiB, top.peak_reserved_bytes / GiB)
    return baseline.measured.peak_mem_bytes / GiB, figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    paths = sorted((ROOT / "results" / "baselines").glob("torchtitan2024__*.toml"))
    lines = [
        "| row | measured | default: allocated / reserved | error | expandable: allocated "
        "/ reserved | error |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    for i, path in enumerate(paths, 1):
        print(f"[{i}/{len(paths)}] {path.stem}: capturing and replaying", flush=True)
        measured, figures = predict(path)
        cells = []
        for setting in SETTINGS:
            allocated, reserved = figures[setting]
            error = 100 * (reserved - measured) / measured
            cells += [f"{allocated:.2f} / {reserved:.2f} GiB", f"{error:+.1f} %"]
        row = path.stem.removeprefix("torchtitan2024__")
        lines.append(f"| {row} | {measured:.2f} GiB | " + " | ".join(cells) + " |")
    report("python results/fidelity/torchtitan_peaks.py", lines, args.out)


if __name__ == "__main__":
    main()
