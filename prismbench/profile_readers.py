"""Readers of torch.profiler records into one form: the ops that launched GPU work, in order.

Two formats give the same `ProfiledOp` records (op, input shapes, (kernel, us) pairs, start):
- the shared `<case>.ops.jsonl.gz` profiles (one object per profiler event with GPU time: the
  ops', and the launches of Inductor's kernels, `INDUCTOR_KERNEL`, which compiled code makes
  outside any op; the kernels' own events and runtime events such as "Activity Buffer
  Request" are skipped, or every kernel would count twice),
- torch.profiler's Chrome trace (`prof.export_chrome_trace(path)`), see `read_chrome_trace`.
`read_profile` tells them apart by content. `prismbench/profile_ingest.py` matches the
records to a capture.

A profile may hold several iterations of the job (`record --profile-iterations N`): a jsonl
record then carries its iteration's number (`ITERATION_KEY`, from 0; a record without it is
iteration 0, so every older file is one iteration), and a Chrome trace marks each iteration
with a user annotation (`kernel_timing.ITERATION_RANGE`, or torch.profiler's own
"ProfilerStep#<n>" when the trace was taken with a schedule and `prof.step()`).
`read_profile_iterations` gives every iteration, in order (ingest-profile, calibrate --job,
the measured variability tables, and compare, which takes the first); `read_profile` gives
iteration 0 alone.
"""

from __future__ import annotations

import bisect
import gzip
import json
import re
import zlib
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from emulator.costs.kernel_timing import ITERATION_RANGE, split_by_ranges
from workloads.config import is_finite_number

# An op event is "namespace::name" (aten::mm, my_ns::fused_op); kernel names ("void at::...",
# "nvjet_sm90_..."), "Memset (Device)" and runtime events ("Activity Buffer Request") are not.
OP_NAME = re.compile(r"^[A-Za-z_]\w*::[\w.]+$")
# Inductor's generated kernels, as it names them (torch/_inductor/codegen/triton.py,
# `TritonScheduling.define_kernel`): "triton_", the kernel's category (poi, red, per, tem, ...),
# the aten ops fused into it, and the kernel's number in its compiled graph
# (`wrapper.next_kernel_suffix()`, counted in the order the graph's code launches them), the
# group. The profiler records each launch as an event of that name, with the kernel's argument
# shapes: compiled code (a custom op's compiled CUDA kernel, FlexAttention) launches its
# kernels there, not under an aten op.
INDUCTOR_KERNEL = re.compile(r"^triton_[a-z]{3}_\w*?_(\d+)$")
_GPU_CATEGORIES = ("kernel", "gpu_memset", "gpu_memcpy")
# The Chrome-trace events the reader uses, whose fields it checks (`_check_chrome_event`).
_READ_CATEGORIES = ("cpu_op", "cuda_runtime", "ac2g", "user_annotation", *_GPU_CATEGORIES)
# A jsonl record's iteration number (`calibrate_job.write_ops_jsonl_iterations` writes it).
ITERATION_KEY = "iteration"
# The range torch.profiler opens around each step of a schedule (torch/profiler/profiler.py,
# `profile.start` and `profile.step`: record_function("ProfilerStep#" + str(self.step_num))).
PROFILER_STEP = re.compile(r"^ProfilerStep#\d+$")


class ProfileError(ValueError):
    """A profile file that cannot be read; the message names the file and the rule."""


@dataclass(frozen=True)
class ProfiledOp:
    """One profiled op that launched kernels: name, input shapes, (kernel, us) pairs, start.

    `stack` holds the enclosing ops (name, start us, shapes), outermost first, where the format
    records nesting (Chrome traces); the jsonl profiles list launching ops only."""

    op: str
    shapes: tuple
    kernels: tuple[tuple[str, float], ...]
    cpu_start_us: float
    stack: tuple[tuple[str, float, tuple], ...] = ()

    @property
    def kernel_us(self) -> float:
        return float(sum(us for _, us in self.kernels))


def open_text(path: Path):
    """A profile file for reading as text, gzipped or not (told by its first bytes)."""
    if not path.is_file():
        raise ProfileError(f"{path}: no such profile file")
    with path.open("rb") as handle:
        gzipped = handle.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rt") if gzipped else path.open()


