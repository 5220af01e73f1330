"""Tests for prismbench.explain: layout, parameter counts, FLOPs and model-state bytes."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from emulator.hardware import gpu_preset
from emulator.world.mesh import World
from prismbench.explain import (
    axis_placements,
    explain,
    explanation_to_dict,
    flops,
    layer_params,
    layout_nccl_communicators,
    model_state_bytes,
    stage_model_flops_per_gpu,
    total_params,
)
from prismbench.spec import job_spec_from_dict, load_job_spec
from workloads.config import ModelSpec
from workloads.flavors import FLAVORS, get_flavor, parameter_count

SLOW = pytest.mark.slow
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "jobspec.example.toml"


def _job(model=None, parallel=None, batch=None, train=None, cluster=None, kernels=None):
    tables = {
        "model": model or {"name": "llama-debug"},
        "parallel": parallel or {},
        "batch": batch or {"seq_len": 64, "global_batch": 8},
    }
    if train:
        tables["train"] = train
    if cluster:
        tables["cluster"] = cluster
    if kernels:
        tables["kernels"] = kernels
    return job_spec_from_dict(tables)


def _gpt(layers=4, hidden=64, heads=4, vocab=256):
    return ModelSpec(
        name="gpt-eq3", family="gpt", layers=layers, hidden=hidden, ffn_hidden=4 * hidden,
        heads=heads, kv_heads=heads, vocab=vocab, positions="learned",
    )  # fmt: skip


@pytest.fixture(scope="module")
def example():
    return explain(load_job_spec(EXAMPLE))


def test_example_world_layout(example):
    assert example.world_size == 8192
    assert example.mesh_shape == (256, 4, 1, 8)
    assert example.nodes == 1024
    assert example.microbatches_per_iteration == 1024 // 256
    assert example.tokens_per_iteration == 1024 * 8192
    assert [s.layers for s in example.stages] == [20, 20, 20, 20]


def test_example_llama3_70b_has_70_55_billion_params(example):
    assert round(example.params_total / 1e9, 2) == 70.55


def test_total_params_agrees_with_flavor_registry_for_every_flavor():
    mismatched = [n for n, spec in FLAVORS.items() if total_params(spec) != parameter_count(spec)]
    assert mismatched == []


def test_tp_and_pp_shards_add_up_to_total_plus_replicated_norms(example):
    m, tp = get_flavor("llama3-70b"), 8
    replicated_norms = m.layers * 2 * m.hidden + m.hidden  # RMSNorm weights on every tp rank
    summed = sum(s.params_per_tp_rank for s in example.stages) * tp
    assert summed == example.params_total + (tp - 1) * replicated_norms


def test_first_stage_holds_embedding_and_last_the_output(example):
    first, *middle, last = example.stages
    assert first.has_embedding and not first.has_output
    assert last.has_output and not last.has_embedding
    m = get_flavor("llama3-70b")
    # The last stage's extra over a middle stage is the vocab-sharded output plus the final norm.
    assert (
        last.params_per_tp_rank - middle[0].params_per_tp_rank == m.vocab // 8 * m.hidden + m.hidden
    )


def test_pipeline_split_unties_tied_embeddings():
    job = _job(model={"name": "gpt-debug"}, parallel={"pp": 2})
    stages = explain(job).stages
    m = get_flavor("gpt-debug")
    assert m.tie_embeddings
    assert sum(s.params_per_tp_rank for s in stages) == total_params(m) + m.vocab * m.hidden


def test_kv_projections_are_sharded_by_kv_heads():
    m = get_flavor("llama-debug")  # hidden 64, ffn 256, heads 4, kv_heads 2, head_dim 16
    # tp=2: wq, wo 64*32 each; one kv head (16 wide) each for wk, wv; ffn 3*64*128; two norms of 64.
    assert layer_params(m, tp=2) == 2 * 64 * 32 + 2 * 64 * 16 + 3 * 64 * 128 + 2 * 64


def test_hand_computed_stage_bytes_with_zero2():
    job = _job(parallel={"tp": 2, "dp": 2, "zero": 2})
    (stage,) = explain(job).stages
    # llama-debug per tp rank: layer = wq 2048 + wk 1024 + wv 1024 + wo 2048 + ffn 24576
    # + norms 128 = 30848; 4 layers = 123392; embedding 128*64 + output 128*64 + norm 64.
    assert stage.params_per_tp_rank == 139840
    # FSDP2 keeps fp32 parameters, gradients and moments sharded over dp: no master copy
    assert stage.weights_bytes == 4 * 69920 and stage.grads_bytes == 4 * 69920
    assert stage.master_weights_bytes == 0 and stage.optimizer_bytes == 8 * 69920


@pytest.mark.parametrize(
    ("precision", "zero", "expected"),
    [  # (weights, grads, master, moments) of 1000 parameters over dp*cp = 4
        ("bf16", 0, (2000, 4000, 4000, 8000)),  # distributed optimizer, fp32 main grads
        ("bf16", 1, (2000, 4000, 1000, 2000)),  # master and moments sharded
        ("bf16", 2, (1000, 1000, 0, 2000)),  # FSDP2: fp32 shards, no master copy
        ("bf16", 3, (1000, 1000, 0, 2000)),
        ("fp32", 0, (4000, 4000, 4000, 8000)),  # the master is a copy even for fp32
        ("fp32", 3, (1000, 1000, 0, 2000)),
    ],
)
def test_model_state_bytes_by_zero_stage(precision, zero, expected):
    assert model_state_bytes(1000, precision, zero, shard=4) == expected


def test_zero_sharding_rounds_up_and_one_rank_still_uses_fsdp():
    assert model_state_bytes(1001, "bf16", 3, shard=4) == (4 * 251, 4 * 251, 0, 8 * 251)
    # the captured program shards with FSDP2 over a one-rank mesh too: fp32 and unsharded
    assert model_state_bytes(1001, "bf16", 3, shard=1) == (4 * 1001, 4 * 1001, 0, 8008)


@pytest.mark.parametrize(
    "job",
    [
        {"parallel": {}, "train": {"precision": "bf16"}},
        {"parallel": {}, "train": {"precision": "fp32"}},
        {"parallel": {"dp": 2, "zero": 1}, "train": {"precision": "bf16"}},
        {"parallel": {"dp": 2, "zero": 3}, "train": {"precision": "bf16"}},
        # slow (CI runs tp, pp and cp inside tp2-dp2-pp2 and tp2-cp2; FSDP with dp2-fsdp)
        pytest.param({"parallel": {"tp": 2, "zero": 0}, "train": {"precision": "bf16"}}, marks=SLOW),
        pytest.param({"parallel": {"pp": 2}, "train": {"precision": "bf16"}}, marks=SLOW),
        pytest.param({"parallel": {"zero": 3}, "train": {"precision": "bf16"}}, marks=SLOW),
        {"parallel": {}, "train": {"precision": "fp8"}},  # fp8 GEMMs, bf16 weights
        {
            "parallel": {},
            "train": {"precision": "bf16"},
            "kernels": {"grad_accumulation": "model-dtype"},
        },
        pytest.param({"parallel": {"cp": 2}, "train": {"precision": "bf16"}}, marks=SLOW),
        {"parallel": {"tp": 2, "cp": 2}, "train": {"precision": "bf16"}},
        {"parallel": {"tp": 2, "dp": 2, "pp": 2}, "train": {"precision": "bf16"}},
        # a pipeline unties the tied embeddings: its ends make an embedding group of their own
        {"model": {"name": "gpt-debug"}, "parallel": {"pp": 2}, "train": {"precision": "bf16"}},
    ],
    ids=[
        "one-rank-bf16",
        "one-rank-fp32",
        "dp2-zero1",
        "dp2-fsdp",
        "tp2",
        "pp2",
        "one-rank-fsdp",
        "one-rank-fp8",
        "model-dtype-grads",
        "cp2",
        "tp2-cp2",
        "tp2-dp2-pp2",
        "tied-pp2",
    ],
)
def test_explain_counts_what_the_capture_declares(job):
    """explain's model state per pipeline rank against the bytes the program declares before
    the iteration (parameters, gradient buffer, master weights, optimizer state), and its NCCL
    communicators against those the program made."""
    from emulator.capture.trace import ALLOC
    from emulator.memory.outside import nccl_communicators
    from prismbench.capture import capture_job

    spec = _job(
        job.get("model"), parallel=job["parallel"], train=job["train"], kernels=job.get("kernels")
    )
    captured = capture_job(spec, workers=1)
    declared = ("parameter", "buffer", "gradient", "master_weights", "optimizer_state")
    for stage in explain(spec).stages:
        trace = captured.traces[stage.pp_rank]
        c = trace.columns
        rows = np.flatnonzero((c["phase"] < 0) & (c["kind"] == ALLOC))
        names = np.array([trace.strings[i] for i in c["category"][rows]])
        held = {n: int(c["size_bytes"][rows[names == n]].sum()) for n in declared}
        assert held["parameter"] == stage.weights_bytes
        assert held["buffer"] == 0  # the workloads register none, so explain counts none
        assert held["master_weights"] == stage.master_weights_bytes
        if spec.parallel.zero >= 2:  # FSDP2 makes gradients in backward; zero_grad frees them
            assert held["gradient"] == 0 and stage.grads_bytes == stage.weights_bytes
        else:  # the distributed optimizer's persistent fp32 buffer
            assert held["gradient"] == stage.grads_bytes
        # beyond the moments: AdamW's step counter, a few bytes per tensor it steps
        tensors = int((names == "parameter").sum())
        assert 0 < held["optimizer_state"] - stage.optimizer_bytes <= 8 * tensors
        p = spec.parallel
        end = stage.has_embedding or stage.has_output
        tied = spec.model.tie_embeddings and p.pp > 1 and end
        assert nccl_communicators(trace) == layout_nccl_communicators(
            p.tp, p.pp, p.cp, p.dp, embedding_group=tied
        )


def test_zero3_shards_over_dp_times_cp():
    job = _job(parallel={"dp": 2, "cp": 2, "zero": 3})
    e = explain(job)
    assert e.dp_shard_group == 4
    (stage,) = e.stages
    assert stage.params_per_rank == -(-stage.params_per_tp_rank // 4)


def test_hardware_flops_with_full_recompute_equal_narayanan_eq3():
    m = _gpt(layers=24, hidden=2304, heads=24, vocab=51200)
    batch, s = 512, 2048
    f = flops(m, seq_len=s, tokens=batch * s, recompute="full", world_size=32)
    n, h, v = m.layers, m.hidden, m.vocab
    eq3 = 96 * batch * s * n * h * h * (1 + Fraction(s, 6 * h) + Fraction(v, 16 * n * h))
    assert f.hardware_flops_per_iteration == eq3


def test_model_flops_drop_the_recompute_forward():
    m = _gpt()
    batch, s = 3, 32
    n, h, v = m.layers, m.hidden, m.vocab
    f = flops(m, seq_len=s, tokens=batch * s, recompute="full", world_size=1)
    # Korthikanti et al. 2022 model FLOPs: 72*B*s*l*h^2*(1 + s/(6h) + V/(12*l*h)).
    expected = 72 * batch * s * n * h * h * (1 + Fraction(s, 6 * h) + Fraction(v, 12 * n * h))
    assert f.model_flops_per_iteration == expected


def test_selective_recompute_adds_only_the_attention_core_forward():
    m = _gpt()
    batch, s = 2, 32
    none, selective = (
        flops(m, seq_len=s, tokens=batch * s, recompute=r, world_size=1)
        for r in ("none", "selective")
    )
    assert none.hardware_flops_per_iteration == none.model_flops_per_iteration
    extra = selective.hardware_flops_per_iteration - none.hardware_flops_per_iteration
    assert extra == 4 * batch * s * s * m.layers * m.hidden


def test_gqa_reduces_forward_flops_by_the_smaller_kv_projections():
    mha = ModelSpec(name="a", family="llama", layers=2, hidden=64, ffn_hidden=128, heads=4,
                    kv_heads=4, vocab=100, positions="rope")  # fmt: skip
    gqa = ModelSpec(name="b", family="llama", layers=2, hidden=64, ffn_hidden=128, heads=4,
                    kv_heads=1, vocab=100, positions="rope")  # fmt: skip
    diff = (
        flops(mha, seq_len=8, tokens=8, recompute="none", world_size=1).forward_flops_per_token
        - flops(gqa, seq_len=8, tokens=8, recompute="none", world_size=1).forward_flops_per_token
    )
    assert diff == 2 * 2 * (2 * 64 * (64 - 16))  # 2 FLOPs/MAC x 2 layers x (wk + wv) shrink


def test_axis_placement_marks_groups_that_leave_the_node():
    dp, pp, cp, tp = axis_placements(World.grid(dp=4, pp=1, cp=4, tp=4, gpus_per_node=8))
    assert tp.intra_node and tp.stride == 1
    assert not cp.intra_node and cp.stride == 4 and cp.max_nodes_per_group == 2
    assert pp.intra_node  # size 1
    assert not dp.intra_node and dp.max_nodes_per_group == 4
    # tp 3 on 8-GPU nodes: rank 0's group fits in node 0, the group of ranks 6-8 does not
    (_, _, _, tp3) = axis_placements(World.grid(dp=4, pp=1, cp=1, tp=3, gpus_per_node=8))
    assert not tp3.intra_node and tp3.max_nodes_per_group == 2


def test_interleaved_stages_follow_the_torch_convention():
    model = {"family": "llama", "layers": 6, "hidden": 64, "ffn_hidden": 128, "heads": 4,
             "vocab": 100}  # fmt: skip
    job = _job(model=model, parallel={"pp": 2, "vpp": 2, "schedule": "interleaved-1f1b"})
    r0, r1 = explain(job).stages
    assert r0.virtual_stages == (0, 2) and r0.layers_per_virtual_stage == (1, 2)
    assert r1.virtual_stages == (1, 3) and r1.layers_per_virtual_stage == (2, 1)
    assert r0.has_embedding and not r0.has_output and r1.has_output


def test_stage_model_flops_split_the_job_s_by_layers_and_the_logits_go_last():
    model = {"family": "llama", "layers": 6, "hidden": 64, "ffn_hidden": 128, "heads": 4,
             "vocab": 100}  # fmt: skip
    job = _job(model=model, parallel={"pp": 2, "vpp": 2, "dp": 2, "schedule": "interleaved-1f1b"})
    e = explain(job)
    r0, r1 = stage_model_flops_per_gpu(e)  # 3 layers each; rank 1 holds the output layer
    tokens, f = e.tokens_per_iteration, e.flops
    logits = 3 * tokens * f.logits_flops_per_token / 2  # 2 GPUs per pipeline rank (dp 2)
    assert r1 - r0 == pytest.approx(logits)
    assert 2 * (r0 + r1) == pytest.approx(f.model_flops_per_iteration)


def test_dict_form_holds_raw_numbers(example):
    data = explanation_to_dict(example)
    assert data["world_size"] == 8192
    assert data["stages"][0]["model_state_bytes"] == example.stages[0].model_state_bytes
    assert data["flops"]["model_flops_per_iteration"] == example.flops.model_flops_per_iteration


def test_memory_outside_the_allocator_is_the_worst_captured_stages():
    """With tied embeddings split by a pipeline, its ends make an embedding group more than the
    mesh's: explain's figure is theirs, as emulate's replay counts it from the capture."""
    from emulator.memory.outside import outside_memory
    from prismbench.capture import capture_job

    job = _job({"name": "gpt-debug"}, parallel={"pp": 2})
    arch = gpu_preset(job.cluster.gpu).arch
    captured = capture_job(job, workers=1)
    outside = [outside_memory(t, arch).total_bytes for t in captured.traces.values()]
    assert explain(job).gpu.outside_allocator_bytes == max(outside)


def test_gpu_fit_compares_model_state_with_what_the_allocator_may_hold_and_peak(example):
    fit = example.gpu
    assert fit.hbm_capacity_bytes == 80 * 1024**3  # h100-sxm-80g preset, nominal
    assert fit.usable_capacity_bytes == gpu_preset("h100-sxm-80g").usable_capacity_bytes
    # Hopper's CUDA context and NCCL setup, then 16 channels x (4 MiB + 512 KiB + 4800 KiB) for
    # each of tp8, pp4 and dp256's communicators (none spans the 8192-GPU world)
    buffers = 3 * 16 * (4 * 1024**2 + 512 * 1024 + 4800 * 1024)
    assert fit.outside_allocator_bytes == 804_061_184 + 585_105_408 + buffers
    assert fit.allocator_limit_bytes == fit.usable_capacity_bytes - fit.outside_allocator_bytes
    assert fit.model_state_fraction_of_allocator_limit == (
        example.max_model_state_bytes / fit.allocator_limit_bytes
    )
    assert fit.iteration_time_at_peak_s == pytest.approx(
        example.flops.hardware_flops_per_gpu / (fit.peak_dense_tflops * 1e12)
    )
