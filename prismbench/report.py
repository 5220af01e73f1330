"""Human-readable rendering (rich tables) of what `prismbench.explain` computes.

Only presentation lives here: unit formatting (GiB, PFLOP, B params) and tables. Every
number comes from the library as raw data; `--json` output bypasses this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from emulator.costs.kernel_table import PRICE_SOURCES
from emulator.graph.results import BREAKDOWN_FIELDS
from emulator.units import GiB, KiB, MiB
from emulator.variability.model import regimes_text
from prismbench.explain import NARAYANAN_EQ3, Explanation
from prismbench.fit import MAX_SCAN

PFLOP = 1e15


def _column(table: Table, header: str, *, left: bool = False) -> None:
    """A column of a report's table: figures right-justified, names left; a cell too wide for
    the terminal folds onto more lines instead of losing its end to rich's ellipsis (at 100
    columns the emulate table's headers read "compu…", "reser…" and compare's counts
    "100/101/1…")."""
    table.add_column(header, justify="left" if left else "right", overflow="fold")


def format_params(count: float) -> str:
    """Parameter count in billions or millions: 70553706496 -> '70.55 B'."""
    if count >= 1e9:
        return f"{count / 1e9:.2f} B"
    return f"{count / 1e6:.2f} M"


def format_bytes(count: float) -> str:
    """Bytes in the largest binary unit that keeps the number >= 1: 1536 -> '1.50 KiB'."""
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(count) >= size:
            return f"{count / size:,.2f} {unit}"
    return f"{count:,.0f} B"


def format_flops(count: float) -> str:
    """FLOPs in the largest decimal unit that keeps the number >= 1: 2.5e15 -> '2.50 PFLOP'."""
    for unit, size in (("PFLOP", PFLOP), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if abs(count) >= size:
            return f"{count / size:,.2f} {unit}"
    return f"{count:,.0f} FLOP"


def render_workloads(rows: Sequence[dict[str, Any]], console: Console) -> None:
    table = Table(title="Model flavors")
    for header in ("name", "family", "layers", "hidden", "ffn", "heads/kv", "vocab", "params"):
        _column(table, header, left=header in ("name", "family"))
    for row in rows:
        table.add_row(
            row["name"],
            row["family"],
            str(row["layers"]),
            str(row["hidden"]),
            str(row["ffn_hidden"]),
            f"{row['heads']}/{row['kv_heads']}",
            str(row["vocab"]),
            f"{format_params(row['params'])} params",
        )
    console.print(table)


def format_nodes(world_size: int, nodes: int, gpus_per_node: int) -> str:
    """'4 x 8 GPUs', or how a world that does not fill its nodes sits on them."""
    last = world_size - (nodes - 1) * gpus_per_node
    if last == gpus_per_node:
        return f"{nodes:,} x {gpus_per_node} GPUs"
    if nodes == 1:
        return f"1 ({world_size} of its {gpus_per_node} GPUs)"
    return f"{nodes:,} of {gpus_per_node} GPUs (the last uses {last})"


def _layout_table(e: Explanation) -> Table:
    table = Table(title=f"World layout: {e.model}", show_header=False)
    _column(table, "what", left=True)
    _column(table, "value")
    mesh = ", ".join(f"{n}={s}" for n, s in zip(e.mesh_dim_names, e.mesh_shape, strict=True))
    table.add_row("world size", f"{e.world_size:,} GPUs")
    table.add_row("mesh (row-major, tp fastest)", mesh)
    table.add_row("nodes", format_nodes(e.world_size, e.nodes, e.gpus_per_node))
    for axis in e.axes:
        where = (
            "intra-node"
            if axis.intra_node
            else f"inter-node (a group spans up to {axis.max_nodes_per_group} nodes)"
        )
        table.add_row(f"  {axis.name} groups (size {axis.size}, stride {axis.stride})", where)
    table.add_row("virtual stages per rank", str(e.virtual_stages_per_rank))
    table.add_row("micro-batches per iteration", str(e.microbatches_per_iteration))
    table.add_row("tokens per iteration", f"{e.tokens_per_iteration:,}")
    return table


def _stage_table(e: Explanation) -> Table:
    w, g, m, o = e.state_bytes_per_param
    table = Table(
        title=(
            f"Per-GPU parameters and model state ({e.precision}: weights {w} + grads {g} + "
            f"master {m} + moments {o} B/param, ZeRO-{e.zero_stage} over "
            f"dp*cp={e.dp_shard_group})"
        )
    )
    for header in (
        "pp rank",
        "layers",
        "holds",
        "params/GPU",
        "weights",
        "grads",
        "master",
        "moments",
        "model state",
    ):
        _column(table, header)
    for s in e.stages:
        holds = " + ".join(
            x for x, on in (("embedding", s.has_embedding), ("output", s.has_output)) if on
        )
        table.add_row(
            str(s.pp_rank),
            "+".join(map(str, s.layers_per_virtual_stage)),
            holds or "-",
            format_params(s.params_per_rank),
            format_bytes(s.weights_bytes),
            format_bytes(s.grads_bytes),
            format_bytes(s.master_weights_bytes),
            format_bytes(s.optimizer_bytes),
            format_bytes(s.model_state_bytes),
        )
    return table


def _zero_table(e: Explanation) -> Table:
    table = Table(title="Model state per GPU by ZeRO stage (* = this job)")
    _column(table, "pp rank")
    for zero in range(4):
        _column(table, f"ZeRO-{zero}{' *' if zero == e.zero_stage else ''}")
    for s in e.stages:
        table.add_row(str(s.pp_rank), *map(format_bytes, s.model_state_bytes_by_zero))
    return table


def _flops_table(e: Explanation) -> Table:
    f = e.flops
    table = Table(
        title="FLOPs per iteration (2 per MAC, backward = 2 x forward)", show_header=False
    )
    _column(table, "what", left=True)
    _column(table, "value")
    table.add_row("forward per token", format_flops(f.forward_flops_per_token))
    table.add_row(
        "  of which attention (QK^T, AV; not causal-halved)",
        format_flops(f.attention_flops_per_token),
    )
    table.add_row("  of which logits", format_flops(f.logits_flops_per_token))
    table.add_row("model FLOPs (no recompute)", format_flops(f.model_flops_per_iteration))
    table.add_row(
        f"hardware FLOPs (recompute={f.recompute})", format_flops(f.hardware_flops_per_iteration)
    )
    table.add_row(
        "model / hardware FLOPs per GPU",
        f"{format_flops(f.model_flops_per_gpu)} / {format_flops(f.hardware_flops_per_gpu)}",
    )
    table.add_row(
        "Narayanan eq. 3 (4h MLP, MHA, full recompute)",
        format_flops(f.narayanan_eq3_flops_per_iteration),
    )
    table.caption = NARAYANAN_EQ3
    return table


def _gpu_table(e: Explanation) -> Table:
    g = e.gpu
    table = Table(title=f"Against the GPU preset {g.gpu}", show_header=False)
    _column(table, "what", left=True)
    _column(table, "value")
    table.add_row("HBM (nominal)", format_bytes(g.hbm_capacity_bytes))
    table.add_row("usable capacity (what CUDA offers)", format_bytes(g.usable_capacity_bytes))
    table.add_row(
        "outside the allocator (CUDA context, NCCL)", format_bytes(g.outside_allocator_bytes)
    )
    table.add_row("allocator limit (usable - outside)", format_bytes(g.allocator_limit_bytes))
    share = g.model_state_fraction_of_allocator_limit
    table.add_row(
        "model state, worst stage (activations not included)",
        f"{format_bytes(e.max_model_state_bytes)} ({share:.0%} of the allocator limit)",
    )
    table.add_row(f"dense {e.precision} peak", f"{g.peak_dense_tflops:,.1f} TFLOP/s")
    table.add_row(
        "iteration time at 100% of peak (lower bound)", _seconds(g.iteration_time_at_peak_s)
    )
    return table


def render_explanation(e: Explanation, console: Console) -> None:
    console.print(_layout_table(e))
    console.print(f"Parameters: {format_params(e.params_total)} params in total")
    console.print(_stage_table(e))
    console.print(_zero_table(e))
    console.print(_flops_table(e))
    console.print(_gpu_table(e))


def render_capture(summary: dict[str, Any], console: Console) -> None:
    """One row per class: ranks, ops, FLOPs, peak live bytes, bytes moved per group kind."""
    table = Table(
        title=f"Capture: {summary['world_size']:,} ranks, {len(summary['classes'])} class(es)"
    )
    for column in (
        "class",
        "rank",
        "members",
        "compute ops",
        "FLOPs",
        "peak live",
        "comm bytes by group",
    ):
        _column(table, column, left=column == "comm bytes by group")
    for class_id, c in summary["classes"].items():
        comm = ", ".join(
            f"{k} {format_bytes(v)}" for k, v in sorted(c["comm_bytes_by_group_kind"].items())
        )
        table.add_row(
            str(class_id),
            str(c["representative_rank"]),
            f"{c['members']:,}",
            f"{c['compute_ops']:,}",
            format_flops(c["flops"]),
            format_bytes(c["peak_live_bytes"]),
            comm,
        )
    console.print(table)
    source = "cache" if summary["cached"] else "captured"
    console.print(f"wall time {summary['wall_s']:.1f} s ({source}: {summary['cache_dir']})")


_BUILT_ON = {
    "device": "the device: whole, in fp32, then cast and sharded (its freed segments cached)",
    "meta": "meta: each rank's own shards only",
}


def render_emulation(r, console: Console) -> None:
    """The headline figures, the breakdown, and one row per class."""
    head = Table(
        title=f"Emulation: {r.job} on {r.world_size:,} GPUs ({r.ranks_executed} rank(s) executed)"
    )
    _column(head, "figure", left=True)
    _column(head, "value")
    rows = [
        ("iteration time", _seconds(r.iteration_time_s)),
        ("throughput", f"{r.tokens_per_s:,.0f} tokens/s"),
        ("model TFLOP/s per GPU", f"{_rate(r.tflops_per_gpu)} TFLOP/s"),
        ("hardware TFLOP/s per GPU (with recompute)", f"{_rate(r.hardware_tflops_per_gpu)} TFLOP/s"),
        ("MFU", f"{_rate(100 * r.mfu)} % of {r.peak_tflops:.1f} TFLOP/s"),
        ("compute (mean over pipeline ranks)", _seconds(r.breakdown["compute_s"])),
        ("exposed communication", _seconds(r.breakdown["exposed_comm_s"])),
        ("pipeline bubble", _seconds(r.breakdown["bubble_s"])),
        ("host wait (kernels not yet launched)", _seconds(r.breakdown["host_wait_s"])),
        ("idle", _seconds(r.breakdown["idle_s"])),
        ("peak allocated, steady (max over ranks)", format_bytes(r.peak_memory_allocated_bytes)),
        ("peak reserved, steady (max over ranks)", format_bytes(r.peak_memory_reserved_bytes)),
        (
            "peak reserved, first iteration",
            format_bytes(r.first_iteration_peak_memory_reserved_bytes),
        ),
        ("device total estimate (nvidia-smi)", format_bytes(r.device_total_estimate_bytes)),
        ("GPU capacity (what CUDA offers)", format_bytes(r.gpu_capacity_bytes)),
        ("out of memory", "YES" if r.oom else "no"),
        ("model built on (train.model_init)", _BUILT_ON[r.model_built_on]),
        (
            f"compute priced by (ops of the {len(r.per_class)} class(es))",
            _priced_by(r.compute_priced_by),
        ),
        ("kernel table", r.kernel_table or "none (roofline curves only)"),
        ("emulation wall time", f"{r.wall_s:.1f} s (capture {r.capture_wall_s:.1f} s)"),
    ]
    for figure, value in rows:
        head.add_row(figure, value)
    console.print(head)
    table = Table(title="Per pipeline rank (class)")
    for column in (
        "pp",
        "ranks",
        "TFLOP/s per GPU",
        "MFU",
        *map(breakdown_label, BREAKDOWN_FIELDS),
        "allocated",
        "reserved",
        "OOM",
    ):
        _column(table, column)
    for c in r.per_class:
        table.add_row(
            str(c.pp),
            f"{c.members:,}",
            _rate(c.tflops_per_gpu),
            f"{_rate(100 * c.mfu)} %",
            *(_seconds(getattr(c, name)) for name in BREAKDOWN_FIELDS),
            format_bytes(c.peak_memory_allocated_bytes),
            format_bytes(c.peak_memory_reserved_bytes),
            "YES" if c.oom else "no",
        )
    console.print(table)
    for c in r.per_class:
        if c.oom_detail is not None:
            console.print(oom_message(c.pp, c.members, c.oom_detail))
        elif c.steady_alloc_retries:
            console.print(alloc_retries_message(c.pp, c.steady_alloc_retries))
        elif c.alloc_retries:
            console.print(one_off_retries_message(c.pp, c.alloc_retries))


def alloc_retries_message(pp: int, retries: int) -> str:
    """The warning for a rank class whose steady iteration fits only by freeing the cache."""
    return (
        f"Pipeline rank {pp} fits only by freeing the allocator's cache: {retries} cudaMalloc "
        "retries every steady iteration (torch's num_alloc_retries; each synchronizes the device "
        "and frees and maps segments again), a slowdown the iteration time above does not include."
    )


def one_off_retries_message(pp: int, retries: int) -> str:
    """The note for a rank class that frees the cache on its way to the steady state only."""
    return (
        f"Pipeline rank {pp} frees the allocator's cache on its way to the steady state: "
        f"{retries} cudaMalloc retries in the iterations before it, once, none in every step."
    )


def module_label(module: str) -> str:
    """A trace row's module for a reader: ModTracker's top level named for what it is. The
    capture gives a row the deepest running module by name length, and "Global" outranks a
    root named "GPT", so the model's own forward outside its blocks reads as the top level."""
    from emulator.torch_compat import TOP_LEVEL_MODULE  # imports torch: help and explain do not

    top = "the top level (the model's root or no module)"
    return top if module in ("", TOP_LEVEL_MODULE) else module


