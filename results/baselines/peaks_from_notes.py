"""Give recorded baselines written before `ALLOCATOR_PEAKS` existed the peaks their notes hold.

    python results/baselines/peaks_from_notes.py [--check]      (from the repository root)

`prismbench record` at 6a9c814 (the `*frameworks__` recordings of the H100 and H200 device runs,
results/gpu_runs/) wrote the caching allocator's four peaks of the largest rank into
`provenance.notes` only ("allocator peaks of the largest rank (bytes): first iteration
allocated A, reserved R; steady allocated S, reserved P"), and P into `measured.peak_mem_bytes`.
Today's `record` writes all four as `[measured]` figures (prismbench.baselines.ALLOCATOR_PEAKS),
which `validate` scores. This script adds the three missing ones to every recorded baseline that
lacks them, read from its own notes, after checking that the notes' steady reserved peak is its
`peak_mem_bytes`; the rest of each file is left byte for byte. `--check` writes nothing and
fails if a file would change (a test runs it).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RECORDED = ROOT / "results" / "baselines" / "recorded"

NOTES_PEAKS = re.compile(
    r"allocator peaks of the largest rank \(bytes\): first iteration allocated (\d+), "
    r"reserved (\d+); steady allocated (\d+), reserved (\d+)"
)
# the line of [measured] the peaks follow, as record writes a repeated run
AFTER = re.compile(r"^iteration_time_s_max = .*$", re.MULTILINE)


def with_peaks(path: Path) -> str | None:
    """The text of `path` with the peaks its notes hold, or None where it needs none (it has
    them, or its notes hold none)."""
    from prismbench.baselines import ALLOCATOR_PEAKS, load_baseline

    text = path.read_text()
    baseline = load_baseline(path)
    measured = baseline.measured
    found = NOTES_PEAKS.search(baseline.provenance.notes or "")
    if found is None or all(getattr(measured, name) is not None for name in ALLOCATOR_PEAKS):
        return None
    first_allocated, first_reserved, steady_allocated, steady_reserved = map(int, found.groups())
    if (measured.peak_mem_bytes, measured.peak_mem_kind) != (steady_reserved, "allocator_reserved"):
        raise SystemExit(f"{path}: notes' steady reserved peak {steady_reserved} is not its "
                         f"peak_mem_bytes {measured.peak_mem_bytes} ({measured.peak_mem_kind})")  # fmt: skip
    peaks = {
        "peak_memory_allocated_bytes": steady_allocated,
        "first_iteration_peak_memory_reserved_bytes": first_reserved,
        "first_iteration_peak_memory_allocated_bytes": first_allocated,
    }
    given = [name for name in peaks if getattr(measured, name) is not None]
    if given:
        raise SystemExit(f"{path}: has {given[0]} but not every allocator peak")
    anchor = AFTER.search(text)
    if anchor is None:
        raise SystemExit(f"{path}: no iteration_time_s_max line in [measured] to add the peaks after")
    lines = "".join(f"\n{name} = {value}" for name, value in peaks.items())
    return text[: anchor.end()] + lines + text[anchor.end() :]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; fail if a recorded baseline lacks peaks its notes hold")  # fmt: skip
    args = parser.parse_args(argv)
    from prismbench.baselines import load_baseline
    from prismbench.files import write_atomically

    changed = []
    for path in sorted(RECORDED.glob("*.toml")):
        text = with_peaks(path)
        if text is None:
            continue
        changed.append(path.name)
        if not args.check:
            write_atomically(path, lambda tmp, text=text: tmp.write_text(text))
            load_baseline(path)  # what was written reads back
    if args.check and changed:
        raise SystemExit(f"{len(changed)} recorded baselines lack the peaks their notes hold: "
                         f"{', '.join(changed)}; run python results/baselines/peaks_from_notes.py")  # fmt: skip
    print(f"{len(changed)} recorded baselines {'lack' if args.check else 'given'} their notes' peaks"
          + "".join(f"\n  {name}" for name in changed))  # fmt: skip


if __name__ == "__main__":
    main()
