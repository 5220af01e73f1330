"""What the memory replay allocates beside the trace's tensors (emulator.memory.events)."""

from emulator.capture.trace import ALLOC, COMPUTE, FREE, PHASES, OpEvent, build_trace
from emulator.memory import replay_memory
from emulator.memory.events import KERNEL_WORKSPACE_CATEGORY
from emulator.memory.outside import CUBLAS_WORKSPACE_BYTES, CUBLASLT_WORKSPACE_BYTES
from emulator.units import MiB

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


def matmul_step(*rows):
    """A trace of compute rows (name, phase, tensors) and nothing else."""
    events = [
        OpEvent(seq, COMPUTE, name, "", 0, "linear", phase, 0, tensors=tensors)
        for seq, (name, phase, tensors) in enumerate(rows)
    ]
    return build_trace(events)


BIAS_ADDMM = ((8,), "bfloat16", False), ((4, 16), "bfloat16", False), ((16, 8), "bfloat16", False)
FULL_ADDMM = ((4, 8), "bfloat16", False), ((4, 16), "bfloat16", False), ((16, 8), "bfloat16", False)
RECOMPUTE = PHASES.index("recompute")


def test_cublaslt_workspace_per_thread_at_its_first_biased_addmm_or_scaled_mm():
    cublas, cublaslt = CUBLAS_WORKSPACE_BYTES["hopper"], CUBLASLT_WORKSPACE_BYTES
    step = matmul_step(
        ("addmm", FORWARD, BIAS_ADDMM),  # main thread: cuBLAS + cuBLASLt workspaces
        ("addmm", FORWARD, BIAS_ADDMM),  # nothing new
        ("mm", BACKWARD, ()),  # autograd's thread: its cuBLAS workspace only
        ("addmm", RECOMPUTE, BIAS_ADDMM),  # the recompute's biased linear: its cuBLASLt one
    )
    r = replay_memory(step, gpu="h100-sxm-80g")
    assert r.peak_allocated_bytes == 2 * cublas + 2 * cublaslt
    plain = matmul_step(("addmm", FORWARD, FULL_ADDMM), ("mm", BACKWARD, ()))  # cuBLAS only
    assert replay_memory(plain, gpu="h100-sxm-80g").peak_allocated_bytes == 2 * cublas
    fp8 = matmul_step(("scaled_mm", FORWARD, ()), ("scaled_mm", BACKWARD, ()))
    assert replay_memory(fp8, gpu="h100-sxm-80g").peak_allocated_bytes == 2 * (cublas + cublaslt)
    assert replay_memory(step, gpu="h100-sxm-80g", workspaces=False).peak_allocated_bytes == 0
