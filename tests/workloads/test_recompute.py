"""Activation recomputation: same gradients as without it, fewer saved activations."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch.distributed._tools.mem_tracker import MemTracker

from workloads.flavors import get_flavor
from workloads.models import build_model
from workloads.recompute import _op_policy, apply_recompute

SETTINGS = [
    ("full", "op"),
    ("selective", "op"),
    ("selective", "op-prism-86a4f47"),
    ("selective", "core-attention"),
]


def _model(name, mode="none", selective="op", early_stop=True):
    torch.manual_seed(0)
    model = build_model(get_flavor(name))
    model.init_weights(0)
    return apply_recompute(model, mode, selective=selective, early_stop=early_stop)


def _tokens(seq=33):
    return torch.randint(0, 256, (2, seq), generator=torch.Generator().manual_seed(2))


def _grads(model):
    tokens = _tokens()
    logits = model(tokens[:, :-1])
    F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
    return {name: p.grad for name, p in model.named_parameters()}


# kernels.recompute_reruns: "needed" stops rerunning once backward has what it needs (torch's
# non-reentrant early stop), "all" reruns the whole region (Megatron's reentrant checkpoint)
@pytest.mark.parametrize("early_stop", [True, False], ids=["reruns-needed", "reruns-all"])
@pytest.mark.parametrize("name", ["gpt-debug", "llama-debug"])
@pytest.mark.parametrize(("mode", "selective"), SETTINGS)
def test_gradients_equal_no_recompute(name, mode, selective, early_stop):
    reference = _grads(_model(name))
    recomputed = _grads(_model(name, mode, selective, early_stop))
    assert reference.keys() == recomputed.keys()
    for key, grad in reference.items():
        torch.testing.assert_close(recomputed[key], grad, rtol=1e-6, atol=1e-7, msg=key)


@pytest.mark.parametrize(("mode", "selective"), [("full", "op"), ("selective", "core-attention")])
def test_recompute_replays_attention_dropout_with_the_same_mask(mode, selective):
    """Megatron's attention drops probabilities at random; the recomputation restores the RNG
    state, so backward sees the forward's mask and the gradients are those of no recompute."""
    from prismbench.spec import job_spec_from_dict
    from workloads.parallelize import set_kernels

    job = job_spec_from_dict(
        {
            "model": {"name": "gpt-debug"},
            "batch": {"seq_len": 32, "global_batch": 2},
            "train": {"attention_dropout": 0.3},
            "kernels": {"framework": "megatron"},
        }
    )

    def grads(mode):
        torch.manual_seed(0)
        model = build_model(get_flavor("gpt-debug"))
        model.init_weights(0)
        set_kernels(model, job)
        apply_recompute(model, mode, selective=selective, preserve_rng_state=True)
        torch.manual_seed(1)
        return _grads(model)

    reference, recomputed = grads("none"), grads(mode)
    for key, grad in reference.items():
        torch.testing.assert_close(recomputed[key], grad, rtol=1e-6, atol=1e-7, msg=key)


def test_parameter_names_unchanged():
    plain = [n for n, _ in _model("llama-debug").named_parameters()]
    assert [n for n, _ in _model("llama-debug", "full").named_parameters()] == plain
    assert [n for n, _ in _model("llama-debug", "selective").named_parameters()] == plain


def _saved_tensor_count(model):
    count = 0

    def pack(t):
        nonlocal count
        count += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(_tokens())
    return count


def test_full_recompute_saves_fewer_tensors():
    plain = _saved_tensor_count(_model("llama-debug"))
    full = _saved_tensor_count(_model("llama-debug", "full"))
    # one block input per layer stays, plus what the embedding, norm and output save
    assert full < plain / 5


def _peak_activation_bytes(model):
    tracker = MemTracker()
    tracker.track_external(model)
    with tracker:
        model(_tokens(129)).sum().backward()
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    return next(v for k, v in peak.items() if getattr(k, "value", None) == "Activation")


def test_selective_keeps_less_than_none_and_more_than_full():
    none = _peak_activation_bytes(_model("llama-debug"))
    selective = _peak_activation_bytes(_model("llama-debug", "selective"))
    full = _peak_activation_bytes(_model("llama-debug", "full"))
    assert full < selective < none


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="train.recompute='some'"):
        apply_recompute(build_model(get_flavor("gpt-debug")), "some")


def test_torchtitans_policy_keeps_abs_and_max_and_every_other_matmul():
    """torchtitan's `_save_list` at 9dec370 keeps float8's `abs` and `max`; the workloads at
    86a4f47 kept `max` only. Both recompute every second matmul, float8's as well."""
    from torch.utils.checkpoint import CheckpointPolicy

    save, rerun = CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_RECOMPUTE
    forward = SimpleNamespace(is_recompute=False)
    aten = torch.ops.aten
    calls = [aten.mm.default, aten._scaled_mm.default, aten.abs.default, aten.max.default]
    torchtitan, prism = _op_policy("op"), _op_policy("op-prism-86a4f47")
    assert [torchtitan(forward, f) for f in calls] == [save, rerun, save, save]
    assert [prism(forward, f) for f in calls] == [save, rerun, rerun, save]


def test_every_granularity_but_core_attention_checkpoints_whole_blocks():
    # the spec (torch-free) and apply_recompute read one rule: kernels.checkpoints_whole_blocks
    from workloads.kernels import CORE_ATTENTION, SELECTIVE_GRANULARITIES, checkpoints_whole_blocks
    from workloads.recompute import OP_POLICIES

    assert set(OP_POLICIES) == set(SELECTIVE_GRANULARITIES) - {CORE_ATTENTION}
    assert [g for g in SELECTIVE_GRANULARITIES if checkpoints_whole_blocks("selective", g)] == [
        *OP_POLICIES
    ]
    assert checkpoints_whole_blocks("full", CORE_ATTENTION)
    assert not checkpoints_whole_blocks("none", "op")
