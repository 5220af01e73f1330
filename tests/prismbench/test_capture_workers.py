"""The capture's worker processes, run as a user runs them: a worker that dies while it captures
(the out-of-memory killer's SIGKILL, or a script without a main guard) ends the capture with a
message naming its class, rather than leaving it waiting for a trace that never comes; SIGTERM
ends the workers with their parent."""

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import weakref
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import pytest

from prismbench.capture import _Lanes, _ParentStopped, _stoppable_parent
from tests.prismbench.processes import HAS_PROC, alive, kill_survivors, spawn_workers

pytestmark = [pytest.mark.skipif(not HAS_PROC, reason="needs Linux /proc"), pytest.mark.integration]
ROOT = Path(__file__).resolve().parents[2]  # the checkout: the children import prismbench from it

# four classes: the worker still has one to capture whenever it is killed
JOB_TOML = """
[model]
name = "gpt-debug"
[parallel]
pp = 4
[batch]
seq_len = 32
global_batch = 4
"""


def _capturing_worker(parent: subprocess.Popen, within_s: float) -> int:
    """The pid of `parent`'s capture worker once it has taken a class: it has loaded torch,
    which only a class's capture imports (its initializer does not)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and parent.poll() is None:
        for pid in spawn_workers(parent.pid):
            try:
                if "libtorch" in Path(f"/proc/{pid}/maps").read_text():
                    return pid
            except (FileNotFoundError, ProcessLookupError):
                pass
        time.sleep(0.05)
    raise AssertionError(f"no worker captured within {within_s} s ({parent.poll()=})")


@contextlib.contextmanager
def _capture(tmp_path):
    """`prismbench capture` of JOB_TOML with two workers (the parent and one spawned process),
    into an empty cache; killed with its workers if the test leaves it running."""
    spec = tmp_path / "job.toml"
    spec.write_text(JOB_TOML)
    parent = subprocess.Popen(
        [sys.executable, "-m", "prismbench", "capture", str(spec), "--out", str(tmp_path / "out"),
         "--workers", "2"],
        cwd=ROOT, env=os.environ | {"PRISMBENCH_CACHE": str(tmp_path / "cache")},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        yield parent
    finally:
        if parent.poll() is None:
            workers = spawn_workers(parent.pid)
            parent.kill()
            parent.wait()
            kill_survivors(workers, 5)


def test_a_worker_killed_while_it_captures_ends_the_capture_naming_its_class(tmp_path):
    with _capture(tmp_path) as parent:
        worker = _capturing_worker(parent, within_s=120)
        os.kill(worker, signal.SIGKILL)
        # the parent finishes the class it captures itself (seconds), then stops: before, it
        # waited forever for the class the worker took, which the pool had lost with it
        _, err = parent.communicate(timeout=120)
    assert parent.returncode == 2
    assert "error: a capture worker process died while capturing class 3" in err, err
    assert "out-of-memory killer" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()
    assert not alive(worker)


def test_sigterm_ends_the_workers_at_once_rather_than_after_their_classes(tmp_path):
    with _capture(tmp_path) as parent:
        worker = _capturing_worker(parent, within_s=120)
        parent.send_signal(signal.SIGTERM)  # to the parent alone, as `kill` sends it
        _, err = parent.communicate(timeout=60)
        assert kill_survivors([worker], 2) == []
    assert parent.returncode == 143, err  # -6 (SIGABRT): a thread wrote as the interpreter exited
    assert err.splitlines()[-1] == "terminated" and "Traceback" not in err
    assert not list((tmp_path / "cache").glob("captures/*/class_0003.npz"))  # the worker's class


def test_a_script_without_a_main_guard_gets_the_error_its_worker_printed(tmp_path):
    # a spawned worker runs the script's top level again, whose capture cannot start processes
    # while the worker is itself starting: the worker fails at once. A pool started another in
    # its place, which failed as well, without end
    (tmp_path / "job.toml").write_text(JOB_TOML)
    script = tmp_path / "capture_it.py"
    script.write_text(
        "from prismbench.capture import capture_job\n"
        "from prismbench.spec import load_job_spec\n"
        f"capture_job(load_job_spec({str(tmp_path / 'job.toml')!r}), workers=2)\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)], cwd=ROOT, timeout=120, capture_output=True, text=True,
        env=os.environ | {"PRISMBENCH_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.count("its bootstrapping phase") == 1
    assert "CaptureWorkerDied: a capture worker process died while capturing class 3" in done.stderr


def test_a_worker_lane_that_fails_stops_the_class_the_parent_is_capturing():
    # before, the parent finished its own class first (minutes for a large job) and only then
    # said that a worker had died
    lanes = _Lanes([0, 1], reported=lambda *_: None)
    parent_finished = threading.Event()

    def parent_class(_class_id):
        threading.Event().wait(timeout=60)  # a long class, unless stopped
        parent_finished.set()
        return 60.0, ""

    def worker_class(_class_id):
        raise BrokenProcessPool("the worker died")

    handler = signal.getsignal(signal.SIGUSR1)
    with pytest.raises(_ParentStopped), _stoppable_parent(lanes):
        parent_class_id = lanes.next_class()
        threading.Thread(target=lanes.run, args=(worker_class, lanes.next_class())).start()
        lanes.run(parent_class, parent_class_id)
    assert not parent_finished.is_set()
    assert [(c, type(e)) for c, e in lanes.failures] == [(1, BrokenProcessPool)]
    assert signal.getsignal(signal.SIGUSR1) == handler and lanes.on_failure is None


def test_a_stop_python_drops_in_a_finalizer_is_sent_again(capsys):
    # the stop's handler raised inside a weakref callback (the capture runs torch's all the
    # time): Python printed "Exception ignored" and dropped it, and the parent finished its class
    lanes = _Lanes([0], reported=lambda *_: None)

    class Held:
        pass

    hook, started = sys.unraisablehook, time.monotonic()
    with pytest.raises(_ParentStopped), _stoppable_parent(lanes):
        held = Held()
        weakref.finalize(held, os.kill, os.getpid(), signal.SIGUSR1)  # the handler runs in there
        del held
        time.sleep(30)  # the class the parent captures, unless stopped
    assert time.monotonic() - started < 10
    assert "Exception ignored" not in capsys.readouterr().err
    assert sys.unraisablehook is hook
