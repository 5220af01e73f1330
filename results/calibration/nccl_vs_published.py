"""Predicted vs published nccl-tests bus bandwidth: prints the Markdown tables of README.md.

Run: python results/calibration/nccl_vs_published.py   (from the repository root)
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np

from emulator.costs.collectives import Topology, bus_bandwidth_GBps, choose_algorithm
from emulator.hardware import gpu_preset, inter_node_network, intra_node_link

# the network of each generation's published clusters; the link is the GPU's own board's
_NETWORK = {"ampere": "ib-hdr-8x200", "hopper": "ib-ndr-8x400"}


def _topology(gpu_name: str, gpus_per_node: int) -> Topology:
    gpu = gpu_preset(gpu_name)
    return Topology(gpu=gpu, gpus_per_node=gpus_per_node, link=intra_node_link(gpu.intra_node),
                    network=inter_node_network(_NETWORK[gpu.arch]))  # fmt: skip


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    path = Path(__file__).with_name("published_nccl_busbw.csv")
    rows = list(csv.DictReader(path.open()))
    current = None
    for row in rows:
        if row["id"] != current:
            current = row["id"]
            print(f"\n### {current}: {row['gpu']}, {row['nodes']} node(s) x {row['gpus_per_node']} GPUs, {row['collective']}\n")
            print("| size (B) | published busbw (GB/s) | predicted (GB/s) | error | predicted algo/proto |")
            print("|---:|---:|---:|---:|---|")
        topo = _topology(row["gpu"], int(row["gpus_per_node"]))
        ranks = np.arange(int(row["nodes"]) * int(row["gpus_per_node"]))
        size, published = float(row["size_bytes"]), float(row["busbw_GBps"])
        predicted = float(bus_bandwidth_GBps(row["collective"], size, ranks, topo)[0])
        algo, proto, _ = choose_algorithm(row["collective"], size, ranks, topo)
        error = (predicted - published) / published
        print(f"| {int(size)} | {published:g} | {predicted:.2f} | {error:+.1%} | {algo}/{proto} |")


if __name__ == "__main__":
    main()
