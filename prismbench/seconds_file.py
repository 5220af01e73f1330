"""Durations measured on a real run, read from a text file of one number of seconds per line.

The measurements a user hands `prismbench variability` (prismbench.network_steps,
prismbench.pipeline_transfers) come as such files, cut from their profiles or timers: blank
lines and lines starting with '#' are comments, every other line is one duration (s), finite
and > 0. Anything else is refused naming the line (SpecError: the CLI exits 2 before any
capture), and so is a file of fewer durations than the estimate needs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from workloads.config import SpecError


def read_seconds(
    path: str | Path, *, option: str, item: str, each: str, minimum: int
) -> np.ndarray:
    """The durations (s) `path` holds, at least `minimum`. Errors name `option` and the file;
    `item` is what one line stands for ("step") and `each` what it holds ("one step's
    communication time")."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise SpecError(f"{option} {path}: cannot be read as text ({err})") from None
    durations = []
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        try:
            seconds = float(text)
        except ValueError:
            raise SpecError(
                f"{option} {path}, line {number}: {text!r} is not a number: give {each} in "
                "seconds per line ('#' starts a comment)"
            ) from None
        if not (np.isfinite(seconds) and seconds > 0):
            raise SpecError(
                f"{option} {path}, line {number}: {text!r}: a time in seconds must be > 0"
            )
        durations.append(seconds)
    if len(durations) < minimum:
        raise SpecError(
            f"{option} {path}: {len(durations)} {item}(s); give at least {minimum} ({each} in "
            "seconds per line)"
        )
    return np.asarray(durations)
