"""Tests for prismbench/capture.py and program.py: captures of the real workload.

Collective counts per parallel mode (what the configuration implies), the class claim on
the real workload, coverage of every parallel option, FLOPs against `explain`, a
131 072-rank job, and the `prismbench capture` command. Jobs are debug flavors (4 layers,
hidden 64), captured in this process (`workers=1`).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import types
from pathlib import Path

import numpy as np
import pytest

import workloads.zero
from emulator.capture.rank import capture_rank
from emulator.capture.trace import COMPUTE, SCHEMA_VERSION, RankTrace
from prismbench.capture import capture_job, world_of, write_capture
from prismbench.cli import main
from prismbench.explain import explain
from prismbench.program import rank_program
from prismbench.spec import job_spec_from_dict
from tests.cases import case_params
from tests.prismbench.capture_cases import (
    capture,
    comm_rows,
    count,
    debug_job,
    first_difference,
    last_backward_row,
    normalised,
)
from workloads.kernels import KernelsSpec

LAYERS = 4  # llama-debug and gpt-debug
TP, DP, PP, CP = ("tp",), ("dp",), ("pp",), ("cp",)


def rows_of(capture_result, class_id=0):
    world = capture_result.world
    return comm_rows(capture_result.traces[class_id], world, world.representative(class_id))


def layer_rows(rows, layer):
    return [r for r in rows if f".layers.{layer}." in r.module + "." and r.phase == "forward"]


# ---- FSDP (zero 3 / zero 2) ---------------------------------------------------------------


@pytest.fixture(scope="module")
def fsdp3():
    return capture(debug_job({"dp": 2, "zero": 3}, global_batch=4))


def test_fsdp_zero3_all_gathers_every_unit_once_per_forward(fsdp3):
    rows = rows_of(fsdp3)
    for mb in (0, 1):
        ags = [
            r
            for r in rows
            if r.kind == "all_gather" and r.phase == "forward" and r.micro_batch == mb
        ]
        # units: each TransformerBlock and the root (embedding, final norm, output)
        assert sorted(r.module for r in ags) == ["FSDPLlama"] + [
            f"FSDPLlama.layers.{i}" for i in range(LAYERS)
        ]
        assert {r.axes for r in ags} == {DP}


def test_fsdp_zero3_regathers_every_unit_in_backward_root_included(fsdp3):
    # FSDP2 keeps the root unsharded after forward only when reshard_after_forward is left
    # None (torch 2.13 _fsdp_state._lazy_init: `_auto_reshard_after_forward`); apply_fsdp
    # passes True explicitly, so the root is resharded and all-gathered again in backward:
    # LAYERS + 1 backward all-gathers per micro-batch.
    rows = rows_of(fsdp3)
    for mb in (0, 1):
        assert (
            count(rows, kind="all_gather", axes=DP, phase="backward", micro_batch=mb) == LAYERS + 1
        )


def test_fsdp_reduce_scatters_every_unit_every_micro_batch(fsdp3):
    # train_step never calls set_requires_gradient_sync(False), so FSDP2 reduce-scatters
    # each unit's gradient in every micro-batch's backward, not only the last one's.
    rows = rows_of(fsdp3)
    for mb in (0, 1):
        assert (
            count(rows, kind="reduce_scatter", axes=DP, phase="backward", micro_batch=mb)
            == LAYERS + 1
        )
    assert count(rows, kind="reduce_scatter") == 2 * (LAYERS + 1)
    # the step: one all-reduce of the DTensor gradient norm over dp, nothing else
    step = [r for r in rows if r.index > last_backward_row(fsdp3.traces[0])]
    assert [(r.kind, r.axes) for r in step] == [("all_reduce", DP)]


def test_fsdp_zero2_keeps_parameters_between_forward_and_backward():
    rows = rows_of(capture(debug_job({"dp": 2, "zero": 2}, global_batch=4)))
    for mb in (0, 1):
        # the post-backward reshard frees them, so every forward gathers all units again
        assert (
            count(rows, kind="all_gather", axes=DP, phase="forward", micro_batch=mb) == LAYERS + 1
        )
        assert (
            count(rows, kind="reduce_scatter", axes=DP, phase="backward", micro_batch=mb)
            == LAYERS + 1
        )
    assert count(rows, kind="all_gather", phase="backward") == 0


@pytest.mark.parametrize(
    "reshard, gathered_again",
    [
        ("all", LAYERS + 1),
        # llm-foundry: FSDP1 never frees the root (embedding, final norm, output) after forward
        # (slow: CI runs the values on either side of it)
        pytest.param("not-root", LAYERS, marks=pytest.mark.slow),
        # torchtitan, Dec 2024: nor the last block, whose parameters backward needs first
        ("not-root-or-last", LAYERS - 1),
        # torchtitan under pipeline parallelism: no unit (zero 2's program)
        ("none", 0),
    ],
)
def test_fsdp_reshard_says_which_units_backward_gathers_again(reshard, gathered_again):
    # kernels.fsdp_reshard: the units that free their parameters after forward are gathered
    # again in backward; post-backward frees every unit, so each forward gathers all of them
    job = debug_job({"dp": 2, "zero": 3}, global_batch=4)
    job = dataclasses.replace(job, kernels=dataclasses.replace(job.kernels, fsdp_reshard=reshard))
    rows = rows_of(capture(job))
    for mb in (0, 1):
        assert (
            count(rows, kind="all_gather", axes=DP, phase="backward", micro_batch=mb)
            == gathered_again
        )
        assert (
            count(rows, kind="all_gather", axes=DP, phase="forward", micro_batch=mb) == LAYERS + 1
        )


# ---- tensor parallelism ---------------------------------------------------------------------


@pytest.mark.parametrize("model", ["llama-debug", "gpt-debug"])
def test_tp_with_sequence_parallel_matches_megatron_per_layer(model):
    cap = capture(debug_job({"tp": 2}, model=model, global_batch=1))
    rows = rows_of(cap)
    assert {r.axes for r in rows} == {TP}
    # Korthikanti et al. 2022 Sec. 4.2.2: per layer 2 all-gathers + 2 reduce-scatters forward
    for layer in range(LAYERS):
        mine = layer_rows(rows, layer)
        assert sorted(r.kind for r in mine) == ["all_gather"] * 2 + ["reduce_scatter"] * 2
    # outside the layers, forward: the vocab-parallel embedding's reduce-scatter to sequence
    # shards, the all-gather of the final norm's output for the column-parallel output
    # layer, and the vocab-parallel cross-entropy's 3 all-reduces (max, target, sum of exp)
    assert count(rows, kind="all_gather", phase="forward") == 2 * LAYERS + 1
    assert count(rows, kind="reduce_scatter", phase="forward") == 2 * LAYERS + 1
    assert count(rows, kind="all_reduce", phase="forward", micro_batch=0) == 3
    # backward: each collective's transpose (backward comms fall between modules, so they
    # are counted per trace, not per module): 2 + 2 per layer plus the ends' two
    assert count(rows, kind="all_gather", phase="backward") == 2 * LAYERS + 1
    assert count(rows, kind="reduce_scatter", phase="backward") == 2 * LAYERS + 1
    assert count(rows, kind="all_reduce", phase="backward") == 0
    # the step: the norm weights' Partial gradients summed over tp, and the grad norm
    step = [r.kind for r in rows if r.index > last_backward_row(cap.traces[0])]
    assert step == ["all_reduce", "all_reduce"]
    assert count(rows, kind="all_reduce", phase="optimizer") == 2


def test_tensorwise_fp8_gathers_the_block_inputs_as_float8():
    # torchtitan's float8 TP plan (workloads.float8): a block input is cast on its sequence
    # shard and all-gathered as float8, one byte per element where bf16 takes two
    def forward_gathers(precision):
        job = job_spec_from_dict({
            "model": {"name": "llama-debug"}, "parallel": {"tp": 2},
            "batch": {"seq_len": 32, "micro_batch": 1, "global_batch": 1},
            "train": {"precision": precision}, "kernels": {"framework": "torchtitan"},
        })  # fmt: skip
        rows = layer_rows(rows_of(capture(job)), 0)
        return [r.size_bytes for r in rows if r.kind == "all_gather"]

    bf16, fp8 = forward_gathers("bf16"), forward_gathers("fp8")
    assert len(bf16) == len(fp8) == 2
    assert fp8 == [size // 2 for size in bf16]


@pytest.mark.slow  # ~15-25 s on 2 cores: an fp8 capture of its own, beside the one above
def test_a_block_part_with_a_linear_left_in_bf16_gathers_bf16():
    # head dim 12: wk and wv are 48 x 24, not a multiple of 16, so they stay plain linears
    # (workloads.float8) and the attention's input is gathered in bf16; the MLP's in float8
    job = job_spec_from_dict({
        "model": {"name": "llama-debug", "hidden": 48, "heads": 4, "kv_heads": 2},
        "parallel": {"tp": 2}, "batch": {"seq_len": 32, "micro_batch": 1, "global_batch": 1},
        "train": {"precision": "fp8"}, "kernels": {"framework": "torchtitan"},
    })  # fmt: skip
    rows = layer_rows(rows_of(capture(job)), 0)
    bf16_gather = 32 * 48 * 2  # the whole sequence of the block input, 2 bytes an element
    assert [r.size_bytes for r in rows if r.kind == "all_gather"] == [bf16_gather, bf16_gather // 2]


def test_dtensor_shape_propagation_adds_no_kernels_to_the_first_micro_batch():
    # DTensor runs each new sharding once on fake tensors to learn the output's shape; on a
    # GPU that costs no kernel, so micro-batch 0's layers compute exactly what micro-batch
    # 1's do (outside the layers the loss bookkeeping differs between micro-batches)
    trace = capture(debug_job({"tp": 2}, global_batch=2)).traces[0]
    c = trace.columns
    forward = (c["kind"] == COMPUTE) & (trace["phase"] == 0)

    def ops(micro_batch):
        rows = np.flatnonzero(forward & (c["micro_batch"] == micro_batch))
        named = [
            (trace.strings[c["module"][i]], trace.strings[c["name"][i]], c["flops"][i])
            for i in rows
        ]
        return [(name, int(flops)) for module, name, flops in named if ".layers." in module]

    assert ops(0) and ops(0) == ops(1)


@pytest.fixture(scope="module")
def tp_no_sp():
    job = debug_job({"tp": 2, "sequence_parallel": False}, global_batch=1)
    return capture(job)


def test_tp_without_sequence_parallel_all_reduces_twice_per_layer_forward(tp_no_sp):
    rows = rows_of(tp_no_sp)
    assert {(r.kind, r.axes) for r in rows} == {("all_reduce", TP)}
    for layer in range(LAYERS):  # attention.wo and feed_forward.w2 (row-parallel outputs)
        assert len(layer_rows(rows, layer)) == 2
    # + the vocab-parallel embedding's partial sums and the cross-entropy's 3
    assert count(rows, phase="forward") == 2 * LAYERS + 1 + 3
    step = [r.kind for r in rows if r.index > last_backward_row(tp_no_sp.traces[0])]
    assert step == ["all_reduce"]  # the grad norm (replicated norm weights need no sum)


def test_tp_without_sequence_parallel_all_reduces_twice_per_layer_backward(tp_no_sp):
    rows = rows_of(tp_no_sp)
    # Megatron's f operator: one all-reduce of the attention input's gradient and one of
    # the MLP input's per layer, plus the output layer's input
    assert count(rows, phase="backward") == 2 * LAYERS + 1


# ---- data parallelism, zero 0 and 1 ---------------------------------------------------------


def _capture_with_buckets(job, monkeypatch, bucket_bytes):
    """Rank 0's trace and the number of gradient buckets its DistributedOptimizer made."""
    monkeypatch.setattr(workloads.zero, "default_bucket_bytes", lambda **_: bucket_bytes)
    program = rank_program(job)
    seen = {}

    def build(context):
        built = program.build(context)
        seen["buckets"] = len(built[0].optimizer.buckets)
        return built

    trace = capture_rank(0, job.world_size, dataclasses.replace(program, build=build))
    return trace, seen["buckets"]


