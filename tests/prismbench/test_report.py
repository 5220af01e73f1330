"""Tests for prismbench/report.py: the figures the CLI prints, with their units."""

from __future__ import annotations

from emulator.units import GiB, MiB
from prismbench.report import (
    _seconds,
    _signed_seconds,
    alloc_retries_message,
    format_bytes,
    format_field,
    format_nodes,
    one_off_retries_message,
    oom_message,
    torch_format_size,
)


def test_bytes_take_the_largest_binary_unit():
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(3 * GiB) == "3.00 GiB"
    assert format_bytes(12) == "12 B"


def test_a_field_is_printed_with_the_unit_its_name_says():
    assert format_field("iteration_time_s", 1.5) == "1.5000 s"
    assert format_field("tokens_per_s", 12345.6) == "12,346 tokens/s"
    assert format_field("peak_memory_reserved_bytes", 3 * GiB) == "3.00 GiB"
    assert format_field("mfu", 0.41234) == "41.23 % of peak"


def test_a_duration_below_a_nanosecond_is_rounding_and_prints_as_zero():
    # a noise source that adds nothing to the step: its std and p95 excess are sums' rounding
    assert _seconds(1.391e-11) == "0 ms" and _signed_seconds(-1.388e-11) == "0 ms"
    assert _seconds(2.5e-6) == "2.5 µs" and _signed_seconds(-2.5e-6) == "-2.5 µs"


def test_nodes_say_how_a_world_that_does_not_fill_them_sits_on_them():
    assert format_nodes(32, 4, 8) == "4 x 8 GPUs"
    assert format_nodes(2, 1, 8) == "1 (2 of its 8 GPUs)"
    assert format_nodes(8, 3, 3) == "3 of 3 GPUs (the last uses 2)"


def _oom_detail(**changes) -> dict:
    """An OomReport as a dict: a 512 MiB request failing in a forward with 78 GiB to reserve
    (79 GiB of GPU, 1 GiB outside the allocator), 256 MiB of it cached."""
    allocated, reserved, outside = 77 * GiB, 77 * GiB + 256 * MiB, GiB
    detail = {
        "iteration": "first",
        "at": {
            "event_index": 7,
            "seq": 9,
            "stage": 0,
            "phase": "forward",
            "micro_batch": 1,
            "module": "Llama.layers.9.feed_forward.w2",
            "op": "aten.mm",
        },  # fmt: skip
        "request_bytes": 512 * MiB,
        "allocation_bytes": 512 * MiB,
        "allocated_bytes": allocated,
        "reserved_bytes": reserved,
        "allocator_capacity_bytes": 78 * GiB,
        "gpu_capacity_bytes": 79 * GiB,
        "outside_bytes": outside,
        "free_bytes": 79 * GiB - outside - reserved,
        "process_in_use_bytes": reserved + outside,
        "live_by_category": {"gradient": 8 * GiB, "activation": 65 * GiB, "parameter": 4 * GiB},
    }
    return detail | changes


def test_an_oom_says_where_in_which_op_and_what_was_live():
    message = oom_message(1, 2048, _oom_detail())
    assert message.startswith("Out of memory on pipeline rank 1 (2,048 ranks): first iteration, "
                              "forward mb1, in Llama.layers.9.feed_forward.w2, op aten.mm.")  # fmt: skip
    assert message.endswith("Live: activation 65.00 GiB, gradient 8.00 GiB, parameter 4.00 GiB.")


def test_an_oom_gives_torch_s_figures_in_torch_s_words():
    message = oom_message(1, 2048, _oom_detail())
    assert (
        "Tried to allocate 512.00 MiB. The GPU has a total capacity of 79.00 GiB of which "
        "768.00 MiB is free. Including non-PyTorch memory, this process has 78.25 GiB memory in "
        "use (1.00 GiB of it outside the allocator: CUDA context and NCCL). Of the allocated "
        "memory 77.00 GiB is allocated by PyTorch, and 256.00 MiB is reserved by PyTorch but "
        "unallocated." in message
    )


