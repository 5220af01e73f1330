"""Published pairs that change one setting, measured against predicted (paired_deltas.py)."""

import pytest


def _row(paired_deltas, rid, measured_s, predicted_s, **job):
    base = {"model.name": "m", "cluster.gpu": "h100-sxm-80g", "parallel.dp": 8,
            "batch.global_batch": 16, "kernels.compile": False, "kernels.fp8_casts": "unfused",
            "train.precision": "bf16"}  # fmt: skip
    return paired_deltas.Row(f"src__m__8g__{rid}", "src", measured_s, predicted_s, base | job)


COMPILED = {"kernels.compile": True, "kernels.fp8_casts": "fused"}


def test_a_pair_is_one_field_or_one_group_of_fields_set_off_first(paired_deltas):
    rows = [
        _row(paired_deltas, "r002", 0.8, 0.7, **COMPILED),
        _row(paired_deltas, "r001", 1.0, 1.0),
        _row(paired_deltas, "r003", 0.9, 0.9, **{"train.precision": "fp8"}),
    ]
    pairs = paired_deltas.find_pairs(rows)
    # r002 -> r003 differs in compile, casts and precision: not one setting
    assert [(p.setting, p.a.rid, p.b.rid) for p in pairs] == [
        ("torch.compile", "r001", "r002"),
        ("train.precision", "r001", "r003"),
    ]
    compile_pair = pairs[0]
    assert compile_pair.measured_ratio == pytest.approx(0.8)
    assert compile_pair.quotient == pytest.approx(0.7 / 0.8)
    assert compile_pair.same_direction


def test_a_flat_measured_ratio_against_a_predicted_gain_is_a_different_direction(paired_deltas):
    rows = [_row(paired_deltas, "r001", 1.0, 1.0),
            _row(paired_deltas, "r002", 1.01, 0.9, **{"train.precision": "fp8"})]  # fmt: skip
    (pair,) = paired_deltas.find_pairs(rows)
    assert not pair.same_direction


def test_the_committed_table_has_the_compile_pairs_the_readme_quotes(paired_deltas):
    pairs = paired_deltas.find_pairs(paired_deltas.load_rows(paired_deltas.HERE / "fidelity.csv"))
    compiled = {(p.a.rid, p.b.rid): p for p in pairs if p.setting == "torch.compile"}
    ratios = {
        k: (round(p.measured_ratio, 3), round(p.predicted_ratio, 3)) for k, p in compiled.items()
    }
    assert ratios == {("r033", "r034"): (0.864, 0.790), ("r040", "r041"): (0.860, 0.786)}