def torch_format_size(count: int) -> str:
    """c10's format_size, which torch's OOM message prints its figures with: two decimals of
    the largest unit a figure exceeds (so 1 GiB reads "1024.00 MiB"), "N bytes" up to 1 KiB."""
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if count > size:
            return f"{count / size:.2f} {unit}"
    return f"{count} bytes"


def oom_message(pp: int, members: int, detail: dict) -> str:
    """What torch's OOM error says, for the first allocation of a rank class that did not fit
    (`emulator.memory.replay.OomReport` as a dict): where and in which op, then torch's own
    sentences and figures (CUDACachingAllocator.cpp: "Tried to allocate" is the segment the
    allocator asked CUDA for, the request beside it), then what was live by category."""
    allocated, reserved = detail["allocated_bytes"], detail["reserved_bytes"]
    live = sorted(detail["live_by_category"].items(), key=lambda item: -item[1])
    return (
        f"Out of memory on pipeline rank {pp} ({members:,} rank{'s' if members > 1 else ''}): "
        f"{_oom_where(detail)}. "
        f"Tried to allocate {_tried(detail)}. The GPU has a total capacity of "
        f"{torch_format_size(detail['gpu_capacity_bytes'])} of which "
        f"{torch_format_size(detail['free_bytes'])} is free. Including non-PyTorch memory, this "
        f"process has {torch_format_size(detail['process_in_use_bytes'])} memory in use "
        f"({format_bytes(detail['outside_bytes'])} of it outside the allocator: CUDA context and "
        f"NCCL). Of the allocated memory {torch_format_size(allocated)} is allocated by PyTorch, "
        f"and {torch_format_size(reserved - allocated)} is reserved by PyTorch but unallocated. "
        "Live: " + ", ".join(f"{name} {format_bytes(size)}" for name, size in live) + "."
    )


