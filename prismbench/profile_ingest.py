"""Kernel-table rows from a torch.profiler record of a real run, matched op by op to its capture.

A profile says what each op of one real iteration cost on the GPU; the capture of the same job
says what the emulator thinks those ops are (normalized name, dtype, GEMM/attention dims, bytes).
`ingest_profile` reads the profile (`prismbench/profile_readers.py`, either format), aligns its
ops with the trace's compute rows in program order, and turns every matched pair into a
measured row of `emulator/costs/kernel_table.py` (identical op, dtype and shape aggregated:
mean kernel time, count, spread), so a measured run becomes a kernel table. A profile of
several iterations (`record --profile-iterations N`) has each aligned apart and pooled into the
same rows (`ingest_iterations`).

Alignment is `difflib.SequenceMatcher` over keys (normalized op, the shapes its cost depends
on), tolerant of ops on one side only (the capture's ops that launch no kernel on the GPU, a
profiler's bookkeeping kernels, ...). Where the profile records nesting (Chrome traces),
kernels go to the outermost enclosing op that the capture records, except the kernels the
capture records as rows of their own before the op that launched them (`launched_first`).

A profile is taken to be of the job only where the alignment covers both sides
(`check_coverage`): at least MIN_COVERAGE of the capture's compute rows matched and of the
profile's kernel time attributed. Either share alone can mislead: a truncated profile of the
job has all its kernel time attributed while most of the capture goes unmatched, and the
profile of a deeper model matches nearly every row of a shallower one's capture while most of
its kernel time stays unattributed. The shared H100 profiles reach 0.997 of the rows and
1.000 of the time with their own specs; the 125M model's profile against its micro-batch-4
spec reaches 0.48 and 0.08, against a two-layer spec 0.98 and 0.67.
"""

from __future__ import annotations

import difflib
import json
import math
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from emulator.capture.opmap import (
    CONTIGUOUS_INPUT,
    READS_NO_INPUT,
    ZERO_FILL,
    ZERO_FILLED_OUTPUT,
    normalized_name,
)
from emulator.capture.trace import COMPUTE, RankTrace
from emulator.costs.calibrate import write_kernel_csv
from emulator.costs.kernel_table import PROVENANCE_FIELDS, row_fields
from emulator.costs.ops import ATTENTION_OPS, GEMM_OPS
from emulator.costs.pricing import op_record
from emulator.hardware import gpu_preset
from prismbench.compiled_calls import attribute_calls
from prismbench.files import write_atomically
from prismbench.profile_readers import (
    INDUCTOR_KERNEL,
    ProfiledOp,
    ProfileError,
    read_profile_iterations,
)

# The least share of the capture's compute rows matched, and of the profile's kernel time
# attributed, for a profile to be taken as one of the job (see the module docstring).
MIN_COVERAGE = 0.9

# Profile op (as an aten packet) -> the normalized name of the op the capture records for the
# same call, where the CUDA build dispatches a different aten op than the CPU capture sees.
PROFILE_ALIASES = {
    "aten._cudnn_attention_forward": "flash_attn_fwd",
    "aten._cudnn_attention_backward": "flash_attn_bwd",
    "aten._efficient_attention_forward": "flash_attn_fwd",
    "aten._efficient_attention_backward": "flash_attn_bwd",
    "aten.gather": "embedding",  # embedding's forward on CUDA (the shared H100 profiles)
    "aten.index_select": "embedding",
}

