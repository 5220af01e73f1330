"""Capture a job: one RankTrace per class of ranks, from the real workload under fake tensors.

`capture_job(job)` builds the world of the job spec, and for the representative rank of
every class (one per pipeline rank) runs `workloads.train_step` through
`emulator.capture.capture_rank`. Classes are captured by this process and spawned worker
processes, one class at a time each (a process is one rank of a virtual world at a time: the
world is process-global state, created and destroyed around each class), and cached on disk
by the resolved spec and a hash of the source that shapes a trace (`capture_sources`: the
workloads and what the capture imports, not pricing), so a second run of the same job and
capturing code costs only the load. A worker that dies (the out-of-memory killer's SIGKILL)
fails the capture with CaptureWorkerDied.

The captured iteration is a steady-state one: before it, the optimizer state is created
by one optimizer step on zero gradients (as after the first iteration, or a checkpoint
load), so the trace's memory starts from parameters + optimizer state.
"""

from __future__ import annotations

import _thread
import collections
import contextlib
import functools
import hashlib
import importlib.metadata
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from emulator.capture.trace import SCHEMA_VERSION, RankTrace
from emulator.world.mesh import World
from prismbench.capture_sources import SourceChangedError, capture_source_hash
from prismbench.orphans import spawn_pool, stop_workers
from prismbench.redelivery import redelivered
from workloads.config import SpecError


@dataclass(frozen=True, kw_only=True)
class JobCapture:
    """The traces of one job: class id (pipeline rank) -> RankTrace, and how they were made."""

    world: World
    traces: dict[int, RankTrace]
    wall_s: float
    cached: bool
    directory: Path


def world_of(job) -> World:
    p = job.parallel
    return World.grid(
        dp=p.dp, pp=p.pp, cp=p.cp, tp=p.tp, vpp=p.vpp, gpus_per_node=job.cluster.gpus_per_node
    )


@functools.cache
def library_versions(libraries: tuple[str, ...] = ("torch", "torchao")) -> str:
    """Versions of the installed libraries whose ops a trace records (torchao's float8 casts)."""
    return ", ".join(f"{name} {importlib.metadata.version(name)}" for name in libraries)


def cache_key(job) -> str:
    """What a capture depends on: the job without its hardware (the GPU and network presets
    only price a trace; the capture reads gpus_per_node alone, through `world_of`; so does
    `kernels.attention` between fused kernels, which only prices: "unfused" is another
    program; so do `kernels.launch_blocking` and `kernels.tp_grad_overlap`), the capturing
    source, the libraries it calls and the trace schema. Jobs that differ only in GPU,
    network, fused attention kernel, blocking launches or Megatron's gradient overlap share
    one; so do `train.model_init = "auto"` and the choice it stands for."""
    tables = job.to_dict()
    tables["cluster"] = {"gpus_per_node": job.cluster.gpus_per_node}
    tables["train"]["model_init"] = job.model_built_on  # "auto" resolved
    kernels = tables.get("kernels", {})
    kernels.pop("launch_blocking", None)
    kernels.pop("tp_grad_overlap", None)
    if job.kernels.attention != "unfused":
        kernels.pop("attention", None)
    spec = json.dumps(tables, sort_keys=True)
    key = f"{spec}|{capture_source_hash()}|{library_versions()}|{SCHEMA_VERSION}"
    return hashlib.sha256(key.encode()).hexdigest()[:20]


def default_cache_dir() -> Path:
    base = os.environ.get("PRISMBENCH_CACHE") or Path.home() / ".cache" / "prismbench"
    return Path(base) / "captures"


class CaptureWorkerDied(SpecError):
    """A capture worker process ended without returning its class's trace. A SpecError, as the
    ranks `record` finds killed are (`record._refuse_out_of_memory`): most often the job is too
    large to capture that many classes at once on this machine, and the command line says so in
    one line."""


