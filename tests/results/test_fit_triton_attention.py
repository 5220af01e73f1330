"""The Triton attention kernel's fitted ratio over FlashAttention v1's bars
(results/kernels/fit_triton_attention.py) on SYNTHETIC rows, and the rates built with it
(results/kernels/build_attention_rates.py)."""

import numpy as np
import pytest


def synthetic_row(fit, name, head_dim, measured_s, rest_s, attention_s):
    """A row whose prediction at ratio k is rest + attention / k."""
    return {
        "baseline": name,
        "gpu": "a100-sxm-80g",
        "head_dim": head_dim,
        "seq_len": 8192,
        "measured_s": measured_s,
        "predicted_s": list(rest_s + attention_s / fit.RATIOS),
    }


def test_each_head_dim_gets_the_ratio_its_own_rows_ask_for(triton_fit):
    # head dim 128: both rows are exact at 1.2; head dim 64: exact at 0.95
    rows = [
        synthetic_row(triton_fit, "a", 128, 1.0 + 3.0 / 1.2, 1.0, 3.0),
        synthetic_row(triton_fit, "b", 128, 2.0 + 1.0 / 1.2, 2.0, 1.0),
        synthetic_row(triton_fit, "c", 64, 1.0 + 2.0 / 0.95, 1.0, 2.0),
    ]
    result = triton_fit.fit(rows)
    assert result["ratios"] == {64: pytest.approx(0.95), 128: pytest.approx(1.2)}
    by_name = {r["baseline"]: r for r in result["rows"]}
    assert by_name["a"]["error_fit"] == pytest.approx(0.0, abs=1e-12)
    # at ratio 1 its attention takes the whole 3.0 s: 4.0 s predicted against 3.5 s
    assert by_name["a"]["error_ratio_1"] == pytest.approx(0.5 / 3.5)
    # left out, row a is predicted with the ratio row b alone asks for: the same 1.2
    assert by_name["a"]["ratio_left_out"] == pytest.approx(1.2)


def test_a_row_left_out_is_predicted_with_the_others_ratio(triton_fit):
    rows = [
        synthetic_row(triton_fit, "fast", 128, 1.0 + 2.0 / 1.3, 1.0, 2.0),
        synthetic_row(triton_fit, "slow", 128, 1.0 + 2.0 / 1.1, 1.0, 2.0),
        synthetic_row(triton_fit, "slow-too", 128, 1.0 + 2.0 / 1.1, 1.0, 2.0),
    ]
    by_name = {r["baseline"]: r for r in triton_fit.fit(rows)["rows"]}
    fast = by_name["fast"]
    assert fast["ratio_left_out"] == pytest.approx(1.1)
    assert fast["error_left_out"] == pytest.approx((1.0 + 2.0 / 1.1) / (1.0 + 2.0 / 1.3) - 1)
    assert abs(fast["error_left_out"]) > abs(fast["error_fit"])


def test_the_grid_holds_ratio_one(triton_fit):
    # the "ratio 1" column is FlashAttention v1's bars themselves
    assert np.min(np.abs(triton_fit.RATIOS - 1.0)) == 0.0


def test_the_rates_are_the_v1_bars_times_the_ratio_of_their_head_dim(attention_build):
    bars = attention_build.read_bars()
    rows = attention_build.triton_rows(bars, {64: 0.9, 128: 1.25})
    for r in rows:
        gpu = "a100-sxm-80g" if r["arch"] == "ampere" else "h100-sxm-80g"
        bar = bars[(gpu, "flash1", r["causal"], r["head_dim"], r["seqlen"])]
        ratio = 0.9 if r["head_dim"] == 64 else 1.25
        assert r["fwd_bwd_tflops"] == pytest.approx(bar * ratio, abs=1e-3)
        assert r["source"].endswith(f"x{ratio:.3f} (triton-attention-fit.json)")
    with pytest.raises(ValueError, match=r"no fitted ratio for head dims \[128\]"):
        attention_build.triton_rows(bars, {64: 1.0})


def test_the_committed_rates_are_what_the_committed_fit_gives(attention_build):
    from emulator.costs.attention_rates import load_attention_rates

    bars = attention_build.read_bars()
    rows = attention_build.triton_rows(bars, attention_build.fitted_ratios())
    for arch in ("ampere", "hopper"):
        committed = load_attention_rates(attention_build.TRITON_OUT, "triton", arch)
        for r in (r for r in rows if r["arch"] == arch):
            rate = committed.tflops(
                causal=r["causal"] == "true", head_dim=r["head_dim"], seq_len=r["seqlen"]
            )
            assert rate == pytest.approx(r["fwd_bwd_tflops"])
