"""Helpers for tests that kill processes: which processes live, and whose children they are.

Read from Linux's /proc (the tests that use them are skipped elsewhere).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

HAS_PROC = Path("/proc/self/stat").exists()


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (state, ppid, ...); None if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped, does not)."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def children(pid: int) -> list[int]:
    """The live processes whose parent is `pid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields is not None and fields[0] != "Z" and int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def spawn_workers(pid: int) -> list[int]:
    """The live multiprocessing spawn workers among `pid`'s children (not its resource tracker,
    which `children` counts too)."""
    return [child for child in children(pid) if b"spawn_main" in _command_line(child)]


def _command_line(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return b""


def kill_survivors(pids: list[int], wait_s: float) -> list[int]:
    """Wait up to `wait_s` for `pids` to end; SIGKILL those still running and return them."""
    deadline = time.monotonic() + wait_s
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    survivors = [pid for pid in pids if alive(pid)]
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    return survivors
