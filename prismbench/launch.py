"""Launch a function on N real processes (a free port) and collect results.

Used by `prismbench record` (a real multi-process run of a small job) and by the workloads'
parity tests. Each process runs torch with `threads` intra-op threads (default 1), so runs on
the same machine are comparable whatever else the machine does. The backend is gloo (CPU) or
nccl (CUDA: rank r uses GPU r).

Ranks are forked from a fork server that imported torch's modules once (PRELOAD), where
the platform has one: a spawned rank imports them again, 3-8 s of CPU each on a 2-core machine,
for every rank of every run. The server never runs torch (no threads, no CUDA), so a fork of it
is as clean as a spawn. Each rank takes its environment from the caller at the time of the run,
as a spawned one would, not from the server's older copy.
"""

from __future__ import annotations

import faulthandler
import os
import queue as queue_module
import socket
import time
import traceback

import torch.distributed as dist
import torch.multiprocessing as mp

from prismbench.orphans import exit_with_caller


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


BACKENDS = ("gloo", "nccl")
# what the fork server imports before it forks ranks: torch, and the parts of it a rank's step
# imports (workloads.train pulls pipelining, DTensor and FSDP2: 2.6 s of the ~6 s a rank took,
# ours 0.1-0.5 s of that). Not our own modules: a rank imports them from disk when it starts, so
# a caller that edits them between two runs does not fork ranks of the old code.
PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.distributed.pipelining",
    "torch.distributed.tensor",
    "torch.distributed.fsdp",
)


class RanksDied(RuntimeError):
    """Ranks exited without reporting a result; `exit_codes` maps rank -> exit code (negative:
    killed by that signal, as multiprocessing reports it)."""

    def __init__(self, exit_codes: dict[int, int]) -> None:
        super().__init__(f"ranks died without a result (exit codes {exit_codes})")
        self.exit_codes = exit_codes

    @property
    def by_signal(self) -> bool:
        return any(code < 0 for code in self.exit_codes.values())


def _context():
    """The fork server's context where the platform has one, preloading PRELOAD; else spawn."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))
    return ctx


def _worker(rank, world_size, port, threads, backend, fn, args, queue, caller) -> None:
    caller_pid, environ = caller
    exit_with_caller(caller_pid)
    os.environ.clear()
    os.environ.update(environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    # a crash in C++ (abort, segfault) prints where each Python thread was before the rank dies
    faulthandler.enable()
    try:
        import torch

        torch.set_num_threads(threads)
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, rank=rank, world_size=world_size)
        # gloo's init can return on one rank while a peer still connects its pairs; a rank whose
        # fn ends at once would destroy the group under it (seen in CI: "connectFullMesh failed")
        dist.barrier()
        queue.put((rank, "ok", fn(*args)))
    except BaseException:  # noqa: BLE001  (sent to the parent, which raises)
        queue.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(
    world_size: int,
    fn,
    *args,
    timeout_s: float = 120.0,
    threads: int = 1,
    backend: str = "gloo",
) -> list:
    """fn(*args) on every rank of a fresh world of `backend`; its return values in rank order.

    A rank that dies without reporting (a crash in C++, a kill, an exit with status 0 before
    fn returns) fails the run with RanksDied, naming its exit code, instead of leaving the
    parent waiting forever (or until `timeout_s`).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} must be one of {BACKENDS}")
    ctx = _context()
    results_queue = ctx.Queue()
    port = free_port()
    caller = (os.getpid(), dict(os.environ))
    procs = [
        ctx.Process(
            target=_worker,
            args=(rank, world_size, port, threads, backend, fn, args, results_queue, caller),
        )
        for rank in range(world_size)
    ]
    for proc in procs:
        proc.start()
    results: dict[int, object] = {}
    errors = []
    deadline = time.monotonic() + timeout_s
    # ranks seen ended with status 0 and no result at the last empty poll: a rank's result is
    # in the pipe before its process ends (the queue's feeder is joined at exit), so one still
    # missing a poll later never sent it (os._exit(0) in fn)
    ended_silent: set[int] = set()
    try:
        while len(results) < world_size:
            try:
                rank, status, value = results_queue.get(timeout=1.0)
            except queue_module.Empty:
                ended = {
                    r for r, p in enumerate(procs) if r not in results and p.exitcode is not None
                }
                dead = sorted(r for r in ended if procs[r].exitcode != 0 or r in ended_silent)
                if dead:
                    raise RanksDied({r: procs[r].exitcode for r in dead}) from None
                ended_silent = ended
                if time.monotonic() > deadline:
                    raise TimeoutError(f"ranks gave no result within {timeout_s} s") from None
                continue
            if status == "error":
                errors.append(f"rank {rank}:\n{value}")
            results[rank] = value
    except BaseException:  # interrupted, timed out, a rank died: the others' work is wasted
        for proc in procs:
            proc.kill()
        raise
    finally:
        for proc in procs:
            proc.join(timeout=5.0)
            if proc.is_alive():
                proc.kill()
    if errors:
        raise RuntimeError("\n".join(errors))
    return [results[rank] for rank in range(world_size)]
