"""prismbench.launch on real gloo processes: a rank that dies without reporting fails the run
with its exit code (a signal shows as a negative one); ranks forked from the fork server see the
caller's environment of the moment and end when the caller is killed. The parity tests show
results coming back in rank order."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from prismbench.launch import PRELOAD, RanksDied, run_ranks
from prismbench.orphans import PARENT_POLL_S
from tests.prismbench.processes import HAS_PROC, kill_survivors

ROOT = Path(__file__).resolve().parents[2]


def die_on_rank_one(how: str) -> None:
    if dist.get_rank() == 1:
        if how == "signal":
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(0 if how == "success" else 3)


@pytest.mark.parametrize(
    ("how", "code"), [("signal", -signal.SIGKILL), ("exit", 3), ("success", 0)]
)
def test_a_rank_that_dies_is_named_with_its_exit_code(how, code):
    # status 0 without a result too: it was left to the timeout (60 s here)
    with pytest.raises(RanksDied) as died:
        run_ranks(2, die_on_rank_one, how, timeout_s=60)
    assert died.value.exit_codes == {1: code}
    assert died.value.by_signal is (code < 0)


def environment_and_modules(name: str) -> tuple[str | None, bool]:
    return os.environ.get(name), all(module in sys.modules for module in PRELOAD)


def test_a_rank_sees_the_callers_environment_of_the_moment(monkeypatch):
    run_ranks(2, environment_and_modules, "PRISMBENCH_LAUNCH_PROBE")  # the fork server starts
    monkeypatch.setenv("PRISMBENCH_LAUNCH_PROBE", "set after the server started")
    results = run_ranks(2, environment_and_modules, "PRISMBENCH_LAUNCH_PROBE")
    assert [value for value, _ in results] == ["set after the server started"] * 2
    # forked from a server that imported them (a spawned rank would import them itself)
    assert all(preloaded for _, preloaded in results)


def write_pid_and_wait(folder: str) -> None:
    Path(folder, f"{dist.get_rank()}.pid").write_text(str(os.getpid()))
    time.sleep(600)


_CALLER = """
from prismbench.launch import run_ranks
from tests.prismbench.test_launch import write_pid_and_wait
run_ranks(2, write_pid_and_wait, {folder!r}, timeout_s=600)
"""


@pytest.mark.skipif(not HAS_PROC, reason="needs Linux /proc")
def test_ranks_end_when_their_caller_is_killed(tmp_path):
    # a forked rank's parent is the fork server, which ends when the caller does
    caller = subprocess.Popen([sys.executable, "-c", _CALLER.format(folder=str(tmp_path))], cwd=ROOT)
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("*.pid"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    pids = [int(path.read_text()) for path in tmp_path.glob("*.pid")]
    caller.send_signal(signal.SIGKILL)
    caller.wait(timeout=30)
    assert len(pids) == 2
    assert not kill_survivors(pids, 8 * PARENT_POLL_S)
