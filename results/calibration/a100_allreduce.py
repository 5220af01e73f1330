"""vTrain's measured NCCL all-reduce on 2-8 A100s of one node against emulator.costs.collectives.

    python results/calibration/a100_allreduce.py       (prints the markdown table of a100.md)

Measured: results/kernels/sources/vtrain_a100_allreduce.csv (nccl-tests, out-of-place time;
provenance in that folder's README). Predicted: `collective_time_s("all_reduce", size, ranks
0..n-1, topology)` on a100-sxm-80g, nvlink3, 8 GPUs per node (one node: the network is unused).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from emulator.costs.collectives import Topology, choose_algorithm  # noqa: E402
from emulator.hardware import gpu_preset, inter_node_network, intra_node_link  # noqa: E402

SOURCE = ROOT / "results" / "kernels" / "sources" / "vtrain_a100_allreduce.csv"
SHOWN_MIB = (1, 8, 64, 256, 1024)


def comparison() -> list[dict]:
    topology = Topology(gpu=gpu_preset("a100-sxm-80g"), gpus_per_node=8, link=intra_node_link("nvlink3"),
                        network=inter_node_network("ib-hdr-8x200"))  # fmt: skip
    rows = []
    with SOURCE.open(newline="") as handle:
        for r in csv.DictReader(handle):
            gpus, size = int(r["gpus"]), int(r["size_bytes"])
            algo, proto, predicted_s = choose_algorithm(
                "all_reduce", size, np.arange(gpus), topology
            )
            measured_us = float(r["time_oop_ns"]) / 1e3
            rows.append({"gpus": gpus, "MiB": size >> 20, "measured_us": measured_us,
                         "predicted_us": predicted_s * 1e6, "algo": f"{algo}/{proto}",
                         "error": predicted_s * 1e6 / measured_us - 1})  # fmt: skip
    return rows


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    rows = comparison()
    print("| GPUs | " + " | ".join(f"{m} MiB: meas / pred us (err)" for m in SHOWN_MIB) + " |")
    print("|---|" + "---|" * len(SHOWN_MIB))
    for gpus in sorted({r["gpus"] for r in rows}):
        cells = {r["MiB"]: r for r in rows if r["gpus"] == gpus}
        shown = [
            f"{cells[m]['measured_us']:.0f} / {cells[m]['predicted_us']:.0f} ({100 * cells[m]['error']:+.0f} %)"
            for m in SHOWN_MIB
        ]
        print(f"| {gpus} | " + " | ".join(shown) + " |")
    for label, chosen in (("all", rows), (">= 64 MiB", [r for r in rows if r["MiB"] >= 64]),
                          ("<= 8 MiB", [r for r in rows if r["MiB"] <= 8])):  # fmt: skip
        errors = [r["error"] for r in chosen]
        print(f"\n{label}: {len(errors)} points, median error {100 * statistics.median(errors):+.1f} %, "
              f"median |error| {100 * statistics.median(abs(e) for e in errors):.1f} %, "
              f"range {100 * min(errors):+.0f} .. {100 * max(errors):+.0f} %")  # fmt: skip
    print("\nalgorithms chosen:", sorted({r["algo"] for r in rows}))


if __name__ == "__main__":
    main()
