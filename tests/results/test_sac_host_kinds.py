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
