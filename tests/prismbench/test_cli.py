"""Tests for the `prismbench` command line: output, exit codes and error messages."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from prismbench.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "jobspec.example.toml"


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "job.toml"
    path.write_text(text)
    return str(path)


def _assert_one_line_error(capsys, *needles: str) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    for needle in needles:
        assert needle in err
    return err


def test_explain_prints_tables(capsys):
    assert main(["explain", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    assert "8,192 GPUs" in out
    assert "70.55 B params" in out
    assert "PFLOP" in out and "GiB" in out
    # model state is weighed against what the allocator may hold, both figures named
    assert "usable capacity (what CUDA offers)" in out and "of the allocator limit" in out


def test_explain_json_is_one_object_with_raw_numbers(capsys):
    assert main(["explain", str(EXAMPLE), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["world_size"] == 8192
    assert round(data["params_total"] / 1e9, 2) == 70.55
    assert data["max_model_state_bytes"] > 0


def test_a_baseline_file_is_read_for_its_job_table(capsys):
    """`explain BASELINE` explains the baseline's [job] table, and says so on stderr."""
    from prismbench.baselines import load_baseline
    from prismbench.explain import explain, explanation_to_dict

    baseline = ROOT / "results" / "baselines" / "torchtitan2024__llama3.1-8b__8g__r033.toml"
    assert main(["explain", str(baseline), "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == json.loads(json.dumps(explanation_to_dict(explain(load_baseline(baseline).job))))
    assert "is a baseline: its [job] table is the job" in err


def test_a_baseline_with_a_bad_job_table_is_refused_naming_the_file(tmp_path, capsys):
    baseline = ROOT / "results" / "baselines" / "torchtitan2024__llama3.1-8b__8g__r033.toml"
    broken = tmp_path / "broken.toml"
    broken.write_text(baseline.read_text().replace("[job.model]", "[job.model]\nlayerz = 3", 1))
    assert main(["explain", str(broken)]) == 2
    _assert_one_line_error(capsys, "broken.toml", "layerz")


def test_workloads_lists_flavors_with_params(capsys):
    assert main(["workloads"]) == 0
    out = capsys.readouterr().out
    assert "llama3-70b" in out and "70.55 B params" in out


def test_workloads_json(capsys):
    assert main(["workloads", "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["llama3-70b"]["params"] == 70_553_706_496
    assert rows["llama3-70b"]["kv_heads"] == 8


def test_tp_that_does_not_divide_heads_exits_2_naming_the_field(tmp_path, capsys):
    path = _write(
        tmp_path,
        '[model]\nfamily = "llama"\nlayers = 4\nhidden = 5120\nffn_hidden = 13824\n'
        "heads = 40\nvocab = 32000\n[parallel]\ntp = 16\n[batch]\nseq_len = 128\n"
        "global_batch = 4\n",
    )
    assert main(["explain", path]) == 2
    _assert_one_line_error(capsys, "tp", "heads", "16", "40")


def test_unknown_key_exits_2_naming_it(tmp_path, capsys):
    path = _write(
        tmp_path,
        '[model]\nname = "llama-debug"\n[parallel]\ntensor_parallel = 2\n'
        "[batch]\nseq_len = 64\nglobal_batch = 8\n",
    )
    assert main(["explain", path]) == 2
    _assert_one_line_error(capsys, "tensor_parallel")


@pytest.mark.parametrize(
    "kernels, needles",
    [
        ('compile = "yes"', ("kernels.compile", "boolean")),
        ("compile = false\nasync_tp = true", ("kernels.async_tp", "kernels.compile")),
    ],
)
def test_bad_compile_fields_exit_2_naming_the_field(tmp_path, capsys, kernels, needles):
    path = _write(
        tmp_path,
        '[model]\nname = "llama-debug"\n[parallel]\ntp = 2\n[batch]\nseq_len = 64\n'
        f"global_batch = 8\n[kernels]\n{kernels}\n",
    )
    assert main(["explain", path]) == 2
    _assert_one_line_error(capsys, *needles)


def test_missing_file_exits_2(tmp_path, capsys):
    missing = str(tmp_path / "nope.toml")
    assert main(["explain", missing]) == 2
    _assert_one_line_error(capsys, "nope.toml")


def test_malformed_toml_exits_2(tmp_path, capsys):
    assert main(["explain", _write(tmp_path, "[model\nname = ")]) == 2
    _assert_one_line_error(capsys, "TOML")


def test_usage_error_exits_2(capsys):
    assert main([]) == 2
    assert main(["explain"]) == 2
    assert "usage:" in capsys.readouterr().err


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    (commands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return commands.choices


@pytest.mark.parametrize("command", sorted(_subcommands()))
def test_every_subcommand_has_help(command, capsys):
    assert main([command, "--help"]) == 0
    assert "usage:" in capsys.readouterr().out
    undescribed = [
        action.dest for action in _subcommands()[command]._actions if not action.help
    ]
    assert undescribed == []  # every argument says what it is in --help


@pytest.mark.parametrize("command", sorted(_subcommands()))
def test_every_option_with_a_default_says_it_in_help(command):
    # a value the option takes when not given is named in its help (an empty string, as
    # --alloc-conf's, by the word "default"); flags, lists and unset options have none
    unsaid = [
        action.option_strings[0]
        for action in _subcommands()[command]._actions
        if action.option_strings
        and action.default not in (None, [], argparse.SUPPRESS)
        and action.default is not False
        and ("default" if action.default == "" else str(action.default)) not in action.help
    ]
    assert unsaid == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA refusal")
def test_calibrate_without_cuda_exits_2(tmp_path, capsys):
    out = tmp_path / "kernels.csv"
    assert main(["calibrate", "--out", str(out), "--quick"]) == 2
    _assert_one_line_error(capsys, "CUDA")
    assert not out.exists()


def test_calibrate_passes_out_and_quick_to_run_calibration(tmp_path, monkeypatch, capsys):
    import prismbench.calibrate_grid  # noqa: F401  (binds the real grids before the fake goes in)

    calls = []
    fake = types.ModuleType("emulator.costs.calibrate")

    def run_calibration(out, *, quick=False, progress=None, extra=None):
        calls.append((out, quick))
        assert callable(extra)  # the fp8 / memory-bound / attention grid, measured on a GPU
        return out

    fake.run_calibration = run_calibration
    monkeypatch.setitem(sys.modules, "emulator.costs.calibrate", fake)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    out = tmp_path / "h100.csv"
    assert main(["calibrate", "--out", str(out), "--quick"]) == 0
    assert calls == [(out, True)]
    assert str(out) in capsys.readouterr().out


@pytest.mark.integration
def test_python_dash_m_prismbench_explain_json():
    result = subprocess.run(
        [sys.executable, "-m", "prismbench", "explain", str(EXAMPLE), "--json"],
        capture_output=True, text=True, cwd=ROOT, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["world_size"] == 8192


@pytest.mark.parametrize("command", ["emulate", "capture"])
def test_workers_must_be_positive(command, capsys):
    extra = ["--out", "unused"] if command == "capture" else []
    assert main([command, "examples/jobspec.example.toml", "--workers", "0", *extra]) == 2
    assert "--workers: '0' must be a positive integer" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["fit", "--vary", "micro_batch", "--step", "0"], "--step: '0' must be a positive integer"),
        (["record", "--out", "r.toml", "--warmup", "-1"], "--warmup: '-1' must be an integer >= 0"),
    ],
)
def test_a_count_out_of_range_is_refused_naming_the_option(argv, message, capsys):
    assert main([*argv, "examples/jobspec.example.toml"]) == 2
    assert message in capsys.readouterr().err


def test_an_allocator_option_the_model_lacks_is_refused_before_anything_runs(capsys):
    assert (
        main(
            ["emulate", "examples/jobspec.example.toml", "--alloc-conf", "backend:cudaMallocAsync"]
        )
        == 2
    )
    assert "--alloc-conf: allocator option 'backend' is not modelled" in capsys.readouterr().err


def test_help_and_explain_do_not_import_torch():
    """`prismbench --help` answers at once: torch (seconds to import) loads only where needed."""
    code = (
        "import sys; from prismbench.cli import main\n"
        "try:\n    main(['explain', 'examples/jobspec.example.toml'])\n"
        "except SystemExit:\n    pass\n"
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("option", "make", "message"),
    [
        ("--trace", lambda tmp: tmp, "is a directory; give a file path"),
        # Path() drops a trailing slash: the trace was written as a file named "new"
        ("--trace", lambda tmp: f"{tmp}/new/", "names a directory (it ends with a slash)"),
        (
            "--trace",
            lambda tmp: (tmp / "file").touch() or tmp / "file" / "t.json",
            "is a file, not a directory",
        ),
        (
            "--memory-out",
            lambda tmp: (tmp / "file").touch() or tmp / "file",
            "exists and is not a directory",
        ),
    ],
)
def test_output_paths_are_checked_before_any_work(
    tmp_path, capsys, monkeypatch, option, make, message
):
    import prismbench.emulate

    monkeypatch.setattr(prismbench.emulate, "emulate", lambda *a, **k: pytest.fail("emulated"))
    assert main(["emulate", str(EXAMPLE), option, str(make(tmp_path))]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("memory_out", ["out", "out/mem"])
def test_a_trace_at_or_above_memory_out_is_refused_before_any_work(
    tmp_path, capsys, monkeypatch, memory_out
):
    """The timeline is written before the memory folder is made: were they the same path (or
    the folder inside the file), the folder would fail and leave the timeline behind."""
    import prismbench.emulate

    monkeypatch.setattr(prismbench.emulate, "emulate", lambda *a, **k: pytest.fail("emulated"))
    trace, memory = tmp_path / "out", tmp_path / memory_out
    assert main(["emulate", str(EXAMPLE), "--trace", str(trace), "--memory-out", str(memory)]) == 2
    _assert_one_line_error(capsys, "--trace", "--memory-out", "a folder above it")
    assert not trace.exists()


def test_a_directory_or_an_empty_file_as_job_spec_is_named(tmp_path, capsys):
    empty = tmp_path / "empty.toml"
    empty.write_text("\n")
    assert main(["explain", str(tmp_path)]) == 2
    assert f"job spec '{tmp_path}': is a directory" in capsys.readouterr().err
    assert main(["explain", str(empty)]) == 2
    assert f"job spec '{empty}': the file is empty" in capsys.readouterr().err


@pytest.mark.parametrize(
    "command",
    [
        ["emulate", "{job}", "--trace", "{job}"],
        ["variability", "{job}", "--plot", "{job}"],
        ["record", "{job}", "--out", "{job}"],
        ["ingest-profile", "{job}", "--job", "{job}", "--out", "{job}"],
    ],
)
def test_an_output_path_that_is_the_input_is_refused(tmp_path, capsys, command):
    text = '[model]\nname = "gpt-debug"\n[batch]\nseq_len = 64\nglobal_batch = 2\n'
    job = _write(tmp_path, text)
    assert main([a.format(job=job) for a in command]) == 2
    _assert_one_line_error(capsys, "is the input", "it would be overwritten")
    assert Path(job).read_text() == text


def test_a_kernels_override_that_changes_nothing_is_said_not_ignored(tmp_path, capsys):
    text = (
        '[model]\nname = "gpt-debug"\n[batch]\nseq_len = 64\nglobal_batch = 2\n'
        '[kernels]\ncp_attention = "ring"\n'
    )
    job = _write(tmp_path, text)
    assert main(["explain", job, "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["world_size"] == 1  # the JSON alone on stdout
    assert err == (
        f"note: {job}: kernels.cp_attention='ring' changes nothing for this job: "
        "parallel.cp = 1\n"
    )


def test_a_framework_choice_that_gave_way_is_said(tmp_path, capsys):
    text = (
        '[model]\nname = "llama-debug"\nlayers = 8\n'
        '[parallel]\npp = 4\nvpp = 2\nschedule = "interleaved-1f1b"\n'
        '[batch]\nseq_len = 64\nglobal_batch = 6\n[kernels]\nframework = "megatron"\n'
    )
    job = _write(tmp_path, text)
    assert main(["explain", job, "--json"]) == 0
    err = capsys.readouterr().err
    assert err.startswith(f"note: {job}: kernels.framework='megatron' runs its pipelines with ")
    assert "torch's pipelining runs it" in err


def test_a_model_field_that_changes_nothing_is_said_not_ignored(tmp_path, capsys):
    text = (
        '[model]\nname = "gpt-debug"\nrope_theta = 5e5\n[batch]\nseq_len = 64\nglobal_batch = 2\n'
    )
    job = _write(tmp_path, text)
    assert main(["explain", job, "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["world_size"] == 1
    assert err == (
        f"note: {job}: model.rope_theta=500000.0 changes nothing for this job: only 'rope' "
        "positions read it (model.positions='learned')\n"
    )


def test_a_source_edited_during_a_capture_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    # a spawned capture worker refuses a source that changed since its parent keyed the cache
    import prismbench.capture
    from prismbench.capture_sources import SourceChangedError

    def edited(*_args, **_kwargs):
        raise SourceChangedError("the capturing source changed while capturing")

    monkeypatch.setattr(prismbench.capture, "capture_job", edited)
    spec = tmp_path / "job.toml"
    spec.write_text('[model]\nname = "gpt-debug"\n[batch]\nseq_len = 32\nglobal_batch = 1\n')
    assert main(["capture", str(spec), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err == "error: the capturing source changed while capturing\n"
    assert not (tmp_path / "out").exists()


def test_an_option_of_one_value_given_twice_is_refused(tmp_path, capsys):
    # argparse would keep the second: validate's history would land in b.duckdb, a.duckdb unsaid
    args = ["validate", "--db", str(tmp_path / "a.duckdb"), "--db", str(tmp_path / "b.duckdb")]
    assert main([*args, "--no-mlflow"]) == 2
    assert "argument --db: given twice" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    # a flag may repeat: nothing is lost
    assert main(["workloads", "--json", "--json"]) == 0


def test_paths_are_printed_as_they_are_not_read_as_rich_markup(tmp_path, capsys, monkeypatch):
    # a folder named like a style tag ("[h100]") vanished from the output, and one that closes
    # a tag ("a[/b]c": the folders "a[" and "b]c") ended the command with rich's MarkupError
    cache = tmp_path / "[h100]" / "a[" / "b]c"
    monkeypatch.setenv("PRISMBENCH_CACHE", str(cache))
    job = _write(tmp_path, '[model]\nname = "gpt-debug"\n[batch]\nseq_len = 32\nglobal_batch = 2\n')
    assert main(["capture", job, "--out", str(tmp_path / "out"), "--workers", "1"]) == 0
    assert f"(captured: {cache}" in capsys.readouterr().out.replace("\n", "")
