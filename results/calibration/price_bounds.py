"""The shared jobs' table-priced ops (interpolated, extrapolated) outside the bounds curve-priced ops keep.

    python results/calibration/price_bounds.py [--gpu h100-sxm-80g|h200-141g] [--only CASE] [--out FILE]

Per case, leave-one-out (the table without the case's own profile, as `gpu_jobs.py`): the ops
the lookup prices above `KernelTable.ceiling_s` (a larger op of the group measured shorter) or
below `KernelTable.floor_s` (a smaller one measured longer), their summed excess, and the five
most frequent. The README's section "A price bounded by a larger measured op" says why these
bounds are kept for curve-priced ops only.
"""
from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # this checkout's packages, not an installed copy
sys.path.insert(0, str(ROOT / "results"))
from shared_gpu import cases_from_cli, leave_one_out_table, shared_dir  # noqa: E402

from emulator.costs.kernel_table import PRICE_SOURCES  # noqa: E402
from emulator.costs.pricing import op_record  # noqa: E402
from prismbench.emulate import price_job  # noqa: E402
from prismbench.spec import load_job_spec  # noqa: E402

# a price this close to a bound is on it (float rounding of the two ways to the same time)
TOLERANCE = 1e-4


def out_of_bounds(table, priced):
    """(seconds above the ceilings, seconds below the floors, Counter of the ops outside)."""
    over = under = 0.0
    found = Counter()
    for p, trace in priced.capture.traces.items():
        durations, sources = priced.prices[p]
        for source in ("interpolated", "extrapolated"):
            for row in np.flatnonzero(sources == PRICE_SOURCES.index(source)):
                op = op_record(trace, int(row))
                seconds = durations[row]
                ceiling, floor = table.ceiling_s(op), table.floor_s(op)
                if seconds > ceiling * (1 + TOLERANCE):
                    side, bound = "above", ceiling
                    over += seconds - ceiling
                elif seconds < floor * (1 - TOLERANCE):
                    side, bound = "below", floor
                    under += floor - seconds
                else:
                    continue
                what = (side, source, op.name, op.aten, op.dtype, op.m, op.n, op.k, int(op.bytes_total))
                found[(*what, f"{seconds * 1e6:.2f} us", f"bound {bound * 1e6:.2f} us")] += 1
    return over, under, found


def main() -> None:
    args, cases, _ = cases_from_cli(__doc__.splitlines()[0])
    lines = []
    for case in cases:
        table = leave_one_out_table(case, args.gpu)
        job = load_job_spec(shared_dir(args.gpu) / "specs" / f"{case}.toml")
        priced = price_job(job, kernel_table=table, host_dispatch=None, kernel_gap_s=0.0)
        compute_s = sum(durations.sum() for durations, _ in priced.prices.values())
        over, under, found = out_of_bounds(table, priced)
        block = [f"{args.gpu} {case}: compute {compute_s * 1e3:.2f} ms; above the ceilings by "
                 f"{over * 1e3:.3f} ms, below the floors by {under * 1e3:.3f} ms "
                 f"({sum(found.values())} ops)"]  # fmt: skip
        block += [f"    {count} x {what}" for what, count in found.most_common(5)]
        print("\n".join(block), flush=True)
        lines += block
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
