"""The host-bound tiny jobs (results/calibration/host_tiny_gpu.py), run on CPU tensors: its
plumbing, not its figures (those need the GPU host that results/device_checks.sh runs it on);
and its report rendered again from a GPU run's JSON."""

import json

import pytest

from tests.results.conftest import ROOT

RUN = ROOT / "results" / "gpu_runs" / "h200-2026-11-30" / "host"
WHERE = "torch 2.11.0+cu130, NVIDIA H200"


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
    assert figures["where"].startswith("torch ") and "CPU tensors" in figures["where"]
    phases = figures["per_phase"]
    assert "recompute" not in phases  # the job recomputes nothing
    for what in ("launches", "calls"):
        assert sum(p[what] for p in phases.values()) == sum(c[what] for c in per_class.values())


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


def test_the_report_of_a_gpu_run_is_rendered_again_to_the_digit(host_tiny):
    """The first table from the committed JSON is the one the H200 run printed."""
    from emulator.costs.host_dispatch import from_figures

    results = json.loads((RUN / "host_tiny.json").read_text())
    host = from_figures(json.loads(host_tiny.HOST_DISPATCH.read_text()), "aten")
    printed = (RUN / "host_tiny.md").read_text().splitlines()[2:]  # after the commit line
    assert host_tiny.table_lines(results, WHERE, 20, host) == printed


def record(launches, calls, us, recompute=(0, 0)):
    phases = {"forward": {"launches": launches - recompute[0], "calls": calls - recompute[1]}}
    if recompute[0]:
        phases["recompute"] = {"launches": recompute[0], "calls": recompute[1]}
    return {
        "where": WHERE,
        "per_class": {"forward": {"launches": launches, "calls": calls}},
        "per_phase": phases,
        "model_host_s": 2e-6 * us,
        "iteration_s": [1e-6 * us],
        "median_s": 1e-6 * us,
        "profiled_s": 1.5e-6 * us,
    }


def test_the_fit_takes_the_jobs_without_recompute_and_prices_the_others_beyond_it(host_tiny):
    results = {
        "a": record(100, 300, 3000.0),  # 30 us a launch, 10 a call
        "b": record(200, 400, 6000.0),  # 30 us a launch, 15 a call
        "c": record(100, 500, 3000.0 + 4000.0, recompute=(20, 200)),
    }
    lines = host_tiny.fit_lines(results)
    assert "30.0 us per launching op" in lines[0]
    assert "30.0 us per launch + -0.00 us per call" in lines[0]
    assert "| a | 3.00 | +0 % |" in lines[4]
    c = next(line for line in lines if line.startswith("| c |"))
    assert c.endswith("| 20 / 200 | 4.0 | 200 | 20 |")  # 4 ms beyond: 200 us a recomputed launch
    assert "profiled / unprofiled 1.50 - 1.50" in lines[-1]


def test_a_json_that_does_not_say_where_it_ran_needs_where(host_tiny, tmp_path, capsys):
    legacy = {"a": {k: v for k, v in record(100, 300, 3000.0).items() if k != "where"}}
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(legacy))
    with pytest.raises(SystemExit) as e:
        host_tiny.main(["--from-json", str(path)])
    assert e.value.code == 2
    assert "give --where" in capsys.readouterr().err
    out = tmp_path / "again.md"
    assert host_tiny.main(["--from-json", str(path), "--where", WHERE, "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("Commit ") and f"--where '{WHERE}'" in text.splitlines()[0]
    assert "| a | 100 | 300 | 3000 |" in text


def test_a_file_that_is_not_its_json_is_refused(host_tiny, tmp_path, capsys):
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"case": "x", "modes": {}}))
    with pytest.raises(SystemExit):
        host_tiny.main(["--from-json", str(path), "--where", WHERE])
    assert "not the JSON host_tiny_gpu.py writes" in capsys.readouterr().err