def test_tried_to_allocate_is_the_segment_torch_asks_for_with_the_request_beside_it():
    detail = _oom_detail(request_bytes=3 * MiB, allocation_bytes=20 * MiB)
    assert "Tried to allocate 20.00 MiB (a segment, for a request of 3.00 MiB)." in oom_message(
        0, 1, detail
    )


def test_sizes_print_as_torch_s_format_size_does():
    assert torch_format_size(1024) == "1024 bytes"
    assert torch_format_size(1536) == "1.50 KiB"
    assert torch_format_size(GiB) == "1024.00 MiB"  # c10 takes the unit a size exceeds
    assert torch_format_size(14 * GiB) == "14.00 GiB"


def test_an_oom_outside_a_micro_batch_names_its_phase_only():
    at = {"event_index": 1, "seq": 1, "stage": 0, "phase": "optimizer", "micro_batch": -1,
          "module": "Global", "op": "aten._foreach_sqrt"}  # fmt: skip
    message = oom_message(0, 1, _oom_detail(iteration="steady", at=at, free_bytes=0))
    assert (
        "steady iteration, optimizer, in the top level (the model's root or no module), "
        "op aten._foreach_sqrt." in message
    )
    assert "of which 0 bytes is free" in message


def test_an_oom_before_the_first_op_is_in_the_build():
    at = {"event_index": 3, "seq": 3, "stage": 0, "phase": "setup", "micro_batch": -1,
          "module": "", "op": ""}  # fmt: skip
    message = oom_message(0, 8, _oom_detail(at=at))
    assert message.startswith(
        "Out of memory on pipeline rank 0 (8 ranks): before the first iteration, building the "
        "model and its state (train.model_init), in the top level (the model's root or no "
        "module). Tried"
    )


def test_retries_every_step_are_a_warning_that_says_they_are_not_priced():
    message = alloc_retries_message(2, 3)
    assert message.startswith("Pipeline rank 2 fits only by freeing the allocator's cache: 3 ")
    assert "does not include" in message


def test_retries_only_on_the_way_to_the_steady_state_are_a_note_that_says_so():
    message = one_off_retries_message(1, 2)
    assert message.startswith("Pipeline rank 1 frees the allocator's cache on its way")
    assert "2 cudaMalloc retries" in message and "once, none in every step" in message


def test_an_oom_of_a_class_of_one_rank_says_one_rank():
    assert oom_message(0, 1, _oom_detail()).startswith("Out of memory on pipeline rank 0 (1 rank): ")


def test_a_small_job_s_rates_keep_their_digits():
    """A debug job runs at hundredths of a TFLOP/s: one decimal printed it as "0.0 TFLOP/s"."""
    from rich.console import Console

    from prismbench.emulate import emulate
    from prismbench.report import render_emulation
    from prismbench.spec import job_spec_from_dict

    result = emulate(job_spec_from_dict({"model": {"name": "gpt-debug"}, "batch": {"seq_len": 64, "global_batch": 2}}))
    assert result.tflops_per_gpu < 0.1
    console = Console(record=True, width=200)
    render_emulation(result, console)
    text = console.export_text()
    assert f"{result.tflops_per_gpu:.3g} TFLOP/s" in text and " 0.0 TFLOP/s" not in text
    assert f"{100 * result.mfu:.3g} % of" in text


