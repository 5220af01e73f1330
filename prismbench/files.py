"""Writing result files so that no half-written one is ever left behind."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def write_atomically(path: str | Path, write: Callable[[Path], object]) -> Path:
    """`write(tmp)` fills a temporary file beside `path`, which is then renamed over `path`;
    on any failure the temporary file is removed and `path` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    # mkstemp makes the file private (0600): the result gets what open() would give it
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
