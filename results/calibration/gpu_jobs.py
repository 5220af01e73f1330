"""Predicted vs measured iteration time of the eight shared jobs (world size 1) on one GPU.

    python results/calibration/gpu_jobs.py [--gpu h100-sxm-80g|h200-141g] [--only CASE]
                                           [--table measured|rule-from-h100] [--out FILE]
                                           [--experimental-host-scale FACTOR]

Measured: ../shared/data/gpu/<gpu>/summary.json `iteration_s_median` (eight timed iterations
after three warm-up ones, torch 2.11 / CUDA 13, workloads at 86a4f47; an H100 80GB HBM3 or an
H200). Predicted: `prismbench.emulate.emulate` of specs/<case>.toml (capture cached), priced
with results/kernels/<gpu>.csv LEAVE-ONE-OUT: the rows ingested from the case's own profile
(source `profile:<case>`) are left out of the table that predicts it, and the host dispatch
figures (results/kernels/host-dispatch.json, `emulator.costs.host_dispatch`, measured in the
H100 profiles) are taken without the case's own profile (per-op intervals and profiler
inflation), as is the time a stream idles between kernels (`kernel_gap_from_figures`, same
file). `--table rule-from-h100` (H200 only) prices with the H100 table instead, less the
case's own H100 profile, carried to the H200 by the rule that builds the tables of GPUs not
measured here (results/kernels/build_a100.py, `transfer_factor`): what that rule is worth on
a GPU where it can be checked. Error =
(predicted - measured) / measured. "no host" is the same prediction with the host binding
nothing (kernels back to back, the idle time between them kept), the model before host
dispatch. "host wait" is the time the GPU waits for the host: predicted, the breakdown's
`host_wait_s` (docs/METRICS.md); measured, the iteration's median less the kernel time of the
case's profiled iteration and its kernels' idle gaps at the same leave-one-out figure the
prediction uses (what is left once the GPU's own work is counted). "priced by" counts the compute
ops of one iteration by how they were priced (`kernel_table.PRICE_SOURCES`: exact shape, interpolated,
extrapolated, an attention kernel's published rates, roofline curves).
Progress goes to stderr, the table to stdout.

`--experimental-host-scale FACTOR` (not the model: a what-if for a proposal) multiplies every
host dispatch figure the prediction takes, per op and per phase entry, by FACTOR; the last
line says so. The host model's own figures are those without it.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # this checkout's packages, not an installed copy
sys.path.insert(0, str(ROOT / "results"))
from shared_gpu import cases_from_cli, commit_label, leave_one_out_table, shared_dir  # noqa: E402

from emulator.costs.kernel_table import PRICE_SOURCES  # noqa: E402


def measured_host_wait_s(case: str, gpu: str, iteration_s: float, gap_s: float) -> float:
    """The measured iteration less the kernels of the case's profile and their idle gaps."""
    from prismbench.profile_readers import read_ops_jsonl

    ops = read_ops_jsonl(shared_dir(gpu) / "profiles" / f"{case}.ops.jsonl.gz")
    kernels_s = sum(op.kernel_us for op in ops) * 1e-6
    return iteration_s - kernels_s - gap_s * sum(len(op.kernels) for op in ops)


def without_host_s(priced) -> float:
    """The iteration time of the same priced job with the host binding nothing."""
    from emulator.graph.build import build_graph
    from emulator.graph.replay import replay

    cost = dataclasses.replace(priced.cost, host=None)
    capture = priced.capture
    graph = build_graph(capture.traces, capture.world, cost, durations_s=priced.durations_s)
    return replay(graph).iteration_time_s


