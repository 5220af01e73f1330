"""SAC's host cost per call kind (results/calibration/sac_host_kinds.py): what it compares its
model with, and how it names a call's kind; the timings need its own run (on a GPU host from
results/device_checks.sh)."""

import json

import pytest


def write_figures(path, case, none_us, selective_us, gpu="h200-141g"):
    modes = {"none": {"per_block_us": none_us}, "selective": {"per_block_us": selective_us}}
    path.write_text(json.dumps({"case": case, "gpu": gpu, "device": "cuda", "modes": modes}))
    return path


class Refusal(Exception):
    pass


class Parser:
    def error(self, message):
        raise Refusal(message)


def test_full_size_figures_are_selective_minus_none_per_job(sac_kinds, tmp_path):
    gpt = write_figures(tmp_path / "gpt.json", "gpt3-760m-s2048-mb4-sel", 829.0, 3170.0)
    llama = write_figures(tmp_path / "llama.json", "llama2-7b-l4-s4096-mb1-sel", 3000.0, 7000.0)
    per_block, gpu = sac_kinds.measured_per_block(Parser(), [llama, gpt])
    assert per_block == {"gpt": 2341.0, "llama-proxy": 4000.0}
    assert gpu == "h200-141g"


@pytest.mark.parametrize(
    "second, message",
    [
        (("gpt3-760m-s2048-mb4-sel", "h200-141g"), "one file for each"),
        (("gpt3-125m-s2048-mb8-none", "h200-141g"), "case 'gpt3-125m-s2048-mb8-none'"),
        (("llama2-7b-l4-s4096-mb1-sel", "h100-sxm-80g"), "from one GPU's host"),
    ],
)
def test_figures_from_other_jobs_or_hosts_are_refused(sac_kinds, tmp_path, second, message):
    gpt = write_figures(tmp_path / "gpt.json", "gpt3-760m-s2048-mb4-sel", 829.0, 3170.0)
    case, gpu = second
    other = write_figures(tmp_path / "other.json", case, 1.0, 2.0, gpu=gpu)
    with pytest.raises(Refusal, match=message):
        sac_kinds.measured_per_block(Parser(), [gpt, other])


def test_a_file_that_is_not_the_figures_is_refused(sac_kinds, tmp_path):
    (tmp_path / "profile.txt").write_text("not json")
    with pytest.raises(Refusal, match="profile.txt: not a sac_host_gpu.py"):
        sac_kinds.measured_per_block(Parser(), [tmp_path / "profile.txt"] * 2)


@pytest.mark.parametrize(
    "op, kind",
    [
        ("aten._scaled_dot_product_flash_attention_for_cpu.default", "sdpa"),
        ("aten._scaled_dot_product_cudnn_attention.default", "sdpa"),
        ("aten._scaled_dot_product_efficient_attention.default", "sdpa"),
        ("aten.view.default", "view"),
        ("aten.add.Tensor", "add"),
    ],
)
def test_every_sdpa_backend_is_the_sdpa_kind(sac_kinds, op, kind):
    assert sac_kinds.kind_of(op) == kind


def test_cuda_is_refused_where_torch_sees_none(sac_kinds, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(SystemExit) as e:
        sac_kinds.main(["--device", "cuda"])
    assert e.value.code == 2
    assert "--device cuda: torch sees no CUDA device" in capsys.readouterr().err


def test_saved_outputs_are_counted_without_the_contexts_op_output(sac_kinds):
    """torch 2.11's SelectiveCheckpointContext has no `op_output` (its policy runs before the
    op): the counter reads the op's schema, and needs nothing else from the context."""
    from types import SimpleNamespace

    import torch

    import workloads.recompute as R

    a = torch.ones(2, 2)
    with sac_kinds.PolicyCounter() as counter:
        policy = R._op_policy("op")
        context = SimpleNamespace(is_recompute=False)  # what torch 2.11 hands the policy
        for _ in range(3):  # torchtitan's policy recomputes every second matmul
            policy(context, torch.ops.aten.mm.default, a, a)
        policy(context, torch.ops.aten.view.default, a, [4])
    assert counter.calls == {"aten.mm.default": 3, "aten.view.default": 1}
    assert counter.saved == {"aten.mm.default": 2}
    assert sum(counter.saved_outputs.values()) == 2


@pytest.mark.parametrize(
    "op, outputs",
    [
        ("mm.default", 1),
        ("native_layer_norm.default", 3),  # output, mean, rstd
        ("_scaled_dot_product_flash_attention_for_cpu.default", 2),  # output, logsumexp
        ("split.Tensor", 1),  # one tensor list
    ],
)
def test_an_ops_outputs_are_its_schemas_returns(sac_kinds, op, outputs):
    import torch

    packet, overload = op.rsplit(".", 1)
    assert sac_kinds.output_count(getattr(getattr(torch.ops.aten, packet), overload)) == outputs


def test_the_count_is_what_the_op_returns_where_the_context_holds_it(sac_kinds):
    """Where torch hands the policy the op's output (2.13), the schema gives its length."""
    import functools

    import torch
    from torch.utils.checkpoint import (
        CheckpointPolicy,
        SelectiveCheckpointContext,
        checkpoint,
        create_selective_checkpoint_contexts,
    )

    if "op_output" not in SelectiveCheckpointContext.__init__.__code__.co_varnames:
        pytest.skip("this torch hands the policy no op output")
    seen = []

    def policy(ctx, func, *args, **kwargs):
        if not ctx.is_recompute:
            out = ctx.op_output
            seen.append((len(out) if isinstance(out, tuple) else 1, sac_kinds.output_count(func)))
        return CheckpointPolicy.MUST_SAVE

    def block(x):
        y = torch.nn.functional.layer_norm(x, (8,))
        return torch.split(y @ y.t(), 2)[0].sin()

    x = torch.randn(4, 8, requires_grad=True)
    context = functools.partial(create_selective_checkpoint_contexts, policy)
    checkpoint(block, x, use_reentrant=False, context_fn=context).sum().backward()
    assert len(seen) >= 4
    assert all(given == counted for given, counted in seen), seen
