"""Tests for prismbench.host_timing (host intervals from profiles) and the committed figures."""

import gzip
import json

import pytest

from emulator.costs.host_dispatch import CLASSES, FRAMEWORKS, from_figures
from prismbench.emulate import HOST_DISPATCH, host_dispatch_for, host_framework
from prismbench.host_timing import profile_figures, read_launch_gaps
from prismbench.spec import job_spec_from_dict


def _write(path, events):
    with gzip.open(path, "wt") as handle:
        for e in events:
            handle.write(json.dumps(e) + "\n")


def _launch(op, start, shapes=(), us=1.0):
    return {"op": op, "shapes": list(shapes), "kernels": [["k", us]], "cpu_start_us": start}


def test_ops_profile_phases_follow_the_op_names(tmp_path):
    events = [
        _launch("aten::fill_", 0.0),
        _launch("aten::gather", 10.0, [[8]]),
        _launch("aten::mm", 20.0),
        {"op": "void kernel<...>()", "shapes": [], "kernels": [], "cpu_start_us": 25.0},
        _launch("aten::nll_loss_backward", 1000.0),
        _launch("aten::mm", 1030.0),
        _launch("aten::gather", 1060.0, [[8]]),  # the forward of the next micro-batch
        _launch("aten::mm", 1070.0),
        _launch("aten::_foreach_mul_", 2000.0),
        _launch("aten::_foreach_add_", 2005.0),
    ]
    _write(tmp_path / "p.ops.jsonl.gz", events)
    gaps = read_launch_gaps(tmp_path / "p.ops.jsonl.gz")
    assert gaps.classes == ["forward"] * 3 + ["backward"] * 2 + ["forward"] * 2 + ["optimizer"] * 2
    figures = profile_figures(gaps)
    assert figures["per_op"]["forward"]["count"] == 3  # 10, 10 and 10 us
    assert figures["per_op"]["forward"]["mean_us"] == 10.0
    assert figures["per_op"]["backward"]["mean_us"] == 30.0
    assert figures["entry"]["backward"]["mean_us"] == 980.0
    assert figures["entry"]["optimizer"]["mean_us"] == 930.0
    assert figures["per_op"]["optimizer"]["p50_us"] == 5.0


def test_hostops_phases_follow_the_engine_and_optimizer_events(tmp_path):
    def cpu(op, start, dur, kernels=()):
        return {"op": op, "shapes": [], "cpu_us": dur, "self_cpu_us": dur,
                "kernels": [["k", 1.0] for _ in kernels], "cpu_start_us": start, "depth": None}  # fmt: skip

    events = [
        cpu("aten::mm", 0.0, 5.0, [1]),
        cpu("aten::view", 6.0, 1.0),
        cpu("autograd::engine::evaluate_function: MmBackward0", 100.0, 50.0),
        cpu("aten::mm", 110.0, 5.0, [1]),
        cpu("aten::mm", 130.0, 5.0, [1]),
        cpu("Optimizer.step#AdamW.step", 300.0, 50.0),
        cpu("aten::add_", 310.0, 5.0, [1]),
        cpu("aten::_foreach_norm", 250.0, 5.0, [1]),
    ]
    _write(tmp_path / "r.hostops.jsonl.gz", events)
    gaps = read_launch_gaps(tmp_path / "r.hostops.jsonl.gz")
    assert gaps.classes == ["forward", "backward", "backward", "optimizer", "optimizer"]
    assert gaps.gap_us.tolist() == [110.0, 20.0, 120.0, 60.0]


def test_committed_figures_load_for_every_framework():
    data = json.loads(HOST_DISPATCH.read_text())
    for framework in FRAMEWORKS:
        host = from_figures(data, framework)
        assert set(host.per_op_s) == set(CLASSES)
        # eager host cost per op: tens to a few hundred microseconds on the measured host
        assert all(10e-6 < v < 500e-6 for v in host.per_op_s.values())
        recorded = data["model"][framework]["per_op_us"]
        assert host.per_op_s == pytest.approx({c: v * 1e-6 for c, v in recorded.items()}, abs=1e-8)
    assert (
        from_figures(data, "dtensor").per_op_s["backward"]
        > from_figures(data, "aten").per_op_s["backward"]
    )


def test_tensor_parallel_jobs_pay_dtensor_dispatch():
    base = {
        "model": {"name": "gpt3-125m"},
        "batch": {"seq_len": 128, "micro_batch": 1, "global_batch": 1},
    }
    tp2 = base | {"parallel": {"tp": 2}, "cluster": {"gpus_per_node": 2}}
    assert host_framework(job_spec_from_dict(base)) == "aten"
    assert host_framework(job_spec_from_dict(tp2)) == "dtensor"
    assert host_dispatch_for(job_spec_from_dict(tp2)).framework == "dtensor"
    megatron = tp2 | {"kernels": {"framework": "megatron"}}
    assert host_framework(job_spec_from_dict(megatron)) == "aten"  # its own TP, plain tensors
    llmc = base | {"kernels": {"framework": "llm.c"}}
    assert host_dispatch_for(job_spec_from_dict(llmc)) is None  # kernels issued from C