def micro_batch_of(phase: str, micro_batch: int) -> int | None:
    """The micro-batch a memory event's op ran for: None in setup and the optimizer, and for
    the ops a step runs before its first micro-batch (the trace's -1)."""
    in_one = phase in ("forward", "backward", "recompute") and micro_batch >= 0
    return micro_batch if in_one else None


def _oom_where(detail: dict) -> str:
    """ "steady iteration, backward mb0, in MODULE, op OP" (the op left out when none)."""
    at = detail["at"]
    if at["phase"] == "setup":  # the rows before the first op (emulator.memory.replay)
        where = "before the first iteration, building the model and its state (train.model_init)"
    else:
        where = f"{detail['iteration']} iteration, {at['phase']}"
        micro_batch = micro_batch_of(at["phase"], at["micro_batch"])
        if micro_batch is not None:
            where += f" mb{micro_batch}"  # the timeline's name: mb0 is the first
    where += f", in {module_label(at['module'])}"
    return where + (f", op {at['op']}" if at["op"] else "")


def _tried(detail: dict) -> str:
    """torch's "Tried to allocate" figure, with the request it rounds when they print apart."""
    tried = torch_format_size(detail["allocation_bytes"])
    request = torch_format_size(detail["request_bytes"])
    return tried if tried == request else f"{tried} (a segment, for a request of {request})"


