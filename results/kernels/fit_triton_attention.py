"""Fit the one unmeasured figure of the Triton attention kernel: its speed over FlashAttention v1.

    python results/kernels/fit_triton_attention.py [--out-json results/kernels/triton-attention-fit.json]
        [--out-md results/kernels/triton_attention_fit.md]   (captures cached; 13 min cold on 2 cores)
    python results/kernels/build_attention_rates.py          (writes the rates with the fitted ratios)

llm-foundry's `attn_impl: triton` runs Tri Dao's FlashAttention Triton kernel, of which no
measurement was found; its docstring puts it "slightly slower" than FlashAttention v1 overall,
faster in the forward, slower in the backward, and says it makes "the backward for d=128 much
faster by reducing register spilling" (FlashAttention v1's head-dim-128 backward is its slow
case). So the ratio of its forward+backward rate to FlashAttention v1's bars is one number per
head dim (64 and 128, the two MPT uses), not 1 at both.

The two ratios are fitted once, globally, on every published llm-foundry row that runs the
kernel (`results/baselines/llmfoundry__*.toml`; A100 40/80 GB and H100 rows together), and on
nothing else: for each row the iteration is replayed (graph.replay.replay_samples, the job's
own graph with its attention kernels' time divided by each candidate ratio), and each head
dim's ratio minimises the sum of squared log errors of its rows over a grid of step 0.005. The
output gives every row's error at ratio 1 and at the fit, and its leave-one-out error (the
ratio fitted without that row), so the fit's effect can be judged on rows it did not see.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from build_attention_rates import read_bars, rows_of  # noqa: E402

from emulator.costs.attention_rates import attention_rates_from_rows  # noqa: E402
from emulator.costs.ops import ATTENTION_OPS  # noqa: E402
from emulator.costs.pricing import compute_prices  # noqa: E402
from emulator.graph.build import build_graph, segment_rows  # noqa: E402
from emulator.graph.execution_graph import SEGMENT  # noqa: E402
from emulator.graph.replay import replay_samples  # noqa: E402
from emulator.hardware import gpu_preset  # noqa: E402
from prismbench.baselines import load_baseline  # noqa: E402
from prismbench.capture import capture_job  # noqa: E402
from prismbench.emulate import cost_context  # noqa: E402

RATIOS = np.round(np.arange(0.70, 1.6001, 0.005), 3)
OUT_JSON = ROOT / "results" / "kernels" / "triton-attention-fit.json"
OUT_MD = ROOT / "results" / "kernels" / "triton_attention_fit.md"


def head_dim(job) -> int:
    return job.model.hidden // job.model.heads


@functools.cache
def fa1_rates(arch: str):
    """FlashAttention v1's bars on `arch` as the Triton kernel's rates: ratio 1."""
    return attention_rates_from_rows(rows_of(read_bars(), "flash1"), "triton", arch)


def row_times(path: Path) -> dict:
    """One baseline's measured iteration and its predicted one at every ratio in RATIOS, with
    the Triton kernel priced at FlashAttention v1's bars times the ratio."""
    baseline = load_baseline(path)
    job = baseline.job
    capture = capture_job(job)
    cost = replace(cost_context(job), attention=fa1_rates(gpu_preset(job.cluster.gpu).arch))
    durations = {p: compute_prices(trace, cost)[0] for p, trace in capture.traces.items()}
    graph = build_graph(capture.traces, capture.world, cost, durations_s=durations)
    # the part of each segment the ratio divides: its attention kernels, less the stream's idle
    # time before each (one kernel an attention call, `pricing._price`)
    attention = []
    for p, trace in capture.traces.items():
        rows, node = segment_rows(trace, graph.classes[p])
        names = np.array(trace.strings)[trace.columns["name"][rows]]
        is_attention = np.isin(names, ATTENTION_OPS)
        kernel_s = np.where(is_attention, durations[p][rows] - cost.kernel_gap_s, 0.0)
        attention.append(np.bincount(node, weights=kernel_s, minlength=len(graph.classes[p])))
    inverse = 1.0 / RATIOS

    def duration(p: int, n: int):
        c = graph.classes[p]
        if c["kind"][n] != SEGMENT or attention[p][n] == 0.0:
            return c["duration_s"][n]
        base, att = c["duration_s"][n], attention[p][n]
        return (base - att + att * inverse).reshape((1,) * len(graph.lanes) + (len(RATIOS),))

    times = replay_samples(graph, len(RATIOS), duration)
    return {
        "baseline": path.stem,
        "gpu": job.cluster.gpu,
        "head_dim": head_dim(job),
        "seq_len": job.batch.seq_len,
        "measured_s": baseline.measured.iteration_time_s,
        "predicted_s": [float(t) for t in times],
    }


