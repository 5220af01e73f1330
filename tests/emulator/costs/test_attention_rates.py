"""Attention priced from a kernel's published rates (emulator.costs.attention_rates), on the
committed FlashAttention Triton rates (results/kernels/triton-attention.csv: FlashAttention v1's
bars times the ratio fitted per head dim, results/kernels/triton-attention-fit.json) and
FlashAttention-2's (results/kernels/flash2-attention.csv)."""

import csv
import json
from dataclasses import replace
from pathlib import Path

import pytest

from emulator.costs.attention_rates import load_attention_rates
from emulator.costs.ops import attention_op, gemm_op
from emulator.hardware import gpu_preset

RATES_CSV = Path(__file__).resolve().parents[3] / "results/kernels/triton-attention.csv"
AMPERE = load_attention_rates(RATES_CSV, "triton", "ampere")
HOPPER = load_attention_rates(RATES_CSV, "triton", "hopper")
FLASH2_CSV = RATES_CSV.with_name("flash2-attention.csv")
# head dim -> the Triton kernel's rate over FlashAttention v1's bars
RATIO = {
    int(hd): r
    for hd, r in json.loads(RATES_CSV.with_name("triton-attention-fit.json").read_text())[
        "ratios"
    ].items()
}


def committed_rate(arch, causal, head_dim, seqlen):
    with RATES_CSV.open() as f:
        for r in csv.DictReader(f):
            if (r["arch"], r["causal"], r["head_dim"], r["seqlen"]) == (
                arch, str(causal).lower(), str(head_dim), str(seqlen)):  # fmt: skip
                return float(r["fwd_bwd_tflops"])
    raise KeyError


def test_at_a_measured_point_the_rate_is_the_figures():
    # FlashAttention-2's A100 figure: FlashAttention v1, causal, head dim 128, 4k: 76 TFLOP/s
    assert AMPERE.tflops(causal=True, head_dim=128, seq_len=4096) == pytest.approx(76.0 * RATIO[128])
    assert HOPPER.tflops(causal=False, head_dim=64, seq_len=512) == committed_rate(
        "hopper", False, 64, 512
    )


def test_between_points_it_interpolates_and_beyond_them_it_holds_the_nearest():
    at_4k, at_8k = (AMPERE.tflops(causal=True, head_dim=128, seq_len=s) for s in (4096, 8192))
    assert at_4k < AMPERE.tflops(causal=True, head_dim=128, seq_len=6000) < at_8k
    # the 16k bar
    assert AMPERE.tflops(causal=True, head_dim=128, seq_len=65536) == pytest.approx(83.0 * RATIO[128])
    d64, d128 = (AMPERE.tflops(causal=True, head_dim=d, seq_len=2048) for d in (64, 128))
    assert AMPERE.tflops(causal=True, head_dim=96, seq_len=2048) == pytest.approx((d64 + d128) / 2)
    assert AMPERE.tflops(causal=True, head_dim=256, seq_len=2048) == d128


def test_forward_plus_backward_takes_the_figures_time():
    gpu = gpu_preset("a100-sxm-80g")
    shape = dict(batch=1, heads_q=16, heads_kv=16, seq_q=16384, seq_kv=16384, head_dim=128)
    fwd, bwd = (attention_op(n, **shape) for n in ("flash_attn_fwd", "flash_attn_bwd"))
    total_s = AMPERE.time_s(fwd, gpu) + AMPERE.time_s(bwd, gpu)
    # the figure's 83 TFLOP/s (times the fitted ratio) over the pair's FLOPs (forward halved
    # when causal, backward 2.5x)
    assert total_s == pytest.approx((fwd.flops + bwd.flops) / (83e12 * RATIO[128]))
    # the same op on the 40 GB A100 (same chip and peak) costs the same
    assert AMPERE.time_s(fwd, gpu_preset("a100-sxm-40g")) == AMPERE.time_s(fwd, gpu)


def test_rates_refuse_another_architecture_and_other_ops():
    op = attention_op("flash_attn_fwd", batch=1, heads_q=8, heads_kv=8, seq_q=1024, seq_kv=1024,
                      head_dim=64)  # fmt: skip
    with pytest.raises(ValueError, match="built for ampere"):
        AMPERE.time_s(op, gpu_preset("h100-sxm-80g"))
    with pytest.raises(ValueError, match="not attention"):
        AMPERE.time_s(gemm_op("mm", 64, 64, 64), gpu_preset("a100-sxm-80g"))
    assert load_attention_rates(RATES_CSV, "triton", "blackwell") is None


def test_the_triton_kernel_is_slower_than_the_tables_flash_attention_at_long_sequences():
    # on the A100 the table prices FlashAttention-2 (its figure: 189 TFLOP/s at 16k, causal,
    # head dim 128); the Triton kernel is priced at FlashAttention v1's 83 times its ratio
    from prismbench.emulate import kernel_table_for

    gpu = gpu_preset("a100-sxm-80g")
    op = attention_op("flash_attn_bwd", batch=1, heads_q=16, heads_kv=16, seq_q=16384,
                      seq_kv=16384, head_dim=128)  # fmt: skip
    op = replace(op, aten="aten._scaled_dot_product_flash_attention_backward")
    table_s, how, _ = kernel_table_for("a100-sxm-80g").lookup(op, gpu.sm_count)
    assert how == "exact"
    assert AMPERE.time_s(op, gpu) > 1.8 * table_s  # 189 / (83 x 1.14) = 2.0 for the pair


def test_flash_attention_2_on_an_h100_is_priced_at_its_figure_and_slower_than_the_table():
    # FlashAttention-2's H100 figure: causal, head dim 128, 8k: 308 TFLOP/s forward+backward
    hopper = load_attention_rates(FLASH2_CSV, "flash2", "hopper")
    assert hopper.tflops(causal=True, head_dim=128, seq_len=8192) == 308.0
    # and its A100 figure is the one the A100 table's attention rows were split from
    ampere = load_attention_rates(FLASH2_CSV, "flash2", "ampere")
    assert ampere.tflops(causal=True, head_dim=128, seq_len=16384) == 189.0
    from prismbench.emulate import kernel_table_for

    # Llama 3 8B's attention at 8k tokens, a shape the H100 table measured (cuDNN's kernels)
    gpu = gpu_preset("h100-sxm-80g")
    table = kernel_table_for("h100-sxm-80g")
    shape = dict(batch=2, heads_q=32, heads_kv=8, seq_q=8192, seq_kv=8192, head_dim=128)
    for name, aten in (("flash_attn_fwd", "aten._scaled_dot_product_flash_attention"),
                       ("flash_attn_bwd", "aten._scaled_dot_product_flash_attention_backward")):
        op = replace(attention_op(name, **shape), aten=aten)
        table_s, how, _ = table.lookup(op, gpu.sm_count)
        assert how == "exact"
        assert hopper.time_s(op, gpu) > 1.3 * table_s
