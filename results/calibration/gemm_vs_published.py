"""Predicted vs published cuBLASLt GEMM throughput: prints the GEMM table of README.md.

Run: python results/calibration/gemm_vs_published.py   (from the repository root)

The published points (`published_gemm_tflops.csv`, transcribed from the Azure AI-benchmarking-
guide result files named in each row) against the roofline curves alone
(`emulator.costs.compute.curve_time_s`: no kernel table) plus the time a stream idles before
each kernel (`prismbench.emulate.kernel_gap_for`, measured on the H100 node: the benchmarks time
back-to-back launches), so that the curves' constants, which each GPU preset anchors on its
largest square shape, are checked on the other shapes.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from emulator.costs.compute import curve_time_s
from emulator.costs.ops import gemm_op
from emulator.hardware import gpu_preset
from prismbench.emulate import kernel_gap_for


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    path = Path(__file__).with_name("published_gemm_tflops.csv")
    gap_s = kernel_gap_for()
    print("| GPU | dtype | m x n x k | published TFLOP/s | predicted | error |")
    print("|---|---|---|---:|---:|---:|")
    for row in csv.DictReader(path.open()):
        m, n, k = (int(row[f]) for f in ("m", "n", "k"))
        gpu = gpu_preset(row["gpu"])
        dtype = row["dtype"]
        op = gemm_op("scaled_mm" if dtype == "fp8" else "mm", m, n, k, dtype=dtype)
        predicted = op.flops / (curve_time_s(op, gpu) + gap_s) / 1e12
        published = float(row["tflops"])
        error = (predicted - published) / published
        print(
            f"| {row['gpu']} | {row['dtype']} | {m}x{n}x{k} | {published:.1f} | {predicted:.1f} "
            f"| {100 * error:+.1f}% |"
        )


if __name__ == "__main__":
    main()
