"""Tests for emulator.costs.pricing: what a trace row is priced as, and what it costs."""

import numpy as np
import pytest

from emulator.costs.collectives import Topology
from emulator.costs.compute import op_time_s
from emulator.costs.kernel_table import PRICE_SOURCES
from emulator.costs.ops import gemm_op
from emulator.costs.pricing import CommPricer, CostContext, compute_durations_s, op_record
from emulator.hardware import gpu_preset, inter_node_network, intra_node_link
from emulator.world.mesh import World
from tests.emulator.synthetic_traces import Stage

TOPO = Topology(
    gpu=gpu_preset("h100-sxm-80g"),
    gpus_per_node=8,
    link=intra_node_link("nvlink4"),
    network=inter_node_network("ib-ndr-8x400"),
)


def _mm_stage(world):
    s = Stage(world, 0)
    s.compute(
        0.0,
        name="mm",
        flops=2 * 64 * 128 * 256,
        tensors=(
            ((64, 256), "bfloat16", False),
            ((256, 128), "bfloat16", False),
            ((64, 128), "bfloat16", True),
        ),
    )
    return s


def test_op_record_reads_gemm_dims_from_tensors():
    world = World.grid(dp=1, pp=1, cp=1, tp=1)
    trace, _ = _mm_stage(world).trace()
    op = op_record(trace, 0)
    assert (op.name, op.dtype, op.m, op.n, op.k) == ("mm", "bf16", 64, 128, 256)


def test_op_record_reads_attention_backward_query_and_key():
    world = World.grid(dp=1, pp=1, cp=1, tp=1)
    s = Stage(world, 0)
    q, k = (2, 16, 1024, 128), (2, 4, 1024, 128)
    s.compute(
        0.0,
        name="flash_attn_bwd",
        tensors=((q, "bfloat16", False), (q, "bfloat16", False), (k, "bfloat16", False)),
    )
    op = op_record(s.trace()[0], 0)
    assert (op.batch, op.heads_q, op.heads_kv, op.seq_q, op.head_dim) == (2, 16, 4, 1024, 128)


def test_ops_of_equal_bytes_and_different_dtypes_are_priced_by_their_own_table_rows(tmp_path):
    from emulator.costs.kernel_table import COLUMNS, load_kernel_table
    from emulator.costs.pricing import compute_prices

    table = tmp_path / "table.csv"
    rows = [{"op": "copy", "dtype": dtype, "aten": "aten.copy", "nbytes": "8192",
             "time_us": time_us, "repetitions": "1", "source": "test"}
            for dtype, time_us in (("bf16", "3"), ("fp8", "7"))]  # fmt: skip
    table.write_text(
        ",".join(COLUMNS) + "\n"
        + "\n".join(",".join(row.get(c, "") for c in COLUMNS) for row in rows) + "\n"
    )
    world = World.grid(dp=1, pp=1, cp=1, tp=1)
    s = Stage(world, 0)
    for shape, dtype in (((2048,), "bfloat16"), ((4096,), "float8_e4m3fn")):
        s.compute(0.0, name="copy", read_bytes=4096, write_bytes=4096,
                  tensors=((shape, dtype, False), (shape, dtype, True)))  # fmt: skip
    trace, _ = s.trace()
    cost = CostContext(topology=TOPO, table=load_kernel_table(table))
    durations, sources = compute_prices(trace, cost)
    assert durations[:2] * 1e6 == pytest.approx([3.0, 7.0])
    assert list(sources[:2]) == [0, 0]  # both exact rows


def test_modelled_compute_durations_use_the_cost_model():
    world = World.grid(dp=1, pp=1, cp=1, tp=1)
    trace, _ = _mm_stage(world).trace()
    expected = op_time_s(gemm_op("mm", 64, 128, 256), TOPO.gpu)
    c = compute_durations_s(trace, CostContext(topology=TOPO))
    assert c[0] == pytest.approx(expected, rel=0.05)  # compute-bound: bytes barely matter


def test_comm_pricer_is_free_without_a_topology_and_names_p2p_as_send_recv():
    ranks = np.arange(8)
    assert CommPricer(None).duration_s("all_reduce", 1 << 20, ranks) == 0.0
    priced = CommPricer(TOPO)
    pair = np.array([0, 1])
    assert (
        priced.duration_s("send", 1 << 20, pair)
        == priced.duration_s("send_recv", 1 << 20, pair)
        > 0
    )


