"""Writing result files so that no half-written one is ever left behind."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from pathlib import Path


def write_atomically(path: str | Path, write: Callable[[Path], object]) -> Path:
    """`write(tmp)` fills a temporary file beside `path`, which is then renamed over `path`;
    on any failure the temporary file is removed and `path` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # not mkstemp, whose file is private (0600): created as open() creates one, the kernel
    # applies the umask and the result gets a plain file's permissions
    tmp = path.parent / f".{path.name}.{secrets.token_hex(8)}.tmp"
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
