"""The skeleton both models share: training, tied embeddings, stage pieces, the block's names."""

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from workloads.flavors import get_flavor
from workloads.models import build_model

GPT_DEBUG = get_flavor("gpt-debug")
EACH_KIND = {
    "gpt-learned": GPT_DEBUG,
    "gpt-alibi": replace(GPT_DEBUG, positions="alibi", heads=6, kv_heads=6, hidden=96),
    "llama-rope-gqa": get_flavor("llama-debug"),
}
TIED = [replace(get_flavor(name), tie_embeddings=True) for name in ("gpt-debug", "llama-debug")]


@pytest.mark.parametrize("spec", TIED, ids=lambda s: s.family)
def test_tied_embeddings_survive_meta_to_empty_and_train_as_one(spec):
    with torch.device("meta"):
        model = build_model(spec)
    model.to_empty(device="cpu")
    model.init_weights(0)
    assert model.output.weight is model.tok_embeddings.weight
    assert sum(p.numel() for p in model.parameters()) == sum(
        p.numel() for n, p in model.named_parameters(remove_duplicate=False) if n != "output.weight"
    )
    tokens = torch.randint(0, spec.vocab, (2, 8), generator=torch.Generator().manual_seed(0))
    model(tokens).sum().backward()
    assert model.tok_embeddings.weight.grad is not None


@pytest.mark.parametrize("spec", TIED, ids=lambda s: s.family)
def test_a_middle_stage_maps_hidden_states_to_hidden_states(spec):
    model = build_model(spec, layer_ids=[1])
    model.init_weights(0)
    hidden = torch.randn(2, 8, spec.hidden)
    model.tok_embeddings = None
    model.norm = None
    model.output = None
    assert model(hidden).shape == hidden.shape
    assert list(model.layers) == ["1"]


@pytest.mark.parametrize("name", ["gpt-debug", "llama-debug"])
def test_blocks_keep_the_names_the_parallel_plans_address(name):
    block = build_model(get_flavor(name)).layers["0"]
    assert [n for n, _ in block.named_children()] == [
        "attention_norm",
        "attention",
        "ffn_norm",
        "feed_forward",
    ]


@pytest.mark.parametrize("spec", EACH_KIND.values(), ids=EACH_KIND.keys())
def test_loss_goes_down_with_adamw(spec):
    torch.manual_seed(0)
    model = build_model(spec)
    model.init_weights(0)
    tokens = torch.randint(0, spec.vocab, (2, 32), generator=torch.Generator().manual_seed(1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(5):
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.1, losses
