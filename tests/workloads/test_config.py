"""ModelSpec validation and the layout rules shared by the job spec and the workloads."""

import pytest

from workloads.config import (
    ModelSpec,
    SpecError,
    check_schedule,
    check_tensor_parallel,
    stage_layer_counts,
)
from workloads.flavors import get_flavor


@pytest.mark.parametrize(
    ("layers", "stages", "counts"),
    [
        (80, 4, (20, 20, 20, 20)),
        (126, 16, (7,) + (8,) * 14 + (7,)),  # Llama 3.1 405B, Llama 3 paper
        (7, 3, (2, 3, 2)),
        (10, 8, (1, 1, 1, 2, 2, 1, 1, 1)),
        (5, 1, (5,)),
    ],
)
def test_stage_layer_counts_trims_outer_stages_first(layers, stages, counts):
    assert stage_layer_counts(layers, stages) == counts
    assert sum(counts) == layers


def test_fewer_layers_than_stages_is_refused():
    with pytest.raises(SpecError, match=r"model.layers\(4\) is fewer than pipeline stages pp\*vpp\(8\)"):
        stage_layer_counts(4, 8)


@pytest.mark.parametrize(
    ("schedule", "pp", "vpp", "microbatches", "rule"),
    [
        ("1f1b", 2, 2, 4, "needs an interleaved schedule"),
        ("gpipe", 2, 2, 4, "needs an interleaved schedule"),
        ("interleaved-1f1b", 2, 1, 4, "vpp >= 2"),
        ("1f1b", 4, 1, 2, r">= pp\(4\)"),
        ("zero-bubble", 2, 2, 7, "multiple of"),
        ("dualpipe", 2, 1, 4, "must be one of"),
    ],
)
def test_check_schedule_refuses(schedule, pp, vpp, microbatches, rule):
    with pytest.raises(SpecError, match=rule):
        check_schedule(schedule, pp, vpp, microbatches)


@pytest.mark.parametrize(
    ("schedule", "pp", "vpp", "microbatches"),
    [("zero-bubble", 2, 1, 4), ("interleaved-1f1b", 4, 2, 8), ("gpipe", 4, 1, 2), ("1f1b", 1, 1, 1)],
)
def test_check_schedule_accepts(schedule, pp, vpp, microbatches):
    check_schedule(schedule, pp, vpp, microbatches)


def test_tensor_parallel_refuses_kv_head_replication():
    llama = get_flavor("llama3-70b")  # 64 heads, 8 kv heads
    check_tensor_parallel(llama, 8)
    with pytest.raises(SpecError, match=r"tp\(16\) does not divide model.kv_heads\(8\)"):
        check_tensor_parallel(llama, 16)


def test_model_spec_names_the_broken_field():
    with pytest.raises(SpecError, match=r"model.heads\(12\) does not divide model.hidden\(100\)"):
        ModelSpec(name="x", family="llama", layers=2, hidden=100, ffn_hidden=256, heads=12,
                  kv_heads=4, vocab=10, positions="rope")
    with pytest.raises(SpecError, match="model.positions='rope' is not valid for family 'gpt'"):
        ModelSpec(name="x", family="gpt", layers=2, hidden=64, ffn_hidden=256, heads=4,
                  kv_heads=4, vocab=10, positions="rope")
    # 15 channels a head: RoPE's pairs do not fit (it was a RuntimeError deep in the capture)
    with pytest.raises(SpecError, match=r"model.hidden\(60\) / model.heads\(4\) = 15: RoPE"):
        ModelSpec(name="x", family="llama", layers=2, hidden=60, ffn_hidden=256, heads=4,
                  kv_heads=2, vocab=10, positions="rope")
    ModelSpec(name="x", family="gpt", layers=2, hidden=60, ffn_hidden=256, heads=4, kv_heads=4,
              vocab=10, positions="learned")  # learned positions take any head dimension


_TINY_LLAMA = dict(name="x", family="llama", layers=2, hidden=64, ffn_hidden=256, heads=4,
                   kv_heads=2, vocab=10, positions="rope")  # fmt: skip


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        (dict(rope_theta="big"), "model.rope_theta='big' must be a positive finite number"),
        (dict(rope_theta=-10.0), "model.rope_theta=-10.0 must be a positive finite number"),
        (dict(rope_theta=float("inf")), "model.rope_theta=inf must be a positive finite number"),
        (dict(norm_eps=-1.0), "model.norm_eps=-1.0 must be a positive finite number"),
        (dict(norm_eps=float("nan")), "model.norm_eps=nan must be a positive finite number"),
        (dict(norm_eps=True), "model.norm_eps=True must be a positive finite number"),
        (dict(tie_embeddings="yes"), "model.tie_embeddings='yes' must be a boolean"),
        (dict(tie_embeddings=0), "model.tie_embeddings=0 must be a boolean"),
        (dict(name=7), "model.name=7 must be a non-empty string"),
    ],
)
def test_model_spec_refuses_a_value_of_the_wrong_kind(change, refusal):
    with pytest.raises(SpecError, match=refusal):
        ModelSpec(**{**_TINY_LLAMA, **change})
