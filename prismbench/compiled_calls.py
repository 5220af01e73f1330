"""Inductor's kernels in a profile, given to the custom op whose compiled code launched them.

A program's custom ops (the workloads' `prism::rope`, `prism::cross_entropy`, ...) run on a
GPU as code compiled by Inductor (`workloads/models/cuda_kernels.py`; position-masked
attention as compiled FlexAttention), and the capture records each call as one row of the
custom op. The profiler records each kernel launch of compiled code as an event named after
the kernel (`profile_readers.INDUCTOR_KERNEL`), under no aten op. Where the profile records
nesting (Chrome traces) the kernels sit under the custom op's own event when the op
dispatched them, and `profile_ingest.collapse_to_recorded` gives them to it; the jsonl
profiles list launching events only, in program order. So, once the other ops are aligned:
- a call is a run of consecutive Inductor kernel events; a kernel whose number in its compiled
  graph is not above the previous kernel's starts another call (the graph's code launches its
  kernels in the order it numbers them: RoPE on q and then on k is two calls of kernel 0, the
  loss's forward one call of kernels 0 and 1);
- a call is the first custom-op row of the capture, not yet matched, between the rows matched
  to the ops around it, whose match key (`profile_ingest.match_key`: its normalized name and
  the shapes its cost depends on) the call's kernel argument shapes give: program order tells
  a forward from its backward, which take the same shapes;
- a call that is no such row keeps its kernels' events, matched to nothing (a GPU-only kernel:
  the block mask FlexAttention builds once per forward).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

from prismbench.profile_readers import INDUCTOR_KERNEL, ProfiledOp


def kernel_number(op: ProfiledOp) -> int | None:
    """The kernel's number in its compiled graph; None for an event that is no Inductor kernel."""
    found = INDUCTOR_KERNEL.match(op.op)
    return int(found.group(1)) if found else None


def calls(ops: list[ProfiledOp]) -> list[list[int]]:
    """Indices of `ops` cut into single ops and compiled calls (the module docstring)."""
    out: list[list[int]] = []
    previous = None
    for i, op in enumerate(ops):
        number = kernel_number(op)
        if number is not None and previous is not None and number > previous:
            out[-1].append(i)
        else:
            out.append([i])
        previous = number
    return out


def _next_matched_rows(n_ops: int, pairs: list[tuple[int, int]], n_rows: int) -> list[int]:
    """Per op index i (and n_ops), the row matched to the first matched op at or after i."""
    row_of = dict(pairs)
    out = [n_rows] * (n_ops + 1)
    for i in range(n_ops - 1, -1, -1):
        out[i] = row_of.get(i, out[i + 1])
    return out


def attribute_calls(
    ops: list[ProfiledOp],
    keys: list[tuple],
    pairs: list[tuple[int, int]],
    custom_rows: dict[int, tuple[str, str, tuple]],
    key_of: Callable[[str, str, tuple], tuple],
) -> tuple[list[ProfiledOp], list[tuple], list[tuple[int, int]]]:
    """(ops, their keys, pairs) with each compiled call that is a custom-op row merged into one
    event of that op ("prism::cross_entropy": the call's kernels, their argument shapes, the
    first one's start) and paired with the row.

    keys, pairs: the ops' match keys and their alignment with the capture's compute rows;
    custom_rows: compute index -> (aten packet, normalized name, match key) of the capture's
    custom-op rows; key_of(name, packet, shapes): the match key a profiled op of that name and
    packet takes with those (profiler) shapes."""
    row_of = dict(pairs)
    n_rows = max([*custom_rows, *row_of.values(), -1]) + 1
    upper_of = _next_matched_rows(len(ops), pairs, n_rows)
    classes = {(name, packet) for packet, name, _ in custom_rows.values()}
    free = sorted(set(custom_rows) - set(row_of.values()))
    out_ops, out_keys, out_pairs, last_row = [], [], [], -1
    for call in calls(ops):
        row = None
        if kernel_number(ops[call[0]]) is not None:
            between = (last_row, upper_of[call[-1] + 1])
            row = _row_of_call([ops[i] for i in call], between, free, custom_rows, classes, key_of)
        if row is not None:
            free.remove(row)
            packet, _, key = custom_rows[row]
            kernels = tuple(k for i in call for k in ops[i].kernels)
            shapes = tuple(s for i in call for s in ops[i].shapes)
            start = ops[call[0]].cpu_start_us
            out_pairs.append((len(out_ops), row))
            out_ops.append(ProfiledOp(packet.replace(".", "::", 1), shapes, kernels, start))
            out_keys.append(key)
            last_row = row
            continue
        for i in call:
            if i in row_of:
                out_pairs.append((len(out_ops), row_of[i]))
                last_row = row_of[i]
            out_ops.append(ops[i])
            out_keys.append(keys[i])
    return out_ops, out_keys, out_pairs


def _row_of_call(call, between, free, custom_rows, classes, key_of) -> int | None:
    """The first free custom-op row strictly between the two rows `between` whose key the
    call's shapes give, or None."""
    after, before = between
    shapes = tuple(s for op in call for s in op.shapes)
    fitting = {key_of(name, packet, shapes) for name, packet in classes}
    for row in free[bisect.bisect_right(free, after) :]:
        if row >= before:
            return None
        if custom_rows[row][2] in fitting:
            return row
    return None
