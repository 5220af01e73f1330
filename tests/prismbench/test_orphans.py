"""Workers started with `exit_with_parent` end when their parent is killed."""

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from prismbench.orphans import PARENT_LOST_EXIT_CODE, PARENT_POLL_S
from tests.prismbench.processes import HAS_PROC, kill_survivors

pytestmark = pytest.mark.skipif(not HAS_PROC, reason="needs Linux /proc")
ROOT = Path(__file__).resolve().parents[2]  # the checkout: the children import prismbench from it

# A parent that starts two spawn workers (a multiprocessing Pool, or a ProcessPoolExecutor, as
# validate and the capture do), lets both run a task, prints their pids and waits.
_PARENT = """
import concurrent.futures, multiprocessing, os, time
from prismbench.orphans import exit_with_parent

if __name__ == "__main__":
    context = multiprocessing.get_context("spawn")
    if "{kind}" == "pool":
        workers = context.Pool(2, {initializer}, (os.getpid(),))
    else:
        workers = concurrent.futures.ProcessPoolExecutor(
            2, mp_context=context, initializer={initializer}, initargs=(os.getpid(),))
    list(workers.map(time.sleep, [0.5, 0.5], chunksize=1))
    print(*(worker.pid for worker in multiprocessing.active_children()), flush=True)
    time.sleep(600)
"""


def _workers_after_parent_killed(kind: str, initializer: str) -> tuple[list[int], bool]:
    """Kill the parent with SIGKILL; its workers' pids and whether any outlives it by 4 polls."""
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT.format(kind=kind, initializer=initializer)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    pids = [int(pid) for pid in parent.stdout.readline().split()]
    parent.send_signal(signal.SIGKILL)
    parent.wait(timeout=30)
    return pids, bool(kill_survivors(pids, 4 * PARENT_POLL_S))


@pytest.mark.parametrize("kind", ["pool", "executor"])
def test_workers_end_when_their_parent_is_killed(kind):
    pids, outlived = _workers_after_parent_killed(kind, "exit_with_parent")
    assert len(pids) == 2 and not outlived


def test_without_it_executor_workers_outlive_a_killed_parent():
    # why validate and the capture need it: an executor's workers wait on a queue whose
    # write end they hold
    pids, outlived = _workers_after_parent_killed("executor", "None")
    assert len(pids) == 2 and outlived


def test_a_worker_whose_parent_is_gone_exits_with_its_own_status():
    # the parent pid given is not this worker's parent: it counts as gone at once
    code = subprocess.run(
        [sys.executable, "-c",
         "import time; from prismbench.orphans import exit_with_parent; "
         "exit_with_parent(1); time.sleep(30)"],
        cwd=ROOT, timeout=30,
    ).returncode  # fmt: skip
    assert code == PARENT_LOST_EXIT_CODE


def test_a_rank_whose_caller_is_gone_exits_with_its_own_status():
    # exit_with_caller watches a process that need not be its parent (a fork server's caller)
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    code = subprocess.run(
        [sys.executable, "-c",
         "import time; from prismbench.orphans import exit_with_caller; "
         f"exit_with_caller({int(ended.stdout)}); time.sleep(30)"],
        cwd=ROOT, timeout=30,
    ).returncode  # fmt: skip
    assert code == PARENT_LOST_EXIT_CODE


def test_ctrl_c_to_the_process_group_interrupts_the_parent_alone():
    # a terminal's Ctrl-C reaches every process of the group: a pool worker interrupted in its
    # loop printed "Process SpawnPoolWorker-1:" and its traceback under the parent's message
    script = (
        "import multiprocessing, os, signal, time\n"
        "from prismbench.orphans import exit_with_parent\n"
        "if __name__ == '__main__':\n"
        # as in a terminal: a shell without job control starts background jobs (a CI runner's
        # commands among them) with SIGINT ignored, which their children inherit
        "    signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "    pool = multiprocessing.get_context('spawn').Pool(1, exit_with_parent, (os.getpid(),))\n"
        "    pool.apply(time.sleep, (0,))\n"
        "    try:\n"
        "        os.killpg(0, signal.SIGINT)\n"
        "        time.sleep(30)\n"
        "    except KeyboardInterrupt:\n"
        "        pool.terminate()\n"
        "        print('interrupted')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, timeout=60,
                          capture_output=True, text=True, start_new_session=True)  # fmt: skip
    assert (done.stdout, done.stderr) == ("interrupted\n", "")