def oom_site_label(site) -> str:
    """A `prismbench.fit.OomSite` in a few words: "class 0, steady iteration, backward, in
    MODULE, op OP"."""
    where = f"class {site.pp}, {site.iteration} iteration, {site.phase}, in "
    return where + module_label(site.module) + (f", op {site.op}" if site.op else "")


def steady_warning(what: str, iterations: int) -> str:
    """The stderr line for replays whose allocator never settled (emulator.memory.replay)."""
    return (
        f"warning: {what}: the allocator's blocks still changed after {iterations} steady "
        "iterations (MAX_STEADY_ITERATIONS); its steady figures are the last one's, which "
        "later steps may not repeat"
    )


def _priced_by(priced_by: dict[str, dict[str, float]]) -> str:
    """ "exact 812 ops (201 ms), interpolated 40 ops (10.02 ms), extrapolated 0 ops (0 ms),
    published-rates 0 ops (0 ms), roofline 3 ops (31.5 µs)"."""
    return ", ".join(
        f"{source} {int(v['ops']):,} ops ({_seconds(v['time_s'])})" for source, v in priced_by.items()
    )


def render_fit(result, console: Console) -> None:
    """Each emulated value (in the order tried), then the answer."""
    follows = (", the job's micro-batches a step kept: the global batch follows"
               if result.vary == "micro_batch" else "")  # fmt: skip
    table = Table(
        title=f"What fits on {result.gpu}: {result.vary} (step {result.step}{follows})"
    )
    columns = ("value", "fits", "peak reserved", "outside allocator", "headroom",
               "retries first / steady step", "OOM request", "OOM at")  # fmt: skip
    for column in columns:
        _column(table, column, left=column == "OOM at")
    for p in result.probes:
        m, oom = p.memory, p.memory.oom_at
        table.add_row(
            f"{p.value:,}",
            "yes" if m.fits else "NO",
            # past an OOM the replay goes on as on an unlimited GPU: its figure, not the GPU's
            format_bytes(m.peak_reserved_bytes) + ("" if m.fits else " (as if unlimited)"),
            format_bytes(m.outside_bytes),
            format_bytes(m.headroom_bytes),
            f"{m.first_iteration_alloc_retries} / {m.steady_alloc_retries}" if m.fits else "",
            "" if oom is None else format_bytes(oom.request_bytes),
            "" if oom is None else oom_site_label(oom),
        )
    console.print(table)
    above = result.value_above
    if result.largest_fitting is None and result.limited_by == "memory":
        console.print(f"Not even {result.vary} = {result.smallest:,} fits.")
    elif result.largest_fitting is None:
        console.print(f"No {result.vary} from {result.smallest:,} on was emulated:")
    else:
        console.print(
            f"Largest {result.vary} that fits: {result.largest_fitting:,} "
            f"(headroom {format_bytes(result.headroom_bytes)})"
        )
    if result.limited_by == "spec":
        reason = next(r.reason for r in result.refused if r.value == above)
        console.print(
            f"{result.vary} {above:,} is refused by the spec: {reason}; the bound is the "
            "spec's, not memory"
        )
    if result.limited_by == "maximum":
        console.print(
            f"{result.vary} {above:,} is beyond --max {result.maximum:,}: the bound is the "
            "search's, not memory"
        )
    if result.fits_above:
        console.print(
            f"Larger values fit again: {', '.join(map(str, result.fits_above))} (what the "
            "allocator reserves is not monotonic in this setting)"
        )
    if result.largest_fitting is not None and not result.contiguous:
        console.print(
            f"Not every value below the answer was probed (more than {MAX_SCAN} lay between "
            "its probes to check one at a time): what the allocator reserves need not grow "
            "with the value, so one of them might not fit."
        )
    elif result.largest_fitting is not None and result.every_value_probed_from > result.smallest:
        start = result.every_value_probed_from
        below = sum(result.smallest <= p.value < start for p in result.probes)
        console.print(
            f"Every {result.vary} from {start:,} to the answer was probed, and "
            f"{below or 'none'} below {start:,}: what the allocator reserves need not grow with "
            "the value, so one not probed might not fit."
        )


