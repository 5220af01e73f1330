"""Host time per launching op or per aten call: which the profiles support, and where it breaks.

    python results/calibration/host_per_call.py [--out FILE]    (from the repository root; ~1 min)

A lead for the host model (`emulator.costs.host_dispatch`, one figure per launching op and
class), tried as the model at ac65dbd and reverted at b9144e0. Each profile below is aligned
with the capture of its job (`prismbench.profile_ingest.align_profile`), and each launching op
it matched gets the aten calls the program dispatched since the previous one (views, reshapes
and other ops that launch nothing, and the op itself), counted by a wrapper around the
recorder's `__torch_dispatch__` while this script captures the job (a fresh capture in a
temporary cache; the recorder itself counts nothing). Per class (forward; backward, recompute
included; optimizer), a profile's host intervals between consecutive matched launches are set
beside the launches and the calls in them. Profiles: the eight shared H100 jobs
(`../shared/data/gpu/h100-sxm-80g/profiles`, the figures' sources) and, held out, the same
jobs run with production kernels on an H100 (`results/gpu_runs/h100-2026-11-28/reprofile`,
the recordings `results/baselines/recorded/h100frameworks__*.toml`).

1. Leave-one-out over the eight: each profile's host time per class predicted from the other
   seven, as its launches x their median mean interval, and as its calls x their median host
   time per call; error ln(predicted / profiled).
2. A bound every profile gives: the host issues the whole iteration, so its host time (the
   figures, divided by the profiler's inflation as the model divides them) cannot exceed the
   unprofiled iteration it was measured in. Each job's host time by both rules (the eight's
   medians, leave-one-out for the eight) against its measured iteration.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "results"))
from shared_gpu import (  # noqa: E402
    FRAMEWORKS_PREFIX,
    RECORDED,
    REPROFILED,
    SHARED,
    command_line,
    recorded_job,
    report,
)

from emulator.costs.host_dispatch import CLASS_OF_PHASE, CLASSES  # noqa: E402
from prismbench.emulate import HOST_DISPATCH  # noqa: E402

# the H100 node's held-out runs: the host figures are that node's
REPROFILES = REPROFILED["h100-sxm-80g"]
RECORDINGS = RECORDED


@contextlib.contextmanager
def counted_calls():
    """While active, every compute event the recorder appends is given (in the returned dict,
    by its seq) the aten calls dispatched to the recorder since the previous one: every call
    outside a pause and the program's build. Rows no call appended get no entry or 0: a
    compiled job's rules rebuild the event list, and micro-batch reuse (3 or more micro-batches)
    copies rows without dispatching; the jobs here have neither."""
    import emulator.capture.op_recorder as recorder

    calls_at, count = {}, [0]
    dispatch, init = recorder.OpRecorder.__torch_dispatch__, recorder.OpRecorder.__init__

    def counting(self, func, types, args=(), kwargs=None):
        state = self.state
        if func is not recorder._PRIM_DEVICE and not state.pause_depth and not state.building:
            count[0] += 1
        return dispatch(self, func, types, args, kwargs)

    class Events(list):
        def append(self, event):
            calls_at[event.seq] = count[0]
            super().append(event)

    def counting_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.events = Events()

    recorder.OpRecorder.__torch_dispatch__ = counting
    recorder.OpRecorder.__init__ = counting_init
    try:
        yield calls_at
    finally:
        recorder.OpRecorder.__torch_dispatch__ = dispatch
        recorder.OpRecorder.__init__ = init


def captured_calls(job, cache: Path):
    """A fresh capture of `job` (class 0's trace, captured into `cache`) and, per compute row,
    its host class (`host_dispatch.CLASS_OF_PHASE`) and the aten calls dispatched since the
    previous compute row (`counted_calls`)."""
    from emulator.capture.trace import COMPUTE, PHASES
    from prismbench.capture import capture_job

    with counted_calls() as calls_at:
        traces = capture_job(job, cache_dir=cache, use_cache=False).traces
    trace = traces[min(traces)]
    c = trace.columns
    compute = np.flatnonzero(c["kind"] == COMPUTE)
    missing = [int(s) for s in c["seq"][compute] if int(s) not in calls_at]
    if missing:  # a capture rule rebuilt the event list (a compiled job): no count to give
        raise ValueError(f"{len(missing)} compute rows were not appended by the recorder")
    at = np.array([calls_at[int(s)] for s in c["seq"][compute]])
    calls = dict(zip(compute.tolist(), np.diff(at, prepend=0).tolist(), strict=True))
    classes = {
        row: CLASS_OF_PHASE[PHASES[p]] if (p := int(c["phase"][row])) >= 0 else "forward"
        for row in compute.tolist()
    }
    return trace, classes, calls


def profile_figures(job, profile: Path, cache: Path) -> dict[str, dict]:
    """Per class: matched intervals, their calls and their sum (us), as profiled."""
    from prismbench.profile_ingest import align_profile
    from prismbench.profile_readers import read_profile

    trace, class_of_row, calls_of_row = captured_calls(job, cache)
    aligned = align_profile(read_profile(profile), trace)
    launches = sorted(
        (aligned.ops[i].cpu_start_us, aligned.compute_rows[j]) for i, j in aligned.pairs
    )
    classes = [class_of_row[row] for _, row in launches]
    out = {cls: {"intervals": 0, "calls": 0, "sum_us": 0.0} for cls in CLASSES}
    pairs = zip(launches[:-1], launches[1:], classes[:-1], classes[1:], strict=True)
    for (t0, _), (t1, row), a, b in pairs:
        if a == b:  # an interval into another class is a phase entry
            out[a]["intervals"] += 1
            out[a]["calls"] += calls_of_row[row]
            out[a]["sum_us"] += t1 - t0
    return out


def medians(figures: dict[str, dict], cls: str, skip: str | None = None) -> tuple[float, float]:
    """The median over profiles (less `skip`) of the mean interval and of host time per call."""
    others = [f[cls] for name, f in figures.items() if name != skip and f[cls]["calls"]]
    return (
        statistics.median(f["sum_us"] / f["intervals"] for f in others),
        statistics.median(f["sum_us"] / f["calls"] for f in others),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the markdown report here")
    args = parser.parse_args(argv)
    from prismbench.baselines import load_baselines

    inflation = math.exp(statistics.mean(
        math.log(r["ratio"]) for r in json.loads(HOST_DISPATCH.read_text())["profiler_inflation"].values()
    ))  # fmt: skip
    summary = json.loads((SHARED / "summary.json").read_text())
    shared, held_out, measured_s = {}, {}, {}
    with tempfile.TemporaryDirectory(prefix="host-per-call-") as cache:
        for path in sorted((SHARED / "profiles").glob("*.ops.jsonl.gz")):
            case = path.name.split(".ops.")[0]
            print(f"shared {case}", file=sys.stderr, flush=True)
            job = recorded_job(case, "h100-sxm-80g")
            shared[case] = profile_figures(job, path, Path(cache))
            measured_s[case] = summary[case]["iteration_s_median"]
        for baseline in load_baselines(RECORDINGS):
            if not baseline.name.startswith(f"{FRAMEWORKS_PREFIX['h100-sxm-80g']}__"):
                continue
            case = baseline.name.split("__", 1)[1]
            print(f"held out {case}", file=sys.stderr, flush=True)
            profile = REPROFILES / f"{case}.ops.jsonl.gz"
            held_out[baseline.name] = profile_figures(baseline.job, profile, Path(cache))
            measured_s[baseline.name] = baseline.measured.iteration_time_s

    lines = [
        f"Profiler inflation {inflation:.3f} (host-dispatch.json). 1. Leave-one-out over the "
        "eight shared profiles, host time per class (ms, as profiled):",
        "",
        "| profile | class | launches | calls | profiled | per launch | ln error | per call "
        "| ln error |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    errors = {cls: ([], []) for cls in CLASSES}
    for cls in CLASSES:
        for case, figures in shared.items():
            own = figures[cls]
            if not own["calls"]:
                continue
            per_launch, per_call = medians(shared, cls, skip=case)
            by_launch, by_call = own["intervals"] * per_launch, own["calls"] * per_call
            ln_launch = math.log(by_launch / own["sum_us"])
            ln_call = math.log(by_call / own["sum_us"])
            errors[cls][0].append(abs(ln_launch))
            errors[cls][1].append(abs(ln_call))
            lines.append(
                f"| {case} | {cls} | {own['intervals']} | {own['calls']} "
                f"| {own['sum_us'] / 1e3:.1f} | {by_launch / 1e3:.1f} | {ln_launch:+.3f} "
                f"| {by_call / 1e3:.1f} | {ln_call:+.3f} |"
            )
    lines += ["", "| class | per launch: median / max abs ln error | per call |", "|---|--:|--:|"]
    for cls, (launch, call) in errors.items():
        lines.append(
            f"| {cls} | {statistics.median(launch):.3f} / {max(launch):.3f} "
            f"| {statistics.median(call):.3f} / {max(call):.3f} |"
        )
    lines += [
        "",
        "2. Host time of the whole iteration by each rule (ms: the eight's medians, leave-one-out "
        "for the eight, over the inflation; phase entries left out) against the unprofiled "
        "iteration it was measured in, which bounds it:",
        "",
        "| job | measured iteration | host, per launch | host, per call | per call over the "
        "iteration |",
        "|---|--:|--:|--:|--:|",
    ]
    for name, figures in (shared | held_out).items():
        skip = name if name in shared else None
        host = [0.0, 0.0]
        for cls in CLASSES:
            if figures[cls]["calls"]:
                per_launch, per_call = medians(shared, cls, skip=skip)
                host[0] += figures[cls]["intervals"] * per_launch / inflation
                host[1] += figures[cls]["calls"] * per_call / inflation
        iteration_ms = 1e3 * measured_s[name]
        over = host[1] / 1e3 / iteration_ms
        lines.append(
            f"| {name} | {iteration_ms:.1f} | {host[0] / 1e3:.1f} | {host[1] / 1e3:.1f} "
            f"| {over:.2f}{' (exceeds it)' if over > 1 else ''} |"
        )
    report(command_line("results/calibration/host_per_call.py", argv), lines, args.out)


if __name__ == "__main__":
    main()