@pytest.mark.parametrize("zero", [0, 1])
def test_dp_reduces_each_bucket_once_in_the_last_micro_batch(monkeypatch, zero):
    job = debug_job({"dp": 2, "zero": zero}, global_batch=4)
    trace, buckets = _capture_with_buckets(job, monkeypatch, 256 * 1024)
    assert buckets > 3  # small buckets: several per model
    world = world_of(job)
    rows = comm_rows(trace, world, 0)
    kind = "all_reduce" if zero == 0 else "reduce_scatter"
    # launched by the post-accumulate-grad hooks once the last micro-batch's grads arrived
    assert count(rows, kind=kind, axes=DP, phase="backward", micro_batch=1) == buckets
    assert count(rows, kind=kind) == buckets
    step = [(r.kind, r.axes) for r in rows if r.index > last_backward_row(trace)]
    if zero == 0:
        assert step == []  # every rank steps on all of it: no norm or gather over dp
    else:  # the sharded norm summed over dp, then each bucket's updated shard gathered
        assert step == [("all_reduce", DP)] + [("all_gather", DP)] * buckets


# ---- pipeline parallelism -------------------------------------------------------------------


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_pp_stages_send_activations_forward_and_gradients_back(schedule):
    m = 4
    cap = capture(debug_job({"pp": 2, "schedule": schedule}, global_batch=m))
    first, last = rows_of(cap, 0), rows_of(cap, 1)
    nxt, prev = (0, 1, 0, 0), (0, -1, 0, 0)
    # stage 0: m activations to stage 1, m gradients back from it; stage 1 the mirror
    assert count(first, kind="send", axes=PP, peer=nxt) == m
    assert count(first, kind="recv", axes=PP, peer=nxt) == m
    assert count(last, kind="recv", axes=PP, peer=prev) == m
    assert count(last, kind="send", axes=PP, peer=prev) == m
    for rows in (first, last):  # + the grad norm summed over stages
        assert len(rows) == 2 * m + 1
        assert count(rows, kind="all_reduce", axes=PP) == 1


