"""Tests for emulator.costs.kernel_table on a tiny SYNTHETIC table (made-up times, not measurements)."""

from dataclasses import replace
from pathlib import Path

import pytest

from emulator.costs.calibrate import write_kernel_csv
from emulator.costs.compute import curve_time_s, op_price, op_time_s
from emulator.costs.gemm_tiles import gemm_tile_utilisation
from emulator.costs.kernel_table import (
    NEIGHBOURS,
    load_kernel_table,
    read_rows,
    table_from_rows,
)
from emulator.costs.ops import attention_op, gemm_op, memory_op
from emulator.hardware import gpu_preset

H100 = gpu_preset("h100-sxm-80g")
SYNTHETIC = {"gpu": "synthetic", "driver": "synthetic", "torch": "synthetic", "clocks": "synthetic", "date": "synthetic"}


def _gemm_row(s, time_us):
    return {"op": "mm", "dtype": "bf16", "m": s, "n": s, "k": s, "batch": 1, "time_us": time_us,
            "repetitions": 1, "spread_us": 0.0}


@pytest.fixture
def table(tmp_path):
    # synthetic rates: 100 TFLOP/s at 2048^3 and 400 TFLOP/s at 4096^3
    rows = [_gemm_row(2048, 2 * 2048**3 / 100e12 * 1e6), _gemm_row(4096, 2 * 4096**3 / 400e12 * 1e6)]
    return load_kernel_table(write_kernel_csv(rows, tmp_path / "synthetic.csv", SYNTHETIC))


def test_exact_row_is_returned(table):
    op = gemm_op("mm", 2048, 2048, 2048)
    assert op_time_s(op, H100, table=table) == pytest.approx(op.flops / 100e12)


def test_linear_shares_the_gemm_rows(table):
    op = gemm_op("linear", 4096, 4096, 4096)
    assert op_time_s(op, H100, table=table) == pytest.approx(op.flops / 400e12)


def _utilisation(s):
    return gemm_tile_utilisation(s, s, 1, H100.sm_count)


def test_interpolates_in_log_space_between_rows_per_busy_tile_slot(table):
    op = gemm_op("mm", 2896, 2896, 2896)  # ~ geometric middle of 2048 and 4096
    rate = op.flops / op_time_s(op, H100, table=table)
    # the geometric mean of the rows' rates per busy tile slot, at the op's own utilisation:
    # 2 896 = 22.6 tiles of 128 pads to 23, and 529 tiles leave 131 of 5 x 132 slots idle
    per_slot = (100e12 / _utilisation(2048) * 400e12 / _utilisation(4096)) ** 0.5
    assert rate == pytest.approx(per_slot * _utilisation(2896), rel=0.01)
    assert _utilisation(2896) < 0.8 < 0.96 < _utilisation(2048) == _utilisation(4096)


def test_falls_back_to_curves_far_from_rows_it_is_not_larger_than(table):
    op = gemm_op("mm", 65536, 65536, 512)  # larger than the rows in m and n, smaller in k
    assert op_price(op, H100, table=table)[1:] == ("roofline", 1.0)
    assert op_time_s(op, H100, table=table) == curve_time_s(op, H100)
    small = gemm_op("mm", 256, 256, 256)  # smaller than every row
    assert op_price(small, H100, table=table)[1] == "roofline"


def test_an_op_larger_than_every_row_takes_the_nearest_rows_rate_per_busy_tile_slot(table):
    op = gemm_op("mm", 65536, 4096, 4096)  # 16x the largest row's m
    seconds, source, kernels = op_price(op, H100, table=table)
    assert source == "extrapolated" and kernels == 1.0
    # inverse-distance weights over both rows (at log2 distances 4 and 5), per busy tile slot
    w4, w5 = 1 / 4**2, 1 / 5**2
    per_slot = ((400e12 / _utilisation(4096)) ** w4 * (100e12 / _utilisation(2048)) ** w5) ** (
        1 / (w4 + w5)
    )
    rate = per_slot * gemm_tile_utilisation(65536, 4096, 1, H100.sm_count)
    assert seconds == pytest.approx(op.flops / rate)
    # a floor below the roofline curves' generic efficiency, not above the largest measured rate
    assert op.flops / 400e12 * 0.99 < seconds


