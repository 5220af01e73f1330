"""Host time per launching op and per aten call, measured without the profiler on a GPU's host.

    python3 results/calibration/host_tiny_gpu.py --out FILE [--device cuda|cpu]
        [--iterations N] [--case CASE ...]          (from the repository root; ~2 min on a GPU)
    python results/calibration/host_tiny_gpu.py --from-json JSON [--where TEXT] [--out FILE]
                                                    (here, on a CPU: the report of a GPU run)

The host model's figures come from torch.profiler records of real runs, whose intervals between
launching ops overstate host cost where a run is GPU-bound (`host_per_call.md`, table 2: the
NeMo GPT reprofiles' host by those figures exceeds their own iteration). This measures host
cost where nothing else can be in it: each shared job's program (its recorded
`prism-86a4f47` spec, `results/baselines/recorded/h100shared__<case>.toml`: same layers,
recompute, precision, optimizer and accumulation) shrunk to tiny tensors (hidden 64, 4 heads,
FFN 256, vocabulary 128, 32 tokens, micro-batch 1), whose kernels take a few microseconds:
the GPU always waits for the host, so an iteration's wall time (`workloads.train_step` between
two `torch.cuda.synchronize()`, median of N after 3 warm-up ones) is the host's time to issue
it. The same tiny job captured on the CPU gives its launching ops (compute rows) and the aten
calls the program dispatched (`host_per_call.counted_calls`). Then one iteration under
torch.profiler as the shared profiles were taken (CPU and CUDA activities, record_shapes):
profiled over unprofiled wall says what the profiler adds, as a factor and per call.

Per job: measured host us per launching op and per call, and the host time the emulator's
model charges the same capture (`emulator.costs.host_dispatch.dispatch_times_s` with
`results/kernels/host-dispatch.json`'s aten figures: per launching op of each class, a phase's
first op its entry figure). `--device cpu` runs the same steps with CPU tensors (their kernels
are not tiny there): plumbing, not a measurement. Writes FILE (markdown) and FILE with `.json`
again after every job, so a job that fails (its traceback on stderr, its row says so) or a cut
keeps the jobs before it. The jobs are the recorded shared ones
(`results/baselines/recorded/h100shared__*.toml`): no ../shared needed, which does not travel
to the device machine. Each job's record also says where it ran and its launches and calls
per trace phase (recompute apart from backward).

`--from-json` renders the report again from such a JSON (no measurement: any machine), with a
second table: the jobs without recompute fitted by one host figure per launching op and by
one per aten call (the geometric mean of theirs, each job's miss), and what the jobs with
recompute take beyond that per-launch figure, per launch and per call of their recomputation.
A JSON written before the records said where they ran (the H200 run of 2026-11-30, at
664c165) needs `--where`; one without the per-phase counts has them counted here (a capture of
each tiny job on this machine's torch, which may count a few calls differently).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "results"))
sys.path.insert(0, str(ROOT / "results" / "calibration"))
from host_per_call import CLASSES, HOST_DISPATCH, captured_calls  # noqa: E402
from shared_gpu import RECORDED, RECORDED_PREFIX, command_line, recorded_job, report  # noqa: E402

WARMUP = 3
TOKENS = 32


def shared_cases() -> list[str]:
    prefix = f"{RECORDED_PREFIX['h100-sxm-80g']}__"
    return sorted(p.stem.removeprefix(prefix) for p in RECORDED.glob(f"{prefix}*.toml"))


def tiny_job(case: str):
    """The shared job's recorded spec at tiny sizes, its program otherwise unchanged."""
    job = recorded_job(case, "h100-sxm-80g")
    heads = 4
    kv_heads = heads if job.model.kv_heads == job.model.heads else 2  # keep GQA where it is
    model = dataclasses.replace(
        job.model, hidden=64, ffn_hidden=256, heads=heads, kv_heads=kv_heads, vocab=128,
        max_seq_len=2 * TOKENS,
    )  # fmt: skip
    batch = dataclasses.replace(
        job.batch, seq_len=TOKENS, micro_batch=1, global_batch=job.num_microbatches
    )  # world size 1: one row per micro-batch, the job's gradient accumulation kept
    return dataclasses.replace(job, model=model, batch=batch)


def counts(job, host) -> tuple[dict, dict, float]:
    """Per class, and per trace phase (recompute apart): the launching ops (compute rows) and
    aten calls of one captured iteration; and the host seconds the emulator charges that
    capture at `host`'s figures (None: not priced)."""
    from emulator.capture.trace import PHASES
    from emulator.costs.host_dispatch import dispatch_times_s

    if job.num_microbatches > 2:  # micro-batch reuse would add rows no call dispatched
        raise ValueError(f"{job.num_microbatches} micro-batches: the call count needs <= 2")
    with tempfile.TemporaryDirectory(prefix="host-tiny-") as cache:
        trace, classes, calls = captured_calls(job, Path(cache))
    out = {cls: {"launches": 0, "calls": 0} for cls in CLASSES}
    phases = {}
    for row, n in calls.items():
        out[classes[row]]["launches"] += 1
        out[classes[row]]["calls"] += n
        p = int(trace.columns["phase"][row])
        phase = phases.setdefault(PHASES[p] if p >= 0 else "forward", {"launches": 0, "calls": 0})
        phase["launches"] += 1
        phase["calls"] += n
    model_s = float(dispatch_times_s(trace, host).sum()) if host is not None else None
    return out, phases, model_s