def profiled_time_label(iterations: int) -> str:
    """Whose kernel time an ingest's coverage is: the profile's, or its first iteration's."""
    return "the profile's" if iterations == 1 else "its first iteration's"


def render_ingest(result, console: Console, top: int = 10) -> None:
    """Matched rows and attributed kernel time, then the largest unmatched profiled ops."""
    iterations = result.profile_iterations
    console.print(
        f"Matched {result.matched_rows:,} of {result.trace_rows:,} trace compute rows "
        f"({result.trace_coverage:.1%} of the capture); attributed "
        f"{result.attributed_kernel_us / 1e3:,.3f} of {result.total_kernel_us / 1e3:,.3f} ms of "
        f"{profiled_time_label(iterations)} kernel time ({result.kernel_time_coverage:.1%})"
    )
    if iterations > 1:
        left_out = result.iterations_left_out
        console.print(
            f"the profile holds {iterations} iterations, each aligned with the capture apart: the "
            f"rows pool {iterations - len(left_out)} of them"
            + (f"; left out, not the job's: {', '.join(map(str, left_out))}" if left_out else "")
        )
    for title, entries in (
        ("Profiled ops with no trace row", result.unmatched_profile),
        ("Trace rows with no profiled op", result.unmatched_trace),
    ):
        if not entries:
            continue
        table = Table(title=title)
        for column in ("op", "shapes", "count", "kernel us"):
            _column(table, column, left=column in ("op", "shapes"))
        for e in entries[:top]:
            table.add_row(e["op"], e["shapes"], f"{e['count']:,}", f"{e['kernel_us']:,.1f}")
        console.print(table)


def render_comparison(result, console: Console, top: int = 15) -> None:
    """Totals, then the `top` op classes with the largest absolute error (times in ms)."""
    error = "n/a" if result.error is None else f"{result.error:+.1%}"
    # the job and the totals on lines of their own: a recording's name is ~50 characters, and
    # on one line with the totals it wrapped mid-figure at 100 columns
    console.print(f"Compute of one iteration of {result.job}:")
    console.print(
        f"  predicted {result.predicted_s * 1e3:,.2f} ms, "
        f"measured {result.measured_s * 1e3:,.2f} ms of kernels ({error})"
    )
    if result.profile_iterations > 1:
        console.print(f"the profile holds {result.profile_iterations} iterations: the first is "
                      "compared (one iteration, as the capture is)")  # fmt: skip
    # a line of its own, never broken by rich: the label is mostly paths, read and copied whole
    console.print(
        f"kernel table: {result.kernel_table or 'none (roofline curves only)'}", soft_wrap=True
    )
    table = Table(
        title=f"Op classes, largest absolute error first (top {top} of {len(result.classes)})",
        caption=f"priced by: how many ops each source priced, {'/'.join(PRICE_SOURCES)}",
    )
    for column in ("op", "aten op", "ops (trace/profile)", "predicted ms", "measured ms",
                   "error ms", "error", "priced by"):  # fmt: skip
        _column(table, column, left=column in ("op", "aten op"))
    for c in result.classes[:top]:
        rel = f"{c.error_s / c.measured_s:+.1%}" if c.measured_s else "n/a (not measured)"
        table.add_row(
            c.op,
            c.aten,
            f"{c.trace_ops:,}/{c.profile_ops:,}",
            f"{c.predicted_s * 1e3:,.3f}",
            f"{c.measured_s * 1e3:,.3f}",
            f"{c.error_s * 1e3:+,.3f}",
            rel,
            "/".join(str(c.priced_by[s]) for s in PRICE_SOURCES),
        )
    console.print(table)


def render_gate(result, console: Console) -> None:
    """One row per threshold: both values, the change, PASS or FAIL; then the verdict."""
    table = Table(title=f"Gate: {result.candidate} against {result.reference}")
    for column in ("threshold", "reference", "candidate", "change", "result"):
        _column(table, column, left=column == "threshold")
    for row in result.rows:
        if row.field == "oom":  # gate.FITS: whether each side runs out of memory
            values = ["runs out of memory" if v else "fits" for v in (row.reference, row.candidate)]
            change = ""
        else:
            values = [format_field(row.field, v) for v in (row.reference, row.candidate)]
            change = "n/a (reference is 0)" if row.change is None else f"{row.change:+.2%}"
        table.add_row(row.threshold, *values, change, "PASS" if row.passed else "FAIL")
    console.print(table)
    if result.layout_differences:
        console.print(
            "note: the two sides are jobs of different sizes: "
            + "; ".join(
                f"{d.field} {format_field(d.field, d.reference)} -> {format_field(d.field, d.candidate)}"
                for d in result.layout_differences
            )
        )
    console.print("gate passed" if result.passed else "gate FAILED")