# Profile ops that take q, k, v (and the gradient, the output) as [batch, seq, heads, head_dim]:
# SDPA's flash backend on CUDA transposes its [batch, heads, seq, head_dim] tensors before it
# calls them (ATen's _scaled_dot_product_flash_attention_cuda and its backward), and a jsonl
# profile lists the kernels under them; the capture records SDPA's own op (no CPU kernel runs
# these two, so a capture never records them itself).
_SEQ_BEFORE_HEADS = ("aten._flash_attention_forward", "aten._flash_attention_backward")
_CONTIGUOUS_INPUT_PACKETS = {overload.rsplit(".", 1)[0] for overload in CONTIGUOUS_INPUT}
# Ops the profiler lists between a parent and the kernel it launches first (jsonl profiles have
# no nesting): embedding_dense_backward's arange on CUDA, before its grad_weight zero-fill.
_LAUNCHED_FIRST_WINDOW = 2
# The class of an Inductor kernel that no custom op of the capture launched
# (`compiled_calls`): no capture row has it, so it matches none.
INDUCTOR_CLASS = "triton"
# Ops taking tensor lists, whose shapes profilers do not record.
_TENSOR_LIST_PREFIXES = ("aten._foreach_", "aten._fused_adam", "aten._fused_sgd")
# Ops matched on one key whatever their shapes, since a profile's shapes say nothing of them:
# concatenations take tensor lists (and CUDA's `stack` launches its kernels as a nested `cat`);
# `arange` is listed with its out= tensor before it is resized (shape [0]).
_KEYED_WITHOUT_SHAPES = {
    "aten.cat": "aten.cat",
    "aten.stack": "aten.cat",
    "aten.arange": "aten.arange",
}


def collapse_to_recorded(ops: list[ProfiledOp], recorded: set[str]) -> list[ProfiledOp]:
    """Give each kernel to the outermost enclosing op the capture records (aten packets such as
    "aten._to_copy"), merging the launching ops under one such op into one record; ops with no
    recorded ancestor stay as they are (aten::linear is not recorded: its aten::addmm is), and
    so do the kernels the capture records as rows of their own (`is_launched_first`)."""
    merged: dict[tuple, ProfiledOp] = {}
    out: list = []
    for op in ops:
        owner = next((s for s in op.stack if aten_packet(s[0]) in recorded), None)
        if owner is not None and is_launched_first(owner[0], owner[2], op):
            owner = None
        if owner is None:
            out.append(op)
            continue
        prev = merged.get(owner)
        if prev is None:
            merged[owner] = ProfiledOp(owner[0], owner[2], op.kernels, owner[1])
            out.append(owner)
        else:
            merged[owner] = ProfiledOp(owner[0], owner[2], prev.kernels + op.kernels, owner[1])
    return [merged[o] if isinstance(o, tuple) else o for o in out]


def is_launched_first(parent: str, parent_shapes, op: ProfiledOp) -> bool:
    """`op` is a kernel that `parent` launches and the capture records as a row of its own
    before it: the copy a full max/min makes of its one input (opmap.CONTIGUOUS_INPUT), the
    zero-fill of a CUDA kernel's output (opmap.ZERO_FILLED_OUTPUT: nll_loss_backward's
    grad_input, the input's shape; embedding_dense_backward's grad_weight, whose rows are the
    vocabulary and whose width is the gradient's)."""
    packet, shapes, child = aten_packet(parent), _shapes(parent_shapes), _shapes(op.shapes)[:1]
    if packet in _CONTIGUOUS_INPUT_PACKETS:
        return len(shapes) == 1 and op.op == "aten::copy_" and child == shapes
    if packet in ZERO_FILLED_OUTPUT:
        return (
            aten_packet(op.op) == ZERO_FILL
            and bool(child)
            and any(s[-1] == child[0][-1] for s in shapes)
        )
    return False


def launched_first(ops: list[ProfiledOp]) -> list[ProfiledOp]:
    """The ops with each `is_launched_first` kernel moved before its parent: the parent starts
    first, so a profile lists the kernel after it (up to _LAUNCHED_FIRST_WINDOW ops later);
    the capture records it first. A parent whose kernel already precedes it (a Chrome trace's
    nesting, `collapse_to_recorded`) is left alone."""
    ops = list(ops)
    i = 0
    while i < len(ops):
        parent = ops[i]
        later = range(i + 1, min(i + 1 + _LAUNCHED_FIRST_WINDOW, len(ops)))
        children = [j for j in later if is_launched_first(parent.op, parent.shapes, ops[j])]
        already_first = i > 0 and is_launched_first(parent.op, parent.shapes, ops[i - 1])
        j = children[0] if children and not already_first else None
        if j is not None:
            ops.insert(i, ops.pop(j))
            i += 1
        i += 1
    return ops