def _capture_class(
    job, class_id: int, out_path: str, parent_source: str | None = None
) -> tuple[float, str]:
    """Worker: capture one class and save its trace; returns the seconds it took and a note.

    Pipeline chunks are reused (emulator.capture.chunk_reuse); where a chunk cannot stand for the
    others (ChunkReuseError), the class is captured again with every chunk run. A spawned worker
    imports the source on disk now, and its trace is cached under the key the parent made from
    the source it read (`parent_source`): if the two differ it refuses, rather than caching a
    trace of one program under the key of another."""
    from emulator.capture.chunk_reuse import ChunkReuseError
    from emulator.capture.rank import capture_rank
    from prismbench.program import rank_program

    if parent_source is not None and capture_source_hash() != parent_source:
        raise SourceChangedError(
            "the capturing source (prismbench.capture_sources) changed while capturing (hash "
            f"{parent_source} when the capture started, {capture_source_hash()} in a worker): "
            "its trace would be cached under the old program's key. Capture from a checkout "
            "nobody edits meanwhile (a `git worktree` of the commit)"
        )
    started = time.perf_counter()
    world = world_of(job)
    rank = world.representative(class_id)
    note = ""
    try:
        trace = capture_rank(rank, world.world_size, rank_program(job))
    except ChunkReuseError as why:
        note = f"every chunk run: {why}"
        trace = capture_rank(rank, world.world_size, rank_program(job), reuse_chunks=False)
    tmp = Path(out_path).with_suffix(".tmp.npz")
    trace.save(tmp)
    tmp.replace(out_path)
    return time.perf_counter() - started, note


def capture_job(
    job,
    *,
    cache_dir: Path | None = None,
    workers: int | None = None,
    use_cache: bool = True,
    progress: Callable[[str], None] | None = None,
) -> JobCapture:
    """Capture (or load from the cache) one trace per class of `job`."""
    started = time.perf_counter()
    world = world_of(job)
    directory = (cache_dir or default_cache_dir()) / cache_key(job)
    paths = {c: directory / f"class_{c:04d}.npz" for c in world.classes()}
    missing = [c for c, path in paths.items() if not (use_cache and path.exists())]
    if missing:
        directory.mkdir(parents=True, exist_ok=True)
        _run_workers(
            job, missing, paths, workers or min(len(missing), os.cpu_count() or 1), progress
        )
    traces = {c: RankTrace.load(path) for c, path in paths.items()}
    return JobCapture(
        world=world,
        traces=traces,
        wall_s=time.perf_counter() - started,
        cached=not missing,
        directory=directory,
    )


# How long an interrupted capture waits for each feeder thread to see its class fail (the
# executor fails a class within a poll once its workers are gone; a bound, not a wait)
FEEDER_JOIN_S = 10.0


def _run_workers(job, class_ids, paths, workers, progress) -> None:
    reported = _Reporter(progress, len(class_ids))
    lanes = _Lanes(_longest_first(world_of(job), class_ids), reported)

    def in_parent(class_id: int) -> tuple[float, str]:
        return _capture_class(job, class_id, str(paths[class_id]))

    if workers <= 1:
        while (class_id := lanes.next_class()) is not None:
            reported(class_id, *in_parent(class_id))
        return
    # The parent is one of the lanes: it has torch imported already and starts at once,
    # while the workers-1 spawned processes import it (~4 s). A worker captures several
    # classes in turn, each in a virtual world it creates and destroys (emulator.capture.capture_rank).
    # An executor, not a multiprocessing Pool: a Pool replaces a worker that dies (the
    # out-of-memory killer) and loses its class without a word, and its parent waited for it
    # forever; a dead worker breaks an executor, which fails every class its workers held.
    source = capture_source_hash()
    with spawn_pool(workers - 1) as pool:

        def in_worker(class_id: int) -> tuple[float, str]:
            return pool.submit(_capture_class, job, class_id, str(paths[class_id]), source).result()

        feeders = [
            threading.Thread(target=lanes.run, args=(in_worker, lanes.next_class()), daemon=True)
            for _ in range(workers - 1)
        ]
        for feeder in feeders:
            feeder.start()
        try:
            with _stoppable_parent(lanes):
                lanes.run(in_parent, lanes.next_class())
            lanes.settle(workers)
        except BaseException as stopped:  # Ctrl-C, SIGTERM in the CLI (cli.Terminated), _ParentStopped
            stop_workers(pool)
            # their classes fail at once with the pool's workers gone; a feeder left running
            # could report to stderr as the interpreter exits, which aborts it (SIGABRT, exit
            # -6 instead of 143: seen once in CI under SIGTERM)
            for feeder in feeders:
                feeder.join(timeout=FEEDER_JOIN_S)
            if isinstance(stopped, _ParentStopped):
                lanes.raise_failure()
            raise
        if lanes.failures:  # the capture has failed: now, not once the workers' classes are done
            stop_workers(pool)
    for feeder in feeders:  # each has its class's result or error: the pool is shut down
        feeder.join()
    lanes.raise_failure()


