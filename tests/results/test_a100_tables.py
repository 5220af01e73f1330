"""The tables of GPUs measured elsewhere (results/kernels/build_a100.py): they load, the transfer
rule does what its docstring says on SYNTHETIC rows, and an A100 job is priced from its table."""

import csv
from dataclasses import replace

import pytest

from emulator.costs.compute import op_price
from emulator.costs.ops import gemm_op, memory_op
from emulator.hardware import gpu_preset
from prismbench.emulate import KERNEL_TABLES, cost_context, kernel_table_for
from prismbench.spec import job_spec_from_dict

DERIVED = ("a100-sxm-80g", "a100-sxm-40g", "h100-hbm2e-96g")


@pytest.mark.parametrize("gpu", DERIVED)
def test_committed_table_loads_and_every_row_names_its_source(gpu):
    assert kernel_table_for(gpu) is not None
    with (KERNEL_TABLES / f"{gpu}.csv").open(newline="") as handle:
        sources = [row["source"] for row in csv.DictReader(handle)]
    assert sources and all(sources)
    if gpu != "a100-sxm-80g":  # derived wholly by the rule
        assert all(s.startswith("rule:") for s in sources)


def test_a100_table_holds_each_published_source():
    with (KERNEL_TABLES / "a100-sxm-80g.csv").open(newline="") as handle:
        kinds = {row["source"].split(":")[0] for row in csv.DictReader(handle)}
    assert {"vidur", "llmcompass", "mamf", "fa2", "rule"} <= kinds


def test_memory_bound_transfer_is_the_ratio_of_achieved_bandwidths(build):
    h100, a100 = gpu_preset("h100-sxm-80g"), gpu_preset("a100-sxm-80g")
    op = memory_op("elementwise", bytes_read=1e8, bytes_written=1e8, dtype="fp32")
    expected = (3350 * h100.hbm_efficiency) / (2039 * a100.hbm_efficiency)
    assert build.transfer_factor(op, h100, a100) == pytest.approx(expected)


def test_compute_bound_transfer_keeps_the_fraction_of_peak(build):
    h100, a100 = gpu_preset("h100-sxm-80g"), gpu_preset("a100-sxm-80g")
    big = gemm_op("mm", 8192, 8192, 8192)  # intensity ~2700 FLOP/byte: compute-bound on both
    assert build.transfer_factor(big, h100, a100) == pytest.approx(989.5 / 312.0)
    # intensity ~120: memory-bound on both rooflines, so the bandwidth ratio again
    thin = gemm_op("mm", 8192, 8192, 128)
    assert build.transfer_factor(thin, h100, a100) == pytest.approx(
        build.achieved_hbm_GBps(h100) / build.achieved_hbm_GBps(a100)
    )


def test_transferred_synthetic_row_is_marked_with_its_rule(build):
    row = {"op": "norm", "dtype": "bf16", "aten": "aten.native_layer_norm", "nbytes": 1_000_000,
           "time_us": 10.0, "source": "synthetic:1", "gpu": "synthetic"}  # fmt: skip
    h100, a100 = gpu_preset("h100-sxm-80g"), gpu_preset("a100-sxm-80g")
    (out,) = build.transferred([row], h100, a100)
    assert out["time_us"] == pytest.approx(
        10.0 * build.achieved_hbm_GBps(h100) / build.achieved_hbm_GBps(a100)
    )
    assert out["source"] == "rule:h100-sxm-80g->a100-sxm-80g; h100-sxm-80g:synthetic:1"


def test_covers_only_the_ops_own_group_within_the_radius(build):
    rows = [{"op": "mm", "dtype": "bf16", "aten": "aten.mm", "m": 2048, "n": 2048, "k": 2048, "batch": 1,
             "time_us": 100.0, "source": "synthetic:1"},
            {"op": "norm", "dtype": "bf16", "aten": "aten.native_layer_norm", "nbytes": 1_000_000,
             "time_us": 10.0, "source": "synthetic:2"}]  # fmt: skip
    table = build.as_table(rows)
    assert build.covers(table, gemm_op("mm", 3000, 3000, 3000))
    assert not build.covers(table, gemm_op("mm", 8192, 8192, 8192))  # beyond a factor 2
    norm = memory_op("norm", bytes_read=5e5, bytes_written=5e5)
    assert build.covers(table, replace(norm, aten="aten.native_layer_norm"))
    # the lookup's class-level fallback prices it, but no row of its own aten op is near
    a100_sms = gpu_preset("a100-sxm-80g").sm_count
    assert table.lookup(replace(norm, aten="aten._fused_rms_norm"), a100_sms) is not None
    assert not build.covers(table, replace(norm, aten="aten._fused_rms_norm"))


def _job(gpu, link):
    return job_spec_from_dict({
        "model": {"name": "llama-debug"},
        "batch": {"seq_len": 32, "micro_batch": 1, "global_batch": 2},
        "cluster": {"gpu": gpu, "gpus_per_node": 8, "intra_node": link, "inter_node": "ib-hdr-8x200"},
    })  # fmt: skip


def test_an_a100_jobs_gemm_is_priced_from_the_a100_table():
    cost = cost_context(_job("a100-sxm-80g", "nvlink3"))
    assert cost.table.label == "results/kernels/a100-sxm-80g.csv"
    # vidur's Llama-2-7B qkv projection at 4096 tokens, TP 1 (fp16, given as bf16 too): two
    # profiled runs, 1.8865 and 1.911 ms; an exact lookup takes the mean of their times
    op = gemm_op("mm", 4096, 12288, 4096, dtype="bf16")
    seconds, how, _ = op_price(op, cost.topology.gpu, table=cost.table)
    assert how == "exact" and seconds == pytest.approx((1886.5e-6 + 1911.0e-6) / 2)
    h100_seconds, _, _ = op_price(
        op, gpu_preset("h100-sxm-80g"), table=kernel_table_for("h100-sxm-80g")
    )
    assert h100_seconds < seconds / 2
