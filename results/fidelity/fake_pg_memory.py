"""Peak memory of one rank of the shared fake-process-group jobs: predicted against measured, and
(on a GPU) the caching allocator's own history of the run, to find where the two part.

    python results/fidelity/fake_pg_memory.py [CASE...] [--out results/fidelity/fake_pg_memory.md]
    python3 results/fidelity/fake_pg_memory.py --measure DIR [--init device|meta] [CASE...]   (GPU)
    python results/fidelity/fake_pg_memory.py --compare DIR|ARCHIVE.tar.gz [--out FILE]

Measured: ../shared/data/gpu/h100-sxm-80g/fake-pg-ranks/results.json `peak_steady` (rank 0 of
each job on one H100 with torch's `fake` process-group backend standing in for the other ranks;
three warm-up iterations, then the allocator's peaks over eight timed ones; torch 2.11,
workloads at 86a4f47, the model built by `build_training(job, mesh, device="cuda")`: whole, in
fp32, on the GPU, then cast and sharded). The fake backend moves nothing and allocates nothing
(its all-gathers copy the local input into each chunk of the caller's output), so the rank
allocates what it would beside real peers. Predicted: the job's capture (rank 0's class)
replayed by `emulator.memory` for the h100-sxm-80g preset, default allocator settings, the
steady iteration; once built on the device, its build's storages recorded (the program as
measured: `train.model_init = "device"`), and once built on meta, only its shards
materialised ("meta": what `emulate` predicts and `prismbench record` runs for a rank of
several by default). The job specs are copies of the shared ones (`fake_pg_ranks/`; the
shared folder does not travel to a device machine).

--measure (a GPU): each CASE (default: all four) runs as rank 0 under the fake backend, once per
build (`--init`, default both: "device" as the shared measurement, "meta" as `record`), each in
a process of its own: WARMUP iterations and then STEADY more, each with its own allocator peaks,
all under torch's memory history (`torch.cuda.memory._record_memory_history`, Python stacks)
from before the build, a MARKER_BYTES request after the build and after each iteration.
DIR/<case>.<init>.json.gz holds the per-iteration figures, the allocator's events (action,
address, size, stream, stack) and the segments at the end, with the GPU, its preset and torch.

--compare (here) reads such a folder, or the .tar.gz of it the device step brings back, and
replays each run for the preset of the GPU it ran on (the capacity is the only input that
differs between presets; the shared measurement's preset too, to score against it). First the
summary, to the byte: the steady peaks (the warm-up iterations left out, as `peak_steady`);
the first iteration (the run resets the peaks after the build, so the replay's first
iteration is read with the peaks reset alike: emulator.memory.export.history_by_iteration's
"peaks"; reserved never falls, so it is the peak from an empty allocator too), with the
build's peak of live requested bytes from either history; meta against device, measured and
predicted; and, with the shared folder beside the checkout, each run against the shared
measurement of its case (built on the device). Then each run part by part (the build, the
first iteration, the steady ones): the segments each side opened, the requests each side made
and where the two request sequences first differ, with the sizes one side asks for more often.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import gzip
import json
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "results"))
from shared_gpu import SHARED, command_line, local_gpu_preset, report  # noqa: E402

SPECS = Path(__file__).resolve().parent / "fake_pg_ranks"
MEASURED = SHARED / "fake-pg-ranks" / "results.json"
GPU = "h100-sxm-80g"  # the preset of the GPU the shared ranks ran on
CASES = tuple(sorted(p.stem for p in SPECS.glob("*.toml")))
WARMUP = 3  # as the shared measurement
STEADY = 2
INITS = ("device", "meta")  # the shared measurement's build, and the one `record` runs
# A request of this size (rounded into the small pool, not otherwise made by these programs)
# marks the end of the build and of each iteration in a measured history. The first one may
# open a 2 MiB small-pool segment of its own: counted in the build's part, 0.002 GB at most.
MARKER_BYTES = 7_777
MAX_FRAMES = 16  # innermost Python frames kept per event
RANK_TIMEOUT_S = 240


def spec_path(case: str) -> Path:
    path = SPECS / f"{case}.toml"
    if not path.is_file():
        raise ValueError(f"CASE {case!r}: not one of {', '.join(CASES)}")
    return path


def job_of(case: str, init: str):
    """`case`'s job with its model built as `init` says (INITS, `train.model_init`): "device" as
    the shared measurement built it (whole, in fp32, on the GPU, then cast and sharded), "meta"
    as `emulate` takes a rank of several to run by default."""
    from prismbench.spec import load_job_spec

    if init not in INITS:
        raise ValueError(f"init={init!r}: one of {', '.join(INITS)}")
    job = load_job_spec(spec_path(case))
    return dataclasses.replace(job, train=dataclasses.replace(job.train, model_init=init))


def predicted_trace(case: str, init: str = "device"):
    """Rank 0's trace of `case` built as `init` says (`job_of`; captures are cached)."""
    from prismbench.capture import capture_job

    capture = capture_job(job_of(case, init))
    return capture.traces[int(capture.world.class_of(0))]


