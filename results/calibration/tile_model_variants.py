"""Variants of the GEMM tile model the kernel tables interpolate with, scored three ways.

    python results/calibration/tile_model_variants.py [--gpu h100-sxm-80g|h200-141g] [--out FILE]

`KernelTable` interpolates a GEMM's rate per busy tile slot (`emulator/costs/gemm_tiles.py`:
128 x 128 tiles, padding and waves of one tile per SM). The profiles show cuBLAS leaving that
picture where k is long: the 125M job's 768 x 768 x 16 384 weight gradient runs a `splitK`
kernel and a `splitKreduce`, and its 768 x 3 072 x 16 384 one (144 tiles of 128, two waves
on 132 SMs by the model) runs in 104 us, faster than the forward GEMM of the same FLOPs with
3 072 tiles (119 us). The variants, each applied to both the rows and the op priced:
- `current`: the package's model;
- `padding only`: no wave quantization;
- `none`: rates interpolated as measured;
- `split-K >= K`: the waves counted over tiles x s work units, s the best split of k into
  parts of at least K (cuBLAS's split-K and stream-K schedules fill the SMs from k).
Scored by (1) leave-one-shape-out over the table's aligned bf16 GEMM rows (each shape priced by
the table without its rows, as `prismbench.emulate` prices: `op_price`), (2) the shared jobs'
GEMM compute leave-one-out (`gpu_compare.py`'s GEMM column: a job priced without its own
profile's rows) and their iteration times (`gpu_jobs.py`'s error), (3) out of sample, vidur's H100 GEMM medians (`build_a100.py`'s same-chip
check; H100 table only). Nothing here changes the package: the variants are patched in.
"""

from __future__ import annotations

import collections
import contextlib
import importlib.util
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "results"))
from shared_gpu import cases_from_cli, commit_label, leave_one_out_table, shared_dir  # noqa: E402

import emulator.costs.kernel_table as kernel_table  # noqa: E402
from emulator.costs.gemm_tiles import GEMM_TILE  # noqa: E402
from emulator.costs.ops import GEMM_OPS, gemm_op  # noqa: E402

SPLIT_K_MIN = (512, 1024, 2048)


def _padding(m: int, n: int) -> float:
    return m * n / (math.ceil(m / GEMM_TILE) * GEMM_TILE * math.ceil(n / GEMM_TILE) * GEMM_TILE)