def breakdown_label(field: str) -> str:
    """A breakdown category's column heading from its emulate JSON name ("exposed comm")."""
    return field.removesuffix("_s").replace("_", " ")


def format_field(field: str, value: float) -> str:
    """A value with its unit, read from the field's name (emulate JSON naming)."""
    if field.endswith("_bytes"):
        return format_bytes(value)
    if field.endswith("tokens_per_s"):  # before "_s", which it also ends with
        return f"{value:,.0f} tokens/s"
    if field.endswith("_s"):
        return f"{value:.4f} s"
    if "tflops" in field:
        return f"{value:.2f} TFLOP/s"
    if field == "mfu" or field.endswith(".mfu"):  # a fraction of the dense peak
        return f"{100 * value:.4g} % of peak"
    return f"{value:g}"


def render_validation(run, summary, failures, console: Console, thresholds=()) -> None:
    """Per (source, GPU, metric): cases, mean and max |error|, mean signed error; failures,
    and with `thresholds` (`--gate`) whether the gate passed."""
    table = Table(
        title=f"Validation {run.run_id}: {len(run.cases)} case(s), history in {run.db_path}"
    )
    for column in ("source", "GPU", "metric", "cases", "mean |error|", "max |error|", "mean error"):
        _column(table, column, left=column in ("source", "GPU", "metric"))
    for row in summary:
        table.add_row(row.source, row.gpu, row.metric, str(row.cases), f"{row.mean_abs_error:.1%}",
                      f"{row.max_abs_error:.1%}", f"{row.mean_error:+.1%}")  # fmt: skip
    console.print(table)
    _render_case_variability(run.cases, console)
    for c in run.cases:
        if c.unscored is not None:
            console.print(f"not scored: {c.baseline}: {c.unscored}")
    failed = [c for c in run.cases if c.status != "ok"]
    for c in failed:
        console.print(f"emulation FAILED: {c.baseline}: {c.error_message}")
    for baseline, metric, error, threshold in failures:
        if metric == "emulation":  # printed above, with its error
            continue
        if baseline == "-":  # a threshold no selected case measures: there is no error to show
            console.print(f"gate FAILED: {threshold}")
        elif metric == "oom":
            console.print(f"gate FAILED: {baseline}: {threshold}")
        else:
            console.print(
                f"gate FAILED: {baseline}: {metric} error {error:+.1%} crosses {threshold}"
            )
    for c in run.cases:  # a bound the measured range widened: the pass is the range's
        for m in c.metrics:
            for t in thresholds:
                if (t.field == m.metric and t.crossed(m.error)
                        and not t.crossed(m.error, slack_below=m.slack_below,
                                          slack_above=m.slack_above)):  # fmt: skip
                    console.print(
                        f"gate: {c.baseline}: {m.metric} error {m.error:+.1%} is within {t} only "
                        f"as the measured iterations reached {-m.slack_below:+.1%} .. "
                        f"{m.slack_above:+.1%} of their median"
                    )
    if thresholds and not failures:
        console.print(f"gate passed: {', '.join(map(str, thresholds))}")


def _render_case_variability(cases, console: Console) -> None:
    """validate --variability: each case's predicted step-time spread beside the measured one."""
    rows = [c for c in cases if c.variability is not None]
    if not rows:
        return
    v0 = rows[0].variability
    table = Table(title=f"Step-time distribution per case ({v0['preset']}, {v0['samples']} "
                  f"samples, seed {v0['seed']})")  # fmt: skip
    for column in ("baseline", "determ.", "mean", "std", "p95", "p99", "p95/determ.",
                   "P(>determ.)", "spread pred.", "spread meas.", "MC wall"):  # fmt: skip
        _column(table, column, left=column == "baseline")
    for c in rows:
        v = c.variability
        measured = v["measured_relative_spread"]
        table.add_row(
            c.baseline,
            *(_seconds(v[k]) for k in ("deterministic_s", "mean_s", "std_s", "p95_s", "p99_s")),
            f"{v['slowdown_p95']:.3f}x",
            f"{100 * v['p_exceeds_threshold']:.1f} %",
            f"±{100 * v['predicted_relative_spread']:.2f} %",
            "-" if measured is None else
            f"±{100 * measured:.2f} % ({v['measured_iterations']})",
            _seconds(v["monte_carlo_wall_s"]),
        )  # fmt: skip
    console.print(table)
    console.print("determ.: the replay without variability; spread pred.: (p95 - p5) / 2 / p50; "
                  "spread meas.: (max - min) / 2 / median of the recorded iterations (how many); "
                  "MC wall: the Monte Carlo's time (docs/METRICS.md)")  # fmt: skip


