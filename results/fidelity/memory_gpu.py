"""Predicted vs measured peak memory of the eight shared jobs on one GPU: first and steady iteration.

    python results/fidelity/memory_gpu.py [--gpu h100-sxm-80g|h200-141g] [--only CASE]
                                          [--out results/fidelity/memory_<gpu>.md]

Measurements: ../shared/data/gpu/<gpu>/summary.json (`peak_first_iteration`: the first
training iteration from an empty allocator; `peak_steady`: after reset_peak_memory_stats()
following three warm-up iterations), torch 2.11 / CUDA 13 on an H100 80GB HBM3 or an H200,
workloads at commit 86a4f47. Prediction: each job's spec (specs/<case>.toml) captured on CPU
(cached) and its one class replayed by emulator.memory for the GPU's preset, default allocator
settings. Error = (predicted - measured) / measured.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "results"))
from shared_gpu import cases_from_cli, report, shared_dir  # noqa: E402

FIGURES = ("allocated", "reserved", "requested")


def predict(case: str, gpu: str) -> dict:
    from emulator.memory import replay_memory
    from prismbench.capture import capture_job
    from prismbench.spec import load_job_spec

    job = load_job_spec(shared_dir(gpu) / "specs" / f"{case}.toml")
    capture = capture_job(job)
    (trace,) = capture.traces.values()
    r = replay_memory(trace, gpu=gpu)
    return {
        "peak_first_iteration": {
            "allocated": r.first_iteration_peak_allocated_bytes,
            "reserved": r.first_iteration_peak_reserved_bytes,
            "requested": r.first_iteration_peak_requested_bytes,
        },
        "peak_steady": {
            "allocated": r.peak_allocated_bytes,
            "reserved": r.peak_reserved_bytes,
            "requested": r.peak_requested_bytes,
        },
        "steady_iterations": r.steady_iterations,
        "unmatched_frees": r.unmatched_frees,
    }


def table(rows: dict, measured: dict) -> list[str]:
    lines = [
        "| case | iteration | allocated: pred / meas (GB) | err | reserved: pred / meas (GB) | err "
        "| requested err |",
        "|---|---|---|--:|---|--:|--:|",
    ]
    for case, pred in rows.items():
        for key, label in (("peak_first_iteration", "first"), ("peak_steady", "steady")):
            p, m = pred[key], measured[case][key]
            err = {f: 100 * (p[f] - m[f]) / m[f] for f in FIGURES}
            lines.append(
                f"| {case} | {label} | {p['allocated'] / 1e9:.3f} / {m['allocated'] / 1e9:.3f} "
                f"| {err['allocated']:+.3f} % | {p['reserved'] / 1e9:.3f} / "
                f"{m['reserved'] / 1e9:.3f} | {err['reserved']:+.2f} % "
                f"| {err['requested']:+.3f} % |"
            )
    return lines


def main() -> None:
    args, cases, measured = cases_from_cli(__doc__.splitlines()[0])
    rows = {}
    for i, case in enumerate(cases, 1):
        print(f"[{i}/{len(cases)}] {case}: capturing and replaying", flush=True)
        rows[case] = predict(case, args.gpu)
    lines = table(rows, measured)
    report(f"python results/fidelity/memory_gpu.py --gpu {args.gpu}", lines, args.out)


if __name__ == "__main__":
    main()