def aten_packet(op: str) -> str:
    """The profiler's "aten::mm" as the capture names it: "aten.mm"."""
    return op.replace("::", ".", 1)


def _shapes(value) -> list[tuple[int, ...]]:
    """Non-empty shapes in a (possibly nested: tensor lists) shape list."""
    if isinstance(value, (list, tuple)) and value and all(isinstance(d, int) for d in value):
        return [tuple(value)]
    if isinstance(value, (list, tuple)):
        return [s for item in value for s in _shapes(item)]
    return []


def match_key(name: str, packet: str, inputs: list, outputs: list = ()) -> tuple:
    """What must agree for a profiled op and a trace row to be the same op: the normalized name
    and the shapes its cost depends on (GEMMs: the matrices; attention: q, k, v or grad, q, k;
    memory-bound ops: the largest input, else output: in-place and out-of-place forms list
    different extras). Tensor-list ops (foreach, fused optimizers): the aten op alone
    (profilers record no tensor-list shapes); `_KEYED_WITHOUT_SHAPES`: one key each."""
    if packet.startswith(_TENSOR_LIST_PREFIXES):
        return (name, packet)
    if packet in _KEYED_WITHOUT_SHAPES:
        return (name, _KEYED_WITHOUT_SHAPES[packet])
    if name in GEMM_OPS:
        return (name, *[s for s in inputs if len(s) >= 2])
    if name in ATTENTION_OPS:
        return (name, *[s for s in inputs if len(s) == 4][:3])
    return (name, max(inputs or outputs, key=math.prod, default=()))


def profile_key(op: ProfiledOp, custom_names: dict[str, str] | None = None) -> tuple:
    """`match_key` of a profiled op; custom_names: the normalized name of each custom op of the
    capture (its rows say it: the op map knows a program's custom ops only in the process that
    captured it)."""
    packet = aten_packet(op.op)
    if INDUCTOR_KERNEL.match(op.op):
        return (INDUCTOR_CLASS, packet)
    name = (
        PROFILE_ALIASES.get(packet)
        or (custom_names or {}).get(packet)
        or normalized_name(packet)
        or packet
    )
    shapes = _shapes(op.shapes)
    if packet in _SEQ_BEFORE_HEADS:  # as SDPA, which the capture records, holds them
        shapes = [(s[0], s[2], s[1], s[3]) if len(s) == 4 else s for s in shapes]
    return match_key(name, packet, shapes)


def trace_key(trace: RankTrace, row: int) -> tuple:
    c = trace.columns
    tensors = trace.tensors(row)
    aten = trace.strings[c["aten"][row]]
    # the tensor a READS_NO_INPUT op takes only names a dtype: the GPU's fill has its output
    inputs = [s for s, _, is_out in tensors if not is_out and s and aten not in READS_NO_INPUT]
    outputs = [shape for shape, _, is_out in tensors if is_out and shape]
    return match_key(trace.strings[c["name"][row]], aten, inputs, outputs)


def align(left: list, right: list) -> list[tuple[int, int]]:
    """Index pairs (i, j) with left[i] == right[j], in order, over the longest matching blocks
    (difflib; autojunk off: a step repeats the same keys hundreds of times)."""
    matcher = difflib.SequenceMatcher(None, left, right, autojunk=False)
    return [
        (block.a + d, block.b + d)
        for block in matcher.get_matching_blocks()
        for d in range(block.size)
    ]


