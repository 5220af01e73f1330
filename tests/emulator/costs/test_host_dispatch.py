"""Tests for emulator.costs.host_dispatch: per-row host time, figure loading and validation."""

import numpy as np
import pytest

from emulator.capture.compile_fusion import block_region
from emulator.costs.host_dispatch import (
    COMPILED_GRAPH_S,
    COMPILED_KERNEL_S,
    HostDispatch,
    dispatch_times_s,
    from_figures,
    kernel_gap_from_figures,
)
from emulator.world.mesh import World
from tests.emulator.synthetic_traces import Stage

HOST = HostDispatch(
    per_op_s={"forward": 1.0, "backward": 2.0, "optimizer": 3.0},
    entry_s={"forward": 10.0, "backward": 20.0, "optimizer": 30.0},
)


def test_rows_pay_their_class_and_phase_entries():
    world = World.grid(dp=2, pp=1, cp=1, tp=1)
    s = Stage(world, 0)
    s.compute(1.0, phase="forward")
    s.compute(1.0, phase="forward")
    s.compute(1.0, phase="backward")
    s.compute(1.0, phase="recompute")  # on autograd's engine thread: a backward op
    s.collective("all_reduce", "dp", async_op=True)  # a call of the backward phase
    s.compute(1.0, phase="optimizer")
    trace, _ = s.trace()
    out = dispatch_times_s(trace, HOST)
    comm_row = int(np.flatnonzero(trace["kind"] == 1)[0])
    assert out[comm_row] == 2.0  # a comm row takes the phase of the op before it (recompute)
    compute = out[trace["kind"] == 0]
    assert compute.tolist() == [1.0, 1.0, 20.0, 2.0, 30.0]


def test_rows_that_issue_nothing_cost_nothing():
    world = World.grid(dp=2, pp=1, cp=1, tp=1)
    s = Stage(world, 0)
    h = s.collective("all_reduce", "dp", async_op=True)
    s.wait(h)
    trace, _ = s.trace()
    out = dispatch_times_s(trace, HOST)
    assert out[trace["kind"] != 1].tolist() == [0.0]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"per_op_s": {"forward": 1.0, "backward": 1.0}}, "classes"),
        ({"entry_s": {"forward": -1.0, "backward": 0.0, "optimizer": 0.0}}, ">= 0"),
        ({"framework": "jax"}, "framework"),
    ],
)
def test_bad_figures_are_refused(change, message):
    args = dict(per_op_s=HOST.per_op_s, entry_s=HOST.entry_s) | change
    with pytest.raises(ValueError, match=message):
        HostDispatch(**args)


def _profile(framework, forward_us, entry_us=100.0):
    summary = {"count": 3, "mean_us": forward_us}
    entry = {"count": 1, "mean_us": entry_us}
    return {
        "framework": framework,
        "per_op": {"forward": summary, "backward": summary, "optimizer": {"count": 0}},
        "entry": {"forward": {"count": 0}, "backward": entry, "optimizer": entry},
    }


def test_figures_are_medians_over_profiles_over_the_global_inflation():
    data = {
        "profiles": {"a": _profile("aten", 10.0), "b": _profile("aten", 20.0),
                     "c": _profile("aten", 60.0), "d": _profile("dtensor", 999.0)},
        "profiler_inflation": {"a": {"ratio": 1.0}, "d": {"ratio": 4.0}},
    }  # fmt: skip
    host = from_figures(data, "aten")
    assert host.per_op_s["forward"] == pytest.approx(20e-6 / 2.0)  # geometric mean of 1 and 4
    assert host.per_op_s["optimizer"] == 0.0  # no measurement: the class binds nothing
    assert host.entry_s["backward"] == pytest.approx(100e-6 / 2.0)
    left_out = from_figures(data, "aten", skip_profiles=("c", "d"))
    assert left_out.per_op_s["forward"] == pytest.approx(15e-6)
    with pytest.raises(ValueError, match="no dtensor profile left"):
        from_figures(data, "dtensor", skip_profiles=("d",))


def test_the_kernel_gap_is_the_median_over_gpu_bound_profiles():
    def gap(us, gpu_bound=True):
        return {"gap_us_per_kernel": us, "gpu_bound": gpu_bound}

    data = {"kernel_gap": {"profiles": {"a": gap(2.0), "b": gap(3.0), "c": gap(1.0),
                                        "host-bound": gap(17.0, gpu_bound=False)}}}  # fmt: skip
    assert kernel_gap_from_figures(data) == pytest.approx(2e-6)
    assert kernel_gap_from_figures(data, skip_profiles=("c",)) == pytest.approx(2.5e-6)
    with pytest.raises(ValueError, match="no GPU-bound profile left"):
        kernel_gap_from_figures(data, skip_profiles=("a", "b", "c"))


def test_rows_of_a_compiled_block_pay_inductors_launch_not_the_dispatcher():
    world = World.grid(dp=2, pp=1, cp=1, tp=1)
    s = Stage(world, 0)
    s.compute(1.0, phase="forward", module="model.tok_embeddings")  # eager
    for name in ("elementwise", "mm", "elementwise"):  # one compiled graph's kernels
        s.compute(1.0, name=name, phase="forward", module="model.layers.0.attention")
    s.compute(1.0, phase="forward", module="model.layers.1.feed_forward")  # the next block
    s.compute(1.0, phase="backward", module="model.layers.1.feed_forward")  # its backward graph
    s.compute(1.0, phase="backward", module="model.norm")  # eager again
    trace, _ = s.trace()
    compiled = dispatch_times_s(trace, HOST, compiled_region=block_region("layers"))
    assert compiled[trace["kind"] == 0].tolist() == [
        1.0,
        COMPILED_GRAPH_S, COMPILED_KERNEL_S, COMPILED_KERNEL_S,
        COMPILED_GRAPH_S,
        COMPILED_GRAPH_S,
        2.0,
    ]  # fmt: skip
    eager = dispatch_times_s(trace, HOST)  # the same rows when nothing is compiled
    assert eager[trace["kind"] == 0].tolist() == [1.0, 1.0, 1.0, 1.0, 1.0, 20.0, 2.0]