def _cell(predicted: int, measured: int, digits: int) -> str:
    return f"{predicted / 1e9:.3f} ({100 * (predicted - measured) / measured:+.{digits}f} %)"


def score(measured: dict, cases: list[str]) -> list[str]:
    """Predicted against measured steady peaks, one row per case: the program as measured
    (built on the device) and as `emulate` takes a job of several ranks to run (built on meta);
    then the segments each prediction opens in each part of the run."""
    from emulator.memory import replay_memory

    peaks = [
        "| case | allocated: meas (GB) | pred, built on device | reserved: meas (GB) "
        "| pred, built on device | pred, built on meta (emulate) |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    parts = [
        "Segments opened per part of the run, predicted (GB: the build with the declared state "
        "/ the first iteration / the next one):",
        "",
        "| case | built on device | built on meta |",
        "|---|--:|--:|",
    ]
    for i, case in enumerate(cases, 1):
        print(f"[{i}/{len(cases)}] {case}: capturing and replaying", file=sys.stderr, flush=True)
        traces = [predicted_trace(case, init) for init in INITS]
        on_device, on_meta = (replay_memory(trace, gpu=GPU) for trace in traces)
        allocated, reserved = (measured[case]["peak_steady"][k] for k in ("allocated", "reserved"))
        peaks.append(
            f"| {case} | {allocated / 1e9:.3f} "
            f"| {_cell(on_device.peak_allocated_bytes, allocated, 3)} "
            f"| {reserved / 1e9:.3f} | {_cell(on_device.peak_reserved_bytes, reserved, 2)} "
            f"| {_cell(on_meta.peak_reserved_bytes, reserved, 2)} |"
        )
        opened = []
        for trace in traces:
            history = predicted_parts(trace, GPU, steady_iterations=1)
            runs = (history["setup"], history["first"], *history["steady"])
            opened.append(" / ".join(f"{opened_bytes(part) / 1e9:.2f}" for part in runs))
        parts.append(f"| {case} | {opened[0]} | {opened[1]} |")
    return [*peaks, "", *parts]


# ---- on the GPU -------------------------------------------------------------------------------


def run_rank(job, device: str = "cuda", warmup: int = WARMUP, steady: int = STEADY) -> dict:
    """Rank 0 of `job` under the fake backend on `device`, its model built as the job says
    (`train.model_init`): per iteration its seconds and (on CUDA) the allocator's peaks and end
    state; on CUDA also the allocator's events from before the build to the end (a MARKER_BYTES
    request after the build and after each iteration cuts them into parts) and the segments at
    the end.
    Call in a process of its own (the process group stays initialised)."""
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from workloads import build_training, make_mesh

    cuda = device == "cuda"
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=job.world_size)
    mesh = make_mesh(job, device)
    if cuda:
        torch.cuda.memory._record_memory_history(context="alloc", stacks="python")
    state = build_training(job, mesh, device=device, init_device=job.init_device)
    shape = (job.local_batch_rows, job.batch.seq_len)
    tokens = torch.randint(0, job.model.vocab, shape, generator=torch.Generator().manual_seed(0))
    tokens = tokens.to(device)
    _mark(device)
    iterations = []
    for i in range(warmup + steady):
        iterations.append(_timed_iteration(job, state, tokens, device))
        _mark(device)
        print(f"iteration {i}: {iterations[-1]}", flush=True)
    history = {}
    if cuda:
        history = compact_snapshot(torch.cuda.memory._snapshot())
        torch.cuda.memory._record_memory_history(enabled=None)
    dist.destroy_process_group()
    return {"device": device, "init": job.train.model_init, "warmup": warmup,
            "iterations": iterations, "torch": torch.__version__} | history  # fmt: skip