@dataclass
class IngestResult:
    """Kernel-table rows and how much of the profile and of the trace they account for."""

    rows: list[dict]
    trace_rows: int
    matched_rows: int
    total_kernel_us: float
    attributed_kernel_us: float
    unmatched_profile: list[dict] = field(default_factory=list)
    unmatched_trace: list[dict] = field(default_factory=list)
    # the iterations the profile holds: the rows pool them all but `iterations_left_out` (not
    # one of the job); the coverage and the unmatched ops are the first iteration's
    profile_iterations: int = 1
    iterations_left_out: tuple[int, ...] = ()

    @property
    def trace_coverage(self) -> float:
        """The share of the capture's compute rows matched to a profiled op."""
        return self.matched_rows / self.trace_rows if self.trace_rows else 0.0

    @property
    def kernel_time_coverage(self) -> float:
        """The share of the profile's kernel time attributed to a capture row."""
        return self.attributed_kernel_us / self.total_kernel_us if self.total_kernel_us else 0.0

    def to_dict(self, top: int = 20) -> dict:
        return {
            "rows": len(self.rows),
            "trace_rows": self.trace_rows,
            "matched_rows": self.matched_rows,
            "trace_coverage": round(self.trace_coverage, 4),
            "total_kernel_us": round(self.total_kernel_us, 3),
            "attributed_kernel_us": round(self.attributed_kernel_us, 3),
            "kernel_time_coverage": round(self.kernel_time_coverage, 4),
            "unmatched_profile": self.unmatched_profile[:top],
            "unmatched_trace": self.unmatched_trace[:top],
            "profile_iterations": self.profile_iterations,
            "iterations_left_out": list(self.iterations_left_out),
            # trace_rows .. unmatched_trace are the first iteration's where there are several
            "coverage_iteration": 0,
        }


def _aggregate(samples: dict[tuple, list[tuple[float, int]]]) -> list[dict]:
    """One row per key from its (kernel us, kernels launched) samples: the means, and the spread
    of the times."""
    rows = []
    for key, pairs in samples.items():
        pairs = [(t, n) for t, n in pairs if t > 0]
        if pairs:
            times = [t for t, _ in pairs]
            rows.append(
                dict(key)
                | {
                    "time_us": float(np.mean(times)),
                    "repetitions": len(times),
                    "spread_us": float(np.std(times)),
                    "kernels": round(float(np.mean([n for _, n in pairs])), 3),
                }
            )
    return rows


def _unmatched(items: list[tuple[str, tuple, float]]) -> list[dict]:
    """(op, shapes, us) grouped: count and total kernel us, largest total first, then count."""
    groups: dict[tuple, list] = {}
    for op, shapes, us in items:
        entry = groups.setdefault((op, shapes), [0, 0.0])
        entry[0] += 1
        entry[1] += us
    ordered = sorted(groups.items(), key=lambda kv: (-kv[1][1], -kv[1][0]))
    return [
        {"op": op, "shapes": json.dumps(shapes), "count": n, "kernel_us": round(us, 3)}
        for (op, shapes), (n, us) in ordered
    ]


@dataclass(frozen=True)
class Alignment:
    """Profiled ops (collapsed to what the capture records, compiled calls given to their custom
    op), the trace's compute rows, the matched (op index, compute index) pairs in program
    order, and each op's match key (`profile_key`)."""

    ops: list[ProfiledOp]
    compute_rows: list[int]
    pairs: list[tuple[int, int]]
    keys: list[tuple]

    @property
    def matched_ops(self) -> set[int]:
        return {i for i, _ in self.pairs}

    @property
    def matched_rows(self) -> set[int]:
        return {j for _, j in self.pairs}

    @property
    def total_kernel_us(self) -> float:
        return sum(op.kernel_us for op in self.ops)

    @property
    def attributed_kernel_us(self) -> float:
        return sum(self.ops[i].kernel_us for i in self.matched_ops)


