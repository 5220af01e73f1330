"""Run the predicted out-of-memory pairs for real on this machine's GPU (issue 16's OOM goal).

    python3 results/fidelity/oom_pairs_gpu.py --out DIR              (on a CUDA machine)
    python3 results/fidelity/oom_pairs_gpu.py --out DIR --dry-run --gpu h100-sxm-80g   (anywhere)
    python3 results/fidelity/oom_pairs_gpu.py --out DIR --predicted FILE   (on a CUDA machine)

For each case in CASES, a shared job (its recorded baseline under results/baselines/recorded/,
the spec the shared measurements ran) and the setting to vary:
1. `prismbench.fit.fit` predicts, on the preset of this machine's GPU, the largest value that
   fits and the next step up: the pair, predicted before anything runs;
2. each value of the pair trains for real in a fresh process (`prismbench.record.record` on
   cuda: 2 warm-up and 2 timed iterations, the allocator's default settings) and is classed
   `fits` (the run ended), `oom` (torch's out-of-memory error) or `error` (anything else, with
   its last line);
3. DIR/oom_pairs_gpu.json and DIR/oom_pairs_gpu.md hold predicted against real, with the
   allocator's measured steady peak where the run ended.
--dry-run stops after step 1 (a CPU machine can check the predictions and the plumbing).
--predicted FILE takes step 1 from a dry run's oom_pairs_gpu.json instead (the pairs predicted
where the project's own torch and torchao are installed, before the GPU machine is asked for; a
device machine's image has another torch, and a capture there would not be the tool's).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "results"))
from shared_gpu import RECORDED_PREFIX, local_gpu_preset, recorded_job  # noqa: E402

# shared job, setting to vary (results/fidelity/oom_pairs.md: the pairs predicted for the H100)
CASES = (
    ("gpt3-125m-s2048-mb8-none", "micro_batch"),
    ("gpt3-1.3b-s2048-mb4-full-ga2", "micro_batch"),
    ("llama2-7b-l4-s4096-mb1-sel", "layers"),
)
OOM_MARKERS = ("OutOfMemoryError", "CUDA out of memory")
RUN_TIMEOUT_S = 90  # a run builds in seconds and takes 4 iterations of at most ~1.5 s
RESULT = "oom_pairs_gpu result: "  # the child's last line: this prefix, then its record as JSON


def outcome_of(returncode: int, output: str) -> str:
    """`fits`, `oom` or `error` for a finished run: its exit status and what it printed."""
    if any(marker in output for marker in OOM_MARKERS):
        return "oom"
    return "fits" if returncode == 0 else "error"


def predict_pair(name: str, vary: str, gpu: str) -> dict:
    """The fit prediction for one case: the largest fitting value and the next step up."""
    from prismbench.fit import fit

    result = fit(recorded_job(name, gpu), vary)
    largest = result.largest_fitting
    return {
        "case": name,
        "vary": vary,
        "gpu": gpu,
        "fits": largest,  # None: not even the smallest value fits (no pair to run)
        "does_not_fit": None if largest is None else largest + result.step,
        "headroom_bytes": result.headroom_bytes,
        "fits_above": list(result.fits_above),
    }


def load_predicted(path: Path, gpu: str) -> dict[str, dict]:
    """A dry run's predicted pairs by case, each checked to be for `gpu` and this script's cases."""
    rows = {row["case"]: row for row in json.loads(path.read_text())}
    for name, vary in CASES:
        row = rows.get(name)
        if row is None or row["vary"] != vary or row["gpu"] != gpu:
            raise ValueError(f"--predicted {path}: no {name} pair varying {vary} on {gpu}")
    return rows


def run_one(name: str, vary: str, value: int, gpu: str) -> dict:
    """Train the varied job for real here (called in a fresh process); its record as a dict."""
    from prismbench.fit import varied_job
    from prismbench.record import record

    recording = record(varied_job(recorded_job(name, gpu), vary, value), iterations=2, warmup=2,
                       device="cuda")  # fmt: skip
    return {"peak_steady": recording.peak_steady, "iteration_s": recording.iteration_s}


def run_real(name: str, vary: str, value: int, gpu: str) -> dict:
    command = [sys.executable, __file__, "--run-one", name, vary, str(value), "--gpu", gpu]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"value": value, "outcome": "error", "detail": f"timed out after {RUN_TIMEOUT_S} s"}
    output = done.stdout + done.stderr
    row = {"value": value, "outcome": outcome_of(done.returncode, output)}
    results = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if row["outcome"] == "fits" and results:
        row |= json.loads(results[-1].removeprefix(RESULT))
    else:
        row["detail"] = (output.strip().splitlines() or [""])[-1][:300]
    return row


def table(rows: list[dict]) -> str:
    lines = [
        "| case | setting | predicted fits | real | predicted does not fit | real |",
        "|---|---|--:|---|--:|---|",
    ]
    for r in rows:
        real = {run["value"]: run["outcome"] for run in r.get("runs", [])}
        lines.append(f"| {r['case']} | {r['vary']} | {r['fits']} | {real.get(r['fits'], '-')} | "
                     f"{r['does_not_fit']} | {real.get(r['does_not_fit'], '-')} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--gpu", choices=sorted(RECORDED_PREFIX), help="default: detected")
    parser.add_argument("--dry-run", action="store_true", help="predict only")
    parser.add_argument("--predicted", type=Path, help="a dry run's oom_pairs_gpu.json")
    parser.add_argument("--run-one", nargs=3, metavar=("CASE", "VARY", "VALUE"))
    args = parser.parse_args(argv)
    if args.run_one:
        name, vary, value = args.run_one
        print(RESULT + json.dumps(run_one(name, vary, int(value), args.gpu)))
        return 0
    if args.out is None:
        parser.error("--out is required")
    gpu = args.gpu or local_gpu_preset()
    try:
        predicted = load_predicted(args.predicted, gpu) if args.predicted else {}
    except (OSError, ValueError, KeyError) as bad:
        parser.error(str(bad))
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, vary in CASES:
        row = dict(predicted[name]) if predicted else predict_pair(name, vary, gpu)
        print(
            f"{name}: {vary} {row['fits']} predicted to fit, {row['does_not_fit']} not", flush=True
        )
        if not args.dry_run and row["fits"] is not None:
            row["runs"] = [run_real(name, vary, v, gpu) for v in (row["fits"], row["does_not_fit"])]
            print(f"  real: {[(r['value'], r['outcome']) for r in row['runs']]}", flush=True)
        rows.append(row)
        # after every case, so a run stopped at its time limit keeps what it measured
        (args.out / "oom_pairs_gpu.json").write_text(json.dumps(rows, indent=2) + "\n")
        (args.out / "oom_pairs_gpu.md").write_text(table(rows) + "\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
