"""The steady peaks of the OOM pairs' fitting runs on a GPU, predicted against measured.

    python results/fidelity/oom_pairs_peaks.py RUN_JSON --gpu GPU [--extra CASE VARY VALUE TXT] [--out FILE]

RUN_JSON is what `oom_pairs_gpu.py` wrote on the GPU machine (results/gpu_runs/<run>/.../
oom_pairs_gpu.json); each run that ended (`fits`) carries the caching allocator's measured steady
peaks (`torch.cuda.max_memory_allocated` / `max_memory_reserved` over the timed iterations).
`--extra` adds a run made apart with `oom_pairs_gpu.py --run-one CASE VARY VALUE`, whose output
TXT ends with the `oom_pairs_gpu result:` line. Predicted: each varied job
(`prismbench.fit.varied_job` of the case's recorded spec) captured here and replayed by
`emulator.memory.replay_memory` on the GPU preset, the steady iteration's peaks, what
`prismbench emulate` reports. Error = (predicted - measured) / measured.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "results"))
from shared_gpu import command_line, recorded_job, report  # noqa: E402

sys.path.insert(0, str(ROOT / "results" / "fidelity"))
from oom_pairs_gpu import RESULT  # noqa: E402


def fitting_runs(run_json: Path, extra: list[list[str]]) -> list[tuple[str, str, int, dict]]:
    """(case, vary, value, measured steady peaks) of every run that ended, in the file's order,
    then the extra ones."""
    runs = [
        (pair["case"], pair["vary"], run["value"], run["peak_steady"])
        for pair in json.loads(run_json.read_text())
        for run in pair.get("runs", [])
        if run["outcome"] == "fits"
    ]
    for case, vary, value, txt in extra:
        lines = [line for line in Path(txt).read_text().splitlines() if line.startswith(RESULT)]
        if not lines:
            raise SystemExit(f"--extra {txt}: no line starting {RESULT!r} (the run did not end)")
        runs.append((case, vary, int(value), json.loads(lines[-1].removeprefix(RESULT))["peak_steady"]))
    return runs


def predicted_peaks(case: str, vary: str, value: int, gpu: str) -> dict[str, int]:
    """The steady iteration's peak allocated and reserved bytes of the varied job on `gpu`."""
    from emulator.memory import replay_memory
    from prismbench.capture import capture_job
    from prismbench.fit import varied_job

    job = varied_job(recorded_job(case, gpu), vary, value)
    (trace,) = capture_job(job).traces.values()  # the shared jobs run on one GPU
    memory = replay_memory(trace, gpu=gpu)
    return {"allocated": memory.peak_allocated_bytes, "reserved": memory.peak_reserved_bytes}


def _error(predicted: int, measured: int) -> str:
    return "0 (exact)" if predicted == measured else f"{100 * (predicted - measured) / measured:+.4f} %"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_json", type=Path, help="oom_pairs_gpu.json of a GPU run")
    parser.add_argument("--gpu", required=True, help="the GPU preset the runs ran on")
    parser.add_argument("--extra", nargs=4, action="append", default=[],
                        metavar=("CASE", "VARY", "VALUE", "TXT"), help="a run made apart")  # fmt: skip
    parser.add_argument("--out", type=Path, help="also write the table here")
    args = parser.parse_args(argv)
    lines = [
        "| job | setting | allocated: predicted / measured | error "
        "| reserved: predicted / measured | error |",
        "|---|---|--:|--:|--:|--:|",
    ]
    for case, vary, value, measured in fitting_runs(args.run_json, args.extra):
        print(f"{case} {vary} = {value}: capturing and replaying", file=sys.stderr, flush=True)
        predicted = predicted_peaks(case, vary, value, args.gpu)
        cells = [
            f"{predicted[k]:,} / {measured[k]:,} B | {_error(predicted[k], measured[k])}"
            for k in ("allocated", "reserved")
        ]
        lines.append(f"| {case} | {vary} {value} | {cells[0]} | {cells[1]} |")
    report(command_line("results/fidelity/oom_pairs_peaks.py", argv), lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