def align_profile(ops: list[ProfiledOp], trace: RankTrace) -> Alignment:
    """Match a profile's ops to a trace's compute rows (see the module docstring), then give
    the kernels of compiled calls to their custom-op rows (`compiled_calls`)."""
    c = trace.columns
    compute = [int(r) for r in np.flatnonzero(c["kind"] == COMPUTE)]
    recorded = {trace.strings[c["aten"][r]] for r in compute}
    trace_keys = [trace_key(trace, r) for r in compute]
    custom = {
        j: (packet, trace.strings[c["name"][r]], trace_keys[j])
        for j, r in enumerate(compute)
        if not (packet := trace.strings[c["aten"][r]]).startswith("aten.")
    }
    names = {packet: name for packet, name, _ in custom.values()}
    ops = launched_first(collapse_to_recorded(ops, recorded))
    keys = [profile_key(op, names) for op in ops]

    def key_of(name: str, packet: str, shapes: tuple) -> tuple:
        return match_key(name, packet, _shapes(shapes))

    ops, keys, pairs = attribute_calls(ops, keys, align(keys, trace_keys), custom, key_of)
    return Alignment(ops, compute, pairs, keys)


class ProfileMismatch(ProfileError):
    """A readable profile whose ops are not the capture's: another program, or another job."""


def coverage_refusal(profile_path, job_label: str, aligned: Alignment) -> ProfileError | None:
    """Why a profile is not one of the job, or None where it is: a ProfileError naming the
    profile and the job for a profile with no GPU kernel, a ProfileMismatch for one whose
    alignment with the capture covers less than MIN_COVERAGE of the capture's compute rows or
    of the profile's kernel time (module docstring)."""
    total_us = aligned.total_kernel_us
    if total_us <= 0:
        return ProfileError(
            f"{profile_path}: the profile records no GPU kernel time (no op that launched a "
            "kernel): profile with CUDA activities to ingest or compare it"
        )
    matched_rows, trace_rows = len(aligned.matched_rows), len(aligned.compute_rows)
    attributed_us = aligned.attributed_kernel_us
    rows = matched_rows / trace_rows if trace_rows else 0.0
    time = attributed_us / total_us
    if min(rows, time) < MIN_COVERAGE:
        return ProfileMismatch(
            f"{profile_path}: not a profile of {job_label}: it matched {matched_rows:,} of the "
            f"capture's {trace_rows:,} compute rows ({rows:.1%}) and {attributed_us / 1e3:,.3f} "
            f"of its {total_us / 1e3:,.3f} ms of kernel time ({time:.1%}); a profile of the job "
            "(same model, batch, parallelism and precision, one whole iteration) matches at "
            f"least {MIN_COVERAGE:.0%} of both"
        )
    return None


def check_coverage(profile_path, job_label: str, aligned: Alignment) -> None:
    """Refuse a profile that is not one of the job (`coverage_refusal`'s error)."""
    refusal = coverage_refusal(profile_path, job_label, aligned)
    if refusal is not None:
        raise refusal


def ingest_ops(
    ops: list[ProfiledOp],
    trace: RankTrace,
    provenance: dict | None = None,
    aligned: Alignment | None = None,
    source: str = "",
    more: tuple[Alignment, ...] = (),
):
    """Align profiled ops with the trace's compute rows (unless `aligned` is their alignment)
    and turn the pairs into kernel rows, each with `source` (`profile_source`). `more`: the
    alignments of further profiled iterations of the same job, whose pairs add their samples
    to the rows (each row's repetitions count them all); the coverage and the unmatched ops
    are the first iteration's."""
    aligned = aligned or align_profile(ops, trace)
    ops, compute = aligned.ops, aligned.compute_rows
    samples: dict[tuple, list[tuple[float, int]]] = defaultdict(list)
    for each in (aligned, *more):
        for i, j in each.pairs:
            key = tuple(row_fields(op_record(trace, each.compute_rows[j])).items())
            samples[key].append((each.ops[i].kernel_us, len(each.ops[i].kernels)))
    rows = [row | (provenance or {}) | {"source": source} for row in _aggregate(samples)]
    matched_ops, matched_rows = aligned.matched_ops, aligned.matched_rows
    return IngestResult(
        rows=rows,
        trace_rows=len(compute),
        matched_rows=len(matched_rows),
        total_kernel_us=aligned.total_kernel_us,
        attributed_kernel_us=aligned.attributed_kernel_us,
        unmatched_profile=_unmatched(
            [(o.op, o.shapes, o.kernel_us) for i, o in enumerate(ops) if i not in matched_ops]
        ),
        unmatched_trace=_unmatched(
            [
                (trace.strings[trace.columns["aten"][r]], trace_key(trace, r)[1:], 0.0)
                for j, r in enumerate(compute)
                if j not in matched_rows
            ]
        ),
    )