def _mark(device: str) -> None:
    """A MARKER_BYTES request, made and freed at once, where a CUDA history is recorded."""
    import torch

    if device == "cuda":
        torch.empty(MARKER_BYTES, dtype=torch.uint8, device=device)


def _timed_iteration(job, state, tokens, device: str) -> dict:
    """One train step: its seconds and, on CUDA, the allocator's peaks over it and its end."""
    import torch

    from workloads import train_step

    cuda = device == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    train_step(job, state, tokens, tokens)
    if cuda:
        torch.cuda.synchronize()
    row = {"iteration_s": time.perf_counter() - start}
    if not cuda:
        return row
    return row | {
        "peak_allocated": torch.cuda.max_memory_allocated(),
        "peak_reserved": torch.cuda.max_memory_reserved(),
        "end_allocated": torch.cuda.memory_allocated(),
        "end_reserved": torch.cuda.memory_reserved(),
    }


def compact_snapshot(snapshot: dict) -> dict:
    """torch.cuda.memory._snapshot() cut to what the comparison reads: events as [action,
    addr, size, stream, stack index] with the stacks (innermost MAX_FRAMES frames, each
    "file:line function") listed once, and the segments' sizes, streams and blocks."""
    stacks: dict[tuple, int] = {}
    events = []
    for e in snapshot["device_traces"][0]:
        frames = tuple(
            f"{f['filename']}:{f['line']} {f['name']}" for f in e.get("frames", [])[:MAX_FRAMES]
        )
        stack = stacks.setdefault(frames, len(stacks))
        events.append([e["action"], e["addr"], e["size"], e["stream"], stack])
    segments = [
        {
            "address": s["address"],
            "total_size": s["total_size"],
            "allocated_size": s["allocated_size"],
            "stream": s["stream"],
            "blocks": [[b["size"], b["state"]] for b in s["blocks"]],
        }
        for s in snapshot["segments"]
    ]
    return {"events": events, "stacks": [list(s) for s in stacks], "segments": segments}


def measure(cases: list[str], inits: list[str], out: Path, budget_s: float) -> int:
    """Each case and build in a fresh process (an empty allocator, a process group of its own),
    every case built on meta first: those ranks were never measured, where the ranks built on
    the device are predicted to the byte already. One that fails, runs past RANK_TIMEOUT_S or
    past what is left of `budget_s` is listed and the others still run while time is left (so
    that a caller's own limit never cuts a run mid-write)."""
    deadline = time.monotonic() + budget_s
    failed = []
    for init in sorted(inits, key=lambda i: i != "meta"):
        for case in cases:
            left = deadline - time.monotonic()
            if left <= 0 or not _rank_process(case, init, out, min(RANK_TIMEOUT_S, left)):
                failed.append(f"{case} ({init})")
                why = "failed" if left > 0 else "no time left"
                print(f"{case} ({init}): not measured ({why})", flush=True)
    if failed:
        print(f"not measured: {', '.join(failed)}", flush=True)
    return 1 if failed else 0


def _rank_process(case: str, init: str, out: Path, timeout_s: float) -> bool:
    """Whether `write_rank(case, init, out)`, in a process of its own, ended well in time."""
    command = [sys.executable, __file__, case, "--init", init, "--measure", str(out), "--rank"]
    try:
        return subprocess.run(command, timeout=timeout_s).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def write_rank(case: str, init: str, out: Path) -> None:
    import torch

    from prismbench.files import write_atomically

    print(f"== {case}, built on {init}", flush=True)
    machine = {"gpu": torch.cuda.get_device_name(), "preset": local_gpu_preset()}
    result = {"case": case} | machine | run_rank(job_of(case, init))

    def write(tmp: Path) -> None:
        with gzip.open(tmp, "wt") as f:
            json.dump(result, f)

    # a run cut while writing leaves no file a comparison would read
    write_atomically(out / f"{case}.{init}.json.gz", write)


# ---- comparing ---------------------------------------------------------------------------------


