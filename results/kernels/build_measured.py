"""Build results/kernels/<gpu>.csv from the shared measurements of one GPU (H100 or H200).

    python results/kernels/build_measured.py [--gpu h100-sxm-80g|h200-141g]
                                   (from the repository root; captures the eight shared jobs
                                    once, then cached)

Sources (all in ../shared/data/gpu/<gpu>: one H100 80GB HBM3 SXM or one H200, each at 700 W,
driver 580.159.04, torch 2.11.0+cu130; see their READMEs), each row's `source` names its own:
- `profile:<case>`: the kernel time of every op of one profiled iteration of the eight shared
  jobs, matched to the capture of the same job (`prismbench.profile_ingest`); identical ops of
  one job are averaged (`repetitions` = how many).
- `microbench-kernels.csv:<line>`: kernel-only microbenchmarks (bf16 mm, fp8 _scaled_mm, norms,
  GELU, add, casts, embedding, causal SDPA), each replayed under the capture to say which op it
  is (`prismbench.microbench_rows`); calls the capture splits into several ops are left out.
The bf16 GEMM grid of `kernels-calibrate.csv` (`prismbench calibrate` at 86a4f47) is left out:
at the 15 shapes it shares with the two sources above it reads 1.0-1.9x their times (median
1.2x), also far above 100 us (8192x4096x4096: 490 us against 343 us in the microbenchmark and
347 us in situ), not only the launch time its README warns of. `calibrate_vs_kernel_only`
prints that comparison. The file only supplies the provenance fields (same machine and software).
The H200 folder has no such file: its provenance fields are its README's (`H200_PROVENANCE`).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "results"))
from shared_gpu import MEASURED_GPUS, shared_dir  # noqa: E402

# ../shared/data/gpu/h200-141g/README.md's first paragraph (its profiles do not name the GPU)
H200_PROVENANCE = {"gpu": "NVIDIA H200", "driver": "580.159.04", "torch": "2.11.0+cu130",
                   "clocks": "sm_max=1980 MHz", "date": "2026-11-23"}  # fmt: skip


def provenance(gpu: str, shared: Path) -> dict:
    """gpu, driver, torch, clocks, date of the shared measurements (the H100's calibrate CSV's
    rows state them; its README says the microbenchmarks and profiles ran on the same setup)."""
    if gpu == "h200-141g":
        return H200_PROVENANCE
    with (shared / "kernels-calibrate.csv").open(newline="") as handle:
        first = next(csv.DictReader(handle))
    return {k: first[k] for k in ("gpu", "driver", "torch", "clocks")} | {"date": "2026-11-23"}


def calibrate_vs_kernel_only(rows: list[dict], shared: Path) -> list[str]:
    """kernels-calibrate.csv's time over the kernel-only time (microbenchmark or profile) at
    every GEMM shape both have: why the former is left out."""
    kernel_only: dict[tuple, list[float]] = {}
    for row in rows:
        if row["op"] == "mm":
            kernel_only.setdefault((int(row["m"]), int(row["n"]), int(row["k"])), []).append(
                row["time_us"]
            )
    lines = []
    with (shared / "kernels-calibrate.csv").open(newline="") as handle:
        for row in csv.DictReader(handle):
            shape = (int(row["m"] or 0), int(row["n"] or 0), int(row["k"] or 0))
            if row["op"] == "mm" and shape in kernel_only:
                reference = min(kernel_only[shape])
                ratio = float(row["time_us"]) / reference
                lines.append(
                    f"  {shape}: calibrate {float(row['time_us']):.1f} us, kernel-only {reference:.1f} us, x{ratio:.2f}"
                )
    return lines


def profile_rows(common: dict, shared: Path) -> tuple[list[dict], list[str]]:
    from prismbench.profile_ingest import ingest_profile
    from prismbench.spec import load_job_spec

    rows, report = [], []
    cases = list(json.loads((shared / "summary.json").read_text()))
    for i, case in enumerate(cases, 1):
        print(f"[{i}/{len(cases)}] ingesting profile of {case}", flush=True)
        job = load_job_spec(shared / "specs" / f"{case}.toml")
        result = ingest_profile(shared / "profiles" / f"{case}.ops.jsonl.gz", job)
        rows += [row | common for row in result.rows]  # each "profile:<case>" (its source)
        share = 100 * result.attributed_kernel_us / result.total_kernel_us
        report.append(
            f"{case}: {result.matched_rows}/{result.trace_rows} trace rows matched, "
            f"{share:.1f} % of the profile's kernel time attributed, {len(result.rows)} rows"
        )
    return rows, report


def main() -> None:
    from prismbench.microbench_rows import microbench_rows
    from prismbench.profile_ingest import write_rows_csv

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="h100-sxm-80g", choices=MEASURED_GPUS)
    gpu = parser.parse_args().gpu
    shared, out = shared_dir(gpu), ROOT / "results" / "kernels" / f"{gpu}.csv"
    common = provenance(gpu, shared)
    micro, skipped = microbench_rows(shared / "microbench-kernels.csv", common)
    profiles, report = profile_rows(common, shared)
    rows = profiles + micro
    write_rows_csv(rows, out)
    print("\n".join(report))
    if (shared / "kernels-calibrate.csv").exists():
        print("kernels-calibrate.csv (left out) against kernel-only times at the same GEMM shapes:")
        print("\n".join(calibrate_vs_kernel_only(rows, shared)))
    print(f"microbenchmark rows skipped: {len(skipped)}")
    print("\n".join(f"  {s}" for s in skipped))
    print(f"wrote {len(rows)} rows to {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