def iteration_s(job, device: str, iterations: int) -> tuple[list[float], float]:
    """Wall seconds of `iterations` train steps (after WARMUP), and of one under the profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from workloads.train import build_training, train_step

    state = build_training(job, None, device=device)
    tokens = torch.randint(0, job.model.vocab, (job.local_batch_rows, job.batch.seq_len))
    tokens = tokens.to(device)
    drain = torch.cuda.synchronize if device == "cuda" else lambda: None

    def step() -> float:
        drain()
        start = time.perf_counter()
        train_step(job, state, tokens, tokens)
        drain()
        return time.perf_counter() - start

    timed = [step() for _ in range(WARMUP + iterations)][WARMUP:]
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities, record_shapes=True):
        profiled = step()
    return timed, profiled


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="markdown report (and .json, when measuring)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--iterations", type=int, default=20, help="timed iterations (20)")
    parser.add_argument("--case", action="append", choices=shared_cases(), help="default: all")
    parser.add_argument("--from-json", type=Path, metavar="JSON",
                        help="render the report of this run's JSON again; measure nothing")  # fmt: skip
    parser.add_argument("--where", help="--from-json: the run's torch and GPU, where its "
                        "records do not say (e.g. 'torch 2.11.0+cu130, NVIDIA H200')")  # fmt: skip
    args = parser.parse_args(argv)
    if args.from_json:
        return rerender(parser, args, argv)
    if args.out is None:
        parser.error("--out FILE is needed to measure")
    if args.iterations < 1:
        parser.error(f"--iterations {args.iterations}: at least 1")
    if not args.out.parent.is_dir():
        parser.error(f"--out {args.out}: no folder {args.out.parent}")
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device on this machine")
    from emulator.costs.host_dispatch import from_figures

    host = from_figures(json.loads(HOST_DISPATCH.read_text()), "aten")
    cases = args.case or shared_cases()
    if not cases:
        parser.error(f"no recorded shared job under {RECORDED}")
    device = torch.cuda.get_device_name() if args.device == "cuda" else "CPU tensors (plumbing)"
    where = f"torch {torch.__version__}, {device}"
    results = {}
    for case in cases:
        print(f"{case}: capture, then {WARMUP + args.iterations} + 1 profiled iterations",
              file=sys.stderr, flush=True)  # fmt: skip
        try:
            job = tiny_job(case)
            per_class, per_phase, model_s = counts(job, host)
            timed, profiled = iteration_s(job, args.device, args.iterations)
        except Exception:  # noqa: BLE001 - a GPU check: the other jobs still count
            traceback.print_exc()
            results[case] = {"failed": traceback.format_exc(limit=1).strip().splitlines()[-1]}
        else:
            results[case] = {
                "where": where,
                "per_class": per_class,
                "per_phase": per_phase,
                "model_host_s": model_s,
                "iteration_s": timed,
                "median_s": statistics.median(timed),
                "profiled_s": profiled,
            }
        args.out.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
        lines = table_lines(results, where, args.iterations, host)
        report(command_line("results/calibration/host_tiny_gpu.py", argv), lines, args.out)
    return 0 if all("failed" not in r for r in results.values()) else 1


def rerender(parser, args, argv) -> int:
    """The report of a measured JSON, with the fits (`fit_lines`): nothing is measured."""
    from emulator.costs.host_dispatch import from_figures

    try:
        results = json.loads(args.from_json.read_text())
    except (OSError, ValueError) as e:
        parser.error(f"--from-json {args.from_json}: {e}")
    if not isinstance(results, dict) or not all(
        isinstance(r, dict) and ("failed" in r or "per_class" in r) for r in results.values()
    ):
        parser.error(f"--from-json {args.from_json}: not the JSON host_tiny_gpu.py writes")
    said = {r["where"] for r in results.values() if "where" in r}
    if len(said) > 1:
        parser.error(f"--from-json {args.from_json}: jobs from several runs: {sorted(said)}")
    where = args.where or (said.pop() if said else None)
    if where is None:
        parser.error(f"--from-json {args.from_json}: its records do not say where they ran: "
                     "give --where")  # fmt: skip
    measured = [r for r in results.values() if "failed" not in r]
    iterations = statistics.median(len(r["iteration_s"]) for r in measured) if measured else 0
    host = from_figures(json.loads(HOST_DISPATCH.read_text()), "aten")
    lines = table_lines(results, where, int(iterations), host)
    lines += ["", *fit_lines(results)]
    report(command_line("results/calibration/host_tiny_gpu.py", argv), lines, args.out)
    return 0


def geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values))


def per_phase(case: str, record: dict) -> tuple[dict, bool]:
    """The job's launches and calls per trace phase: its record's, or counted here (True)."""
    if "per_phase" in record:
        return record["per_phase"], False
    return counts(tiny_job(case), None)[1], True


def fit_lines(results: dict) -> list[str]:
    """The jobs without recompute fitted by one host figure per launch and one per call; what
    the jobs with recompute take beyond the per-launch figure."""
    rows, recounted = {}, False
    for case, r in results.items():
        if "failed" in r:
            continue
        phases, here = per_phase(case, r)
        recounted |= here
        launches = sum(v["launches"] for v in r["per_class"].values())
        calls = sum(v["calls"] for v in r["per_class"].values())
        rec = phases.get("recompute", {"launches": 0, "calls": 0})
        rows[case] = (launches, calls, 1e6 * r["median_s"], rec["launches"], rec["calls"])
    plain = {c: v for c, v in rows.items() if not v[3]}
    if len(plain) < 2:
        return ["(fewer than two jobs without recompute: no fit)"]
    per_launch = geomean(us / n for n, _, us, _, _ in plain.values())
    per_call = geomean(us / c for _, c, us, _, _ in plain.values())
    a, b = np.linalg.lstsq(
        np.array([[n, c] for n, c, *_ in plain.values()], float),
        np.array([us for _, _, us, *_ in plain.values()]), rcond=None,
    )[0]  # fmt: skip
    lines = [
        f"The {len(plain)} jobs without recompute, fitted (geometric mean of theirs): "
        f"{per_launch:.1f} us per launching op, or {per_call:.1f} us per aten call; least "
        f"squares over launches and calls together: {a:.1f} us per launch + {b:.2f} us per "
        "call. The jobs with recompute against the per-launch figure: what they take beyond "
        "it, per launch and per call of their recomputation"
        + (" (the per-phase counts are this machine's captures: the JSON has none)." if recounted else "."),
        "",
        "| job | calls / launch | one figure per launch: miss | one per call: miss "
        "| recompute launches / calls | beyond per launch (ms) | per recompute launch (us) "
        "| per recompute call (us) |",
        "|---|--:|--:|--:|--:|--:|--:|--:|",
    ]  # fmt: skip
    for case, (n, c, us, rn, rc) in rows.items():
        beyond = us - per_launch * n
        tail = (f"{rn} / {rc} | {beyond / 1e3:.1f} | {beyond / rn:.0f} | {beyond / rc:.0f}"
                if rn else "- | | |")  # fmt: skip
        lines.append(
            f"| {case} | {c / n:.2f} | {100 * (per_launch * n / us - 1):+.0f} % "
            f"| {100 * (per_call * c / us - 1):+.0f} % | {tail} |"
        )
    ratios = {c: r["profiled_s"] / r["median_s"] for c, r in results.items() if "failed" not in r}
    extra = [1e6 * (r["profiled_s"] - r["median_s"]) / rows[c][1]
             for c, r in results.items() if "failed" not in r]  # fmt: skip
    lines += [
        "",
        f"The profiler, per job: profiled / unprofiled {min(ratios.values()):.2f} - "
        f"{max(ratios.values()):.2f} (geometric mean {geomean(ratios.values()):.3f}; the host "
        f"model divides by 1.509), or {min(extra):.1f} - {max(extra):.1f} us per call: "
        f"{max(ratios.values()) / min(ratios.values()):.2f} x between the extremes as a factor, "
        f"{max(extra) / min(extra):.2f} x as a cost per call.",
    ]
    return lines


def table_lines(results: dict, where: str, iterations: int, host) -> list[str]:
    """The report's first table: per job, host time per launch and per call, the model's."""
    lines = [
        f"{where}; {TOKENS} tokens, hidden 64; median of {iterations} iterations; the "
        f"model: {host.source} (us per launching op, forward / backward / optimizer: "
        + " / ".join(f"{1e6 * host.per_op_s[c]:.1f}" for c in CLASSES) + ", a phase's first op "
        "its entry figure).",
        "",
        "| job | launches | calls | iteration (us) | us per launch | us per call "
        "| model's host (us) | model / measured | profiled / unprofiled "
        "| profiler's us per call |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]  # fmt: skip
    for case, r in results.items():
        if "failed" in r:
            lines.append(f"| {case} | failed: {r['failed']} |||||||||")
            continue
        launches = sum(v["launches"] for v in r["per_class"].values())
        calls = sum(v["calls"] for v in r["per_class"].values())
        us, model_us = 1e6 * r["median_s"], 1e6 * r["model_host_s"]
        extra = 1e6 * (r["profiled_s"] - r["median_s"]) / calls
        lines.append(
            f"| {case} | {launches} | {calls} | {us:.0f} | {us / launches:.1f} | {us / calls:.1f} "
            f"| {model_us:.0f} | {model_us / us:.2f} | {r['profiled_s'] / r['median_s']:.2f} "
            f"| {extra:.1f} |"
        )
    return lines


if __name__ == "__main__":
    sys.exit(main())