def measured_parts(events: list) -> dict[str, list]:
    """A measured history cut at its markers: "setup" (the build), then one list per iteration
    in "iterations"; the markers themselves left out."""
    cuts, part = [], []
    for e in events:
        if e[2] == MARKER_BYTES and e[0] in ("alloc", "free_requested", "free_completed"):
            if e[0] == "free_completed":
                cuts.append(part)
                part = []
            continue
        part.append(e)
    if not cuts:
        raise ValueError(f"no marker request of {MARKER_BYTES} B in the history")
    return {"setup": cuts[0], "iterations": cuts[1:]}


def event_rows(history: list[dict]) -> list[list]:
    """A replay's events (emulator.memory.export) in the measured histories' form (no stack)."""
    return [[e["action"], e["addr"], e["size"], e["stream"], -1] for e in history]


def requests(events: list) -> list[int]:
    """The sizes of the allocation requests, in order ("alloc" events)."""
    return [e[2] for e in events if e[0] == "alloc"]


def opened_bytes(events: list) -> int:
    """Bytes of the segments opened (cudaMalloc'd) in `events`."""
    return sum(e[2] for e in events if e[0] == "segment_alloc")


def parting(measured: list[int], predicted: list[int], context: int = 3) -> dict:
    """Where two request sequences part: the index of the first difference (the shorter one's
    length where it is the other's start; None where they are equal), a few requests either
    side on each side, and the sizes one side asks for more often than the other (size:
    measured count - predicted count), largest bytes first."""
    shorter = min(len(measured), len(predicted))
    first = next((i for i in range(shorter) if measured[i] != predicted[i]), None)
    if first is None and len(measured) != len(predicted):
        first = shorter
    lo, hi = (0, 0) if first is None else (max(first - context, 0), first + context + 1)
    counts = collections.Counter(measured)
    counts.subtract(collections.Counter(predicted))
    excess = sorted(((s, n) for s, n in counts.items() if n), key=lambda kv: -abs(kv[0] * kv[1]))
    return {
        "measured_requests": len(measured),
        "predicted_requests": len(predicted),
        "first_difference": first,
        "measured_around": measured[lo:hi],
        "predicted_around": predicted[lo:hi],
        "excess_sizes": excess,
    }


def predicted_parts(trace, gpu: str, steady_iterations: int) -> dict:
    """The replay's history of `trace` in the measured histories' form: "setup", "first" and
    a list of "steady" parts, and the parts' "peaks", reset at each part's start
    (emulator.memory.export.history_by_iteration)."""
    from emulator.memory.export import history_by_iteration

    history = history_by_iteration(trace, gpu=gpu, steady_iterations=steady_iterations)
    return {
        "setup": event_rows(history["setup"]),
        "first": event_rows(history["first"]),
        "steady": [event_rows(part) for part in history["steady"]],
        "peaks": history["peaks"],
    }


def part_row(label: str, real: list, model: list, iteration: dict | None) -> str:
    """One part of a run, measured beside predicted: its allocator figures (an iteration's),
    the segments each side opened, the requests each side made, where they first differ."""
    p = parting(requests(real), requests(model))
    figures = " | | |"
    if iteration:
        gb = (iteration[k] / 1e9 for k in ("peak_allocated", "peak_reserved", "end_reserved"))
        figures = " | ".join([f"{iteration['iteration_s']:.3f}", *(f"{x:.3f}" for x in gb)])
    opened = f"{opened_bytes(real) / 1e9:.3f} / {opened_bytes(model) / 1e9:.3f}"
    requested = f"{p['measured_requests']} / {p['predicted_requests']}"
    return f"| {label} | {figures} | {opened} | {requested} | {p['first_difference']} |"


def parting_line(label: str, real: list, model: list) -> str:
    p = parting(requests(real), requests(model))
    sizes = ", ".join(f"{size:,} B x {n:+d}" for size, n in p["excess_sizes"][:12]) or "none"
    return (
        f"{label}: first difference at request {p['first_difference']} (measured "
        f"{p['measured_around']}, predicted {p['predicted_around']}); sizes requested more "
        f"often measured (+) or predicted (-), largest bytes first: {sizes}"
    )


