"""Llama: shapes, parameter count, GQA, RoPE positions, init."""

from dataclasses import replace

import pytest
import torch

from workloads.flavors import get_flavor, parameter_count
from workloads.models.common import rope_rotate
from workloads.models.llama import Llama

DEBUG = get_flavor("llama-debug")
MHA = replace(DEBUG, name="llama-debug-mha", kv_heads=DEBUG.heads)


def _model(spec, seed=0):
    model = Llama(spec)
    model.init_weights(seed)
    return model


def _tokens(spec, batch=2, seq=16):
    return torch.randint(0, spec.vocab, (batch, seq), generator=torch.Generator().manual_seed(1))


def test_debug_flavor_uses_gqa():
    assert DEBUG.kv_heads < DEBUG.heads


@pytest.mark.parametrize("spec", [DEBUG, MHA], ids=["gqa", "mha"])
def test_logits_shape(spec):
    assert _model(spec)(_tokens(spec)).shape == (2, 16, spec.vocab)


def test_kv_projections_have_kv_heads_width():
    attention = Llama(DEBUG).layers["0"].attention
    assert attention.wk.out_features == DEBUG.kv_heads * DEBUG.head_dim
    assert attention.wq.out_features == DEBUG.hidden


@pytest.mark.parametrize("spec", [DEBUG, MHA, get_flavor("llama3-8b")], ids=["gqa", "mha", "8b"])
def test_meta_parameter_count_matches_formula(spec):
    with torch.device("meta"):
        model = Llama(spec)
    assert sum(p.numel() for p in model.parameters()) == parameter_count(spec)


def test_gqa_equals_mha_with_repeated_kv_weights():
    gqa = _model(DEBUG)
    mha = Llama(MHA)
    state = gqa.state_dict()
    group = DEBUG.heads // DEBUG.kv_heads
    for key, value in state.items():
        if key.endswith(("wk.weight", "wv.weight")):
            heads = value.unflatten(0, (DEBUG.kv_heads, DEBUG.head_dim))
            state[key] = heads.repeat_interleave(group, dim=0).flatten(0, 1)
    mha.load_state_dict(state)
    tokens = _tokens(DEBUG)
    torch.testing.assert_close(gqa(tokens), mha(tokens))


def test_explicit_positions_equal_default():
    model = _model(DEBUG)
    tokens = _tokens(DEBUG)
    torch.testing.assert_close(model(tokens, torch.arange(16)), model(tokens))


def test_prefix_rows_match_full_causal_run():
    model = _model(DEBUG)
    tokens = _tokens(DEBUG)
    torch.testing.assert_close(model(tokens[:, :7], torch.arange(7)), model(tokens)[:, :7])


def test_rope_attention_scores_depend_only_on_relative_position():
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)

    def score(pq, pk):
        rq = rope_rotate(q, torch.tensor([pq]), 10_000.0)
        rk = rope_rotate(k, torch.tensor([pk]), 10_000.0)
        return (rq * rk).sum()

    torch.testing.assert_close(score(9, 4), score(105, 100))
    assert not torch.allclose(score(9, 4), score(9, 5))


def test_rope_theta_changes_output():
    tokens = _tokens(DEBUG)
    base = _model(DEBUG)(tokens)
    other = _model(replace(DEBUG, rope_theta=500_000.0))(tokens)
    assert not torch.allclose(base, other)


def test_init_weights_after_meta_build_matches_eager_init():
    with torch.device("meta"):
        late = Llama(DEBUG)
    late.to_empty(device="cpu")
    late.init_weights(5)
    early = _model(DEBUG, seed=5)
    for (name, a), (_, b) in zip(early.named_parameters(), late.named_parameters(), strict=True):
        assert torch.equal(a, b), name
    assert torch.all(early.layers["1"].ffn_norm.weight == 1)


def test_refuses_gpt_spec():
    with pytest.raises(ValueError, match="family='llama'"):
        Llama(get_flavor("gpt-debug"))
