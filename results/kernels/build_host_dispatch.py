"""Build results/kernels/host-dispatch.json: measured host (CPU) time per GPU op.

    python results/kernels/build_host_dispatch.py      (from the repository root; ~5 s)

Sources (../shared/data/gpu/h100-sxm-80g, one H100 80GB HBM3 node, torch 2.11.0+cu130,
workloads at 86a4f47; see its README):
- `profiles/<case>.ops.jsonl.gz`: one profiled iteration of the eight world-size-1 jobs
  (framework `aten`: plain tensors);
- `fake-pg-ranks/<case>.hostops.jsonl.gz`: one profiled iteration of one tensor-parallel rank
  (tp 4 and 8) with torch's fake process group (framework `dtensor`).
`prismbench.host_timing` reads, per profile, the interval from each launching op's CPU start to
the next one's, split into per-op intervals and phase entries by class (forward, backward,
optimizer), and summarizes them (count, mean, quantiles, sum; microseconds).

Profiler inflation: torch.profiler (CPU + CUDA activities, record_shapes) adds host time to
every event. Where a run is host-bound without the profiler (its unprofiled median iteration
exceeds the profile's kernel sum by more than 20 %, so the GPU waits for the host), the
profiled iteration over the unprofiled one measures that inflation: 760m (profiled wall over
summary.json's median) and the tp8 rank (the profile's host span over results.json's median; a
later run of the same code). `emulator.costs.host_dispatch.from_figures` divides the measured
intervals by the geometric mean of these ratios: one global factor, its residuals printed here.

Kernel gap (the launch path's GPU side): for each world-size-1 profile, (summary.json's
unprofiled median iteration - the profile's kernel sum) / the kernels its launching ops
launched; `emulator.costs.host_dispatch.kernel_gap_from_figures` takes the median over the
profiles that are not host-bound by the rule above (their GPU never waits for the host, so what
the kernels do not account for is time between kernels).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "results"))
from shared_gpu import SHARED  # noqa: E402

OUT = ROOT / "results" / "kernels" / "host-dispatch.json"
HOST_BOUND = 1.2  # unprofiled iteration / profiled kernel sum above which a run is host-bound


def _profiles() -> dict[str, tuple[str, Path]]:
    found = {
        p.name.split(".ops.")[0]: ("aten", p)
        for p in sorted((SHARED / "profiles").glob("*.ops.jsonl.gz"))
    }
    for p in sorted((SHARED / "fake-pg-ranks").glob("*.hostops.jsonl.gz")):
        found[p.name.split(".hostops.")[0]] = ("dtensor", p)
    return found


def _unprofiled_s() -> dict[str, float]:
    summary = json.loads((SHARED / "summary.json").read_text())
    fake = json.loads((SHARED / "fake-pg-ranks" / "results.json").read_text())
    out = {case: entry["iteration_s_median"] for case, entry in summary.items()}
    out |= {case: e["iteration_s_median"] for case, e in fake.items() if isinstance(e, dict)}
    return out


def _profiled_s(case: str, figures: dict) -> float:
    summary = json.loads((SHARED / "summary.json").read_text())
    if case in summary:
        return summary[case]["profiled_iteration_wall_s"]
    return figures["host_span_us"] * 1e-6  # hostops: no wall clock recorded, the host span


def build() -> dict:
    from emulator.costs.host_dispatch import FRAMEWORKS, from_figures, kernel_gap_from_figures
    from prismbench.host_timing import profile_figures, read_launch_gaps

    profiles, inflation = {}, {}
    unprofiled = _unprofiled_s()
    for case, (framework, path) in _profiles().items():
        figures = profile_figures(read_launch_gaps(path))
        profiles[case] = {
            "framework": framework,
            "file": str(path.relative_to(SHARED.parents[2])),
        } | figures
        kernel_s = figures["kernel_sum_us"] * 1e-6
        if case in unprofiled and unprofiled[case] > HOST_BOUND * kernel_s:
            profiled = _profiled_s(case, figures)
            inflation[case] = {
                "profiled_s": round(profiled, 4),
                "unprofiled_s": round(unprofiled[case], 4),
                "kernel_sum_s": round(kernel_s, 4),
                "ratio": round(profiled / unprofiled[case], 4),
            }
    data = {
        "schema": 1,
        "measured_on": "../shared/data/gpu/h100-sxm-80g: H100 80GB HBM3 node, torch 2.11.0+cu130, "
        "CUDA 13.0, workloads at 86a4f47, 2026-11-23",
        "built_by": "results/kernels/build_host_dispatch.py",
        "units": "microseconds (host_span_us, kernel_sum_us, *_us); seconds (*_s)",
        "host_bound_rule": f"unprofiled iteration > {HOST_BOUND} x the profile's kernel sum",
        "profiler_inflation": inflation,
        "profiles": profiles,
    }
    data["kernel_gap"] = _kernel_gaps(profiles, unprofiled)
    data["model"] = {}
    for framework in FRAMEWORKS:
        host = from_figures(data, framework)
        data["model"][framework] = {
            "per_op_us": {c: round(v * 1e6, 2) for c, v in host.per_op_s.items()},
            "entry_us": {c: round(v * 1e6, 2) for c, v in host.entry_s.items()},
            "source": host.source,
        }
    data["kernel_gap"]["model_us"] = round(kernel_gap_from_figures(data) * 1e6, 3)
    return data


def _kernel_gaps(profiles: dict, unprofiled: dict) -> dict:
    """Per world-size-1 profile (the `aten` ones): the unprofiled iteration's time beyond the
    kernel sum, per kernel launched, and whether the run is GPU-bound (module docstring)."""
    out = {}
    for case, figures in profiles.items():
        if figures["framework"] != "aten":
            continue
        kernel_s = figures["kernel_sum_us"] * 1e-6
        out[case] = {
            "unprofiled_s": round(unprofiled[case], 6),
            "kernel_sum_s": round(kernel_s, 6),
            "kernels": figures["kernels"],
            "gap_us_per_kernel": round((unprofiled[case] - kernel_s) / figures["kernels"] * 1e6, 3),
            "gpu_bound": unprofiled[case] <= HOST_BOUND * kernel_s,
        }
    return {"rule": "median over the GPU-bound profiles of (unprofiled - kernel sum) / kernels",
            "profiles": out}  # fmt: skip


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    data = build()
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    ratios = {case: r["ratio"] for case, r in data["profiler_inflation"].items()}
    gm = 1.0
    for r in ratios.values():
        gm *= r ** (1 / len(ratios))
    print(f"wrote {OUT.relative_to(ROOT)}", file=sys.stderr)
    print(f"profiler inflation (global, geometric mean) {gm:.3f}; residuals: "
          + ", ".join(f"{c} {100 * (r / gm - 1):+.1f} %" for c, r in ratios.items()))  # fmt: skip
    print("| framework | class | per op (us) | entry (us) |")
    print("|---|---|--:|--:|")
    for framework, m in data["model"].items():
        for cls, us in m["per_op_us"].items():
            print(f"| {framework} | {cls} | {us:.1f} | {m['entry_us'][cls]:.1f} |")
    print("| case | kernels | beyond the kernel sum (us per kernel) | GPU-bound |")
    print("|---|--:|--:|---|")
    for case, g in data["kernel_gap"]["profiles"].items():
        print(f"| {case} | {g['kernels']} | {g['gap_us_per_kernel']:.2f} | {g['gpu_bound']} |")
    print(
        f"kernel gap (median over the GPU-bound profiles): {data['kernel_gap']['model_us']:.2f} us"
    )


if __name__ == "__main__":
    main()