@contextmanager
def readable(path: Path):
    """Turn a file that cannot be decoded while read (a gzip cut short or corrupt, bytes that are
    not UTF-8) into a ProfileError naming it, not a traceback."""
    try:
        yield
    except (EOFError, gzip.BadGzipFile, zlib.error) as err:
        raise ProfileError(f"{path}: a truncated or corrupt gzip file ({err})") from None
    except UnicodeDecodeError as err:
        raise ProfileError(f"{path}: not UTF-8 text ({err})") from None


def _freeze(shapes) -> tuple:
    return tuple(_freeze(s) if isinstance(s, list) else s for s in shapes or ())


def read_ops_jsonl(path: str | Path) -> list[ProfiledOp]:
    """The op events of a `<case>.ops.jsonl[.gz]` profile's first iteration, in program order."""
    return read_ops_jsonl_iterations(path)[0]


def read_ops_jsonl_iterations(path: str | Path) -> list[list[ProfiledOp]]:
    """The op events of a `<case>.ops.jsonl[.gz]` profile, per iteration (`ITERATION_KEY`), in
    file (program) order. Iterations are numbered 0, 1, 2, ... in file order with no gap; in a
    profile of several, each holds an op (one of one iteration may hold none, as before)."""
    path = Path(path)
    iterations: list[list[ProfiledOp]] = []
    first_lines: list[int] = []
    with readable(path), open_text(path) as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                event = json.loads(line)
                op, kernels = event["op"], event["kernels"]
            except (json.JSONDecodeError, KeyError, TypeError) as err:
                raise ProfileError(
                    f"{path}:{line_no}: each line must be a JSON object with op, shapes, "
                    f"kernels ({err})"
                ) from None
            index = _iteration_of(event, len(iterations) - 1, f"{path}:{line_no}")
            if index == len(iterations):
                iterations.append([])
                first_lines.append(line_no)
            profiled = _jsonl_op(event, f"{path}:{line_no}")
            if kernels and (OP_NAME.match(op) or INDUCTOR_KERNEL.match(op)):
                iterations[index].append(profiled)  # else a kernel's own or a runtime event
    for index, (ops, line_no) in enumerate(zip(iterations, first_lines, strict=True)):
        if not ops and len(iterations) > 1:
            raise ProfileError(
                f"{path}:{line_no}: iteration {index} (from this line) holds no op that "
                f"launched kernels: each of a profile's {len(iterations)} iterations must hold one"
            )
    return iterations or [[]]


def _jsonl_op(event: dict, where: str) -> ProfiledOp:
    """A jsonl record as a ProfiledOp, each field checked: op a string, kernels [name, us]
    pairs of finite times >= 0, shapes a list, cpu_start_us a finite number; a record of
    another form is refused naming its line and the field (a NaN or a negative time would
    reach the rows and the JSON printed, a string a traceback)."""
    op, kernels = event["op"], event["kernels"]
    if not isinstance(op, str):
        raise ProfileError(f'{where}: op must be a string ("aten::mm"), got {op!r}')
    if not isinstance(kernels, list):
        raise ProfileError(f"{where}: kernels must be a list of [name, us] pairs, got {kernels!r}")
    for pair in kernels:
        if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)):
            raise ProfileError(f"{where}: each of kernels must be a [name, us] pair, got {pair!r}")
        finite_number(pair[1], where, f"the us of kernel {pair[0]!r}", minimum=0.0)
    shapes = event.get("shapes")
    if shapes is not None and not isinstance(shapes, list):
        raise ProfileError(f"{where}: shapes must be a list of input shapes, got {shapes!r}")
    start = finite_number(event.get("cpu_start_us", 0.0), where, "cpu_start_us")
    kernel_times = tuple((name, float(us)) for name, us in kernels)
    return ProfiledOp(op=op, shapes=_freeze(shapes), kernels=kernel_times, cpu_start_us=start)


def finite_number(value, where: str, name: str, *, minimum: float | None = None) -> float:
    """`value` as a float, refused (ProfileError naming `where` and `name`) unless a finite
    number (at least `minimum`): a profile's times and starts."""
    if not (is_finite_number(value) and (minimum is None or value >= minimum)):
        rule = "a finite number" + ("" if minimum is None else f" >= {minimum:g}")
        raise ProfileError(f"{where}: {name} must be {rule}, got {value!r}")
    return float(value)


