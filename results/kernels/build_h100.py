"""Build results/kernels/h100-sxm-80g.csv from the shared H100 measurements.

    python results/kernels/build_h100.py            (from the repository root; captures the
                                                      eight shared jobs once, then cached)

Sources (all in ../shared/data/gpu/h100-sxm-80g, one H100 80GB HBM3 SXM at 700 W, driver
580.159.04, torch 2.11.0+cu130; see its README), each row's `source` column names its own:
- `profile:<case>`: the kernel time of every op of one profiled iteration of the eight shared
  jobs, matched to the capture of the same job (`prismbench.profile_ingest`); identical ops of
  one job are averaged (`repetitions` = how many).
- `microbench-kernels.csv:<line>`: kernel-only microbenchmarks (bf16 mm, fp8 _scaled_mm, norms,
  GELU, add, casts, embedding, causal SDPA), each replayed under the capture to say which op it
  is (`prismbench.microbench_rows`); calls the capture splits into several ops are left out.
- `kernels-calibrate.csv:<line>`: the bf16 GEMM grid of `prismbench calibrate` at 86a4f47, only
  rows of at least MIN_CALIBRATE_US: that method counted launch time, which the README measures
  at ~44 us for tiny kernels. Its attention rows are left out: they force the flash backend,
  while the workloads run torch's default choice (cuDNN on this H100, ~2x faster).
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "results"))
from shared_h100 import SHARED  # noqa: E402

OUT = ROOT / "results" / "kernels" / "h100-sxm-80g.csv"
# Below this a kernels-calibrate.csv row is mostly the launch (README: ~44 us for a 5 us kernel).
MIN_CALIBRATE_US = 100.0


def provenance() -> dict:
    """gpu, driver, torch, clocks, date of the shared measurements (the calibrate CSV's rows
    state them; the README says the microbenchmarks and profiles ran on the same setup)."""
    with (SHARED / "kernels-calibrate.csv").open(newline="") as handle:
        first = next(csv.DictReader(handle))
    return {k: first[k] for k in ("gpu", "driver", "torch", "clocks")} | {"date": "2026-11-23"}


def calibrate_rows(common: dict) -> list[dict]:
    rows = []
    with (SHARED / "kernels-calibrate.csv").open(newline="") as handle:
        for line, row in enumerate(csv.DictReader(handle), start=2):
            if row["op"] != "mm" or float(row["time_us"]) < MIN_CALIBRATE_US:
                continue
            rows.append(
                row | common | {"aten": "aten.mm", "source": f"kernels-calibrate.csv:{line}"}
            )
    return rows


def profile_rows(common: dict) -> tuple[list[dict], list[str]]:
    from prismbench.profile_ingest import ingest_profile
    from prismbench.spec import load_job_spec

    rows, report = [], []
    cases = list(json.loads((SHARED / "summary.json").read_text()))
    for i, case in enumerate(cases, 1):
        print(f"[{i}/{len(cases)}] ingesting profile of {case}", flush=True)
        job = load_job_spec(SHARED / "specs" / f"{case}.toml")
        result = ingest_profile(SHARED / "profiles" / f"{case}.ops.jsonl.gz", job)
        rows += [row | common | {"source": f"profile:{case}"} for row in result.rows]
        share = 100 * result.attributed_kernel_us / result.total_kernel_us
        report.append(
            f"{case}: {result.matched_rows}/{result.trace_rows} trace rows matched, "
            f"{share:.1f} % of the profile's kernel time attributed, {len(result.rows)} rows"
        )
    return rows, report


def main() -> None:
    from prismbench.microbench_rows import microbench_rows
    from prismbench.profile_ingest import write_rows_csv

    common = provenance()
    micro, skipped = microbench_rows(SHARED / "microbench-kernels.csv", common)
    profiles, report = profile_rows(common)
    rows = profiles + micro + calibrate_rows(common)
    write_rows_csv(rows, OUT)
    print("\n".join(report))
    print(f"microbenchmark rows skipped: {len(skipped)}")
    print("\n".join(f"  {s}" for s in skipped))
    print(f"wrote {len(rows)} rows to {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