def scored(result: dict) -> dict:
    """One measured run (`write_rank`'s file) and the replay of the same program for the
    measured GPU's preset: the measured parts and per-iteration figures, the predicted parts
    (with their peaks, reset at each part's start as the run reset them), the replay's
    headline (`replay_memory`) and, where the run was on another GPU, the replay for the
    shared measurement's preset (GPU)."""
    from emulator.memory import replay_memory

    case, init, its = result["case"], result["init"], result["iterations"]
    gpu = result.get("preset", GPU)
    trace = predicted_trace(case, init)
    replay = replay_memory(trace, gpu=gpu)
    warmup = min(result.get("warmup", WARMUP), len(its) - 1)
    return {
        "case": case, "init": init, "gpu": gpu, "device": result.get("gpu", gpu),
        "torch": result.get("torch"), "iterations": its,
        "steady": {k: max(it[k] for it in its[warmup:]) for k in PEAKS},
        "measured": measured_parts(result["events"]),
        "predicted": predicted_parts(trace, gpu, max(len(its) - 1, 0)),
        "replay": replay,
        "on_shared_gpu": replay if gpu == GPU else replay_memory(trace, gpu=GPU),
    }  # fmt: skip


PEAKS = ("peak_allocated", "peak_reserved")  # a measured iteration's peaks, as run_rank names them


def _header(*cells: str, left: int = 2) -> list[str]:
    """A markdown table's head: `left` columns of names, then right-aligned figures."""
    rule = "|".join(["---"] * left + ["--:"] * (len(cells) - left))
    return [f"| {' | '.join(cells)} |", f"|{rule}|"]


def _error(predicted: int, measured: int, digits: int) -> str:
    return f"{predicted - measured:+,d} B ({100 * (predicted - measured) / measured:+.{digits}f} %)"


def steady_table(runs: list[dict]) -> list[str]:
    """The headline: each run's steady peaks (the warm-up iterations left out, as the shared
    measurement's `peak_steady`) beside the replay's for its GPU's preset, to the byte."""
    lines = _header("case", "built on", "allocated: measured (B)", "predicted - measured",
                    "reserved: measured (B)", "predicted - measured")  # fmt: skip
    for r in runs:
        allocated, reserved = r["steady"]["peak_allocated"], r["steady"]["peak_reserved"]
        lines.append(
            f"| {r['case']} | {r['init']} | {allocated:,d} "
            f"| {_error(r['replay'].peak_allocated_bytes, allocated, 4)} "
            f"| {reserved:,d} | {_error(r['replay'].peak_reserved_bytes, reserved, 3)} |"
        )
    return lines


def first_table(runs: list[dict]) -> list[str]:
    """The first iteration: the run reset the peaks after the build, so its iteration 0 is
    set beside the replay's first iteration with the peaks reset alike; reserved never falls
    (no empty_cache), so it is the peak from an empty allocator too. The replay's own
    `first_iteration_peak_allocated_bytes` (from an empty allocator, the build counted) is
    listed where the build is the larger. The build's peak requested bytes (live requests,
    from either history's events) check the part the run's peaks do not cover."""
    lines = _header("case", "built on", "allocated: measured (B)", "predicted - measured",
                    "reserved: measured (B)", "predicted - measured",
                    "build's peak requested: measured (B)", "predicted - measured")  # fmt: skip
    notes = []
    for r in runs:
        first, predicted = r["iterations"][0], r["predicted"]["peaks"]["first"]
        allocated, reserved = first["peak_allocated"], first["peak_reserved"]
        build = live_requested_peak(r["measured"]["setup"])
        lines.append(
            f"| {r['case']} | {r['init']} | {allocated:,d} "
            f"| {_error(predicted['allocated'], allocated, 4)} "
            f"| {reserved:,d} | {_error(predicted['reserved'], reserved, 3)} "
            f"| {build:,d} | {_error(live_requested_peak(r['predicted']['setup']), build, 4)} |"
        )
        from_empty = r["replay"].first_iteration_peak_allocated_bytes
        if from_empty > predicted["allocated"]:
            notes.append(f"{r['case']} built on {r['init']}: {from_empty:,d} B")
    if notes:
        lines += ["", "The replay's first iteration from an empty allocator (the build counted: "
                  "`first_iteration_peak_allocated_bytes`), where the build is the larger: "
                  + "; ".join(notes) + "."]  # fmt: skip
    return lines