def _transfer_against_modelled(measured_s: float, modelled_s: dict[str, float]) -> str:
    """The measured no-bubble median over the modelled transfer of each link the job's pipeline
    boundaries cross (pipeline_transfers.TRANSFER_LINKS): the measurement is of one boundary,
    so where both links occur the user reads the ratio of the one it crossed."""
    prices = "; ".join(f"{_seconds(price_s)} {link.replace('_', ' ')} ({measured_s / price_s:.2f}x)"
                       for link, price_s in modelled_s.items())  # fmt: skip
    which = " (read the link your boundary crosses)" if len(modelled_s) > 1 else ""
    return f"{_seconds(measured_s)} / {prices}; medians over the job's boundaries{which}"


def render_variability(r, console: Console) -> None:
    """The step-time distribution of `prismbench variability`, every figure with its unit."""
    d = r.distribution
    table = Table(
        title=f"Step-time distribution: {r.job} on {r.world_size:,} GPUs "
        f"({d.samples} samples, {r.preset}, seed {d.seed})"
    )
    _column(table, "figure", left=True)
    _column(table, "value")
    rows = [
        ("deterministic prediction", _seconds(d.deterministic_s)),
        ("mean", _seconds(d.mean_s)),
        ("standard deviation", _seconds(d.std_s)),
        ("p5 / p50", f"{_seconds(d.p5_s)} / {_seconds(d.p50_s)}"),
        ("p95 / p99", f"{_seconds(d.p95_s)} / {_seconds(d.p99_s)}"),
        (f"P(step > {_seconds(d.threshold_s)})", f"{100 * d.p_exceeds_threshold:.1f} %"),
        *_allocation_rows(d),
        (
            f"{d.k_steps:,} steps on one allocation: mean, {100 * d.confidence:.0f} % upper bound"
            if d.allocation_std_s is not None
            else f"{d.k_steps:,} independent steps: mean, {100 * d.confidence:.0f} % upper bound",
            f"{_seconds(d.k_steps_mean_s)}, {_seconds(d.k_steps_bound_s)}",
        ),
        ("slowdown vs deterministic: mean, p95", f"{d.slowdown_mean:.3f}x, {d.slowdown_p95:.3f}x"),
        ("Monte Carlo wall time", _seconds(r.monte_carlo_wall_s)),
    ]
    share = r.tail_slow_network_share
    if share is not None:
        rows.insert(-2, ("steps above p95 in a slower network regime", f"{100 * share:.1f} %"))
    measured = r.network_measured
    rows.insert(-1, ("network regimes (a factor on inter-node communication)",
                     measured.describe() if measured
                     else f"{regimes_text(r.network)}; assumed by {r.preset}"))  # fmt: skip
    if r.transfer_cv is not None:
        transfers = r.transfers_measured
        rows.insert(-1, ("pipeline transfer CV (one send/recv, no bubble)",
                         transfers.describe() if transfers
                         else f"{100 * r.transfer_cv:.2f} %: the collectives', assumed by {r.preset}"))  # fmt: skip
        if transfers and r.transfer_modelled_s:
            rows.insert(-1, ("pipeline transfer (no bubble): measured / modelled",
                             _transfer_against_modelled(transfers.no_bubble_mean_s, r.transfer_modelled_s)))  # fmt: skip
    if r.variability_table is not None:
        rows.insert(0, (f"{r.preset} preset's table (temporal variation)", r.variability_table))
    for figure, value in rows:
        table.add_row(figure, value)
    console.print(table)
    if share is not None and share > 0.5 and measured is None:
        console.print(
            f"note: {100 * share:.0f} % of the steps above p95 drew a slower network regime: p95 "
            f"and p99 restate the regimes {r.preset} assumes (their probability and factor: "
            "emulator/variability/model.py) more than they measure this job; --network-steps "
            "takes them from a real run's per-step communication times"
        )
    if r.attribution is not None:
        render_attribution(r.attribution, console)
    if r.placement is not None:
        render_placement(r.placement, console)


def render_variability_table(table: dict, console: Console) -> None:
    """What `prismbench variability-table` measured (table_dict's form), each figure with its
    unit: per class kernel CV, the jitter floor, the step CV, and per job its iteration CV
    measured, the CV its kernels' noise alone gives and the step CV left."""
    figures = Table(title=f"Temporal variation measured on {table['gpu']} "
                          f"({len(table['jobs'])} job(s))")  # fmt: skip
    _column(figures, "figure", left=True)
    _column(figures, "value")
    for klass, cv in table["temporal_cv_by_class"].items():
        pools = table["pools_by_class"][klass]
        figures.add_row(f"kernel CV, {klass} ({pools} pools)", f"{100 * cv:.2f} %")
    figures.add_row(f"jitter floor ({table['short_pools']} short pools)",
                    f"{table['temporal_floor_s'] * 1e6:.3f} us")  # fmt: skip
    figures.add_row("step CV (median over jobs)", f"{100 * table['step_cv']:.3f} %")
    figures.add_row("step CV between runs (sd of its log)", f"{table['step_cv_dispersion']:.3f}")
    console.print(figures)
    jobs = Table(title="Per job (CV of the iteration time)",
                 caption="kernel time, measured: the CV of the profiled iterations' summed kernel "
                         "time (record --profile-iterations N; - for a profile of one)")  # fmt: skip
    for column in ("job", "measured", "kernel noise alone", "kernel time, measured", "step"):
        _column(jobs, column, left=column == "job")
    for job, cvs in table["jobs"].items():
        measured = cvs.get("kernel_cv_measured")  # tables written before it existed lack it
        jobs.add_row(job, f"{100 * cvs['iteration_cv']:.3f} %", f"{100 * cvs['kernel_cv']:.3f} %",
                     "-" if measured is None else f"{100 * measured:.3f} %",
                     f"{100 * cvs['step_cv']:.3f} %")  # fmt: skip
    console.print(jobs)