def sq_log_error(rows: list[dict]) -> np.ndarray:
    """Per ratio: the sum over `rows` of squared log(predicted / measured)."""
    if not rows:
        return np.zeros(len(RATIOS))
    return sum(np.log(np.array(r["predicted_s"]) / r["measured_s"]) ** 2 for r in rows)


def best_ratio(rows: list[dict]) -> int:
    """Index into RATIOS minimising the rows' squared log errors."""
    return int(np.argmin(sq_log_error(rows)))


def error_at(row: dict, i: int) -> float:
    return row["predicted_s"][i] / row["measured_s"] - 1


def fit(rows: list[dict]) -> dict:
    """The ratio per head dim, every row's error at ratio 1, at the fit and left out."""
    one = int(np.argmin(np.abs(RATIOS - 1.0)))
    ratios, table = {}, []
    for hd in sorted({r["head_dim"] for r in rows}):
        group = [r for r in rows if r["head_dim"] == hd]
        i = best_ratio(group)
        ratios[hd] = float(RATIOS[i])
        for r in group:
            j = best_ratio([o for o in group if o is not r])
            table.append(
                {
                    "baseline": r["baseline"],
                    "gpu": r["gpu"],
                    "head_dim": hd,
                    "seq_len": r["seq_len"],
                    "measured_s": r["measured_s"],
                    "error_ratio_1": error_at(r, one),
                    "error_fit": error_at(r, i),
                    "ratio_left_out": float(RATIOS[j]),
                    "error_left_out": error_at(r, j),
                }
            )
    return {"ratios": ratios, "rows": table}


def summary(errors: list[float]) -> str:
    a = [abs(e) for e in errors]
    return (
        f"median |error| {100 * statistics.median(a):.1f} %, max {100 * max(a):.1f} %, "
        f"{sum(x <= 0.05 for x in a)} of {len(a)} within 5 %"
    )


def markdown(result: dict, commit: str) -> str:
    rows = sorted(result["rows"], key=lambda r: (r["head_dim"], r["gpu"], r["seq_len"]))
    lines = [
        "# The Triton attention kernel's rate over FlashAttention v1, fitted on llm-foundry's rows",
        "",
        f"Made at {commit} by `python results/kernels/fit_triton_attention.py` (the method is in "
        "its docstring). Error = (predicted - measured) / measured iteration time; "
        "`left out`: the row predicted with the ratio fitted on the other rows of its head dim.",
        "",
        "| head dim | rows | fitted ratio |",
        "|--:|--:|--:|",
    ]
    for hd, ratio in result["ratios"].items():
        n = sum(r["head_dim"] == int(hd) for r in rows)
        lines.append(f"| {hd} | {n} | {ratio:.3f} |")
    lines += [
        "",
        f"- ratio 1 (FlashAttention v1's bars): {summary([r['error_ratio_1'] for r in rows])}",
        f"- fitted: {summary([r['error_fit'] for r in rows])}",
        f"- left out: {summary([r['error_left_out'] for r in rows])}",
        "",
        "| row | gpu | head dim | seq | ratio 1 | fitted | left out (its ratio) |",
        "|---|---|--:|--:|--:|--:|--:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['baseline']} | {r['gpu']} | {r['head_dim']} | {r['seq_len']} | "
            f"{100 * r['error_ratio_1']:+.1f} % | {100 * r['error_fit']:+.1f} % | "
            f"{100 * r['error_left_out']:+.1f} % ({r['ratio_left_out']:.3f}) |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-json", type=Path, default=OUT_JSON)
    parser.add_argument("--out-md", type=Path, default=OUT_MD)
    args = parser.parse_args()
    paths = [
        path
        for path, b in (
            (p, load_baseline(p))
            for p in sorted((ROOT / "results" / "baselines").glob("llmfoundry__*.toml"))
        )
        if b.job.kernels.attention == "triton" and b.measured.iteration_time_s is not None
    ]
    rows = []
    for i, path in enumerate(paths, 1):
        print(f"[{i}/{len(paths)}] {path.stem}: capturing (cached) and replaying", flush=True)
        rows.append(row_times(path))
    result = fit(rows)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    args.out_json.write_text(
        json.dumps(
            {
                "made_at": commit,
                "ratios": {str(k): v for k, v in result["ratios"].items()},
                "rows": result["rows"],
            },
            indent=1,
        )
        + "\n"
    )
    args.out_md.write_text(markdown(result, commit))
    print(f"ratios {result['ratios']}; wrote {args.out_json} and {args.out_md}")


if __name__ == "__main__":
    main()