def live_requested_peak(events: list) -> int:
    """The largest sum of live requests in a history's events (alloc adds its size,
    free_requested takes it off, as torch's requested_bytes counts them), from zero at the
    part's start: the same figure from a measured history and from the replay's."""
    live = peak = 0
    for action, _, size, *_ in events:
        if action == "alloc":
            live += size
            peak = max(peak, live)
        elif action == "free_requested":
            live -= size
    return peak


def builds_table(runs: list[dict]) -> list[str]:
    """What building on meta rather than on the device changes, measured and predicted
    (meta - device, steady peaks), per case measured both ways."""
    by_case: dict[str, dict] = collections.defaultdict(dict)
    for r in runs:
        by_case[r["case"]][r["init"]] = r
    lines = _header("case", "allocated, meta - device: measured (B)", "predicted",
                    "reserved, meta - device: measured (B)", "predicted", left=1)  # fmt: skip
    for case, pair in sorted(by_case.items()):
        if set(pair) != set(INITS):
            continue
        meta, device = pair["meta"], pair["device"]
        cells = []
        for key in PEAKS:
            attr = f"{key}_bytes"
            measured = meta["steady"][key] - device["steady"][key]
            predicted = getattr(meta["replay"], attr) - getattr(device["replay"], attr)
            cells += [f"{measured:+,d}", f"{predicted:+,d}"]
        lines.append(f"| {case} | {' | '.join(cells)} |")
    return lines


def shared_table(runs: list[dict], shared: dict) -> list[str]:
    """The runs beside the shared measurement of the same case (the H100's `peak_steady`,
    built on the device): measured there, what this run measured minus it, and the replay
    for the H100's preset against it."""
    lines = _header("case", "built on", f"allocated on the {GPU} (B)", "this run - it",
                    f"predicted ({GPU}) - it", f"reserved on the {GPU} (B)", "this run - it",
                    "predicted - it")  # fmt: skip
    for r in runs:
        if r["case"] not in shared:
            continue
        peaks, cells = shared[r["case"]]["peak_steady"], []
        for key in ("allocated", "reserved"):
            measured = peaks[key]
            predicted = getattr(r["on_shared_gpu"], f"peak_{key}_bytes")
            this_run = r["steady"][f"peak_{key}"] - measured
            cells += [f"{measured:,d}", f"{this_run:+,d}", _error(predicted, measured, 4)]
        lines.append(f"| {r['case']} | {r['init']} | {' | '.join(cells)} |")
    return lines


def presets_line(runs: list[dict]) -> str:
    """Whether the replay for the shared measurement's preset differs from the one for the
    measured GPU's (capacity is the only input that differs)."""

    def peaks(replay) -> tuple:
        return (replay.peak_allocated_bytes, replay.peak_reserved_bytes,
                replay.first_iteration_peak_allocated_bytes,
                replay.first_iteration_peak_reserved_bytes)  # fmt: skip

    differ = [f"{r['case']} ({r['init']})" for r in runs
              if peaks(r["replay"]) != peaks(r["on_shared_gpu"])]  # fmt: skip
    gpus = ", ".join(sorted({r["gpu"] for r in runs} - {GPU}))
    if not gpus:
        return f"Every run was on the {GPU}."
    if differ:
        return f"The replay for the {GPU} preset differs from {gpus}'s on: {', '.join(differ)}."
    return (f"The replay for the {GPU} preset gives the same peaks, first and steady, as for "
            f"{gpus} on every run (the capacity is the only input that differs).")  # fmt: skip


def compare_case(result: dict | None = None, run: dict | None = None) -> list[str]:
    """One measured run (`write_rank`'s file, or `scored`'s of it) beside the replay of the
    same program on the measured GPU's preset, part by part: the build, then each iteration."""
    r = run or scored(result)
    its, measured, predicted = r["iterations"], r["measured"], r["predicted"]
    lines = [f"### {r['case']}, built on {r['init']}, on {r['device']}", "",
             "| part | seconds | peak allocated (GB) | peak reserved (GB) | reserved at end (GB) "
             "| opened: meas / pred (GB) | requests: meas / pred | first difference |",
             "|---|--:|--:|--:|--:|--:|--:|--:|",
             part_row("build", measured["setup"], predicted["setup"], None)]  # fmt: skip
    model_iterations = [predicted["first"], *predicted["steady"]]
    for i, pair in enumerate(zip(measured["iterations"], model_iterations, its, strict=True)):
        lines.append(part_row(f"iteration {i}", *pair))
    lines += [
        f"| predicted steady peaks | | {r['replay'].peak_allocated_bytes / 1e9:.3f} "
        f"| {r['replay'].peak_reserved_bytes / 1e9:.3f} | | | | |",
        "",
        parting_line("build", measured["setup"], predicted["setup"]),
        "",
        parting_line("first iteration", measured["iterations"][0], predicted["first"]),
        "",
    ]
    return lines


