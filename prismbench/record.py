"""Record a real baseline on this machine: run the job for real and measure its iterations.

`record(job)` runs the workloads' real program on one CPU process per rank (gloo, through
`prismbench.launch`; small jobs only: every rank is a process on this machine), with a fixed
number of torch threads per process, `warmup` iterations left out, then `iterations` timed
ones: each iteration starts after a barrier and ends when the slowest rank is done (a barrier
after the step), timed on rank 0. On CPU the memory figure is each process's peak resident
set (`getrusage` ru_maxrss), not a GPU allocator's: the record says so (`peak_mem_kind`).

With `device="cuda"` the ranks run on this machine's GPUs (nccl, rank r on GPU r; the world
must fit: world size <= GPUs here), as the shared H100 measurements were taken
(../shared/data/gpu/h100-sxm-80g/README.md): each timed iteration is the wall time between
`torch.cuda.synchronize()` calls (and barriers), and the caching allocator's peaks are kept for
the first iteration (from the allocator as the build leaves it: optimizer state is created
lazily there) and for the steady state (peak statistics reset after warm-up, over the timed
iterations). The headline memory figure is the steady reserved peak of the largest rank
(`allocator_reserved`), as the emulator's `peak_memory_reserved_bytes` predicts it. With
`profile=True` every rank then runs `profile_iterations` (1) more iterations under one
torch.profiler session (emulator.costs.kernel_timing.profile_iterations: kernel-only times) and
rank 0's op records come back per iteration in `Recording.profiled_iterations`, the first in
`Recording.profile` (write them with `prismbench.calibrate_job.write_ops_jsonl_iterations`;
`prismbench compare` reads iteration 0, as from a profile of one; `ingest-profile` and the
measured variability tables read them all, `profile_readers.read_profile_iterations`: the
same op at the same place in each iteration gives its spread over time alone). A profiler that
records no kernels (a CUDA build without CUPTI) makes `record` raise
`kernel_timing.KernelsNotRecorded`, before anything is written.

A CUDA record runs only on GPUs that are the job's `cluster.gpu` (architecture, SM count and
the capacity CUDA offers, `emulator.hardware.presets.gpu_presets_matching`): the recording is
scored against the prediction for that preset.

`write_record(recording, path)` writes it as a recorded baseline (`prismbench.baselines`:
the job spec, the median with the range and count of the timed iterations, provenance with
machine, software, commit and date), atomically (no half-written file); put it under
`results/baselines/recorded/` and `prismbench validate` scores the emulator against a CUDA
recording. A CPU recording says `measured.device = "cpu"`: validate runs it (the harness's
plumbing) but scores nothing, as the emulator predicts the job's GPU, not this CPU.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import resource
import signal
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from emulator.units import GiB
from prismbench.files import write_atomically
from workloads.config import SpecError

RECORD_SCHEMA_VERSION = 1
MAX_RANKS = 16  # every rank is a process on this machine
DEVICES = ("cpu", "cuda")
PEAK_MEM_KIND = {"cpu": "cpu_max_rss", "cuda": "allocator_reserved"}


def _allocator_peaks() -> dict:
    import torch

    return {
        "allocated": torch.cuda.max_memory_allocated(),
        "reserved": torch.cuda.max_memory_reserved(),
    }


def _rank_run(
    job,
    warmup: int,
    iterations: int,
    device: str = "cpu",
    profile: bool = False,
    profile_iterations: int = 1,
) -> dict:
    """One rank: build, warm up, time `iterations` steps between barriers (seconds)."""
    import torch
    import torch.distributed as dist

    from workloads import build_training, make_mesh, train_step

    # On a CPU mesh DTensor has no RNG tracker, so a tensor-parallel rank initialises its
    # shards from its own generator and torch warns once per rank. The values a shard starts
    # from change nothing a timed iteration does.
    warnings.filterwarnings(
        "ignore",
        message="DTensor random operators may not have complete support",
        category=UserWarning,
    )
    cuda = device == "cuda"
    mesh = make_mesh(job, device)
    # the program the emulator predicts (`train.model_init`: by default several ranks
    # materialise their own shards only)
    state = build_training(job, mesh, device=device, init_device=job.init_device)
    rows = job.local_batch_rows
    generator = torch.Generator().manual_seed(dist.get_rank())
    tokens = torch.randint(0, job.model.vocab, (rows, job.batch.seq_len), generator=generator)
    tokens = tokens.to(device)

    def step_s() -> float:
        dist.barrier()
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        train_step(job, state, tokens, tokens)
        if cuda:
            torch.cuda.synchronize()
        dist.barrier()
        return time.perf_counter() - start

    result: dict = {}
    for i in range(warmup):
        if cuda and i == 0:
            torch.cuda.reset_peak_memory_stats()
        step_s()
        if cuda and i == 0:
            result["peak_first_iteration"] = _allocator_peaks()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    result["iteration_s"] = [step_s() for _ in range(iterations)]
    if cuda:
        result["peak_steady"] = _allocator_peaks()
        result["gpu"] = torch.cuda.get_device_name()
    if profile:
        from emulator.costs import kernel_timing

        try:
            per_iteration = kernel_timing.profile_iterations(
                lambda: train_step(job, state, tokens, tokens),
                iterations=profile_iterations,
                warmup=0,
            )
        except kernel_timing.KernelsNotRecorded as refused:
            # returned, not raised: the parent says it as one error, not as every rank's traceback
            result["kernels_not_recorded"] = str(refused)
        else:
            result["profiled_iterations"] = per_iteration if dist.get_rank() == 0 else None
    result["max_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return result


@dataclass(frozen=True)
class Recording:
    """What a recorded run measured, and on what."""

    job: dict
    iteration_s: list[float]  # rank 0's timing of each timed iteration
    warmup: int
    threads_per_rank: int
    peak_mem_bytes: int  # the largest rank's
    peak_mem_kind: str
    provenance: dict
    device: str = "cpu"
    # CUDA: the largest rank's allocator peaks (bytes), {"allocated": ., "reserved": .}
    peak_first_iteration: dict | None = None
    peak_steady: dict | None = None
    # CUDA with profile=True: rank 0's op records, per profiled iteration, in order
    profiled_iterations: list[list[dict]] | None = None

    @property
    def profile(self) -> list[dict] | None:
        """The first profiled iteration's op records (what a profile of one iteration holds)."""
        return self.profiled_iterations[0] if self.profiled_iterations else None

    @property
    def iteration_s_median(self) -> float:
        return statistics.median(self.iteration_s)

    def to_dict(self) -> dict:
        spread = statistics.stdev(self.iteration_s) if len(self.iteration_s) > 1 else 0.0
        return {
            "schema_version": RECORD_SCHEMA_VERSION,
            "device": self.device,
            "job": self.job,
            "measured": {
                "iteration_time_s": self.iteration_s_median,
                "iteration_time_s_min": min(self.iteration_s),
                "iteration_time_s_max": max(self.iteration_s),
                "iteration_time_s_stdev": spread,
                "iterations": len(self.iteration_s),
                "iteration_s": self.iteration_s,
                "warmup_iterations": self.warmup,
                "peak_mem_bytes": self.peak_mem_bytes,
                "peak_mem_kind": self.peak_mem_kind,
            }
            | (
                {"peak_first_iteration": self.peak_first_iteration, "peak_steady": self.peak_steady}
                if self.device == "cuda"
                else {}
            ),
            "provenance": self.provenance | {"threads_per_rank": self.threads_per_rank},
        }