def test_interleaved_pp_sends_across_every_virtual_stage_boundary():
    m, pp, vpp = 4, 2, 2
    cap = capture(debug_job({"pp": pp, "vpp": vpp, "schedule": "interleaved-1f1b"}, global_batch=m))
    stages = pp * vpp
    for class_id, held in cap.world.classes().items():
        rows = rows_of(cap, class_id)
        # per held virtual stage: m activations out unless last, m gradients out unless first
        expected = sum(m * ((s < stages - 1) + (s > 0)) for s in held.virtual_stages)
        assert count(rows, kind="send", axes=PP) == expected
        assert count(rows, kind="recv", axes=PP) == expected


@pytest.mark.parametrize(  # CI: with sequence parallelism (~20 s a case on 2 cores)
    "sequence_parallel", [pytest.param(False, marks=pytest.mark.slow), True]
)
def test_megatron_sends_each_tp_rank_its_slice_and_gathers_it_on_receive(sequence_parallel):
    m, tp = 4, 2

    def stage_rows(transfer):
        job = job_spec_from_dict(
            {
                "model": {"name": "llama-debug"},
                "parallel": {"pp": 2, "tp": tp, "sequence_parallel": sequence_parallel},
                "batch": {"seq_len": 32, "micro_batch": 1, "global_batch": m},
                "kernels": {"framework": "megatron", "pipeline_transfer": transfer},
            }
        )
        cap = capture(job)
        return [rows_of(cap, class_id) for class_id in (0, 1)]

    whole, split = stage_rows("whole"), stage_rows("scatter-gather")
    for whole_rows, split_rows in zip(whole, split, strict=True):
        p2p = [r for r in whole_rows if r.axes == PP and r.kind in ("send", "recv")]
        p2p_split = [r for r in split_rows if r.axes == PP and r.kind in ("send", "recv")]
        assert [r.kind for r in p2p_split] == [r.kind for r in p2p] and len(p2p) == 2 * m
        gathers = [r for r in split_rows if r.axes == TP and r.kind == "all_gather"]
        extra = len(gathers) - count(whole_rows, axes=TP, kind="all_gather")
        if sequence_parallel:  # already split: Megatron sends it whole
            assert [r.size_bytes for r in p2p_split] == [r.size_bytes for r in p2p]
            assert extra == 0
        else:  # 1/tp of each transfer crosses stages; each receive gathers the whole back
            assert [r.size_bytes * tp for r in p2p_split] == [r.size_bytes for r in p2p]
            assert extra == count(p2p, kind="recv") == m
            after_recv = [
                split_rows[split_rows.index(r) + 1] for r in p2p_split if r.kind == "recv"
            ]
            assert all(r.kind == "all_gather" and r.axes == TP for r in after_recv)
            assert {r.size_bytes for r in after_recv} == {p2p[0].size_bytes}


# ---- context parallelism --------------------------------------------------------------------


def test_cp_gathers_k_and_v_per_layer_and_reduce_scatters_their_gradients():
    cap = capture(debug_job({"cp": 2}, global_batch=1))
    rows = rows_of(cap)
    for layer in range(LAYERS):  # K and V separately, not coalesced
        assert [r.kind for r in layer_rows(rows, layer)] == ["all_gather", "all_gather"]
    assert count(rows, kind="all_gather", axes=CP) == 2 * LAYERS
    assert count(rows, kind="reduce_scatter", axes=CP, phase="backward") == 2 * LAYERS
    # gradients are reduced over dp x cp (here cp only): one bucket for this small model
    assert count(rows, kind="all_reduce", axes=CP, phase="backward") == 1
    assert len(rows) == 4 * LAYERS + 1