def profile_case(profile_path: str | Path) -> str:
    """A profile's name without its format's suffixes: `<case>.ops.jsonl[.gz]` or a Chrome
    trace `<case>.json[.gz]`."""
    name = Path(profile_path).name.removesuffix(".gz")
    return name.split(".ops.")[0].removesuffix(".json")


def profile_source(profile_path: str | Path) -> str:
    """The `source` of the kernel rows a profile gives, "profile:<case>": the prefix
    `compare --skip-source` and `load_kernel_table(skip_sources=...)` leave out."""
    return f"profile:{profile_case(profile_path)}"


def profile_provenance(profile_path: str | Path) -> dict:
    """gpu, torch, date of a shared profile from the summary.json beside its profiles/ folder
    (keyed by case name); the fields it lacks (driver, clocks) stay empty."""
    path = Path(profile_path)
    case = profile_case(path)
    summary = path.parent.parent / "summary.json"
    provenance = dict.fromkeys(PROVENANCE_FIELDS, "")
    if summary.is_file():
        entry = _summary_entry(summary, case)
        provenance |= {k: str(entry[k]) for k in ("gpu", "torch", "date") if k in entry}
    return provenance


def _summary_entry(summary: Path, case: str) -> dict:
    """The case's object in a shared summary.json ({case: {gpu, torch, date, ...}}; {} where
    it has none); a file of another form is refused naming it, not read as no provenance: it
    says which GPU the profile ran on."""
    try:
        cases = json.loads(summary.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ProfileError(f"{summary}: the profile's summary.json is not JSON ({err})") from None
    entry = cases.get(case, {}) if isinstance(cases, dict) else None
    if not isinstance(entry, dict):
        raise ProfileError(
            f"{summary}: the profile's summary.json must be a JSON object with an object per "
            f"case ({case!r}: gpu, torch, date)"
        )
    return entry


def check_profile_gpu(profile_path, job, job_label: str) -> None:
    """Refuse (ProfileMismatch) a profile measured on another GPU than the job's cluster.gpu,
    as the summary.json beside it names it (`profile_provenance`): its kernels ran at that
    GPU's speed, so compare would score one GPU's prediction against another's times, and
    ingest would write rows that the job's own table refuses (emulate.check_table_gpu). The
    alignment cannot tell: the same program captures alike for every GPU. A profile that
    names no GPU (a Chrome trace, or no summary.json) is taken as the job's."""
    measured_on = profile_provenance(profile_path)["gpu"]
    preset = gpu_preset(job.cluster.gpu)
    names = preset.device_names
    if measured_on and not preset.is_named(measured_on):
        raise ProfileMismatch(
            f"{profile_path}: measured on {measured_on!r} (its summary.json), not on "
            f"{job_label}'s cluster.gpu={job.cluster.gpu!r} (whose device names are "
            f"{', '.join(map(repr, names)) or 'none listed'}): give the job spec of the GPU "
            "the profile ran on"
        )


def check_provenance_gpu(gpu: str, job, job_label: str) -> None:
    """Refuse (ProfileMismatch) rows to be labelled with a GPU the job's cluster.gpu preset
    does not name (`GpuPreset.is_named`): the job's own table would refuse them once written
    (`prismbench.emulate.check_table_gpu`). An empty `gpu` (not given) is not checked."""
    preset = gpu_preset(job.cluster.gpu)
    if gpu and not preset.is_named(gpu):
        names = ", ".join(map(repr, (preset.name, *preset.device_names)))
        raise ProfileMismatch(
            f"--provenance gpu={gpu!r}: {job_label}'s cluster.gpu={job.cluster.gpu!r} is named "
            f"{names}; rows of another GPU would be refused by its table: give one of those, "
            "or the job spec of the GPU the profile ran on"
        )


def job_trace(job, progress=None) -> RankTrace:
    """The trace a profile of `job` is aligned with: its capture's (cached) class 0 trace, the
    lowest class id, a job of several classes of ranks taken as profiled on a rank of it."""
    from prismbench.capture import capture_job

    traces = capture_job(job, progress=progress).traces
    return traces[min(traces)]


def check_profile_of_job(
    profile_path, ops: list[ProfiledOp], job, job_label: str, progress=None
) -> tuple[RankTrace, Alignment]:
    """Refuse (ProfileError) a profile measured on another GPU than the job's
    (`check_profile_gpu`) or whose ops, one iteration's (a profile of several: its first), are
    not the job's (`check_coverage` against `job_trace`); else the trace and the alignment."""
    check_profile_gpu(profile_path, job, job_label)
    trace = job_trace(job, progress)
    aligned = align_profile(ops, trace)
    check_coverage(profile_path, job_label, aligned)
    return trace, aligned


def ingest_profile(
    profile_path: str | Path, job, *, provenance: dict | None = None, job_label: str = "the job"
):
    """Read a profile (either format), capture `job` and ingest, the rows' source the
    profile's (`profile_source`); a job of several classes of ranks is matched against class
    0's trace (the profiled rank is assumed to be one of it). A profile of several iterations
    (`record --profile-iterations N`) gives rows of all of them (`ingest_iterations`: a later
    iteration that is not the job's is left out and named). A profile whose first iteration is
    not one of the job, or measured on another GPU, is refused (`check_coverage`,
    `check_profile_gpu`: ProfileError)."""
    iterations = read_profile_iterations(profile_path)
    check_profile_gpu(profile_path, job, job_label)
    check_provenance_gpu((provenance or {}).get("gpu", ""), job, job_label)
    trace = job_trace(job)
    provenance = profile_provenance(profile_path) | (provenance or {})
    return ingest_iterations(profile_path, iterations, trace, provenance, job_label=job_label)


def ingest_iterations(
    profile_path: str | Path,
    iterations: list[list[ProfiledOp]],
    trace: RankTrace,
    provenance: dict | None,
    *,
    job_label: str = "the job",
    check: bool = True,
) -> IngestResult:
    """The rows of every profiled iteration of one job (`ingest_ops` with `more`), each aligned
    with the trace apart. Where `check`, the first iteration must be one of the job
    (`check_coverage`: refused otherwise, as a profile of one), and a later one that is not (a
    step cut off at the trace's end, one with evaluation or a checkpoint in it) is left out of
    the rows and named (`IngestResult.iterations_left_out`), so that it neither refuses the
    whole profile nor pools other work into the rows."""
    alignments = [align_profile(ops, trace) for ops in iterations]
    left_out = []
    if check:
        check_coverage(profile_path, job_label, alignments[0])
        left_out = [index for index, aligned in enumerate(alignments[1:], start=1)
                    if coverage_refusal(profile_path, job_label, aligned) is not None]  # fmt: skip
    pooled = tuple(a for index, a in enumerate(alignments[1:], start=1) if index not in left_out)
    result = ingest_ops(iterations[0], trace, provenance, alignments[0],
                        source=profile_source(profile_path), more=pooled)  # fmt: skip
    return replace(result, profile_iterations=len(iterations), iterations_left_out=tuple(left_out))


def write_rows_csv(rows: list[dict], path: str | Path) -> Path:
    """Write kernel-table rows atomically (`prismbench.files.write_atomically`)."""
    return write_atomically(path, lambda tmp: write_kernel_csv(rows, tmp, {}))