@functools.cache
def _h100_rows_and_rule():
    """The H100 table's rows and build_a100.py (the transfer rule), read once per run."""
    import csv

    from prismbench.emulate import KERNEL_TABLES

    spec = importlib.util.spec_from_file_location("build_a100", KERNEL_TABLES / "build_a100.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    with (KERNEL_TABLES / "h100-sxm-80g.csv").open(newline="") as handle:
        return list(csv.DictReader(handle)), build


def rule_from_h100_table(case: str, gpu: str):
    """The H100 table less `case`'s own profile, every row carried to `gpu` by
    build_a100.py's `transferred` (the rule the A100 and H100 HBM2e tables are built with)."""
    from emulator.hardware import gpu_preset

    rows, build = _h100_rows_and_rule()
    rows = [r for r in rows if r["source"] != f"profile:{case}"]
    return build.as_table(build.transferred(rows, gpu_preset("h100-sxm-80g"), gpu_preset(gpu)))


def _options(parser) -> None:
    parser.add_argument("--table", choices=("measured", "rule-from-h100"), default="measured",
                        help="price with the GPU's own table or the H100's carried by the rule")  # fmt: skip
    parser.add_argument("--experimental-host-scale", type=float, metavar="FACTOR",
                        help="what-if, not the model: every host dispatch figure times FACTOR")  # fmt: skip


def scaled_host(host, factor: float | None):
    """`host`'s figures, per op and per entry, times `factor` (None: `host` itself)."""
    if factor is None or host is None:
        return host
    return dataclasses.replace(
        host,
        per_op_s={k: v * factor for k, v in host.per_op_s.items()},
        entry_s={k: v * factor for k, v in host.entry_s.items()},
        source=f"{host.source}, EXPERIMENTAL x {factor:g}",
    )


def main() -> None:
    from prismbench.emulate import emulate, host_dispatch_for, kernel_gap_for, price_job
    from prismbench.spec import load_job_spec

    args, cases, measured = cases_from_cli(__doc__.splitlines()[0], _options)
    scale = args.experimental_host_scale
    if scale is not None and not scale >= 0:
        print(f"--experimental-host-scale {scale}: a factor >= 0", file=sys.stderr)
        sys.exit(2)
    if args.table == "rule-from-h100" and args.gpu == "h100-sxm-80g":
        print("--table rule-from-h100: give --gpu h200-141g (the H100 is measured)",
              file=sys.stderr)  # fmt: skip
        sys.exit(2)
    shared = shared_dir(args.gpu)
    lines = [
        "| case | predicted (s) | measured (s) | error | no host (s) | no-host error "
        "| host wait: predicted / measured (ms) "
        f"| priced by: {' / '.join(PRICE_SOURCES)} |",
        "|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    errors, before = [], []
    for i, case in enumerate(cases, 1):
        print(f"[{i}/{len(cases)}] {case}", file=sys.stderr, flush=True)
        if args.table == "measured":
            table = leave_one_out_table(case, args.gpu)
        else:
            table = rule_from_h100_table(case, args.gpu)
        job = load_job_spec(shared / "specs" / f"{case}.toml")
        host = scaled_host(host_dispatch_for(job, skip_profiles=(case,)), scale)
        gap = kernel_gap_for(skip_profiles=(case,))
        priced = price_job(job, kernel_table=table, host_dispatch=host, kernel_gap_s=gap)
        result = emulate(job, name=case, priced=priced)
        by = result.compute_priced_by
        real = measured[case]["iteration_s_median"]
        errors.append(100 * (result.iteration_time_s - real) / real)
        no_host = without_host_s(priced)
        before.append(100 * (no_host - real) / real)
        waited_s = measured_host_wait_s(case, args.gpu, real, gap)
        lines.append(
            f"| {case} | {result.iteration_time_s:.4f} | {real:.4f} | {errors[-1]:+.1f} % "
            f"| {no_host:.4f} | {before[-1]:+.1f} % "
            f"| {1e3 * result.breakdown['host_wait_s']:.1f} / {1e3 * waited_s:.1f} | "
            + " / ".join(f"{int(by[s]['ops'])}" for s in PRICE_SOURCES)
            + " |"
        )
    commit = commit_label()
    absolute = [abs(e) for e in errors]
    lines.append("")
    lines.append(f"median |error| {statistics.median(absolute):.1f} %, max {max(absolute):.1f} %; "
                 f"no host: median {statistics.median(abs(e) for e in before):.1f} %, "
                 f"max {max(abs(e) for e in before):.1f} % ({args.gpu}, table {args.table}, "
                 f"commit {commit})")  # fmt: skip
    if scale is not None:
        lines.append(f"EXPERIMENTAL: every host dispatch figure x {scale:g} "
                     "(--experimental-host-scale; not the host model)")  # fmt: skip
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
