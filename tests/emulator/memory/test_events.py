"""What the memory replay allocates beside the trace's tensors (emulator.memory.events)."""

from emulator.capture.trace import ALLOC, COMPUTE, FREE, PHASES, OpEvent, build_trace
from emulator.memory import replay_memory
from emulator.memory.events import KERNEL_WORKSPACE_CATEGORY

MiB = 1 << 20
FORWARD, BACKWARD = PHASES.index("forward"), PHASES.index("backward")


def attention_step(scratch_bytes: int):
    """40 MiB of parameters; forward keeps 64 MiB of activations; the attention backward
    allocates its 32 MiB of gradients, then runs with `scratch_bytes` of its own scratch;
    backward then frees the activations and the gradients."""
    events, seq = [], iter(range(100))

    def row(kind, phase, name="", **kw):
        events.append(OpEvent(next(seq), kind, name, "", 0, "attn", phase, 0, **kw))

    row(ALLOC, -1, size_bytes=40 * MiB, storage=0, category="parameter")
    row(COMPUTE, FORWARD, "flash_attn_fwd")
    row(ALLOC, FORWARD, size_bytes=64 * MiB, storage=1, category="activation")
    row(ALLOC, BACKWARD, size_bytes=32 * MiB, storage=2, category="gradient")
    row(COMPUTE, BACKWARD, "flash_attn_bwd", workspace_bytes=scratch_bytes)
    row(FREE, BACKWARD, size_bytes=64 * MiB, storage=1)
    row(FREE, BACKWARD, size_bytes=32 * MiB, storage=2)
    return build_trace(events)


def test_a_kernels_scratch_is_live_while_it_runs_and_freed_after():
    r = replay_memory(attention_step(100 * MiB))
    assert r.peak_allocated_bytes == (40 + 64 + 32 + 100) * MiB
    assert r.live_at_peak_by_category[KERNEL_WORKSPACE_CATEGORY] == 100 * MiB
    assert r.peak.phase == "backward"
    # freed when the op returns: the steady iterations reuse its segment, none is added
    assert r.steady_converged and r.peak_reserved_bytes == r.first_iteration_peak_reserved_bytes
    assert r.timeline.allocated[-1] == 40 * MiB


def test_without_workspaces_the_scratch_is_not_allocated():
    r = replay_memory(attention_step(100 * MiB), workspaces=False)
    assert r.peak_allocated_bytes == (40 + 64 + 32) * MiB
    assert KERNEL_WORKSPACE_CATEGORY not in r.live_at_peak_by_category


def test_an_op_without_scratch_allocates_nothing_more():
    assert replay_memory(attention_step(0)).peak_allocated_bytes == (40 + 64 + 32) * MiB
