"""The host-bound tiny jobs (results/calibration/host_tiny_gpu.py), run on CPU tensors: its
plumbing, not its figures (those need the GPU host that results/device_checks.sh runs it on)."""

import json

import pytest


def test_a_tiny_job_keeps_the_programs_shape(host_tiny):
    job = host_tiny.tiny_job("gpt3-1.3b-s2048-mb4-full-ga2")
    assert (job.model.hidden, job.model.layers, job.batch.seq_len) == (64, 24, host_tiny.TOKENS)
    assert job.num_microbatches == 2  # the job's gradient accumulation
    assert job.train.recompute == "full"
    llama = host_tiny.tiny_job("llama3-8b-l2-s8192-mb2-none")
    assert llama.model.kv_heads < llama.model.heads  # grouped-query attention kept


def test_a_cpu_run_times_each_iteration_and_counts_its_calls(host_tiny, tmp_path):
    out = tmp_path / "tiny.md"
    argv = ["--device", "cpu", "--iterations", "1", "--case", "llama3-8b-l2-s8192-mb2-none",
            "--out", str(out)]  # fmt: skip
    assert host_tiny.main(argv) == 0
    (figures,) = json.loads(out.with_suffix(".json").read_text()).values()
    per_class = figures["per_class"]
    assert per_class["forward"]["launches"] > 0 and per_class["optimizer"]["launches"] > 0
    for cls in per_class.values():  # at least one call per launch: its own
        assert cls["calls"] >= cls["launches"]
    assert len(figures["iteration_s"]) == 1 and figures["profiled_s"] > 0
    assert "| llama3-8b-l2-s8192-mb2-none |" in out.read_text()


def test_an_output_folder_that_does_not_exist_is_refused(host_tiny, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        host_tiny.main(["--device", "cpu", "--out", str(tmp_path / "no" / "tiny.md")])
    assert e.value.code == 2
    assert "no folder" in capsys.readouterr().err


def test_a_job_that_fails_leaves_the_others_and_says_why(host_tiny, tmp_path, monkeypatch):
    def broken(job, device, iterations):
        raise RuntimeError("CUDA error: no kernel image")

    monkeypatch.setattr(host_tiny, "iteration_s", broken)
    out = tmp_path / "tiny.md"
    argv = ["--device", "cpu", "--case", "llama3-8b-l2-s8192-mb2-none", "--out", str(out)]
    assert host_tiny.main(argv) == 1
    figures = json.loads(out.with_suffix(".json").read_text())
    assert figures == {
        "llama3-8b-l2-s8192-mb2-none": {"failed": "RuntimeError: CUDA error: no kernel image"}
    }
    assert "failed: RuntimeError" in out.read_text()
