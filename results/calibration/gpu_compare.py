"""Per-op-class predicted vs measured compute of the eight shared jobs on one GPU, leave-one-out.

    python results/calibration/gpu_compare.py [--gpu h100-sxm-80g|h200-141g] [--only CASE]
                                              [--out FILE] [--top N]

For each case: `prismbench.compare.compare_profile` of specs/<case>.toml against
profiles/<case>.ops.jsonl.gz (../shared/data/gpu/<gpu>), priced with results/kernels/<gpu>.csv
without the rows of the case's own profile. The same as `prismbench compare SPEC --profile
PROFILE --kernel-table results/kernels/<gpu>.csv --skip-source profile:CASE`. Then, over all cases, the error per op kind (GEMM, attention,
memory-bound), which the issue's goal (GEMM and attention classes within 5 %) is about.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "results"))
from shared_gpu import cases_from_cli, commit_label, leave_one_out_table, shared_dir  # noqa: E402

from emulator.costs.kernel_table import PRICE_SOURCES  # noqa: E402


def kind(op: str) -> str:
    from emulator.costs.ops import ATTENTION_OPS, GEMM_OPS

    if op in GEMM_OPS:
        return "GEMM"
    return "attention" if op in ATTENTION_OPS else "memory-bound and other"


def main() -> None:
    from prismbench.compare import compare_profile
    from prismbench.spec import load_job_spec

    def top(parser):
        parser.add_argument("--top", type=int, default=6, help="classes shown per case")

    args, cases, _ = cases_from_cli(__doc__.splitlines()[0], top)
    shared = shared_dir(args.gpu)
    lines, by_kind = [], defaultdict(lambda: defaultdict(float))
    for i, case in enumerate(cases, 1):
        print(f"[{i}/{len(cases)}] {case}", file=sys.stderr, flush=True)
        table = leave_one_out_table(case, args.gpu)
        result = compare_profile(
            load_job_spec(shared / "specs" / f"{case}.toml"),
            shared / "profiles" / f"{case}.ops.jsonl.gz",
            name=case,
            kernel_table=table,
        )
        error = (result.predicted_s - result.measured_s) / result.measured_s
        lines += [
            f"### {case}",
            "",
            f"Compute predicted {result.predicted_s * 1e3:.2f} ms, kernels measured "
            f"{result.measured_s * 1e3:.2f} ms ({100 * error:+.1f} %).",
            "",
            "| op | aten op | ops (trace/profile) | predicted ms | measured ms | error "
            f"| priced by ({'/'.join(PRICE_SOURCES)}) |",
            "|---|---|--:|--:|--:|--:|--:|",
        ]
        for c in result.classes[: args.top]:
            rel = f"{100 * c.error_s / c.measured_s:+.1f} %" if c.measured_s else "not measured"
            by = "/".join(str(c.priced_by[s]) for s in PRICE_SOURCES)
            lines.append(
                f"| {c.op} | {c.aten} | {c.trace_ops}/{c.profile_ops} | {c.predicted_s * 1e3:.2f} | "
                f"{c.measured_s * 1e3:.2f} | {rel} | {by} |"
            )
        lines.append("")
        for c in result.classes:
            entry = by_kind[(case, kind(c.op))]
            entry["predicted"] += c.predicted_s
            entry["measured"] += c.measured_s
    kinds = ("GEMM", "attention", "memory-bound and other")
    summary = ["| case | " + " | ".join(kinds) + " |", "|---|" + "--:|" * len(kinds)]
    for case in cases:
        cells = []
        for k in kinds:
            e = by_kind[(case, k)]
            cells.append(
                f"{100 * (e['predicted'] - e['measured']) / e['measured']:+.1f} %"
                if e["measured"]
                else "-"
            )
        summary.append(f"| {case} | " + " | ".join(cells) + " |")
    text = "\n".join(
        [
            "Error of predicted compute per op kind, (predicted - measured) / measured:",
            "",
            *summary,
            "",
            *lines,
            f"({args.gpu}, commit {commit_label()})",
        ]  # fmt: skip
    )
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