def _iteration_of(event: dict, last: int, where: str) -> int:
    """A record's iteration number: `last` (the one before it, -1 for none) or the next."""
    index = event.get(ITERATION_KEY, 0)
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ProfileError(
            f"{where}: {ITERATION_KEY!r} must be an integer >= 0 (the record's iteration, "
            f"from 0), got {index!r}"
        )
    after = f"after iteration {last}" if last >= 0 else "on the first record"
    if index < last:
        raise ProfileError(
            f"{where}: iteration {index} {after}: a profile lists its iterations in order"
        )
    if index > last + 1:
        raise ProfileError(
            f"{where}: iteration {index} {after}: iteration {last + 1} has no op (iterations "
            "are numbered 0, 1, 2, ... with no gap)"
        )
    return index


def _launching_ops(events: list[dict]) -> dict:
    """External id -> the cpu op event that carries it."""
    by_external = {}
    for event in events:
        if event.get("cat") == "cpu_op" and "External id" in event.get("args", {}):
            by_external[event["args"]["External id"]] = event
    return by_external


def _enclosing(stacks: dict, tid_key, ts: float) -> list[dict]:
    """Ops of one thread whose [ts, ts + dur] contains `ts`, outermost first."""
    starts, ops = stacks.get(tid_key, ([], []))
    out = []
    for op in ops[: bisect.bisect_right(starts, ts)]:
        if op["ts"] <= ts <= op["ts"] + op.get("dur", 0):
            out.append(op)
    return out


def _thread_stacks(events: list[dict]) -> dict:
    """(pid, tid) -> (sorted start times, cpu ops in start order; outer before inner on ties)."""
    per_thread = defaultdict(list)
    for event in events:
        if event.get("cat") == "cpu_op" and event.get("ph") == "X":
            per_thread[(event["pid"], event["tid"])].append(event)
    stacks = {}
    for key, ops in per_thread.items():
        ops.sort(key=lambda e: (float(e["ts"]), -float(e.get("dur", 0))))
        stacks[key] = ([float(e["ts"]) for e in ops], ops)
    return stacks


def _launcher_of(kernel: dict, by_external: dict, launches: dict, stacks: dict) -> dict | None:
    """The innermost cpu op that launched `kernel`: by External id, else by its correlation id
    through the cuda_runtime launch event (or the ac2g flow start) enclosed by that op."""
    args = kernel.get("args", {})
    if args.get("External id") in by_external:
        return by_external[args["External id"]]
    launch = launches.get(args.get("correlation"))
    if launch is None:
        return None
    enclosing = _enclosing(stacks, (launch["pid"], launch["tid"]), float(launch["ts"]))
    return enclosing[-1] if enclosing else None


def _dims(event: dict) -> tuple:
    return _freeze(event.get("args", {}).get("Input Dims"))


def _chrome_events(path: Path) -> list[dict]:
    with readable(path), open_text(path) as handle:
        try:
            data = json.load(handle)
        except json.JSONDecodeError as err:
            raise ProfileError(f"{path}: not JSON ({err})") from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ProfileError(f"{path}: a Chrome trace is an object with a traceEvents list")
    for index, event in enumerate(events):
        if isinstance(event, dict) and event.get("cat") in _READ_CATEGORIES:
            _check_chrome_event(event, f"{path}: traceEvents[{index}] ({event['cat']})")
    return [e for e in events if isinstance(e, dict)]


def _check_chrome_event(event: dict, where: str) -> None:
    """Refuse (ProfileError naming the event and the field) an event of a category the reader
    uses whose fields are not of the form kineto writes: ts a finite number, dur one >= 0,
    pid and tid, the ids an integer or a string, args an object, a name (flows excepted)."""
    finite_number(event.get("ts"), where, "ts")
    if "dur" in event:
        finite_number(event["dur"], where, "dur", minimum=0.0)
    args = event.get("args", {})
    if not isinstance(args, dict):
        raise ProfileError(f"{where}: args must be an object, got {args!r}")
    ids = {key: event.get(key) for key in ("pid", "tid")}
    ids |= {key: args[key] for key in ("External id", "correlation") if key in args}
    ids |= {"id": event.get("id")} if event["cat"] == "ac2g" else {}
    for key, value in ids.items():
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise ProfileError(f"{where}: {key} must be an integer or a string, got {value!r}")
    if event["cat"] != "ac2g" and not isinstance(event.get("name"), str):
        raise ProfileError(f"{where}: name must be a string, got {event.get('name')!r}")


