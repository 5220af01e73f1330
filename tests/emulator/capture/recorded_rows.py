"""A helper shared by the capture tests of norms: the compute rows one forward and backward
records, as (aten op, phase) pairs."""

from __future__ import annotations

from collections.abc import Callable

from emulator.capture.op_recorder import OpRecorder
from emulator.capture.trace import COMPUTE, PHASES

# the loss's sum and the gradient of ones backward starts from: not the module's kernels
LOSS_OPS = ("aten.sum", "aten.ones_like")


def compute_rows(
    run: Callable[[], None], skip: tuple[str, ...] = LOSS_OPS
) -> list[tuple[str, str]]:
    """(aten op, phase) of every compute row `run()` records, in order, leaving out `skip`."""
    recorder = OpRecorder()
    with recorder:
        run()
    trace = recorder.trace()
    c, s = trace.columns, trace.strings
    return [
        (s[c["aten"][i]], PHASES[c["phase"][i]])
        for i in range(len(trace))
        if c["kind"][i] == COMPUTE and s[c["aten"][i]] not in skip
    ]
