"""Tests for prismbench/report.py: the figures the CLI prints, with their units."""

from __future__ import annotations

from emulator.units import GiB
from prismbench.report import (
    alloc_retries_message,
    format_bytes,
    format_field,
    format_nodes,
    one_off_retries_message,
    oom_message,
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


def test_nodes_say_how_a_world_that_does_not_fill_them_sits_on_them():
    assert format_nodes(32, 4, 8) == "4 x 8 GPUs"
    assert format_nodes(2, 1, 8) == "1 (2 of its 8 GPUs)"
    assert format_nodes(8, 3, 3) == "3 of 3 GPUs (the last uses 2)"


def test_an_oom_says_where_what_was_asked_and_what_was_live():
    detail = {
        "iteration": "first",
        "at": {
            "event_index": 7,
            "seq": 9,
            "stage": 0,
            "phase": "forward",
            "micro_batch": 1,
            "module": "Llama.layers.9.feed_forward.w2",
        },
        "request_bytes": 512 << 20,
        "allocated_bytes": 77 * GiB,
        "reserved_bytes": 77 * GiB + (256 << 20),
        "allocator_capacity_bytes": 78 * GiB,
        "gpu_capacity_bytes": 79 * GiB,
        "live_by_category": {"gradient": 8 * GiB, "activation": 65 * GiB, "parameter": 4 * GiB},
    }
    message = oom_message(1, 2048, detail)
    assert message.startswith("Out of memory on pipeline rank 1 (2,048 ranks): first iteration, "
                              "forward mb1, in Llama.layers.9.feed_forward.w2.")  # fmt: skip
    assert "Tried to allocate 512.00 MiB" in message
    assert "78.00 GiB (CUDA offers 79.00 GiB" in message
    assert (
        "77.00 GiB is allocated, 256.00 MiB reserved but unallocated and 768.00 MiB free" in message
    )
    assert message.endswith("Live: activation 65.00 GiB, gradient 8.00 GiB, parameter 4.00 GiB.")


def test_an_oom_outside_a_micro_batch_names_its_phase_only():
    detail = {
        "iteration": "steady",
        "at": {
            "event_index": 1,
            "seq": 1,
            "stage": 0,
            "phase": "optimizer",
            "micro_batch": -1,
            "module": "Global",  # what the capture records outside every module (ModTracker)
        },
        "request_bytes": GiB,
        "allocated_bytes": 10 * GiB,
        "reserved_bytes": 10 * GiB,
        "allocator_capacity_bytes": 10 * GiB,
        "gpu_capacity_bytes": 11 * GiB,
        "live_by_category": {},
    }
    message = oom_message(0, 1, detail)
    assert (
        "steady iteration, optimizer, in the top level (the model's root or no module)." in message
    )
    assert "0 B free" in message


def test_an_oom_before_the_first_op_is_in_the_build():
    detail = {
        "iteration": "first",
        "at": {"event_index": 3, "seq": 3, "stage": 0, "phase": "setup", "micro_batch": -1,
               "module": ""},  # fmt: skip
        "request_bytes": 256 << 20,
        "allocated_bytes": 77 * GiB,
        "reserved_bytes": 77 * GiB,
        "allocator_capacity_bytes": 77 * GiB,
        "gpu_capacity_bytes": 79 * GiB,
        "live_by_category": {"other": 77 * GiB},
    }
    message = oom_message(0, 8, detail)
    assert message.startswith(
        "Out of memory on pipeline rank 0 (8 ranks): before the first iteration, building the "
        "model and its state (train.model_init), in the top level"
    )


def test_retries_every_step_are_a_warning_that_says_they_are_not_priced():
    message = alloc_retries_message(2, 3)
    assert message.startswith("Pipeline rank 2 fits only by freeing the allocator's cache: 3 ")
    assert "does not include" in message


def test_retries_only_on_the_way_to_the_steady_state_are_a_note_that_says_so():
    message = one_off_retries_message(1, 2)
    assert message.startswith("Pipeline rank 1 frees the allocator's cache on its way")
    assert "2 cudaMalloc retries" in message and "once, none in every step" in message