def read_chrome_trace(path: str | Path) -> list[ProfiledOp]:
    """The cpu ops of a torch.profiler Chrome trace that launched GPU work, in start order.

    Fields used (torch/profiler/_chrome_trace_export.py writes them as kineto does): cpu ops
    are "X" events of cat "cpu_op" with args "External id" (their correlation) and, with
    record_shapes=True, "Input Dims"; GPU events of cat "kernel", "gpu_memset", "gpu_memcpy"
    carry "External id" (the launching op's) and "correlation"; "cuda_runtime" launch events
    carry the same "correlation", and "ac2g" flow events ("s" at the launch, "f" at the
    kernel) share it as their id. Nesting follows from ts/dur on each thread."""
    return _launching_cpu_ops(_chrome_events(Path(path)))


def _launching_cpu_ops(events: list[dict]) -> list[ProfiledOp]:
    """`read_chrome_trace` on a trace's events."""
    by_external = _launching_ops(events)
    stacks = _thread_stacks(events)
    # correlation id -> the launch: the cuda_runtime event, else the ac2g flow's start
    launches = {e["id"]: e for e in events if e.get("cat") == "ac2g" and e.get("ph") == "s"}
    for event in events:
        if event.get("cat") == "cuda_runtime" and "correlation" in event.get("args", {}):
            launches[event["args"]["correlation"]] = event
    kernels_of = defaultdict(list)
    for event in events:
        if event.get("cat") in _GPU_CATEGORIES:
            op = _launcher_of(event, by_external, launches, stacks)
            if op is not None:
                kernels_of[id(op)].append((event["name"], float(event.get("dur", 0.0))))
    ops = []
    for _, thread_ops in stacks.values():
        for op in thread_ops:
            if id(op) in kernels_of:
                key = (op["pid"], op["tid"])
                outer = _enclosing(stacks, key, float(op["ts"]))
                stack = tuple((e["name"], float(e["ts"]), _dims(e)) for e in outer if e is not op)
                shapes = _dims(op)
                kernels = tuple(kernels_of[id(op)])
                ops.append(ProfiledOp(op["name"], shapes, kernels, float(op["ts"]), stack))
    return sorted(ops, key=lambda o: o.cpu_start_us)


def _iteration_ranges(events: list[dict]) -> list[tuple[float, float]]:
    """(start, end) us of each iteration a Chrome trace marks, in order: its `ITERATION_RANGE`
    annotations where it has any, else torch.profiler's "ProfilerStep#<n>" ones (cat
    "user_annotation", the host's; "gpu_user_annotation" is their copy on the GPU timeline)."""
    annotations = [e for e in events if e.get("cat") == "user_annotation" and e.get("ph") == "X"]
    ours = [e for e in annotations if e.get("name") == ITERATION_RANGE]
    marks = ours or [e for e in annotations if PROFILER_STEP.match(str(e.get("name")))]
    return sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in marks)


def read_chrome_trace_iterations(path: str | Path) -> list[list[ProfiledOp]]:
    """`read_chrome_trace`'s ops per iteration the trace marks (`_iteration_ranges`), each op
    in the one its start lies in; a trace that marks none is one iteration. A marked range
    that holds no op is no iteration: torch opens the next "ProfilerStep#<n>" as the trace
    ends, and an iteration that launched no GPU work has nothing to read."""
    events = _chrome_events(Path(path))
    ops, ranges = _launching_cpu_ops(events), _iteration_ranges(events)
    if not ranges:
        return [ops]
    split = split_by_ranges(ops, ranges, lambda o: o.cpu_start_us)
    return [iteration for iteration in split if iteration] or [[]]


def read_profile_iterations(path: str | Path) -> list[list[ProfiledOp]]:
    """Every iteration of a profile, in order, either format (told apart by content: JSON
    lines with "op", or a Chrome trace)."""
    path = Path(path)
    with readable(path), open_text(path) as handle:
        # kineto's older exports open with a blank line before the trace's "{"
        first = next((line for line in handle if line.strip()), "")
    try:
        head = json.loads(first)
    except json.JSONDecodeError:
        head = None
    if isinstance(head, dict) and "op" in head:
        return read_ops_jsonl_iterations(path)
    if first.lstrip()[:1] in ("{", "["):
        return read_chrome_trace_iterations(path)
    raise ProfileError(
        f"{path}: unknown format: expected ops JSON lines (objects with op, shapes, kernels) "
        "or a torch.profiler Chrome trace (JSON with traceEvents)"
    )


def read_profile(path: str | Path) -> list[ProfiledOp]:
    """A profile's first iteration (`read_profile_iterations`): the whole of a profile of one,
    as every profile written before profiles held several was."""
    return read_profile_iterations(path)[0]