def test_attention_rates_price_attention_rows_and_leave_the_others_to_the_table():
    from pathlib import Path

    from emulator.costs.attention_rates import load_attention_rates
    from emulator.costs.pricing import compute_prices

    rates = load_attention_rates(
        Path(__file__).resolve().parents[3] / "results/kernels/triton-attention.csv",
        "triton", "hopper",
    )  # fmt: skip
    world = World.grid(dp=1, pp=1, cp=1, tp=1)
    s = _mm_stage(world)
    q = (1, 16, 8192, 128)
    s.compute(0.0, name="flash_attn_fwd", flops=4 * 16 * 8192**2 * 128 // 2, causal=True,
              tensors=((q, "bfloat16", False), (q, "bfloat16", False), (q, "bfloat16", True)))  # fmt: skip
    trace, _ = s.trace()
    plain, _ = compute_prices(trace, CostContext(topology=TOPO))
    triton, sources = compute_prices(trace, CostContext(topology=TOPO, attention=rates))
    assert triton[0] == plain[0]  # the GEMM
    assert triton[1] == pytest.approx(rates.time_s(op_record(trace, 1), TOPO.gpu))
    assert triton[1] > plain[1]
    assert PRICE_SOURCES[sources[1]] == "published-rates"  # not the table's interpolation


def test_each_kernel_an_op_launches_pays_the_streams_idle_time_before_it():
    world = World.grid(dp=1, pp=1, cp=1, tp=1)
    trace, _ = _mm_stage(world).trace()
    kernel = compute_durations_s(trace, CostContext(topology=TOPO))[0]
    # no table: the curves price one kernel
    with_gap = compute_durations_s(trace, CostContext(topology=TOPO, kernel_gap_s=2e-6))[0]
    assert with_gap == pytest.approx(kernel + 2e-6)
    with pytest.raises(ValueError, match="kernel_gap_s=-1e-06 must be >= 0"):
        CostContext(topology=TOPO, kernel_gap_s=-1e-6)


def test_a_gemm_and_its_transpose_are_priced_by_their_own_table_rows(tmp_path):
    """(64 x 256) @ (256 x 128) and (128 x 256) @ (256 x 64) move the same flops and bytes;
    the table measured them apart, and each is priced by its own exact row."""
    from emulator.costs.kernel_table import COLUMNS, load_kernel_table
    from emulator.costs.pricing import compute_prices

    table = tmp_path / "table.csv"
    rows = [{"op": "mm", "dtype": "bf16", "aten": "aten.mm", "m": str(m), "n": str(n),
             "k": "256", "batch": "1", "time_us": time_us, "repetitions": "1", "source": "test"}
            for m, n, time_us in ((64, 128, "5"), (128, 64, "9"))]  # fmt: skip
    table.write_text(
        ",".join(COLUMNS) + "\n"
        + "\n".join(",".join(row.get(c, "") for c in COLUMNS) for row in rows) + "\n"
    )
    world = World.grid(dp=1, pp=1, cp=1, tp=1)
    s = Stage(world, 0)
    for m, n in ((64, 128), (128, 64)):
        s.compute(0.0, name="mm", flops=2 * m * n * 256,
                  read_bytes=2 * 256 * (m + n), write_bytes=2 * m * n,
                  tensors=(((m, 256), "bfloat16", False), ((256, n), "bfloat16", False),
                           ((m, n), "bfloat16", True)))  # fmt: skip
    trace, _ = s.trace()
    durations, sources = compute_prices(trace, CostContext(topology=TOPO, table=load_kernel_table(table)))
    assert durations[:2] * 1e6 == pytest.approx([5.0, 9.0])
    assert list(sources[:2]) == [0, 0]  # both exact rows


def test_shape_signatures_group_gemms_by_their_tensors_shapes_in_order():
    from emulator.costs.pricing import shape_signatures

    world = World.grid(dp=1, pp=1, cp=1, tp=1)
    s = Stage(world, 0)
    shapes_by_row = [
        ((4, 5), (5, 6)),  # 0
        ((4, 5), (5, 6)),  # 1: the same shapes as row 0
        ((5, 6), (4, 5)),  # 2: the same tensors in another order
        ((4,), (5, 5, 6)),  # 3: the same dims split into tensors otherwise
        ((4, 5, 5), (6,)),  # 4: and again
        ((4, 5), (5, 6), (4, 6)),  # 5: one tensor more
    ]
    for shapes in shapes_by_row:
        s.compute(0.0, name="mm", tensors=tuple((shape, "bfloat16", False) for shape in shapes))
    s.compute(0.0, name="add", tensors=(((4, 5), "bfloat16", False),))  # 6: its price reads no shape
    trace, _ = s.trace()
    rows = np.arange(7)
    ids = shape_signatures(trace, rows)
    assert ids[0] == ids[1] != 0
    assert len(set(ids[[0, 2, 3, 4, 5]].tolist())) == 5 and 0 not in ids[:6]
    assert ids[6] == 0
    # the ids depend on the rows asked about only through which rows share shapes
    sub = np.array([1, 6, 5])
    assert (shape_signatures(trace, sub) == 0).tolist() == [False, True, False]