def _allocation_rows(d) -> list[tuple[str, str]]:
    """The spread split into allocations of GPUs and steps within one (summary's docstring)."""
    if d.allocation_std_s is None:
        return [("allocations", f"{d.allocations:,} of 1 step (no split)")]
    return [
        ("allocations", f"{d.allocations:,} of {d.steps_per_allocation} steps"),
        ("std between allocations (of the mean step)", _seconds(d.allocation_std_s)),
        ("std within an allocation (of a step)", _seconds(d.within_allocation_std_s)),
    ]


def render_attribution(a, console: Console) -> None:
    """Noise sources ranked by the step-time variance each gives alone (same seed), each
    split source's signatures nested under it; the sources left out unrun, under the table."""
    table = Table(
        title=f"Noise sources alone, ranked by step-time std ({a.samples} samples, seed {a.seed}; "
        "shares of the all-on run need not add to 100 %)"
    )
    for column in ("source", "category", "std", "variance share", "mean - determ.",
                   "p95 - determ.", "p95 share"):  # fmt: skip
        _column(table, column, left=column in ("source", "category"))
    for e in (*a.sources, a.total):
        table.add_row(e.source, e.category, *_effect_cells(e))
        for i, sig in enumerate(e.signatures):
            branch = "└" if i == len(e.signatures) - 1 else "├"
            table.add_row(f" {branch} {sig.signature}", signature_kind(sig.lumped, sig.own_run),
                          *_effect_cells(sig))  # fmt: skip
    console.print(table)
    if a.signature_runs:
        console.print(f"signatures: {a.signature_runs} more Monte Carlo runs "
                      f"({_seconds(a.signature_wall_s)}); each split source's signatures are "
                      "pre-ranked by their variance along the deterministic critical path, the "
                      "largest run alone and the rest together "
                      "as 'other' (emulator/variability/signatures.py)")  # fmt: skip
    if a.skipped:
        reasons: dict[str, list[str]] = {}
        for s in a.skipped:
            reasons.setdefault(s.reason, []).append(s.source)
        text = "; ".join(f"{', '.join(names)}: {reason}" for reason, names in reasons.items())
        console.print(f"not run, {len(a.skipped)} source(s) that provably add no noise: {text}")


def signature_kind(lumped: int, own_run: bool) -> str:
    """What a signature row under its source stands for: one signature run alone, the "other"
    entry of `lumped` run together, or a source's only one (the source's own run)."""
    if not own_run:
        return "its only signature"
    return "signature" if lumped == 1 else f"{lumped} signatures"


def _effect_cells(e) -> tuple[str, ...]:
    """A source's or signature's figures, each with its unit."""
    return (
        _seconds(e.std_s),
        f"{100 * e.variance_share:.1f} %",
        _signed_seconds(e.mean_shift_s),
        _signed_seconds(e.p95_excess_s),
        f"{100 * e.p95_share:.1f} %",
    )


def render_placement(study, console: Console) -> None:
    """Step time with k slow GPUs at each placement against none."""
    table = Table(
        title=f"{study.slow_gpus} GPUs {study.factor:g}x slower, by placement "
        f"({study.samples} samples, seed {study.seed})"
    )
    for column in ("placement", "ranks", "deterministic", "p50", "p95", "p95 / no slow GPU"):
        _column(table, column, left=column in ("placement", "ranks"))
    for e in (study.reference, *study.placements):
        ranks = ", ".join(map(str, e.ranks[:6])) + (" ..." if len(e.ranks) > 6 else "")
        table.add_row(
            e.placement,
            ranks or "-",
            _seconds(e.deterministic_s),
            _seconds(e.p50_s),
            _seconds(e.p95_s),
            f"{e.p95_ratio:.4f}x",
        )
    console.print(table)


# Below this a duration is the rounding of sums of seconds (a noise source that adds
# nothing shows 1e-11 s), not a figure: printed as 0.
_SHORTEST_PRINTED_S = 1e-9


def _signed_seconds(t: float) -> str:
    if abs(t) < _SHORTEST_PRINTED_S:
        return _seconds(0.0)
    return ("-" if t < 0 else "+") + _seconds(abs(t))


def _rate(value: float) -> str:
    """A rate or percentage to three significant digits however small (a debug job runs at
    0.04 TFLOP/s, which one decimal printed as 0.0), to one decimal from 100 up."""
    return f"{value:,.1f}" if abs(value) >= 100 else f"{value:.3g}"


def _seconds(t: float) -> str:
    """A duration with a unit that keeps four significant digits readable."""
    if abs(t) < _SHORTEST_PRINTED_S:
        t = 0.0
    if t >= 3600:
        return f"{t / 3600:.4g} h"
    if t >= 1:
        return f"{t:.4g} s"
    return f"{t * 1e3:.4g} ms" if t >= 1e-3 or t == 0 else f"{t * 1e6:.4g} µs"