def cpu_model() -> str:
    """The CPU's model name as Linux reports it, else what `platform` knows."""
    try:
        with open("/proc/cpuinfo") as handle:
            return next(
                line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")
            )
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def provenance() -> dict:
    """machine, software, commit, date of a recording made here."""
    import torch

    from prismbench.checkout import git_version

    commit, dirty = git_version()
    return {
        "kind": "recorded",
        "machine": f"{platform.node()}: {cpu_model()}, {os.cpu_count()} cores",
        "software": f"torch {torch.__version__}, python {platform.python_version()}, {platform.system()}",
        "commit": commit,
        "dirty": dirty,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def _check_profile(profile: bool, profile_iterations: int | None) -> int:
    """How many iterations to profile: `profile_iterations`, 1 where not given (None); given
    without a profile, even as 1, it is refused, not ignored."""
    if profile_iterations is None:
        return 1
    if profile_iterations < 1:
        raise SpecError(f"--profile-iterations {profile_iterations}: profile at least 1 iteration")
    if not profile:
        raise SpecError(
            f"--profile-iterations {profile_iterations} given without --profile FILE: it says "
            "how many iterations the profile holds"
        )
    return profile_iterations


def _check_device(job, device: str, warmup: int) -> None:
    if device not in DEVICES:
        raise SpecError(f"--device {device!r}: must be one of {', '.join(DEVICES)}")
    if device == "cpu":
        return
    import torch

    if not torch.cuda.is_available():
        raise SpecError("--device cuda: no CUDA GPU on this machine (torch.cuda.is_available())")
    if job.world_size > torch.cuda.device_count():
        raise SpecError(
            f"--device cuda: the job's world size {job.world_size} needs one GPU per rank, this "
            f"machine has {torch.cuda.device_count()}: record it on a machine with "
            f"{job.world_size}, or predict it here with `prismbench emulate`"
        )
    for index in range(job.world_size):
        _check_gpu_is_preset(job.cluster.gpu, index)
    if warmup < 1:
        raise SpecError("--warmup 0: a CUDA record needs one warm-up iteration (its first-"
                        "iteration allocator peak is measured there)")  # fmt: skip


def local_gpu(index: int = 0) -> tuple[str, list[str]]:
    """GPU `index` of this machine: a description (name, compute capability, SMs, the capacity
    CUDA offers) and the GPU presets it is (`emulator.hardware.presets.gpu_presets_matching`).
    From the device's properties alone (cudaGetDeviceProperties: totalGlobalMem, the total
    cudaMemGetInfo reports): cudaMemGetInfo would open a CUDA context on the GPU here, in the
    parent of the ranks that then train on it, and hold its memory through the recording."""
    import torch

    from emulator.hardware import gpu_presets_matching

    gpu = torch.cuda.get_device_properties(index)
    description = (f"{gpu.name} (compute capability {gpu.major}.{gpu.minor}, "
                   f"{gpu.multi_processor_count} SMs, {gpu.total_memory / GiB:.2f} GiB)")  # fmt: skip
    return description, gpu_presets_matching(gpu.major, gpu.multi_processor_count, gpu.total_memory)


def _check_gpu_is_preset(gpu: str, index: int) -> None:
    """GPU `index` is the job's cluster.gpu: validate scores the recording against the
    prediction for that preset, so a run on another GPU (or a MIG slice) would be scored
    against the wrong machine."""
    from emulator.hardware import gpu_preset

    description, matching = local_gpu(index)
    if gpu in matching:
        return
    preset = gpu_preset(gpu)
    instead = (f"set cluster.gpu = {matching[0]!r}" if matching
               else "no GPU preset describes it (emulator/hardware/)")  # fmt: skip
    raise SpecError(
        f"cluster.gpu={gpu!r}: GPU {index} here is an {description}, not {gpu} ({preset.arch}, "
        f"{preset.sm_count} SMs, {preset.usable_capacity_bytes / GiB:.2f} GiB): {instead}"
    )


def _refuse_out_of_memory(job, died) -> None:
    """A rank SIGKILL ended (`launch.RanksDied`) is what Linux's out-of-memory killer does to
    a job whose processes need more memory than the machine has: a job too large to record
    here, said as such rather than as the launcher's traceback."""
    killed = sorted(rank for rank, code in died.exit_codes.items() if code == -signal.SIGKILL)
    if killed:
        memory_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        raise SpecError(
            f"parallel: rank(s) {killed} of the job's {job.world_size} process(es) were killed "
            f"(SIGKILL, as the out-of-memory killer ends a process): the job is likely too large "
            f"for this machine's {memory_bytes / GiB:.1f} GiB of memory; record a smaller one "
            "(fewer ranks, a smaller model or batch)"
        )


def _largest(ranks: list[dict], key: str) -> dict:
    return {kind: max(r[key][kind] for r in ranks) for kind in ("allocated", "reserved")}


def oversubscription_note(world_size: int, threads: int, cores: int) -> str | None:
    """What a CPU recording's times mean when its processes' threads outnumber the cores they
    may run on (None when they do not): the ranks then take turns on cores, and an iteration
    time measures that contention as well as the job."""
    if world_size * threads <= cores:
        return None
    return (
        f"note: {world_size} process(es) x {threads} thread(s) = {world_size * threads} threads "
        f"on {cores} usable core(s): the ranks share cores, and the iteration times include "
        "their waiting for one"
    )


def record(
    job,
    *,
    iterations: int = 10,
    warmup: int = 3,
    threads: int = 1,
    device: str = "cpu",
    profile: bool = False,
    profile_iterations: int | None = None,
    timeout_s: float = 1800.0,
    progress: Callable[[str], None] | None = None,
) -> Recording:
    """Run `job` for real on this machine's CPU or GPUs (see the module docstring); `progress`
    is told what runs once the job is found recordable here."""
    from prismbench.launch import RanksDied, run_ranks

    if job.world_size > MAX_RANKS:
        raise SpecError(
            f"parallel: record runs every rank as a process on this machine; world size "
            f"{job.world_size} is above {MAX_RANKS}"
        )
    if iterations < 1 or warmup < 0:
        raise SpecError(
            f"iterations={iterations}, warmup={warmup}: need iterations >= 1, warmup >= 0"
        )
    profile_iterations = _check_profile(profile, profile_iterations)
    _check_device(job, device, warmup)
    if profile and device != "cuda":
        raise SpecError("--profile: kernel times need --device cuda (a CPU run has no kernels)")
    if progress is not None:
        progress(f"recording on {device}: {job.world_size} process(es), {threads} thread(s) each, "
                 f"{warmup} warm-up + {iterations} timed iterations")  # fmt: skip
        note = device == "cpu" and oversubscription_note(
            job.world_size, threads, len(os.sched_getaffinity(0))
        )
        if note:
            progress(note)
    try:
        ranks = run_ranks(
            job.world_size,
            _rank_run,
            job,
            warmup,
            iterations,
            device,
            profile,
            profile_iterations,
            timeout_s=timeout_s,
            threads=threads,
            backend="nccl" if device == "cuda" else "gloo",
        )
    except RanksDied as died:
        _refuse_out_of_memory(job, died)
        raise
    refusals = [r["kernels_not_recorded"] for r in ranks if "kernels_not_recorded" in r]
    if refusals:
        from emulator.costs.kernel_timing import KernelsNotRecorded

        raise KernelsNotRecorded(f"--profile: {refusals[0]}")
    cuda = device == "cuda"
    steady = _largest(ranks, "peak_steady") if cuda else None
    return Recording(
        job=job.to_dict(),
        iteration_s=ranks[0]["iteration_s"],
        warmup=warmup,
        threads_per_rank=threads,
        peak_mem_bytes=steady["reserved"] if cuda else max(r["max_rss_bytes"] for r in ranks),
        peak_mem_kind=PEAK_MEM_KIND[device],
        provenance=provenance() | ({"gpu": ranks[0]["gpu"]} if cuda else {}),
        device=device,
        peak_first_iteration=_largest(ranks, "peak_first_iteration") if cuda else None,
        peak_steady=steady,
        profiled_iterations=ranks[0].get("profiled_iterations"),
    )


def to_baseline(recording: Recording, name: str):
    """The recording as a recorded baseline (`prismbench.baselines`, kind "recorded")."""
    from prismbench.baselines import Baseline, Measured, Provenance
    from prismbench.spec import job_spec_from_dict

    p = recording.provenance
    commit = p["commit"] + (" (with uncommitted changes)" if p["dirty"] else "")
    job = job_spec_from_dict(recording.job)
    return Baseline(
        name=name,
        job=job,
        measured=Measured(
            iteration_time_s=recording.iteration_s_median,
            iterations=len(recording.iteration_s),
            iteration_time_s_min=min(recording.iteration_s),
            iteration_time_s_max=max(recording.iteration_s),
            peak_mem_bytes=recording.peak_mem_bytes,
            peak_mem_kind=recording.peak_mem_kind,
            **_allocator_peaks(recording),
            device="cpu" if recording.device == "cpu" else "gpu",
        ),
        provenance=Provenance(
            kind="recorded",
            source="prismbench record",
            model=job.model.name,
            notes=_notes(recording),
            machine=p["machine"],
            software=p["software"],
            commit=commit,
            date=p["date"],
        ),
    )


def _allocator_peaks(recording: Recording) -> dict[str, int]:
    """A CUDA recording's allocator peaks besides the steady reserved one (`peak_mem_bytes`),
    as `baselines.ALLOCATOR_PEAKS` names them; none for a CPU run."""
    if recording.device == "cpu":
        return {}
    first, steady = recording.peak_first_iteration, recording.peak_steady
    return {
        "peak_memory_allocated_bytes": steady["allocated"],
        "first_iteration_peak_memory_reserved_bytes": first["reserved"],
        "first_iteration_peak_memory_allocated_bytes": first["allocated"],
    }


def _notes(recording: Recording) -> str:
    times = ", ".join(f"{t:.6f}" for t in recording.iteration_s)
    if recording.device == "cpu":
        return (
            f"CPU run, one gloo process per rank, {recording.threads_per_rank} torch thread(s) "
            f"each, {recording.warmup} warm-up iteration(s) left out; iterations (s): {times}"
        )
    first, steady = recording.peak_first_iteration, recording.peak_steady
    return (
        f"CUDA run on {recording.provenance['gpu']}, one nccl process per rank, "
        f"{recording.warmup} warm-up iteration(s) left out; iterations (s): {times}; allocator "
        f"peaks of the largest rank (bytes): first iteration allocated {first['allocated']}, "
        f"reserved {first['reserved']}; steady allocated {steady['allocated']}, reserved "
        f"{steady['reserved']}"
    )


def write_record(recording: Recording, path: str | Path) -> Path:
    """The recording as a recorded baseline file (TOML; its name is the file's stem), written
    to a temporary file and renamed over `path`: `validate` reads it from `recorded/`."""
    from prismbench.baselines import baseline_to_toml

    path = Path(path)
    if path.suffix != ".toml":
        raise SpecError(f"--out {path}: a recorded baseline is a .toml file")
    text = baseline_to_toml(to_baseline(recording, path.stem), "Recorded by prismbench record.")
    return write_atomically(path, lambda tmp: tmp.write_text(text))