def test_a_memory_bound_op_larger_than_every_row_takes_their_bandwidth(tmp_path):
    rows = [{"op": "elementwise", "dtype": "bf16", "aten": "aten.add", "nbytes": n, "time_us": n / rate * 1e6,
             "repetitions": 1, "spread_us": 0.0} for n, rate in ((1 << 20, 1e12), (1 << 30, 3e12))]  # fmt: skip
    table = load_kernel_table(write_kernel_csv(rows, tmp_path / "t.csv", SYNTHETIC))
    op = replace(memory_op("elementwise", bytes_read=1 << 32, bytes_written=1 << 32), aten="aten.add")
    seconds, source, _ = op_price(op, H100, table=table)
    assert source == "extrapolated"
    # the 1 GiB row's 3 TB/s alone: the 1 MiB row, 2^10 smaller, runs below saturation
    assert seconds == pytest.approx(op.bytes_total / 3e12)


def test_other_dtype_falls_back(table):
    op = gemm_op("mm", 2048, 2048, 2048, dtype="fp16")
    assert op_time_s(op, H100, table=table) == curve_time_s(op, H100)


def test_missing_columns_are_named(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("op,dtype,time_us\nmm,bf16,1.0\n")
    with pytest.raises(ValueError, match="lacks columns"):
        load_kernel_table(path)


def _memory_row(aten, nbytes, time_us, op="norm"):
    return {"op": op, "dtype": "bf16", "aten": aten, "nbytes": nbytes, "time_us": time_us,
            "repetitions": 1, "spread_us": 0.0}


@pytest.fixture
def mixed_table(tmp_path):
    rows = [
        _gemm_row(2048, 2 * 2048**3 / 100e12 * 1e6),
        _gemm_row(4096, 2 * 4096**3 / 400e12 * 1e6),
        # synthetic: the backward runs at 1 TB/s, the forward at 2 TB/s, at the same bytes
        _memory_row("aten.native_layer_norm_backward", 1e9, 1e3),
        _memory_row("aten.native_layer_norm", 1e9, 500.0),
        # unaligned GEMM: 10 TFLOP/s
        {**_gemm_row(2048, 0), "n": 2049, "time_us": 2 * 2048 * 2049 * 2048 / 10e12 * 1e6},
    ]
    return load_kernel_table(write_kernel_csv(rows, tmp_path / "mixed.csv", SYNTHETIC))


def test_lookup_says_exact_then_interpolated(mixed_table):
    assert mixed_table.lookup(gemm_op("mm", 2048, 2048, 2048), H100.sm_count)[1] == "exact"
    assert mixed_table.lookup(gemm_op("mm", 2896, 2896, 2896), H100.sm_count)[1] == "interpolated"
    assert mixed_table.lookup(gemm_op("mm", 65536, 65536, 512), H100.sm_count) is None


def test_op_price_names_the_roofline_where_the_table_is_silent(mixed_table):
    assert op_price(gemm_op("mm", 65536, 65536, 512), H100, table=mixed_table)[1] == "roofline"


def test_memory_ops_are_told_apart_by_their_aten_op(mixed_table):
    def op(aten):
        return memory_op("norm", bytes_read=5e8, bytes_written=5e8) if not aten else replace(
            memory_op("norm", bytes_read=5e8, bytes_written=5e8), aten=aten)

    assert mixed_table.lookup(op("aten.native_layer_norm_backward"), H100.sm_count)[:2] == (pytest.approx(1e-3), "exact")
    assert mixed_table.lookup(op("aten.native_layer_norm"), H100.sm_count)[:2] == (pytest.approx(5e-4), "exact")
    # an aten op without rows borrows its class's rows (both, at distance 0): interpolated
    seconds, source, _ = mixed_table.lookup(op("aten.native_group_norm"), H100.sm_count)
    assert source == "interpolated" and 5e-4 < seconds < 1e-3


def test_unaligned_gemms_never_borrow_aligned_rows(mixed_table):
    unaligned = gemm_op("mm", 2048, 2047, 2048)
    rate = unaligned.flops / mixed_table.lookup(unaligned, H100.sm_count)[0]
    # the unaligned row's 10 TFLOP/s (2 048 x 2 049: 17 tiles wide), moved to the op's 16 tiles
    tiles = gemm_tile_utilisation(2048, 2047, 1, H100.sm_count) / gemm_tile_utilisation(
        2048, 2049, 1, H100.sm_count
    )
    assert rate == pytest.approx(10e12 * tiles, rel=0.01) and tiles != pytest.approx(1, abs=0.05)


def test_an_unaligned_gemm_far_from_every_unaligned_row_takes_their_rate_not_the_curves(mixed_table):
    # the curves price aligned tensor-core kernels; the only unaligned row (2 048 x 2 049 x 2 048,
    # 10 TFLOP/s) is 16x off in n and in k and not below: still nearer the truth
    far = gemm_op("mm", 8192, 127, 32768)
    seconds, source, _ = mixed_table.lookup(far, H100.sm_count)
    assert source == "extrapolated"
    per_slot = 10e12 / gemm_tile_utilisation(2048, 2049, 1, H100.sm_count)
    assert far.flops / seconds == pytest.approx(per_slot * gemm_tile_utilisation(8192, 127, 1, H100.sm_count))
    assert seconds > 5 * curve_time_s(far, H100)
    # a larger unaligned GEMM is never cheaper than a smaller one beside it
    times = [op_time_s(gemm_op("mm", m, 4096, 4096), H100, table=mixed_table) for m in (88948, 101218)]
    assert times[0] < times[1]


def test_neighbours_are_capped(tmp_path):
    # 20 rows around 4096^3, the nearest at 100 TFLOP/s, the 12 farthest at 1 TFLOP/s
    # (rates per busy tile slot)
    rows = [_gemm_row(4096 + d, 2 * (4096 + d) ** 3 / (100e12 if d <= 8 * 64 else 1e12)
                      / _utilisation(4096 + d) * 1e6)
            for d in range(64, 20 * 64 + 1, 64)]
    table = load_kernel_table(write_kernel_csv(rows, tmp_path / "t.csv", SYNTHETIC))
    op = gemm_op("mm", 4096, 4096, 4096)
    rate = op.flops / table.lookup(op, H100.sm_count)[0]
    assert rate == pytest.approx(100e12 * _utilisation(4096), rel=1e-6)
    assert NEIGHBOURS == 8


def test_rows_of_one_shape_give_the_mean_time_of_every_kernel_they_measured(tmp_path):
    # the H100 table's case: one residual add of 75 MB measured 168 times at 22.5 us in one
    # profile, and twice at 47.7 us (another kernel, same bytes) in another
    rows = [
        _memory_row("aten.add", 75497472, 22.47, op="elementwise") | {"repetitions": 168},
        _memory_row("aten.add", 75497472, 47.70, op="elementwise") | {"repetitions": 2},
    ]
    table = load_kernel_table(write_kernel_csv(rows, tmp_path / "t.csv", SYNTHETIC))
    add = replace(
        memory_op("elementwise", bytes_read=75497472 / 2, bytes_written=75497472 / 2),
        aten="aten.add",
    )
    expected_s = (168 * 22.47 + 2 * 47.70) / 170 * 1e-6
    assert table.lookup(add, H100.sm_count)[:2] == (pytest.approx(expected_s), "exact")
    # a mean of times, not of rates: 10 and 30 us once each give 20 us (rates would give 15)
    rows = [_gemm_row(2048, 10.0), _gemm_row(2048, 30.0) | {"repetitions": ""}]
    table = load_kernel_table(write_kernel_csv(rows, tmp_path / "u.csv", SYNTHETIC))
    assert table.lookup(gemm_op("mm", 2048, 2048, 2048), H100.sm_count)[:2] == (pytest.approx(20e-6), "exact")


def test_skip_sources_leaves_rows_out(tmp_path):
    rows = [_gemm_row(2048, 1.0) | {"source": "profile:a"}, _gemm_row(4096, 1.0) | {"source": "micro:1"}]
    path = write_kernel_csv(rows, tmp_path / "t.csv", SYNTHETIC)
    table = load_kernel_table(path, skip_sources=("profile:a",))
    assert table.lookup(gemm_op("mm", 2048, 2048, 2048), H100.sm_count)[1] == "interpolated"
    assert "without profile:a" in table.label


def test_a_later_tables_row_replaces_an_earlier_ones_of_the_same_op_and_shape(tmp_path):
    preset = write_kernel_csv([_gemm_row(2048, 20.0), _gemm_row(4096, 100.0)], tmp_path / "p.csv", SYNTHETIC)
    mine = write_kernel_csv([_gemm_row(2048, 50.0) | {"source": "profile:mine"}], tmp_path / "m.csv", SYNTHETIC)
    table = table_from_rows(read_rows(preset), read_rows(mine), label="m over p")
    # replaced, not averaged with the preset's 20 us; the 4096 row kept
    assert table.lookup(gemm_op("mm", 2048, 2048, 2048), H100.sm_count)[:2] == (pytest.approx(50e-6), "exact")
    assert table.lookup(gemm_op("mm", 4096, 4096, 4096), H100.sm_count)[:2] == (pytest.approx(100e-6), "exact")
    assert "profile:mine" in table.sources and table.gpus == ("synthetic",)


def test_a_left_out_row_replaces_no_other_tables_row(tmp_path):
    # your rows ingested from a profile, over the preset's, scored leave-one-out against that
    # same profile: the preset's row of the shape stays (merged first, it would have gone too)
    preset = write_kernel_csv([_gemm_row(2048, 20.0) | {"source": "micro:1"}], tmp_path / "p.csv", SYNTHETIC)
    mine = write_kernel_csv([_gemm_row(2048, 50.0) | {"source": "profile:mine"}], tmp_path / "m.csv", SYNTHETIC)
    table = table_from_rows(read_rows(preset), read_rows(mine), label="m over p", skip_sources=("profile:mine",))
    assert table.lookup(gemm_op("mm", 2048, 2048, 2048), H100.sm_count)[:2] == (pytest.approx(20e-6), "exact")
    assert table.label == "m over p without profile:mine"


def test_attention_variants_do_not_price_each_other(tmp_path):
    sdpa = replace(attention_op("flash_attn_fwd", batch=1, heads_q=32, heads_kv=32, seq_q=8192, seq_kv=8192,
                                head_dim=128), aten="aten._scaled_dot_product_flash_attention")  # fmt: skip
    row = {"op": "flash_attn_fwd", "dtype": "bf16", "aten": sdpa.aten, "batch": 1, "heads_q": 32,
           "heads_kv": 32, "seq_q": 8192, "seq_kv": 8192, "head_dim": 128, "causal": "true",
           "time_us": 1000.0, "repetitions": 1, "spread_us": 0.0}  # fmt: skip
    table = load_kernel_table(write_kernel_csv([row], tmp_path / "t.csv", SYNTHETIC))
    assert table.lookup(sdpa, H100.sm_count)[:2] == (pytest.approx(1e-3), "exact")
    assert table.lookup(replace(sdpa, aten="prism.masked_attention"), H100.sm_count) is None


def _attention_row(head_dim, time_us, seq=2048):
    return {"op": "flash_attn_fwd", "dtype": "bf16", "aten": "aten._scaled_dot_product_flash_attention",
            "batch": 4, "heads_q": 16, "heads_kv": 16, "seq_q": seq, "seq_kv": seq, "head_dim": head_dim,
            "causal": "true", "time_us": time_us, "repetitions": 1, "spread_us": 0.0}  # fmt: skip


def test_attention_is_priced_as_the_head_dim_tile_its_kernel_runs(tmp_path):
    table = load_kernel_table(write_kernel_csv([_attention_row(128, 142.0)], tmp_path / "t.csv", SYNTHETIC))
    op = replace(attention_op("flash_attn_fwd", batch=4, heads_q=16, heads_kv=16, seq_q=2048, seq_kv=2048,
                              head_dim=96), aten="aten._scaled_dot_product_flash_attention")  # fmt: skip
    seconds, how, _ = table.lookup(op, H100.sm_count)
    # head dim 96 runs the 128-wide kernel, padded: the same time, not 96/128 of it
    assert seconds == pytest.approx(142e-6)
    assert how == "interpolated"  # a neighbour of another head dim, not this shape
    assert table.lookup(replace(op, head_dim=64), H100.sm_count) is None  # the 64-wide tile is another kernel


def test_kernels_per_call_come_from_the_rows_that_state_them(tmp_path):
    # a profile row says its op launched 2 kernels a call (GEMM + split-K reduce, say); a
    # microbenchmark row at the same shape lists kernel names, not launches: blank
    rows = [_gemm_row(2048, 20.0) | {"kernels": 2, "repetitions": 3},
            _gemm_row(2048, 20.0) | {"kernels": "", "repetitions": 10},
            _gemm_row(4096, 100.0) | {"kernels": 1}]  # fmt: skip
    table = load_kernel_table(write_kernel_csv(rows, tmp_path / "t.csv", SYNTHETIC))
    assert table.lookup(gemm_op("mm", 2048, 2048, 2048), H100.sm_count)[2] == 2
    # interpolated: the neighbours' counts with the neighbours' weights, here equally near
    assert table.lookup(gemm_op("mm", 2896, 2896, 2896), H100.sm_count)[2] == pytest.approx(1.5, rel=0.01)
    # no row states it: one kernel, as the curves assume
    blank = load_kernel_table(write_kernel_csv([_gemm_row(2048, 20.0)], tmp_path / "u.csv", SYNTHETIC))
    assert blank.lookup(gemm_op("mm", 2048, 2048, 2048), H100.sm_count)[2] == 1
    assert op_price(gemm_op("mm", 65536, 65536, 512), H100, table=table)[1:] == ("roofline", 1)


def test_tables_without_a_kernels_column_are_read(tmp_path):
    path = tmp_path / "old.csv"
    write_kernel_csv([_gemm_row(2048, 20.0)], path, SYNTHETIC)
    lines = path.read_text().splitlines()
    column = lines[0].split(",").index("kernels")
    path.write_text("\n".join(",".join(c for i, c in enumerate(line.split(",")) if i != column)
                              for line in lines) + "\n")  # fmt: skip
    assert load_kernel_table(path).lookup(gemm_op("mm", 2048, 2048, 2048), H100.sm_count)[1:] == ("exact", 1)


def test_a_kernel_count_below_one_is_refused_with_its_line(tmp_path):
    path = write_kernel_csv([_gemm_row(2048, 20.0) | {"kernels": 0}], tmp_path / "t.csv", SYNTHETIC)
    with pytest.raises(ValueError, match=r"t.csv:2: kernels='0' must be blank or >= 1"):
        load_kernel_table(path)


def test_a_row_too_short_to_run_at_its_throughput_lends_no_rate_upwards(tmp_path):
    # 1 MiB in 4 us: mostly a kernel's fixed cost; carried to 8 GiB it would price 33 ms
    row = {"op": "elementwise", "dtype": "bf16", "aten": "aten.add", "nbytes": 1 << 20, "time_us": 4.0,
           "repetitions": 1, "spread_us": 0.0}  # fmt: skip
    table = load_kernel_table(write_kernel_csv([row], tmp_path / "t.csv", SYNTHETIC))
    op = replace(memory_op("elementwise", bytes_read=1 << 32, bytes_written=1 << 32), aten="aten.add")
    assert op_price(op, H100, table=table)[1] == "roofline"


def test_a_table_with_no_rows_left_is_refused(tmp_path):
    # no rows would price every op by the roofline without a word
    with pytest.raises(ValueError, match="no rows"):
        load_kernel_table(write_kernel_csv([], tmp_path / "empty.csv", SYNTHETIC))
    path = write_kernel_csv([_gemm_row(2048, 100.0)], tmp_path / "one.csv", SYNTHETIC)
    with pytest.raises(ValueError, match="no rows once"):
        load_kernel_table(path, skip_sources=("",))  # every source starts with ""


def test_an_op_just_past_a_short_row_is_never_priced_below_it(tmp_path):
    # 1 MiB measured at 4 us (too short to lend its rate upwards); 4 MiB of the same aten op is
    # beyond the radius and on the curves, which move it in ~3 us of bandwidth: no less than the
    # measured 4 us a quarter of its bytes took
    row = {"op": "elementwise", "dtype": "bf16", "aten": "aten.add", "nbytes": 1 << 20, "time_us": 4.0,
           "repetitions": 1, "spread_us": 0.0}  # fmt: skip
    table = load_kernel_table(write_kernel_csv([row], tmp_path / "t.csv", SYNTHETIC))
    op = replace(memory_op("elementwise", bytes_read=1 << 21, bytes_written=1 << 21), aten="aten.add")
    assert curve_time_s(op, H100) < 4e-6
    seconds, source, _ = op_price(op, H100, table=table)
    assert source == "roofline" and seconds == pytest.approx(4e-6)
    # far beyond it the curves' own time is the larger, and stands
    big = replace(memory_op("elementwise", bytes_read=1 << 32, bytes_written=1 << 32), aten="aten.add")
    assert op_price(big, H100, table=table)[0] == curve_time_s(big, H100)
    # a smaller op sets no floor
    small = replace(op, bytes_read=1 << 16, bytes_written=1 << 16)
    assert op_price(small, H100, table=table)[0] == curve_time_s(small, H100)


def test_an_op_short_of_a_larger_row_is_never_priced_above_it(tmp_path):
    # an nll_loss forward measured at 19 us for 1.6 GB of logits (its kernel touches one entry a
    # token, so the bytes are not its traffic); a quarter of those bytes is beyond the radius and
    # on the curves, which read every byte: no longer than the larger op was measured to take
    row = _nll_row("aten.nll_loss_forward", 1 << 31, 19.0)
    table = load_kernel_table(write_kernel_csv([row], tmp_path / "t.csv", SYNTHETIC))
    op = replace(memory_op("cross_entropy", bytes_read=1 << 28, bytes_written=0, dtype="fp32"),
                 aten="aten.nll_loss_forward")  # fmt: skip
    assert curve_time_s(op, H100) > 19e-6
    assert op_price(op, H100, table=table) == (pytest.approx(19e-6), "roofline", 1.0)
    # another aten op's row bounds nothing: it is another kernel
    other = replace(op, aten="aten.nll_loss_backward")
    assert op_price(other, H100, table=table)[0] == curve_time_s(other, H100)
    # GEMMs: a (made-up) 4096^3 row of 2 us bounds the 1024^3 GEMM it contains, which the curves
    # price longer; not one larger on one field and smaller on another
    gemms = load_kernel_table(write_kernel_csv([_gemm_row(4096, 2.0)], tmp_path / "g.csv", SYNTHETIC))
    inside = gemm_op("mm", 1024, 1024, 1024)
    assert curve_time_s(inside, H100) > 2e-6
    assert op_price(inside, H100, table=gemms) == (pytest.approx(2e-6), "roofline", 1.0)
    wide = gemm_op("mm", 1024, 8192 * 4, 1024)
    assert op_price(wide, H100, table=gemms) == (curve_time_s(wide, H100), "roofline", 1.0)


def test_an_op_past_its_class_s_rows_takes_no_less_than_the_fastest_of_them(tmp_path):
    # two other aten ops of its class measured at 1 KiB (too short to lend their rate upwards);
    # a 4 KiB mul is beyond their radius and has no row of its own: the curves move it in
    # nanoseconds, but no kernel of its class ran in less than 1.2 us
    rows = [{"op": "elementwise", "dtype": "fp32", "aten": aten, "nbytes": 1024, "time_us": time_us,
             "repetitions": 1, "spread_us": 0.0} for aten, time_us in (("aten.add", 1.2), ("aten.sub", 3.0))]  # fmt: skip
    table = load_kernel_table(write_kernel_csv(rows, tmp_path / "t.csv", SYNTHETIC))
    mul = replace(memory_op("elementwise", bytes_read=2048, bytes_written=2048, dtype="fp32"), aten="aten.mul")
    assert curve_time_s(mul, H100) < 0.01e-6
    # the fastest, not the slower sub: that is another kernel's time, not a bound on this one
    assert op_price(mul, H100, table=table) == (pytest.approx(1.2e-6), "roofline", 1.0)


def _nll_row(aten, nbytes, time_us):
    return {"op": "cross_entropy", "dtype": "fp32", "aten": aten, "nbytes": nbytes,
            "time_us": time_us, "repetitions": 1, "spread_us": 0.0}  # fmt: skip


def _fused_loss_backward(tokens, vocab):
    """The fused loss's backward as the capture records it (workloads/loss.py): float32 loss
    gradient first (its dtype keys the op), bf16 logits read, their bf16 gradient written."""
    logits = tokens * vocab * 2
    op = memory_op("cross_entropy", bytes_read=logits + tokens * 16, bytes_written=logits, dtype="fp32")
    return replace(op, aten="prism.cross_entropy_backward")


def test_nll_loss_rows_price_their_own_op_but_lend_no_rate_to_their_class(tmp_path):
    # synthetic times, at the kernels' order: ~20 us whatever the vocabulary
    rows = [_nll_row("aten.nll_loss_backward", 3_293_708_296, 11.0),
            _nll_row("aten.nll_loss_forward", 1_646_886_920, 19.0)]  # fmt: skip
    table = load_kernel_table(write_kernel_csv(rows, tmp_path / "t.csv", SYNTHETIC))
    nll = replace(memory_op("cross_entropy", bytes_read=1_646_886_920, bytes_written=1_646_821_376,
                            dtype="fp32"), aten="aten.nll_loss_backward")  # fmt: skip
    assert op_price(nll, H100, table=table)[:2] == (pytest.approx(11e-6), "exact")
    fused = _fused_loss_backward(8192, 50368)
    seconds, source, _ = op_price(fused, H100, table=table)
    assert source == "roofline" and seconds == curve_time_s(fused, H100)


def test_an_nll_loss_op_with_no_row_of_its_own_near_takes_the_other_nll_loss_rows(tmp_path):
    rows = [_nll_row("aten.nll_loss_backward", 1 << 30, 10.0)]
    table = load_kernel_table(write_kernel_csv(rows, tmp_path / "t.csv", SYNTHETIC))
    forward = replace(memory_op("cross_entropy", bytes_read=1 << 29, bytes_written=1 << 10, dtype="fp32"),
                      aten="aten.nll_loss_forward")  # fmt: skip
    seconds, source, _ = op_price(forward, H100, table=table)
    # ~5 us at the backward's "rate", where its bytes at HBM bandwidth take ~200 us
    assert source == "interpolated" and seconds == pytest.approx(forward.bytes_total / (1 << 30) * 10e-6)


def test_other_memory_rows_still_lend_their_rate_to_their_class(tmp_path):
    rows = [_nll_row("aten.nll_loss_backward", 1 << 30, 10.0),
            _nll_row("aten.cross_entropy_made_up", 1 << 30, 400.0)]  # fmt: skip
    table = load_kernel_table(write_kernel_csv(rows, tmp_path / "t.csv", SYNTHETIC))
    op = replace(memory_op("cross_entropy", bytes_read=1 << 29, bytes_written=1 << 29, dtype="fp32"),
                 aten="aten.another")  # fmt: skip
    assert op_price(op, H100, table=table)[:2] == (pytest.approx(400e-6), "interpolated")


def test_the_fused_loss_backward_is_priced_by_its_bytes_on_the_committed_h200_table():
    # MPT-7B's 8 192 tokens x 50 368: an H200 measured 0.536 ms (Inductor's kernel,
    # results/calibration/README.md); the nll_loss rows of the class priced it at 0.02 ms
    h200 = gpu_preset("h200-141g")
    table = load_kernel_table(Path(__file__).resolve().parents[3] / "results/kernels/h200-141g.csv")
    seconds, source, _ = op_price(_fused_loss_backward(8192, 50368), h200, table=table)
    assert source == "roofline"
    assert seconds == pytest.approx(2 * 8192 * 50368 * 2 / 4.8e12 / 0.835, rel=1e-3)


def test_an_embedding_forward_takes_no_rate_from_the_backward_s_rows(tmp_path):
    # the H100 table's order: a 17 MB gather in 8 us, its sort-and-scatter backward at 66 us
    rows = [{"op": "embedding", "dtype": "bf16", "aten": aten, "nbytes": 16_793_600, "time_us": t,
             "repetitions": 1, "spread_us": 0.0}
            for aten, t in (("aten.embedding", 8.0), ("aten.embedding_dense_backward", 66.2))]  # fmt: skip
    table = load_kernel_table(write_kernel_csv(rows, tmp_path / "t.csv", SYNTHETIC))
    # 50 MB, beyond its own row's radius: extrapolated at the backward's rate it took 200 us
    forward = replace(memory_op("embedding", bytes_read=44 << 20, bytes_written=6 << 20, dtype="bf16"),
                      aten="aten.embedding")  # fmt: skip
    seconds, source, _ = op_price(forward, H100, table=table)
    assert source == "roofline" and seconds == max(curve_time_s(forward, H100), 8.0e-6)
    backward = replace(forward, aten="aten.embedding_dense_backward")
    assert op_price(backward, H100, table=table)[1] == "extrapolated"  # from its own row
