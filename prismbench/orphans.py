"""Worker processes that end when the process that started them dies.

`validate`, the capture and `record` start spawn workers. A spawn worker waits on a queue its
parent fills, and holds a copy of that queue's write end, so a parent killed by a signal it
cannot catch (SIGKILL, the OOM killer) leaves it waiting forever, holding torch and its
captures in memory. `exit_with_parent` is the workers' initializer: a daemon thread notices the
parent is gone (the worker is reparented, so `os.getppid()` changes) and ends the worker.
`exit_with_caller` does the same for a rank a fork server started (prismbench.launch): its
parent is the server, which outlives a killed caller while its children hold the server's pipe,
so the rank watches the caller itself.
It also leaves Ctrl-C to the parent: a terminal sends SIGINT to the whole process group, and a
worker interrupted in its loop printed "Process SpawnPoolWorker-1:" under the parent's own
"interrupted"; every parent ends its workers itself when it is interrupted (`stop_workers`).
"""

from __future__ import annotations

import multiprocessing
import os
import select
import signal
import threading
import time
from concurrent.futures import ProcessPoolExecutor

# How often a worker looks for its parent: a dead parent's workers are gone within this.
PARENT_POLL_S = 0.5
# Exit status of a worker ended because its parent died (distinct from a crash's 1).
PARENT_LOST_EXIT_CODE = 71


def exit_with_parent(parent_pid: int) -> None:
    """Initializer of a worker process: end it (`os._exit`) once `parent_pid` has died, and
    ignore SIGINT (the parent's to act on)."""
    _exit_when_gone(lambda: os.getppid() == parent_pid)


def exit_with_caller(caller_pid: int) -> None:
    """As `exit_with_parent`, for a process whose parent is not `caller_pid` but a fork server
    of it: end it once `caller_pid` has ended (a pidfd, Linux >= 5.3; else whether the pid
    still exists, which a zombie caller not yet reaped does)."""
    try:
        pidfd = os.pidfd_open(caller_pid)
    except ProcessLookupError:
        os._exit(PARENT_LOST_EXIT_CODE)
    except (AttributeError, OSError):
        _exit_when_gone(lambda: _exists(caller_pid))
        return
    # a pidfd reads ready once its process has ended
    _exit_when_gone(lambda: not select.select([pidfd], [], [], 0)[0])


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process of that pid: it exists
        pass
    return True


def _exit_when_gone(alive) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch() -> None:
        while alive():
            time.sleep(PARENT_POLL_S)
        os._exit(PARENT_LOST_EXIT_CODE)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def spawn_pool(workers: int) -> ProcessPoolExecutor:
    """An executor of `workers` spawned processes that end with this one (`exit_with_parent`).
    Spawn, not fork: the parent may hold torch state a child must not inherit."""
    return ProcessPoolExecutor(
        workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=exit_with_parent,
        initargs=(os.getpid(),),
    )


def stop_workers(pool: ProcessPoolExecutor) -> None:
    """End `pool`'s workers now: leaving the pool waits for every queued task, and a SIGTERM
    sent to the parent alone (`kill`) reaches none of them."""
    for worker in list(pool._processes.values()):  # what Python 3.14's terminate_workers() does
        worker.terminate()
