"""Stage splitting and schedule rules of workloads/pipeline.py (single process)."""

from __future__ import annotations

import torch

from workloads.flavors import get_flavor
from workloads.models import build_model
from workloads.pipeline import detachable_in_place, local_stage_ids, split_model, stage_plans


def test_stage_plans_follow_the_uneven_split_rule():
    plans = stage_plans(10, 4)  # stage_layer_counts(10, 4) = (2, 3, 3, 2)
    assert [p.layers for p in plans] == [(0, 1), (2, 3, 4), (5, 6, 7), (8, 9)]
    assert [p.is_first for p in plans] == [True, False, False, False]
    assert [p.is_last for p in plans] == [False, False, False, True]


def test_local_stage_ids_are_interleaved():
    assert local_stage_ids(1, pp=4, vpp=3) == (1, 5, 9)


def _split(name: str, stage: int, stages: int):
    with torch.device("meta"):
        model = build_model(get_flavor(name))
    return split_model(model, stage_plans(model.spec.layers, stages)[stage])


def test_first_stage_keeps_embeddings_only():
    first = _split("gpt-debug", 0, 3)  # 4 layers over 3 stages: (1, 2, 1)
    assert list(first.layers.keys()) == ["0"]
    assert first.tok_embeddings is not None and first.pos_embeddings is not None
    assert first.norm is None and first.output is None


def test_middle_stage_keeps_global_layer_names():
    middle = _split("llama-debug", 1, 3)
    assert list(middle.layers.keys()) == ["1", "2"]
    assert middle.tok_embeddings is None and middle.output is None
    assert {n.split(".")[1] for n, _ in middle.named_parameters()} == {"1", "2"}


def test_last_stage_keeps_norm_and_output():
    last = _split("llama-debug", 2, 3)
    assert list(last.layers.keys()) == ["3"]
    assert last.tok_embeddings is None
    assert last.norm is not None and last.output is not None


def test_split_stage_runs_on_hidden_states():
    middle = _split("llama-debug", 1, 3)
    middle.to_empty(device="cpu")
    middle.init_weights(0)
    out = middle(torch.randn(2, 8, 64), positions=torch.arange(8))
    assert out.shape == (2, 8, 64)


def test_a_loss_that_is_a_view_is_detachable_in_place():
    # loss-parallel's local loss is a view of its DTensor's; zero-bubble's input backward
    # detached it in place and autograd refused ("Can't detach views in-place")
    logits = torch.randn(4, requires_grad=True)
    loss = detachable_in_place(lambda output, _target: output.mean().view(()))(logits, None)
    loss.detach_()
    assert not loss.requires_grad