def test_ring_cp_runs_torchs_ring_attention():
    cp = 4
    job = debug_job({"cp": cp}, global_batch=1, kernels={"cp_attention": "ring"})
    cap = capture(job)
    trace, rows = cap.traces[0], rows_of(cap)
    # K and V (repeated to every query head) concatenated and gathered once each way
    assert count(rows, kind="all_gather", axes=CP, phase="forward") == LAYERS
    assert count(rows, kind="all_gather", axes=CP, phase="backward") == LAYERS
    # dK/dV (float32) passed on around the ring after every backward step: each rank's whole
    # buffer to the next rank (torch's permute_tensor), priced as one transfer, not an all_to_all
    assert count(rows, kind="permute", axes=CP, phase="backward") == cp * LAYERS
    assert count(rows, kind="all_to_all") == 0
    assert count(rows, kind="reduce_scatter", axes=CP) == 0
    c = trace.columns
    names = np.array(trace.strings)[c["name"]]
    for name in ("flash_attn_fwd", "flash_attn_bwd"):
        # per layer one causal call on the local chunks, then cp - 1 unmasked ones
        causal = c["causal"][names == name]
        assert len(causal) == cp * LAYERS and causal.sum() == LAYERS
    # the repeated K/V: all heads, 4 bytes a float32 element, K and V, local tokens
    model = job.built_model
    kv_bytes = 2 * (job.batch.seq_len // cp) * model.heads * (model.hidden // model.heads) * 4
    assert {r.size_bytes for r in rows if r.kind == "permute"} == {kv_bytes}


# ---- the class claim on the real workload ---------------------------------------------------


@pytest.fixture(scope="module")
def three_d():
    """dp=2, tp=2, pp=2 (W=8): rank 0, a dp/tp-shifted member of class 0, a rank of class 1."""
    job = debug_job({"dp": 2, "tp": 2, "pp": 2}, global_batch=4)
    world = world_of(job)
    ranks = {"rep": 0, "member": world.rank_of(dp=1, tp=1, pp=0), "other": world.rank_of(pp=1)}
    traces = {k: capture_rank(r, job.world_size, rank_program(job)) for k, r in ranks.items()}
    return world, ranks, traces


@pytest.mark.integration
def test_members_of_one_class_capture_the_same_normalised_trace(three_d):
    world, ranks, traces = three_d
    a = normalised(traces["rep"], world, ranks["rep"])
    b = normalised(traces["member"], world, ranks["member"])
    assert first_difference(a, b) is None
    # group ids themselves differ: the comparison really went through the normaliser
    assert not np.array_equal(
        traces["rep"].ragged["group_ranks"], traces["member"].ragged["group_ranks"]
    )


@pytest.mark.integration
def test_ranks_of_different_classes_capture_different_traces(three_d):
    world, ranks, traces = three_d
    a = normalised(traces["rep"], world, ranks["rep"])
    assert first_difference(a, normalised(traces["other"], world, ranks["other"])) is not None


@pytest.mark.integration
def test_every_collective_of_a_3d_job_is_on_its_mesh_axis(three_d):
    world, ranks, traces = three_d
    for key in ("rep", "other"):
        rows = comm_rows(traces[key], world, ranks[key])
        by_axes = {}
        for r in rows:
            by_axes.setdefault(r.axes, set()).add(r.kind)
        # TP+SP gathers/scatters and the loss on tp; zero-0 buckets on dp; p2p and the
        # grad norm over stages on pp
        assert by_axes[TP] == {"all_gather", "reduce_scatter", "all_reduce"}
        assert by_axes[DP] == {"all_reduce"}
        assert by_axes[PP] == {"send", "recv", "all_reduce"}
        assert set(by_axes) == {TP, DP, PP}


# ---- coverage of every parallel option --------------------------------------------------------

COVERAGE = {
    "tp-sp": ({"tp": 2}, {}, "llama-debug"),
    "tp-nosp": ({"tp": 2, "sequence_parallel": False}, {}, "llama-debug"),
    "pp-1f1b": ({"pp": 2}, {}, "llama-debug"),
    "pp-gpipe": ({"pp": 2, "schedule": "gpipe"}, {}, "llama-debug"),
    "pp-interleaved-vpp2": ({"pp": 2, "vpp": 2, "schedule": "interleaved-1f1b"}, {}, "llama-debug"),
    "pp-zero-bubble": ({"pp": 2, "schedule": "zero-bubble"}, {}, "llama-debug"),
    "cp": ({"cp": 2}, {}, "llama-debug"),
    "dp-zero0": ({"dp": 2, "zero": 0}, {}, "llama-debug"),
    "dp-zero1": ({"dp": 2, "zero": 1}, {}, "llama-debug"),
    "dp-zero2": ({"dp": 2, "zero": 2}, {}, "llama-debug"),
    "dp-zero3": ({"dp": 2, "zero": 3}, {}, "llama-debug"),
    "recompute-none": ({}, {"recompute": "none"}, "llama-debug"),
    "recompute-selective": ({}, {"recompute": "selective"}, "llama-debug"),
    "recompute-full": ({}, {"recompute": "full"}, "llama-debug"),
    # FSDP2's hooks run record_function inside the block's recompute only: SAC must ignore it
    "recompute-selective-fsdp": ({"dp": 2, "zero": 3}, {"recompute": "selective"}, "llama-debug"),
    "fp16": ({}, {"precision": "fp16"}, "llama-debug"),
    "fp8": ({}, {"precision": "fp8"}, "llama-debug"),
    "gpt-learned-tp-pp": ({"tp": 2, "pp": 2}, {}, "gpt-debug"),
    "gpt-alibi-cp-tp": ({"tp": 2, "cp": 2}, {}, "gpt-debug+alibi"),
    "llama-everything": (
        {"tp": 2, "pp": 2, "dp": 2, "zero": 3},
        {"recompute": "full"},
        "llama-debug",
    ),
}


@pytest.mark.parametrize(
    "case",
    list(COVERAGE),
)
def test_every_parallel_option_captures_a_sane_trace(case):
    parallel, train, model = COVERAGE[case]
    dims = {}
    if model.endswith("+alibi"):
        model, dims = model.removesuffix("+alibi"), {"positions": "alibi"}
    job = debug_job(parallel, model=model, train=train, **dims)
    cap = capture(job)
    assert set(cap.traces) == set(range(job.parallel.pp))
    for class_id, trace in cap.traces.items():
        phases = trace.summary().flops_by_phase
        assert phases["forward"] > 0 and phases["backward"] > 0, (class_id, phases)
        if job.world_size > 1:
            assert len(rows_of(cap, class_id)) > 0
        recompute = job.train.recompute
        assert (phases["recompute"] > 0) == (recompute != "none"), (recompute, phases)
        names = set(trace.text("name"))
        assert ("scaled_mm" in names) == (job.train.precision == "fp8")


# ---- FLOPs against explain ----------------------------------------------------------------------


def _flops(recompute):
    job = debug_job(seq_len=64, global_batch=2, train={"recompute": recompute})
    trace = capture(job).traces[0]
    total = int(trace["flops"][trace["kind"] == COMPUTE].sum())
    return job, total, explain(job).flops


def test_trace_flops_equal_model_flops_up_to_the_causal_attention_convention():
    job, total, info = _flops("none")
    # explain counts attention as 4*s*h per layer per token forward and 2x that backward
    # (Narayanan et al. 2021, no causal halving); the trace counts what flash kernels do:
    # causal forward = half (1/2 A), backward = 2.5x that forward (5/4 A), so the trace
    # has 3A - 1/2 A - 5/4 A = 5/4 A fewer, with A = forward attention FLOPs.
    attention = info.attention_flops_per_token * job.tokens_per_iteration
    assert total == info.model_flops_per_iteration - attention * 5 // 4
    assert total == pytest.approx(info.model_flops_per_iteration, rel=0.05)


def test_full_recompute_flops_equal_hardware_flops_up_to_conventions():
    job, total, info = _flops("full")
    attention = info.attention_flops_per_token * job.tokens_per_iteration
    m = job.model
    # + the rerun forward's attention is causal-halved too (another 1/2 A), and torch's
    # non-reentrant checkpoint stops recomputing once the last saved tensor backward needs
    # exists (early stop): a block's last matmul (w2, 2*h*ffn per token) is never rerun
    early_stop = m.layers * 2 * m.hidden * m.ffn_hidden * job.tokens_per_iteration
    assert total == info.hardware_flops_per_iteration - attention * 7 // 4 - early_stop


# ---- scale -----------------------------------------------------------------------------------


@pytest.mark.slow  # 28 s; CI's scale tests are the 131 072-rank world and mesh
@pytest.mark.integration
def test_a_131072_rank_job_captures_every_class():
    job = debug_job({"tp": 2, "pp": 2, "dp": 32768}, global_batch=65536)
    assert job.world_size == 131_072
    cap = capture(job)
    assert set(cap.traces) == {0, 1}
    for class_id in (0, 1):
        rows = rows_of(cap, class_id)
        dp_rows = [r for r in rows if r.axes == DP]
        assert dp_rows
        groups = cap.traces[class_id].groups()
        trace = cap.traces[class_id]
        sizes = {len(groups[trace.strings[trace["group"][r.index]]]) for r in dp_rows}
        assert sizes == {32768}


# ---- the command -----------------------------------------------------------------------------

JOB_TOML = """
[model]
name = "llama-debug"
[parallel]
pp = 2
[batch]
seq_len = 32
global_batch = 2
"""


def test_capture_command_writes_traces_and_summary_then_hits_the_cache(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("PRISMBENCH_CACHE", str(tmp_path / "cache"))
    spec = tmp_path / "job.toml"
    spec.write_text(JOB_TOML)
    out = tmp_path / "out"
    assert main(["capture", str(spec), "--out", str(out), "--workers", "1"]) == 0
    printed = capsys.readouterr().out
    assert "Capture: 2 ranks, 2 class(es)" in printed
    assert (tmp_path / "cache" / "captures").is_dir()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["cached"] is False and summary["world_size"] == 2
    assert summary["trace_schema_version"] == SCHEMA_VERSION
    for class_id in (0, 1):
        trace = RankTrace.load(out / f"class_{class_id:04d}.npz")
        assert len(trace) == summary["classes"][str(class_id)]["events"] > 0

    assert main(["capture", str(spec), "--out", str(out), "--json", "--workers", "1"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["cached"] is True
    assert again["classes"] == summary["classes"]


def test_a_capture_into_a_folder_of_an_earlier_one_leaves_only_its_own_traces(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("PRISMBENCH_CACHE", str(tmp_path / "cache"))
    spec = tmp_path / "job.toml"
    spec.write_text(JOB_TOML)
    out = tmp_path / "out"
    out.mkdir()
    (out / "class_0003.npz").write_bytes(b"a trace of a 4-stage capture")
    (out / "notes.txt").write_text("the user's own")
    assert main(["capture", str(spec), "--out", str(out), "--workers", "1", "--json"]) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "class_0000.npz", "class_0001.npz", "notes.txt", "summary.json"
    ]  # fmt: skip


@pytest.mark.integration
def test_workers_that_capture_several_classes_in_turn_give_the_same_traces(tmp_path):
    # pp 4 -> 4 classes over 2 worker processes: each worker captures classes one after the
    # other in one interpreter, which must leave nothing behind that changes the next trace
    job = debug_job({"pp": 4}, global_batch=4)
    alone = capture(job, tmp_path / "one")
    pooled = capture_job(job, workers=2, cache_dir=tmp_path / "two")
    world = alone.world
    for class_id in world.classes():
        rep = world.representative(class_id)
        a = normalised(alone.traces[class_id], world, rep)
        b = normalised(pooled.traces[class_id], world, rep)
        assert first_difference(a, b) is None, class_id


# ---- chunk reuse (emulator/capture/chunk_reuse.py) -----------------------------------------------

REUSE_CASES = {
    "1f1b-tp-dp-zero1": ({"pp": 4, "tp": 2, "dp": 2, "zero": 1}, {}, "llama-debug"),
    "gpipe": ({"pp": 4, "schedule": "gpipe"}, {}, "llama-debug"),
    "interleaved-vpp2-cp": (
        {"pp": 2, "vpp": 2, "cp": 2, "schedule": "interleaved-1f1b"},
        {},
        "llama-debug",
    ),
    "1f1b-full-recompute-gpt": ({"pp": 4, "dp": 2, "zero": 1}, {"recompute": "full"}, "gpt-debug"),
}


@pytest.mark.integration
# CI: the interleaved schedule under cp and 1F1B with recomputation; 1F1B under tp and dp, and
# GPipe, are `slow` (each captures a stage twice, 10-25 s on 2 cores)
@pytest.mark.parametrize("case", case_params(REUSE_CASES, {"1f1b-tp-dp-zero1", "gpipe"}))
def test_reused_chunks_give_the_trace_every_chunk_gives(case, stub_count):
    # 8 micro-batches per stage: a stage's first forward and backward are recorded and
    # stand for micro-batches 1..6 (the last runs for real); event for event, storage
    # pairing and phases included, the trace is the one running every chunk records
    parallel, train, model = REUSE_CASES[case]
    job = debug_job(parallel, model=model, train=train, global_batch=parallel.get("dp", 1) * 8)
    world = world_of(job)
    for class_id in world.classes():
        rank = world.representative(class_id)
        reused = capture_rank(rank, world.world_size, rank_program(job))
        full = capture_rank(rank, world.world_size, rank_program(job), reuse_chunks=False)
        assert (
            first_difference(normalised(reused, world, rank), normalised(full, world, rank)) is None
        )
    assert stub_count["n"] >= len(world.classes()) * 6


@pytest.mark.parametrize(
    "parallel",
    [
        {"pp": 2, "schedule": "zero-bubble"},  # the backward is split (input, weight)
        {"pp": 2, "dp": 2, "zero": 3},  # FSDP2 records stream events a copy cannot replay
    ],
)
def test_chunks_a_stub_cannot_stand_for_all_run(parallel, stub_count):
    job = debug_job(parallel, global_batch=parallel.get("dp", 1) * 8)
    world = world_of(job)
    capture_rank(world.representative(0), world.world_size, rank_program(job))
    assert stub_count["n"] == 0


def test_the_last_stage_keeps_no_logits_across_micro_batches():
    # 1F1B bounds the micro-batches in flight; a last stage that kept every micro-batch's
    # logits (torch's return_outputs=True) would grow by them per micro-batch. What may grow
    # is small: torch preallocates one receive buffer per micro-batch, and the losses
    def peak(micro_batches):
        job = debug_job({"pp": 2}, global_batch=micro_batches, vocab=4096)
        world = world_of(job)
        trace = capture_rank(world.representative(1), world.world_size, rank_program(job))
        return job, trace.summary().peak_live_bytes

    job, peak_4 = peak(4)
    _, peak_8 = peak(8)
    logits_bytes = job.batch.seq_len * job.model.vocab * 2  # one micro-batch's, bf16
    assert 0 <= peak_8 - peak_4 < logits_bytes


def _setup_rows(trace: RankTrace, kind: int) -> np.ndarray:
    c = trace.columns
    return np.flatnonzero((c["phase"] < 0) & (c["kind"] == kind))


def test_a_one_gpu_build_leaves_its_freed_fp32_parameters_before_the_iteration():
    """The program builds in fp32 and casts to bf16 (workloads.parallelize): one 4-byte copy of
    every parameter is allocated and freed before the first op, beside the 2-byte parameters."""
    from emulator.capture.trace import ALLOC, FREE

    one = capture(debug_job(train={"precision": "bf16"})).traces[0]
    c = one.columns
    allocs, frees = _setup_rows(one, ALLOC), _setup_rows(one, FREE)
    is_param = np.array([one.strings[i] == "parameter" for i in c["category"][allocs]])
    param_bytes = int(c["size_bytes"][allocs[is_param]].sum())
    assert int(c["size_bytes"][frees].sum()) == 2 * param_bytes
    # several ranks build on meta (module docstring of prismbench.program): nothing freed
    two = capture(debug_job({"dp": 2}, train={"precision": "bf16"})).traces[0]
    assert len(_setup_rows(two, FREE)) == 0


def test_a_rank_of_several_records_its_build_where_its_program_builds_on_the_device():
    """Several ranks build on meta by default (`train.model_init = "auto"`, what `record` runs);
    a rank that builds the whole fp32 model on its device (`"device"`, as the shared
    fake-process-group measurements did) records it: every full fp32 parameter allocated and
    freed before the iteration. One GPU built on meta records nothing."""
    import torch

    from emulator.capture.trace import ALLOC, FREE
    from workloads.models import build_model

    job = debug_job({"tp": 2}, train={"precision": "bf16"})
    one_gpu = debug_job(train={"precision": "bf16"})
    assert job.builds_on_meta and not one_gpu.builds_on_meta
    assert not rank_program(job).record_build
    one_gpu_on_meta = debug_job(train={"precision": "bf16", "model_init": "meta"})
    assert one_gpu_on_meta.builds_on_meta and not rank_program(one_gpu_on_meta).record_build
    on_device = debug_job({"tp": 2}, train={"precision": "bf16", "model_init": "device"})
    built = capture_rank(0, world_of(on_device).world_size, rank_program(on_device))
    c = built.columns
    freed = int(c["size_bytes"][_setup_rows(built, FREE)].sum())
    with torch.device("meta"):
        full_fp32 = 4 * sum(p.numel() for p in build_model(job.built_model).parameters())
    assert freed >= full_fp32  # the whole model, not this rank's shards alone
    assert len(_setup_rows(built, ALLOC)) > len(_setup_rows(built, FREE))  # its shards stay


def test_a_recorded_tensor_parallel_build_allocates_each_full_parameter_once():
    """Sharding a parameter, DTensor learns the result's shape by running the op on fake
    tensors of the global shape; on a GPU those are no device memory, so the recorded build
    holds none of them (they opened segments the real allocator never did: the shared
    fake-process-group ranks' reserved bytes were 4-7 % high). The largest fp32 parameter size
    is no shard's or cast's size, so it is allocated once per parameter of that size."""
    import torch

    from emulator.capture.trace import ALLOC
    from workloads.models import build_model

    job = debug_job({"tp": 2}, train={"precision": "bf16", "model_init": "device"})
    built = capture_rank(0, world_of(job).world_size, rank_program(job))
    with torch.device("meta"):
        full_sizes = collections.Counter(
            4 * p.numel() for p in build_model(job.built_model).parameters()
        )
    largest = max(full_sizes)
    allocated = built.columns["size_bytes"][_setup_rows(built, ALLOC)]
    assert int((allocated == largest).sum()) == full_sizes[largest]


def test_jobs_that_differ_only_in_hardware_share_a_capture():
    from prismbench.capture import cache_key

    base = {"model": {"name": "gpt-debug"}, "batch": {"seq_len": 64, "global_batch": 2}}
    a100 = job_spec_from_dict(base | {"cluster": {"gpu": "a100-sxm-80g", "intra_node": "nvlink3"}})
    h100 = job_spec_from_dict(base | {"cluster": {"gpu": "h100-sxm-80g"}})
    four_per_node = job_spec_from_dict(
        base | {"cluster": {"gpu": "h100-sxm-80g", "gpus_per_node": 4}}
    )
    assert cache_key(a100) == cache_key(h100)
    assert cache_key(four_per_node) != cache_key(h100)


def test_model_init_auto_shares_a_capture_with_the_choice_it_stands_for():
    from prismbench.capture import cache_key

    def key(parallel, model_init):
        return cache_key(debug_job(parallel, train={"model_init": model_init}))

    assert key({"tp": 2}, "auto") == key({"tp": 2}, "meta") != key({"tp": 2}, "device")
    assert key({}, "auto") == key({}, "device") != key({}, "meta")


def test_alibi_attention_is_one_flash_kernel_each_way_and_keeps_no_score_matrix():
    """Position-masked attention (workloads/models/attention_ops.py) is captured as what the
    fused GPU kernel does: one op forward and one backward per layer and micro-batch, the output
    and the fp32 logsumexp kept, nothing of the s x s score matrix allocated."""
    from emulator.capture.trace import ALLOC

    job = debug_job(model="gpt-debug", positions="alibi", seq_len=48, global_batch=2)
    job = dataclasses.replace(job, kernels=KernelsSpec(custom_ops="fused"))
    trace = capture_rank(0, 1, rank_program(job))
    c, aten = trace.columns, np.array(trace.text("aten"))
    layers, micro_batches = job.model.layers, job.num_microbatches
    for op in ("prism.masked_attention", "prism.masked_attention_backward"):
        assert np.count_nonzero((c["kind"] == COMPUTE) & (aten == op)) == layers * micro_batches
    heads, s = job.model.heads, job.batch.seq_len
    shapes = [
        shape for i in np.flatnonzero(c["kind"] == COMPUTE) for shape, _, _ in trace.tensors(i)
    ]
    assert not [shape for shape in shapes if tuple(shape[-2:]) == (s, s)]
    lse_bytes = job.batch.micro_batch * heads * s * 4
    allocated = c["size_bytes"][c["kind"] == ALLOC]
    assert np.count_nonzero(allocated == lse_bytes) >= layers * micro_batches


def test_megatron_attention_keeps_the_score_matrix_and_runs_its_own_kernels():
    """`kernels.attention = "unfused"` (Megatron-LM 2021-22) is captured kernel by kernel: per
    layer and micro-batch a scores GEMM, the fused masked softmax, dropout and the PV GEMM,
    then their backward; the probabilities, dropout's byte mask and its output are kept."""
    from emulator.capture.trace import ALLOC

    job = job_spec_from_dict(
        {
            "model": {"name": "gpt-debug"},
            "batch": {"seq_len": 48, "global_batch": 2},
            "train": {"attention_dropout": 0.1},
            "kernels": {"framework": "megatron"},
        }
    )
    assert job.kernels.attention == "unfused"
    trace = capture_rank(0, 1, rank_program(job))
    c, aten = trace.columns, np.array(trace.text("aten"))
    per_layer = job.model.layers * job.num_microbatches
    compute = c["kind"] == COMPUTE
    for op, per_call in (
        ("aten.baddbmm", 1),
        ("prism.causal_softmax", 1),
        ("aten.native_dropout", 1),
        ("aten.bmm", 1 + 4),  # PV forward; backward: two for PV, two for the scores GEMM
        ("prism.causal_softmax_backward_", 1),
        ("aten.native_dropout_backward", 1),
    ):
        assert np.count_nonzero(compute & (aten == op)) == per_call * per_layer, op
    assert not np.count_nonzero(compute & np.char.startswith(aten.astype(str), "aten._scaled_dot"))
    heads, s, b = job.model.heads, job.batch.seq_len, job.batch.micro_batch
    scores_bytes = b * heads * s * s * 2  # bf16
    allocated = c["size_bytes"][c["kind"] == ALLOC]
    # per layer: scores, probabilities, dropout's output (bf16) and its mask (one byte each)
    assert np.count_nonzero(allocated == scores_bytes) >= 3 * per_layer
    assert np.count_nonzero(allocated == scores_bytes // 2) >= per_layer


def test_fused_attention_kernels_share_a_capture_and_the_unfused_program_does_not():
    from prismbench.capture import cache_key

    def job(attention):
        return job_spec_from_dict(
            {
                "model": {"name": "gpt-debug"},
                "batch": {"seq_len": 64, "global_batch": 2},
                "kernels": {"attention": attention},
            }
        )

    assert cache_key(job("flash")) == cache_key(job("triton"))  # the same program, priced apart
    assert cache_key(job("unfused")) != cache_key(job("flash"))
    blocking = dataclasses.replace(
        job("flash"), kernels=dataclasses.replace(job("flash").kernels, launch_blocking=True)
    )
    assert cache_key(blocking) == cache_key(job("flash"))
    overlapped = dataclasses.replace(
        job("flash"), kernels=dataclasses.replace(job("flash").kernels, tp_grad_overlap=True)
    )
    assert cache_key(overlapped) == cache_key(job("flash"))  # pricing only


def test_the_workloads_at_86a4f47_ran_alibi_attention_and_rope_as_eager_float32_math():
    """`kernels.custom_ops = "eager"` (the default framework, prism-86a4f47) records what a GPU
    ran at that commit: float32 GEMMs over the s x s scores and a softmax for ALiBi attention,
    RoPE's chain of elementwise kernels; no fused op of either."""
    alibi = debug_job(model="gpt-debug", positions="alibi", seq_len=48, global_batch=2)
    llama = debug_job(model="llama-debug", seq_len=48, global_batch=2)
    assert alibi.kernels.custom_ops == llama.kernels.custom_ops == "eager"
    s = alibi.batch.seq_len
    trace = capture_rank(0, 1, rank_program(alibi))
    aten, compute = np.array(trace.text("aten")), trace.columns["kind"] == COMPUTE
    assert not np.count_nonzero(compute & np.char.startswith(aten.astype(str), "prism."))
    fp32_scores = [
        i
        for i in np.flatnonzero(compute & (aten == "aten.bmm"))
        if any(shape[-2:] == (s, s) and dtype == "float32" for shape, dtype, _ in trace.tensors(i))
    ]
    # forward QK^T and PV; backward recomputes QK^T and PV's probabilities, then four GEMMs
    assert len(fp32_scores) == (2 + 1 + 4) * alibi.model.layers * alibi.num_microbatches
    per_layer = alibi.model.layers * alibi.num_microbatches
    assert np.count_nonzero(compute & (aten == "aten._softmax")) == 2 * per_layer
    trace = capture_rank(0, 1, rank_program(llama))
    aten, compute = np.array(trace.text("aten")), trace.columns["kind"] == COMPUTE
    assert not np.count_nonzero(aten == "prism.rope")
    in_layers = np.char.find(np.array(trace.text("module")).astype(str), ".layers.") >= 0
    # q and k, forward and backward; nothing that only computes a dtype is a kernel
    assert np.count_nonzero(compute & in_layers & (aten == "aten.stack")) == 4 * per_layer
    assert not np.count_nonzero(compute & (aten == "aten.promote_types"))


def test_megatron_selective_recompute_reruns_the_core_attention_and_nothing_else():
    """Korthikanti et al.'s selective recompute (`kernels.selective_recompute =
    "core-attention"`): the recompute phase holds the scores GEMM, softmax, dropout and PV GEMM
    of each layer, and no projection or MLP GEMM."""
    from emulator.capture.trace import PHASES

    job = job_spec_from_dict(
        {
            "model": {"name": "gpt-debug"},
            "batch": {"seq_len": 48, "global_batch": 1},
            "train": {"recompute": "selective", "attention_dropout": 0.1},
            "kernels": {"framework": "megatron"},
        }
    )
    trace = capture_rank(0, 1, rank_program(job))
    c, aten = trace.columns, np.array(trace.text("aten"))
    recompute = (c["kind"] == COMPUTE) & (c["phase"] == PHASES.index("recompute"))
    rerun = collections.Counter(aten[recompute].tolist())
    layers = job.model.layers
    assert rerun["aten.baddbmm"] == rerun["prism.causal_softmax"] == layers
    assert rerun["aten.native_dropout"] == rerun["aten.bmm"] == layers
    assert not rerun["aten.mm"] and not rerun["aten.addmm"]


@pytest.mark.parametrize(("reruns", "rerun_gemms"), [("needed", 5), ("all", 6)])
def test_full_recompute_reruns_the_last_gemm_only_when_the_whole_block_reruns(reruns, rerun_gemms):
    """torch's non-reentrant checkpoint stops once backward has what it saved: the MLP's second
    GEMM, whose output nothing keeps, is not rerun; Megatron's reentrant checkpoint reruns it."""
    from emulator.capture.trace import PHASES

    job = job_spec_from_dict(
        {
            "model": {"name": "gpt-debug"},
            "batch": {"seq_len": 48, "global_batch": 1},
            "train": {"recompute": "full"},
            "kernels": {"recompute_reruns": reruns},
        }
    )
    trace = capture_rank(0, 1, rank_program(job))
    c, aten = trace.columns, np.array(trace.text("aten"))
    recompute = (c["kind"] == COMPUTE) & (c["phase"] == PHASES.index("recompute"))
    # six linears per block (wq, wk, wv, wo, w1, w2), all with biases
    assert np.count_nonzero(recompute & (aten == "aten.addmm")) == rerun_gemms * job.model.layers


@pytest.mark.parametrize("parallel", [{}, {"dp": 2, "zero": 3}], ids=["master-copy", "fsdp"])
def test_a_fused_optimizer_step_is_one_kernel_not_foreach_passes(parallel):
    """`kernels.optimizer_step = "fused"` (Megatron's apex FusedAdam, llm.c): the AdamW step is
    `_fused_adamw_`, not foreach's passes (lerp, addcmul, the second moment's square root)."""
    from emulator.capture.trace import PHASES

    def optimizer_ops(step):
        job = debug_job(parallel, model="gpt-debug", global_batch=2)
        job = dataclasses.replace(job, kernels=KernelsSpec(optimizer_step=step))
        trace = capture(job).traces[0]
        aten = np.array(trace.text("aten"))
        step_rows = (trace["kind"] == COMPUTE) & (trace["phase"] == PHASES.index("optimizer"))
        return collections.Counter(aten[step_rows].tolist())

    fused, foreach = optimizer_ops("fused"), optimizer_ops("foreach")
    assert fused["aten._fused_adamw_"] >= 1 and not foreach["aten._fused_adamw_"]
    passes = ("aten._foreach_lerp_", "aten._foreach_addcmul_", "aten._foreach_sqrt")
    assert all(foreach[op] for op in passes) and not any(fused[op] for op in passes)


def test_a_worker_refuses_to_capture_when_the_source_changed_since_the_key_was_made(tmp_path):
    """A spawned worker imports the source on disk when it starts; the trace it writes is cached
    under the key its parent made earlier. If the two programs differ, it refuses and writes
    nothing, rather than caching one program's trace under the other's key."""
    from prismbench.capture import SourceChangedError, _capture_class
    from prismbench.capture_sources import capture_source_hash

    job = job_spec_from_dict(
        {"model": {"name": "gpt-debug"}, "batch": {"seq_len": 32, "global_batch": 1}}
    )
    out = tmp_path / "class_0000.npz"
    with pytest.raises(SourceChangedError, match="changed while capturing"):
        _capture_class(job, 0, str(out), parent_source="0" * 16)
    assert not out.exists() and not list(tmp_path.iterdir())
    _capture_class(job, 0, str(out), parent_source=capture_source_hash())  # the same source: captured
    assert out.exists()


def test_a_capture_that_fails_to_write_leaves_its_folder_as_it_was(tmp_path):
    # the second trace failing to save (a full disk) left the first one new beside the earlier
    # capture's summary, which described another capture
    class Trace:
        def __init__(self, fails: bool):
            self.fails = fails

        def save(self, path):
            if self.fails:
                raise OSError(28, "No space left on device")
            Path(path).write_bytes(b"a new trace")

    out = tmp_path / "out"
    out.mkdir()
    earlier = {"class_0000.npz": b"an earlier trace", "summary.json": b"{}"}
    for name, data in earlier.items():
        (out / name).write_bytes(data)
    capture = types.SimpleNamespace(traces={0: Trace(False), 1: Trace(True)})
    with pytest.raises(OSError, match="No space"):
        write_capture(capture, {"classes": 2}, out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == earlier
    assert [p.name for p in tmp_path.iterdir()] == ["out"]

    capture.traces[1].fails = False
    write_capture(capture, {"classes": 2}, out)
    assert sorted(p.name for p in out.iterdir()) == ["class_0000.npz", "class_0001.npz", "summary.json"]