class _ParentStopped(BaseException):
    """Raised in the parent's lane when another lane has failed: the capture has failed, and the
    class the parent is capturing, which can take minutes, is of no use. A BaseException: it is
    not the parent's class failing (`_Lanes.run` records Exceptions as that)."""


@contextlib.contextmanager
def _stoppable_parent(lanes: _Lanes) -> Iterator[None]:
    """While the block (the parent's own lane) runs in the main thread, a failure in another lane
    raises _ParentStopped in it: a simulated SIGUSR1 with a handler of its own for the block,
    sent again if Python drops the exception (prismbench.redelivery: the capture runs torch's
    weakref callbacks all the time). Not SIGINT: Ctrl-C stays Ctrl-C, and a shell's background
    job ignores SIGINT, which would make the simulated one do nothing. Elsewhere (signal
    handlers are the main thread's) the parent finishes its class first."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(_signum, _frame) -> None:
        raise _ParentStopped

    previous = signal.signal(signal.SIGUSR1, stop)
    with lanes.changed:
        lanes.on_failure = lambda: _thread.interrupt_main(signal.SIGUSR1)
    try:
        with redelivered({_ParentStopped: signal.SIGUSR1}):
            yield
    finally:
        with lanes.changed:
            lanes.on_failure = None
        signal.signal(signal.SIGUSR1, previous)


class _Lanes:
    """Lanes (the parent, a thread per worker) that capture the classes of one queue in turn
    until it is empty or one of them fails: after a failure no lane takes another class, and the
    lane in the main thread is stopped by `on_failure` where it is set (`_stoppable_parent`)."""

    def __init__(self, class_ids: list[int], reported: _Reporter):
        self.queue, self.reported = collections.deque(class_ids), reported
        self.failures: list[tuple[int, Exception]] = []  # (class id, error), first first
        self.ended = 0
        self.changed = threading.Condition()
        self.on_failure: Callable[[], None] | None = None

    def next_class(self) -> int | None:
        with self.changed:
            return self.queue.popleft() if self.queue and not self.failures else None

    def run(self, capture: Callable[[int], tuple[float, str]], class_id: int | None) -> None:
        """Capture `class_id`, then the next class, and so on, with `capture`."""
        try:
            while class_id is not None:
                self.reported(class_id, *capture(class_id))
                class_id = self.next_class()
        except Exception as error:  # raised by the parent once every lane has stopped
            with self.changed:
                self.failures.append((class_id, error))
                if self.on_failure is not None and threading.current_thread() is not threading.main_thread():
                    self.on_failure()
        finally:
            with self.changed:
                self.ended += 1
                self.changed.notify_all()

    def settle(self, lanes: int) -> None:
        """Wait until all `lanes` have ended, or one has failed."""
        with self.changed:
            self.changed.wait_for(lambda: self.failures or self.ended == lanes)

    def raise_failure(self) -> None:
        """Raise the first failure, if any; a worker that died as CaptureWorkerDied."""
        if not self.failures:
            return
        _, first = self.failures[0]
        if not isinstance(first, BrokenProcessPool):
            raise first
        # the executor fails the class of every worker when one dies, and cannot say which died
        held = sorted(c for c, error in self.failures if isinstance(error, BrokenProcessPool))
        classes = ", ".join(map(str, held))
        which = f"class {classes}" if len(held) == 1 else f"one of classes {classes}"
        raise CaptureWorkerDied(
            f"a capture worker process died while capturing {which}: killed (Linux's "
            "out-of-memory killer sends SIGKILL to the largest process when memory runs out, and "
            "one class's capture can take many GiB) or failed as it started (its error is above). "
            "Capture with fewer workers (--workers: each holds one class's capture) or on a "
            "machine with more memory"
        ) from first


def _longest_first(world: World, class_ids: list[int]) -> list[int]:
    """The pipeline's last stage (output layer and loss), then its first (embedding), then
    the rest: the longest captures start first, so no lane is left alone at the end."""
    stages, classes = world.pp * world.vpp, world.classes()

    def rank(class_id: int) -> int:
        held = classes[class_id].virtual_stages
        return 0 if stages - 1 in held else 1 if 0 in held else 2

    return sorted(class_ids, key=rank)


class _Reporter:
    """Progress lines "captured class N (k/total) in S s", from any thread."""

    def __init__(self, progress, total: int):
        self.progress, self.total, self.done = progress, total, 0
        self.lock = threading.Lock()

    def __call__(self, class_id: int, seconds: float, note: str) -> None:
        with self.lock:
            self.done += 1
            if self.progress is not None:
                extra = f" ({note})" if note else ""
                self.progress(
                    f"captured class {class_id} ({self.done}/{self.total}) in {seconds:.1f} s{extra}"
                )


def summarize(capture: JobCapture) -> dict:
    """Per-class figures of a capture: events, ops, FLOPs, peak live bytes, bytes per group kind."""
    from emulator.world.mesh import group_axes

    classes = {}
    for class_id, trace in capture.traces.items():
        summary = trace.summary()
        rep = capture.world.representative(class_id)
        by_axes: dict[str, int] = {}
        for group, nbytes in summary.comm_bytes_by_group.items():
            ranks = trace.groups().get(group)
            axes = group_axes(capture.world, rep, np.asarray(ranks)) if ranks is not None else None
            key = "+".join(axes) if axes else "other"
            by_axes[key] = by_axes.get(key, 0) + nbytes
        classes[class_id] = {
            "representative_rank": rep,
            "members": capture.world.classes()[class_id].members,
            "events": summary.events,
            "compute_ops": summary.compute_ops,
            "flops": summary.flops,
            "flops_by_phase": summary.flops_by_phase,
            "comm_bytes_by_kind": summary.comm_bytes_by_kind,
            "comm_bytes_by_group_kind": by_axes,
            "peak_live_bytes": summary.peak_live_bytes,
        }
    return {
        "trace_schema_version": SCHEMA_VERSION,
        "world_size": capture.world.world_size,
        "classes": classes,
        "wall_s": capture.wall_s,
        "cached": capture.cached,
        "cache_dir": str(capture.directory),
    }


def write_capture(capture: JobCapture, summary: dict, out: Path) -> None:
    """Copy the class traces into `out` (class_NNNN.npz) and write summary.json beside them;
    the traces of an earlier capture written to `out` that this one has no class for go, so
    the folder holds one capture, as its summary says. The files are written in a staging
    folder beside `out` and moved in once all are whole, the summary last: a capture that fails
    to write (a full disk, Ctrl-C) leaves `out` as it was."""
    out.mkdir(parents=True, exist_ok=True)
    staging = out.parent / f".{out.name}.{os.getpid()}.staging"
    staging.mkdir()
    names = [f"class_{class_id:04d}.npz" for class_id in capture.traces]
    try:
        for name, trace in zip(names, capture.traces.values(), strict=True):
            trace.save(staging / name)
        (staging / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        for stale in out.glob("class_[0-9][0-9][0-9][0-9].npz"):
            if stale.name not in names:
                stale.unlink()
        for name in [*names, "summary.json"]:
            os.replace(staging / name, out / name)
    finally:
        for path in staging.iterdir():
            path.unlink()
        staging.rmdir()
