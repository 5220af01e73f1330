"""What fits: the largest micro-batch, sequence length or layer count a job can take.

`fit(job, vary)` bisects over one setting, each probe a capture (cached, so a repeated or
earlier-captured value costs a cache read) and a memory replay of every class on the job's
GPU preset (emulator.memory: first and steady iterations, usable capacity minus memory
outside the allocator). A value fits when no class runs out of memory in either iteration.
Allocated memory grows with each of the three settings, but what the allocator reserves need
not (its rounding and caching can make a larger batch pack better), so the values that fit
need not be a prefix. The search doubles from the job's own value (or halves, when that does
not fit, down to the least value the layout takes) to bracket the line and bisects, then
checks every value between the largest value whose smaller probes all fit and the bisection's
answer (at most MAX_SCAN of them): the answer is the largest value below which everything
probed fits, larger values found to fit are reported apart (`fits_above`), and the values
below the bracket that the doubling stepped over are not probed (`every_value_probed_from`
says from where all were). Values step by `step` (default: 1 micro-batch, the sequence-length
unit the job's parallelism needs, one layer per pipeline stage) from the least multiple of it
the layout takes (`smallest`: a pipeline needs a layer per stage), and the job's other
settings follow the rules in `varied_job` (a micro-batch keeps the number of micro-batches a
step: the global batch follows). A value the job spec refuses (a sequence longer
than a learned position table, ...) counts as not fitting in the search but is no memory
figure: it is kept apart (`refused`, with the spec's message), and when it is the value one
step above the answer, the answer is bounded by the spec, not memory (`limited_by`).
`maximum` bounds the search from above: no value beyond it is emulated (a probe's capture
grows with the value: a debug model fits ~1e5 layers, each probe minutes), and when the
value one step above the answer is beyond it, `limited_by` says "maximum".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

from emulator.units import GiB
from prismbench.spec import JobSpec, SpecError, job_spec_from_dict

VARIABLES = ("micro_batch", "seq_len", "layers")
# doubling, then bisection: about two probes a bit of the answer, so any 31-bit value
MAX_PROBES = 64
MAX_SCAN = 16


@dataclass(frozen=True, kw_only=True)
class OomSite:
    """Where a job first ran out of memory (emulator.memory.replay.OomReport, in brief)."""

    pp: int  # the class (pipeline rank)
    iteration: str  # "first" or "steady"
    phase: str
    module: str
    op: str  # the aten op (or collective) that asked; "" before the first op
    request_bytes: int
    allocation_bytes: int  # torch's "Tried to allocate": the segment asked of CUDA


@dataclass(frozen=True, kw_only=True)
class MemoryCheck:
    """Whether a job fits on its GPU and by how much (negative headroom: short by)."""

    fits: bool
    # the larger of the first and steady iteration, max over classes; for a job that does not
    # fit, as if the GPU were unlimited (the replay goes on past the OOM)
    peak_reserved_bytes: int
    outside_bytes: int
    capacity_bytes: int  # what CUDA offers the process (the preset's usable capacity)
    headroom_bytes: int  # capacity - outside - peak reserved
    oom_at: OomSite | None  # the first OOM, over classes in order
    # cache-freeing cudaMalloc retries every steady step, the most over classes: a value that
    # fits only this way runs slower than the emulated time (emulator.memory.replay)
    steady_alloc_retries: int
    # the same in the first iteration: a value that fits only by them there reports the
    # headroom torch's max_memory_reserved would show after the cache was freed
    first_iteration_alloc_retries: int
    # every class's allocator repeated its blocks within replay.MAX_STEADY_ITERATIONS steady
    # iterations (False: the steady figures are the last replayed iteration's)
    steady_converged: bool


@dataclass(frozen=True, kw_only=True)
class FitProbe:
    value: int
    memory: MemoryCheck


@dataclass(frozen=True, kw_only=True)
class FitRefusal:
    """A value the job spec refuses (e.g. beyond a learned position table): no memory figure."""

    value: int
    reason: str  # the spec's message


@dataclass(frozen=True, kw_only=True)
class FitResult:
    vary: str
    step: int
    smallest: int  # the least value searched: the least multiple of `step` the layout takes
    largest_fitting: int | None  # None: not even `smallest` fits
    headroom_bytes: int | None  # at largest_fitting
    # what stops the answer one step up: "memory" (that value does not fit), "spec" (the
    # spec refuses it, `refused` says why) or "maximum" (it is beyond the search's bound)
    limited_by: str
    maximum: int | None  # the search's bound (None: none)
    fits_above: tuple[int, ...]  # larger values that fit too, past one that does not
    contiguous: bool  # every value from the bracketing fit up to largest_fitting was probed
    # where some value fits and contiguous: the least value from which every one up to
    # largest_fitting was probed (below it the doubling stepped over values); else None
    every_value_probed_from: int | None
    gpu: str
    probes: tuple[FitProbe, ...]  # in the order emulated
    refused: tuple[FitRefusal, ...]  # values the spec refused, in the order tried

    @property
    def value_above(self) -> int:
        """The value one step above the answer (`smallest` when nothing fits): what it ran into
        is `limited_by`."""
        return self.smallest if self.largest_fitting is None else self.largest_fitting + self.step

    def to_dict(self) -> dict:
        return asdict(self)


def fit(
    job: JobSpec,
    vary: str,
    *,
    step: int | None = None,
    maximum: int | None = None,
    alloc_conf: str = "",
    progress: Callable[[str], None] | None = None,
) -> FitResult:
    """The largest value of `vary` (one of VARIABLES) at which `job` fits (module docstring)."""
    if vary not in VARIABLES:
        raise SpecError(f"--vary {vary!r} must be one of {VARIABLES}")
    least = _default_step(job, vary)
    step_given = step is not None
    if step is None:
        step = least
    elif step < 1:
        raise SpecError(f"--step {step} must be >= 1")
    elif vary == "seq_len" and step % least:
        # the spec refuses a length the layout cannot split: such probes would read as its bound
        raise SpecError(
            f"--step {step} must be a multiple of {least}, the least seq_len the layout takes"
        )
    # layers step by any count but start at a layer a stage (pp x vpp): the spec refuses fewer
    smallest = math.ceil(least / step) * step
    if maximum is not None and maximum < smallest:
        if not step_given:
            why = f"the least {vary} the layout takes"
        else:
            why = "the step" if smallest == step else "the least multiple of it the layout takes"
        raise SpecError(f"--max {maximum} must be >= {smallest} ({why}): nothing to search")
    say = progress or (lambda _message: None)
    probes: dict[int, FitProbe] = {}
    refused: dict[int, FitRefusal] = {}

    def fits(value: int) -> bool:
        """Whether `value` fits; a value the spec refuses does not, and is kept apart; one
        beyond `maximum` is not emulated and counts as not fitting."""
        if value in refused or (maximum is not None and value > maximum):
            return False
        if value not in probes:
            try:
                varied = varied_job(job, vary, value)
            except SpecError as err:
                refused[value] = FitRefusal(value=value, reason=str(err))
                say(f"{vary} = {value}: refused by the spec: {err}")
                return False
            say(f"{vary} = {value}: replaying memory (capturing it first where not cached)")
            check = check_memory(
                varied, alloc_conf=alloc_conf, progress=lambda m: say(f"{vary} = {value}: {m}")
            )
            probes[value] = FitProbe(value=value, memory=check)
            verdict = "fits" if check.fits else "does not fit"
            say(f"{vary} = {value}: {verdict}, headroom {check.headroom_bytes / GiB:.2f} GiB")
        return probes[value].memory.fits

    largest, bracketed = _search(fits, _current(job, vary), step, smallest)
    largest, probed_from = _scan(fits, largest, bracketed, step)
    fits_above = tuple(
        v
        for v, p in sorted(probes.items())
        if largest is not None and v > largest and p.memory.fits
    )
    return FitResult(
        vary=vary,
        step=step,
        smallest=smallest,
        largest_fitting=largest,
        fits_above=fits_above,
        contiguous=largest is None or probed_from is not None,
        every_value_probed_from=probed_from,
        headroom_bytes=None if largest is None else probes[largest].memory.headroom_bytes,
        # the search ends on a miss one step above the answer (or at `smallest`: nothing fits)
        limited_by=_limit(smallest if largest is None else largest + step, refused, maximum),
        maximum=maximum,
        gpu=job.cluster.gpu,
        probes=tuple(probes.values()),
        refused=tuple(refused.values()),
    )


def _limit(above: int, refused: dict, maximum: int | None) -> str:
    """What the value one step above the answer ran into."""
    if maximum is not None and above > maximum:
        return "maximum"
    return "spec" if above in refused else "memory"


def check_memory(
    job: JobSpec, *, alloc_conf: str = "", progress: Callable[[str], None] | None = None
) -> MemoryCheck:
    """Capture `job` (cached; `progress` hears the capture's, minutes for a big job when not
    cached) and replay its memory: does it fit on its GPU, by how much."""
    from emulator.hardware import gpu_preset
    from emulator.memory import replay_memory
    from prismbench.capture import capture_job

    gpu = gpu_preset(job.cluster.gpu)
    capture = capture_job(job, progress=progress)
    worst, oom_at, retries, first_retries, converged = None, None, 0, 0, True
    for p, trace in capture.traces.items():
        m = replay_memory(trace, gpu=gpu, alloc_conf=alloc_conf, stage=p)
        retries = max(retries, m.steady_alloc_retries)
        first_retries = max(first_retries, m.first_iteration_alloc_retries)
        converged = converged and m.steady_converged
        reserved = max(m.peak_reserved_bytes, m.first_iteration_peak_reserved_bytes)
        headroom = gpu.usable_capacity_bytes - m.outside.total_bytes - reserved
        if worst is None or headroom < worst[0]:
            worst = (headroom, reserved, m.outside.total_bytes)
        if m.oom is not None and oom_at is None:
            oom_at = _oom_site(p, m.oom)
    headroom, reserved, outside = worst
    return MemoryCheck(
        fits=oom_at is None,
        peak_reserved_bytes=reserved,
        outside_bytes=outside,
        capacity_bytes=gpu.usable_capacity_bytes,
        headroom_bytes=headroom,
        oom_at=oom_at,
        steady_alloc_retries=retries,
        first_iteration_alloc_retries=first_retries,
        steady_converged=converged,
    )


def _oom_site(pp: int, oom) -> OomSite:
    at = oom.at
    return OomSite(
        pp=pp,
        iteration=oom.iteration,
        phase=at.phase,
        module=at.module,
        op=at.op,
        request_bytes=oom.request_bytes,
        allocation_bytes=oom.allocation_bytes,
    )


def _search(fits: Callable[[int], bool], start: int, step: int, smallest: int) -> tuple:
    """(the largest multiple of `step` from `smallest` on that bisection finds fitting, the
    largest fit known when the line was first bracketed); both None when not even `smallest`
    (a multiple of `step`) fits."""
    low, high, bracketed = None, None, None  # largest known fit, smallest known miss
    value = max(smallest, start - start % step)
    for _ in range(MAX_PROBES):
        if fits(value):
            low = value
        else:
            high = value
        if bracketed is None and low is not None and high is not None:
            bracketed = low
        if high is None:
            value *= 2
        elif low is None:
            if value == smallest:
                return None, None
            value = max(smallest, (value // 2) - (value // 2) % step)
        else:
            if high - low <= step:
                return low, bracketed
            value = low + math.ceil((high - low) / step / 2) * step
    raise RuntimeError(f"no answer after {MAX_PROBES} probes (low {low}, high {high})")


def _scan(fits, largest: int | None, bracketed: int | None, step: int) -> tuple:
    """(the largest value up to which every value probed fits, the value from which all up to
    it were probed, None where more than MAX_SCAN lay between): the values between the
    bracket's fit and bisection's answer, which bisection skipped, in turn."""
    if largest is None:
        return None, None
    if (largest - bracketed) // step - 1 > MAX_SCAN:  # the values strictly between the two
        return largest, None
    for value in range(bracketed + step, largest, step):
        if not fits(value):
            return value - step, bracketed
    return largest, bracketed


def _current(job: JobSpec, vary: str) -> int:
    return {
        "micro_batch": job.batch.micro_batch,
        "seq_len": job.batch.seq_len,
        "layers": job.model.layers,
    }[vary]


def _default_step(job: JobSpec, vary: str) -> int:
    p = job.parallel
    if vary == "seq_len":  # what the parallelism needs: 2*cp chunks, each split over tp with SP
        return math.lcm(2 * p.cp if p.cp > 1 else 1, p.cp * p.tp if p.sequence_parallel else 1)
    if vary == "layers":
        return p.pp * p.vpp
    return 1


def varied_job(job: JobSpec, vary: str, value: int) -> JobSpec:
    """`job` with `vary` set to `value`. A new micro-batch keeps the number of micro-batches
    (the global batch follows); a new sequence length or layer count changes nothing else."""
    tables = job.to_dict()
    if vary == "micro_batch":
        tables["batch"]["micro_batch"] = value
        tables["batch"]["global_batch"] = value * job.parallel.dp * job.num_microbatches
    elif vary == "seq_len":
        tables["batch"]["seq_len"] = value
    else:
        tables["model"]["layers"] = value
    return job_spec_from_dict(tables)