def test_the_comparison_s_kernel_table_line_is_whole_at_100_columns():
    """The header wrapped at a 100-120 column terminal inside "kernel table: <label>"."""
    from rich.console import Console

    from prismbench.compare import ClassComparison, Comparison
    from prismbench.report import render_comparison

    label = "results/kernels/h100-sxm-80g.csv without profile:gpt3-125m-s2048-mb8-none"
    classes = [ClassComparison(op="matmul", aten="aten.mm", trace_ops=1, profile_ops=1,
                               matched=1, predicted_s=1e-3, measured_s=1e-3, priced_by={})]  # fmt: skip
    comparison = Comparison(job="gpt3-125m-s2048-mb8-none", profile="p.ops.jsonl.gz",
                            kernel_table=label, classes=classes)  # fmt: skip
    console = Console(record=True, width=100)
    render_comparison(comparison, console, top=0)
    assert f"kernel table: {label}" in console.export_text().splitlines()


def test_the_comparison_s_totals_are_whole_at_100_columns():
    """The one-line header (job name and both totals) wrapped at a 100 column terminal for a
    recording's name; its totals are on a line of their own now, each with its unit."""
    from rich.console import Console

    from prismbench.compare import ClassComparison, Comparison
    from prismbench.report import render_comparison

    job = "h100frameworks__llama3-8b-l4-s8192-mb1-fp8-none"  # the longest recording's name
    classes = [ClassComparison(op="matmul", aten="aten.mm", trace_ops=1, profile_ops=1,
                               matched=1, predicted_s=1.2, measured_s=1.5, priced_by={})]  # fmt: skip
    comparison = Comparison(job=job, profile="p.ops.jsonl.gz", kernel_table="none",
                            classes=classes)  # fmt: skip
    console = Console(record=True, width=100)
    render_comparison(comparison, console, top=0)
    lines = [line.strip() for line in console.export_text().splitlines()]
    assert f"Compute of one iteration of {job}:" in lines
    assert "predicted 1,200.00 ms, measured 1,500.00 ms of kernels (-20.0%)" in lines


def test_the_comparison_s_table_folds_long_cells_instead_of_cutting_them():
    """At 100 columns rich cut the op-class table's cells with an ellipsis ("aten._sca…",
    "100/101/1…"): folded, every figure is still there."""
    from rich.console import Console

    from emulator.costs.kernel_table import PRICE_SOURCES
    from prismbench.compare import ClassComparison, Comparison
    from prismbench.report import render_comparison

    priced_by = {s: 100 + i for i, s in enumerate(PRICE_SOURCES)}
    classes = [ClassComparison(op="flash_attn_bwd", aten="aten._scaled_dot_product_flash_attention_backward",
                               trace_ops=1234, profile_ops=1234, matched=1, predicted_s=1.2,
                               measured_s=1.5, priced_by=priced_by)]  # fmt: skip
    comparison = Comparison(job="j", profile="p.ops.jsonl.gz", kernel_table="none", classes=classes)
    console = Console(record=True, width=100)
    render_comparison(comparison, console, top=1)
    text = console.export_text()
    assert "…" not in text
    body = [line.split("│")[1:-1] for line in text.splitlines() if line.startswith("│")]
    columns = ["".join(part.strip() for part in column) for column in zip(*body, strict=True)]
    assert columns[1] == "aten._scaled_dot_product_flash_attention_backward"
    assert columns[2] == "1,234/1,234"
    assert columns[-1] == "/".join(str(n) for n in priced_by.values())
    assert "priced by: how many ops each source priced, " + "/".join(PRICE_SOURCES) in " ".join(text.split())


def test_emulate_s_tables_lose_nothing_in_an_80_column_terminal():
    """The per-class table of `emulate` at 100 columns read "compu…" and "reser…" for its
    headers: every report column folds instead (report._column)."""
    from rich.console import Console

    from prismbench.emulate import emulate
    from prismbench.report import render_emulation
    from prismbench.spec import job_spec_from_dict

    job = {"model": {"name": "gpt-debug"}, "parallel": {"pp": 2}, "batch": {"seq_len": 64, "global_batch": 2}}
    console = Console(record=True, width=80)
    render_emulation(emulate(job_spec_from_dict(job)), console)
    text = console.export_text()
    assert "…" not in text
