"""GPT: shapes, parameter count, ALiBi slopes and head slices, positions."""

import math
from dataclasses import replace

import pytest
import torch

from workloads.flavors import get_flavor, parameter_count
from workloads.models.common import alibi_slopes, local_alibi_slopes
from workloads.models.gpt import GPT

DEBUG = get_flavor("gpt-debug")
ALIBI = replace(DEBUG, name="gpt-debug-alibi", positions="alibi", heads=6, kv_heads=6, hidden=96)


def _model(spec, seed=0):
    model = GPT(spec)
    model.init_weights(seed)
    return model


def _tokens(spec, batch=2, seq=16):
    return torch.randint(0, spec.vocab, (batch, seq), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("spec", [DEBUG, ALIBI], ids=["learned", "alibi"])
def test_logits_shape(spec):
    assert _model(spec)(_tokens(spec)).shape == (2, 16, spec.vocab)


@pytest.mark.parametrize("spec", [DEBUG, ALIBI, replace(DEBUG, tie_embeddings=False)])
def test_meta_parameter_count_matches_formula(spec):
    with torch.device("meta"):
        model = GPT(spec)
    assert sum(p.numel() for p in model.parameters()) == parameter_count(spec)


def test_init_weights_is_deterministic_and_matches_meta_build():
    with torch.device("meta"):
        late = GPT(DEBUG)
    late.to_empty(device="cpu")
    late.init_weights(7)
    early = _model(DEBUG, seed=7)
    for (name, a), (_, b) in zip(early.named_parameters(), late.named_parameters(), strict=True):
        assert torch.equal(a, b), name
    assert torch.all(early.layers["0"].attention.wq.bias == 0)
    assert torch.all(early.norm.weight == 1)
    assert early.layers["0"].attention.wq.weight.std().item() == pytest.approx(0.02, rel=0.1)


def test_init_weights_of_a_layer_does_not_depend_on_other_layers():
    full = _model(DEBUG, seed=3)
    split = GPT(DEBUG)
    del split.layers["0"]
    split.tok_embeddings = None
    split.pos_embeddings = None
    split.init_weights(3)
    assert torch.equal(
        split.layers["2"].feed_forward.w1.weight, full.layers["2"].feed_forward.w1.weight
    )
    assert torch.equal(split.output.weight, full.tok_embeddings.weight)


def test_alibi_slopes_power_of_two():
    assert alibi_slopes(8) == pytest.approx([2.0 ** -(i + 1) for i in range(8)])


def test_alibi_slopes_non_power_of_two():
    # 12 heads: the 8 slopes of 8 heads, then every other slope of 16 heads
    expected = [2.0 ** -(i + 1) for i in range(8)] + [2.0 ** -(i + 0.5) for i in range(4)]
    assert alibi_slopes(12) == pytest.approx(expected)
    assert all(math.isfinite(s) and 0 < s < 1 for s in alibi_slopes(25))


@pytest.mark.parametrize("heads", [1, 8, 12, 25, 32, 112])
def test_the_slopes_made_on_the_device_are_the_reference_slopes_of_each_rank(heads):
    for tp in (t for t in (1, 2, 4, 8) if heads % t == 0):
        local = heads // tp
        made = torch.cat([local_alibi_slopes(heads, r * local, local, "cpu") for r in range(tp)])
        assert made.dtype == torch.float32
        torch.testing.assert_close(made, torch.tensor(alibi_slopes(heads)), rtol=2e-7, atol=0)
    with pytest.raises(ValueError, match="exceeds model heads"):
        local_alibi_slopes(heads, 1, heads, "cpu")


def test_the_slopes_are_made_on_the_gpu_not_copied_from_the_host():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.__name__)
            return func(*args, **(kwargs or {}))

    with FakeTensorMode(), Ops() as ops:
        slopes = local_alibi_slopes(112, 56, 28, "cuda")  # crosses the two runs of slopes
    assert slopes.is_cuda and slopes.shape == (28,)
    assert not {"lift_fresh.default", "_to_copy.default"} & set(ops.names), ops.names


def test_alibi_head_offset_slice_matches_full_heads():
    attention = GPT(ALIBI).layers["0"].attention.core_attention
    b, s, d = 2, 10, 16
    q, k, v = (torch.randn(b, s, 6, d) for _ in range(3))
    positions = torch.arange(s)
    full = attention(q, k, v, positions)
    attention.head_offset = 2
    part = attention(q[:, :, 2:5], k[:, :, 2:5], v[:, :, 2:5], positions)
    torch.testing.assert_close(part, full[:, :, 2:5])
    attention.head_offset = 0
    wrong = attention(q[:, :, 2:5], k[:, :, 2:5], v[:, :, 2:5], positions)
    assert not torch.allclose(wrong, full[:, :, 2:5])


def test_alibi_head_offset_out_of_range_is_refused():
    attention = GPT(ALIBI).layers["0"].attention.core_attention
    attention.head_offset = 4
    q = torch.randn(1, 4, 3, 16)
    with pytest.raises(ValueError, match="exceeds model heads"):
        attention(q, q, q, torch.arange(4))


@pytest.mark.parametrize("spec", [DEBUG, ALIBI], ids=["learned", "alibi"])
def test_explicit_positions_equal_default(spec):
    model = _model(spec)
    tokens = _tokens(spec)
    torch.testing.assert_close(model(tokens, torch.arange(16)), model(tokens))


def test_shifted_positions_change_learned_output():
    model = _model(DEBUG)
    tokens = _tokens(DEBUG)
    assert not torch.allclose(model(tokens, torch.arange(16) + 5), model(tokens))


def test_alibi_is_translation_invariant():
    model = _model(ALIBI)
    tokens = _tokens(ALIBI)
    torch.testing.assert_close(model(tokens, torch.arange(16) + 40), model(tokens))


def test_alibi_prefix_rows_match_full_run():
    model = _model(ALIBI)
    tokens = _tokens(ALIBI)
    torch.testing.assert_close(model(tokens[:, :9], torch.arange(9)), model(tokens)[:, :9])


def test_hidden_state_input_without_embeddings():
    model = _model(DEBUG)
    tokens = _tokens(DEBUG)
    full = model(tokens)
    hidden = model.tok_embeddings(tokens) + model.pos_embeddings(torch.arange(16))
    model.tok_embeddings = None
    model.pos_embeddings = None
    torch.testing.assert_close(model(hidden), full)
