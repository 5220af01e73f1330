"""results/fidelity/attention_split.py: the two-factor fit behind its diagnosis."""

import pytest


def _row(rest_s, attention_s, f_rest, f_attention):
    return {"predicted_s": rest_s + attention_s, "parts_s": [attention_s],
            "measured_s": f_rest * rest_s + f_attention * attention_s}  # fmt: skip


def test_fit_recovers_the_factors_that_made_the_measurements(split):
    # short sequences (little attention) to long ones (mostly attention), as llm-foundry's rows
    rows = [_row(rest, attention, 1.25, 0.8) for rest, attention in
            ((1.5, 0.2), (1.2, 0.25), (1.7, 5.4), (1.8, 10.8))]  # fmt: skip
    f_rest, (f_attention,), residuals = split.fit(rows)
    assert (f_rest, f_attention) == (pytest.approx(1.25), pytest.approx(0.8))
    assert max(abs(r) for r in residuals) < 1e-9


def test_a_row_the_split_cannot_explain_shows_as_a_residual(split):
    rows = [_row(1.0, 0.1 * i, 1.0, 1.0) for i in range(1, 6)]
    rows[2]["measured_s"] *= 1.3  # one row 30 % slower than any factor says
    *_, residuals = split.fit(rows)
    assert max(range(5), key=lambda i: abs(residuals[i])) == 2


def test_factors_fitted_on_one_precision_score_the_other_rows_out_of_sample(split):
    bf16 = [
        {**_row(rest, part, 0.8, 1.3), "name": f"b{i}", "group": ("gpu", "bf16"), "plain": True}
        for i, (rest, part) in enumerate(((1.0, 2.0), (0.5, 2.0), (0.9, 1.7)))
    ]
    fp8 = {**_row(0.7, 1.1, 0.8, 1.3), "name": "f0", "group": ("gpu", "fp8"), "plain": True}
    context_parallel = {**fp8, "name": "f1", "plain": False}  # left out: not plain
    lines = split.held_out([*bf16, fp8, context_parallel], "bf16")
    (row,) = [line for line in lines if line.startswith("| f")]
    assert row.split("|")[1].strip() == "f0"
    assert row.split("|")[-2].strip() == "+0.0 %"  # the same factors made it: exact


def test_gemms_and_attention_get_a_factor_each(split):
    made = (1.1, 1.3, 0.9)  # rest, GEMMs, attention
    rows = [
        {"predicted_s": rest + gemm + attention, "parts_s": [gemm, attention],
         "measured_s": made[0] * rest + made[1] * gemm + made[2] * attention}
        for rest, gemm, attention in ((1.0, 2.0, 0.1), (0.5, 1.0, 2.0), (0.8, 3.0, 1.0), (0.3, 0.5, 0.2))
    ]  # fmt: skip
    f_rest, factors, _ = split.fit(rows)
    assert [f_rest, *factors] == [pytest.approx(f) for f in made]