def load_measured(path: Path) -> list[dict]:
    """The runs `--measure` wrote: DIR/<case>.<init>.json.gz, or the same files inside a
    .tar.gz of DIR (as the device step brings it back), in file-name order."""
    if path.is_dir():
        files = {p.name: p.read_bytes() for p in path.rglob("*.json.gz")}
    elif path.is_file() and tarfile.is_tarfile(path):
        with tarfile.open(path) as archive:
            members = [m for m in archive.getmembers() if m.name.endswith(".json.gz")]
            files = {Path(m.name).name: archive.extractfile(m).read() for m in members}
    else:
        raise SystemExit(f"--compare {path}: neither a folder nor a .tar.gz")
    if not files:
        raise SystemExit(f"--compare {path}: no <case>.<init>.json.gz here")
    return [json.loads(gzip.decompress(files[name])) for name in sorted(files)]


def compare(path: Path, shared: dict | None = None) -> list[str]:
    """Every run of a --measure folder (or its archive): the summary tables (steady peaks,
    first iteration, meta against device, against the shared measurement), then each run
    part by part."""
    runs = [scored(result) for result in load_measured(path)]
    runs.sort(key=lambda r: (r["case"], INITS.index(r["init"])))
    versions = ", ".join(sorted({f"{r['device']} (torch {r['torch']})" for r in runs}))
    presets = ", ".join(sorted({r["gpu"] for r in runs}))
    lines = [f"Runs: {len(runs)}, on {versions}; predicted for the {presets} preset.", "",
             "#### Steady iteration", "", *steady_table(runs), "",
             "#### First iteration (peaks reset after the build)", "", *first_table(runs), "",
             "#### Built on meta against built on the device", "", *builds_table(runs)]  # fmt: skip
    if shared:
        lines += ["", f"#### Against the shared {GPU} measurement (built on the device)", "",
                  *shared_table(runs, shared)]  # fmt: skip
    lines += ["", presets_line(runs), "", "#### Part by part", ""]
    for r in runs:
        lines += compare_case(run=r)
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("cases", nargs="*", metavar="CASE", help=f"default: {', '.join(CASES)}")
    parser.add_argument("--measure", type=Path, metavar="DIR",
                        help="run the ranks on this GPU, write DIR/<case>.<init>.json.gz")
    parser.add_argument("--init", action="append", choices=INITS,
                        help="how --measure builds the model (repeatable; default: both)")
    parser.add_argument("--budget-s", type=float, default=450.0,
                        help="--measure starts no run after this many seconds (default 450)")
    parser.add_argument("--compare", type=Path, metavar="DIR",
                        help="score a --measure folder, or its .tar.gz")  # fmt: skip
    # one run, in a process of its own (`measure` starts it)
    parser.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help="also write the markdown here")
    args = parser.parse_args(argv)
    try:
        cases = [spec_path(c).stem for c in args.cases] or list(CASES)
    except ValueError as err:
        parser.exit(2, f"{err}\n")
    inits = args.init or list(INITS)
    if args.rank:
        write_rank(cases[0], inits[0], args.measure)
        return 0
    if args.measure:
        import torch

        if not torch.cuda.is_available():
            parser.exit(2, "--measure: no CUDA device here\n")
        args.measure.mkdir(parents=True, exist_ok=True)
        return measure(cases, inits, args.measure, args.budget_s)
    command = command_line("results/fidelity/fake_pg_memory.py", argv)
    if args.compare:
        shared = json.loads(MEASURED.read_text()) if MEASURED.is_file() else None
        report(command, compare(args.compare, shared), args.out)
        return 0
    report(command, score(json.loads(MEASURED.read_text()), cases), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