def _split_k(min_k: int):
    def utilisation(m: int, n: int, k: int, batch: int, sm_count: int) -> float:
        tiles = math.ceil(m / GEMM_TILE) * math.ceil(n / GEMM_TILE) * batch
        best = max(
            units / (math.ceil(units / sm_count) * sm_count)
            for units in (tiles * s for s in range(1, max(1, k // min_k) + 1))
        )
        return _padding(m, n) * best

    return utilisation


VARIANTS = {
    "current": None,
    "padding only": lambda m, n, k, b, sms: _padding(m, n),
    "none": lambda m, n, k, b, sms: 1.0,
    **{f"split-K >= {k}": _split_k(k) for k in SPLIT_K_MIN},
}


@contextlib.contextmanager
def tile_model(utilisation):
    """Interpolate with `utilisation(m, n, k, batch, sm_count)` in place of the package's."""
    if utilisation is None:
        yield
        return
    from_rows, rows_utilisation, op_utilisation = (
        kernel_table.KernelTable._from_rows, kernel_table._tile_utilisation, kernel_table.gemm_tile_utilisation
    )  # fmt: skip
    op_k = [0]

    def priced_from_rows(self, op, *args, **kwargs):
        op_k[0] = op.k  # the package's call for the op passes no k
        return from_rows(self, op, *args, **kwargs)

    def of_rows(features, sm_count):
        shapes = np.rint(np.exp2(features)).astype(np.int64)
        return np.array([utilisation(m, n, k, b, sm_count) for m, n, k, b in shapes])

    kernel_table.KernelTable._from_rows = priced_from_rows
    kernel_table._tile_utilisation = of_rows
    kernel_table.gemm_tile_utilisation = lambda m, n, b, sms: utilisation(m, n, op_k[0], b, sms)
    try:
        yield
    finally:
        kernel_table.KernelTable._from_rows = from_rows
        kernel_table._tile_utilisation = rows_utilisation
        kernel_table.gemm_tile_utilisation = op_utilisation


def shape_loo(gpu: str):
    """(errors of the interpolated shapes, of all shapes): each aligned bf16 GEMM shape of the
    table priced without its rows, (predicted - measured) / measured."""
    from emulator.costs.compute import op_price
    from emulator.hardware import gpu_preset
    from prismbench.emulate import KERNEL_TABLES

    preset = gpu_preset(gpu)
    rows = kernel_table.read_rows(KERNEL_TABLES / f"{gpu}.csv")
    by_shape = collections.defaultdict(list)
    for r in rows:
        o = r.op
        if o.name in GEMM_OPS and o.dtype == "bf16" and all(d % 8 == 0 for d in (o.m, o.n, o.k)):
            by_shape[kernel_table.row_key(o)].append(r)
    tables = {
        key: kernel_table.table_from_rows(
            [r for r in rows if kernel_table.row_key(r.op) != key], label="without the shape"
        )
        for key in by_shape
    }

    def score() -> tuple[list[float], list[tuple]]:
        interpolated, every = [], []
        for key, own in by_shape.items():
            seconds, source, _ = op_price(own[0].op, preset, table=tables[key])
            measured = np.average([r.time_us for r in own], weights=[r.repetitions for r in own]) * 1e-6
            error = (seconds - measured) / measured
            every.append((error, own[0].op))
            if source == "interpolated":
                interpolated.append(error)
        return interpolated, every

    return score


def job_gemm_errors(gpu: str, cases: list[str]):
    from prismbench.compare import compare_profile
    from prismbench.spec import load_job_spec

    shared = shared_dir(gpu)
    jobs = {case: load_job_spec(shared / "specs" / f"{case}.toml") for case in cases}
    tables = {case: leave_one_out_table(case, gpu) for case in cases}

    def score() -> dict[str, float]:
        errors = {}
        for case in cases:
            result = compare_profile(
                jobs[case], shared / "profiles" / f"{case}.ops.jsonl.gz", name=case, kernel_table=tables[case]
            )
            gemms = [c for c in result.classes if c.op in GEMM_OPS]
            predicted, measured = sum(c.predicted_s for c in gemms), sum(c.measured_s for c in gemms)
            errors[case] = (predicted - measured) / measured
        return errors

    return score


def iteration_errors(gpu: str, cases: list[str], measured: dict):
    """(predicted - measured) / measured iteration time of each shared job, leave-one-out, as
    `gpu_jobs.py` scores it (host dispatch and kernel gaps without the job's own profile)."""
    from prismbench.emulate import emulate, host_dispatch_for, kernel_gap_for, price_job
    from prismbench.spec import load_job_spec

    shared = shared_dir(gpu)
    inputs = {
        case: (
            load_job_spec(shared / "specs" / f"{case}.toml"),
            leave_one_out_table(case, gpu),
            kernel_gap_for(skip_profiles=(case,)),
        )
        for case in cases
    }

    def score() -> dict[str, float]:
        errors = {}
        for case, (job, table, gap) in inputs.items():
            host = host_dispatch_for(job, skip_profiles=(case,))
            priced = price_job(job, kernel_table=table, host_dispatch=host, kernel_gap_s=gap)
            real = measured[case]["iteration_s_median"]
            errors[case] = (emulate(job, name=case, priced=priced).iteration_time_s - real) / real
        return errors

    return score


def vidur_h100():
    """(m, vidur's H100 GEMM median time over the H100 table's price) per shape it profiled.
    vidur ran another software stack, about 1.1x the table's times overall: what tells models
    apart is the spread around that ratio (median absolute deviation of the log ratio)."""
    spec = importlib.util.spec_from_file_location("build_a100", ROOT / "results" / "kernels" / "build_a100.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    from emulator.hardware import gpu_preset

    h100 = gpu_preset("h100-sxm-80g")
    table = kernel_table.load_kernel_table(build.KERNELS / "h100-sxm-80g.csv")
    shapes = []
    for r in build.read_csv(build.SOURCES / "vidur_mlp.csv"):
        if r["gpu"] == "h100" and r["op"] in build.VIDUR_GEMMS:
            n, k, _ = build.vidur_gemm_shape(r)[r["op"]]
            shapes.append((gemm_op("mm", int(r["num_tokens"]), n, k), float(r["median_ms"]) * 1e-3))

    def score() -> list[tuple[int, float]]:
        ratios = []
        for op, measured_s in shapes:
            found = table.lookup(op, h100.sm_count)
            if found is not None:
                ratios.append((op.m, measured_s / found[0]))
        return ratios

    return score


def pct(values) -> str:
    return f"{100 * values:.1f} %"


def main() -> None:
    args, cases, measured = cases_from_cli(__doc__.splitlines()[0], lambda parser: None)
    shapes, jobs = shape_loo(args.gpu), job_gemm_errors(args.gpu, cases)
    iterations = iteration_errors(args.gpu, cases, measured)
    vidur = vidur_h100() if args.gpu == "h100-sxm-80g" else None
    header = ["variant", "shapes interpolated: median / p90 / max |error|", "jobs' GEMMs: max |error|",
              "jobs' iterations: median / max |error|"]  # fmt: skip
    header += ["vidur H100 / table: median ratio, MAD of log ratio; at m < 512: median ratio"] if vidur else []
    lines = ["| " + " | ".join(header) + " |", "|---|" + "--:|" * (len(header) - 1)]
    per_job = {}
    for i, (name, utilisation) in enumerate(VARIANTS.items(), 1):
        print(f"[{i}/{len(VARIANTS)}] {name}", file=sys.stderr, flush=True)
        with tile_model(utilisation):
            interpolated, _ = shapes()
            per_job[name] = jobs()
            iteration = np.abs(list(iterations().values()))
            ratios = vidur() if vidur else None
        e = np.abs(interpolated)
        cells = [
            name,
            f"{pct(np.median(e))} / {pct(np.percentile(e, 90))} / {pct(e.max())} (n = {len(e)})",
            pct(max(abs(v) for v in per_job[name].values())),
            f"{pct(np.median(iteration))} / {pct(iteration.max())}",
        ]
        if ratios:
            logs = np.log([r for _, r in ratios])
            small = [r for m, r in ratios if m < 512]
            cells.append(
                f"{np.exp(np.median(logs)):.3f}, {np.median(np.abs(logs - np.median(logs))):.3f}; "
                f"{np.median(small):.3f} (n = {len(ratios)}, {len(small)})"
            )
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "GEMM compute per job, leave-one-out, (predicted - measured) / measured:", ""]
    lines += ["| case | " + " | ".join(VARIANTS) + " |", "|---|" + "--:|" * len(VARIANTS)]
    lines += [f"| {case} | " + " | ".join(f"{100 * per_job[v][case]:+.1f} %" for v in VARIANTS) + " |" for case in cases]
    text = "\n".join([*lines, "", f"({args.gpu}, commit {commit_label()})"])
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
