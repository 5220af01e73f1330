"""Every code block of README.md runs here (STYLE.md, "Tests"), as far as this machine can:

- the quick start's `nox` commands name sessions of noxfile.py, and its test command is the
  one CI runs (`.ci/run`); the sessions themselves are what CI and a fresh clone run;
- every `prismbench` line of the command blocks is accepted by the CLI's parser as written
  (placeholders such as JOB.toml are strings to it), and the ones that need neither a GPU nor
  minutes run for real;
- the Python block runs, and the error the `text` block shows is the one the CLI prints.
"""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from prismbench.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"^```(\w+)\n(.*?)^```", README, flags=re.DOTALL | re.MULTILINE)


def _blocks(language: str) -> list[str]:
    return [body for lang, body in BLOCKS if lang == language]


def _commands(prefix: str) -> list[list[str]]:
    """The command lines of the bash blocks that start with `prefix`, comments cut, each split
    on `&&` into its commands."""
    found = []
    for body in _blocks("bash"):
        for line in body.splitlines():
            for command in line.split("#")[0].split("&&"):
                words = shlex.split(command)
                if words[: len(prefix.split())] == prefix.split():
                    found.append(words)
    return found


def _prismbench_lines() -> list[list[str]]:
    """Every `prismbench ...` and `python -m prismbench ...` line: the arguments after it."""
    return [w[1:] for w in _commands("prismbench")] + [w[3:] for w in _commands("python -m prismbench")]


def test_the_readme_has_the_blocks_this_file_runs():
    assert {lang for lang, _ in BLOCKS} == {"bash", "python", "text"}
    assert len(_prismbench_lines()) >= 20


def test_the_quick_start_names_nox_sessions_and_its_test_command_is_what_ci_runs():
    import noxfile

    quick_start = _blocks("bash")[0]
    sessions = [words[2] for words in _commands("nox -s") if " ".join(words) in quick_start]
    assert sessions == ["emulate-validate", "tests"]
    defined = {name for name, value in vars(noxfile).items() if callable(value)}
    assert "tests" in defined and 'name="emulate-validate"' in (ROOT / "noxfile.py").read_text()
    assert "\nnox -s tests\n" in (ROOT / ".ci" / "run").read_text()


@pytest.mark.parametrize("argv", _prismbench_lines(), ids=lambda argv: " ".join(argv)[:60])
def test_every_prismbench_line_is_accepted_by_the_cli_as_written(argv):
    if "--help" in argv:
        with pytest.raises(SystemExit) as done:
            build_parser().parse_args(argv)
        assert done.value.code == 0
    else:
        args = build_parser().parse_args(argv)
        assert args.command == argv[0]


@pytest.mark.parametrize(
    "argv",
    [["workloads"], ["explain", "examples/jobspec.example.toml"]],
    ids=" ".join,
)
def test_the_commands_that_need_no_gpu_nor_minutes_run(argv, monkeypatch, capsys):
    assert argv in _prismbench_lines()
    monkeypatch.chdir(ROOT)
    assert main(argv) == 0
    assert capsys.readouterr().out.strip()


@pytest.mark.slow
@pytest.mark.integration
def test_the_python_block_runs_and_prints_its_three_figures():
    """The README example emulated from Python (its 8 192 GPUs: 40-75 s cold on 2 cores, a
    capture of its own in a fresh process, so `slow`; the same library calls are CI's in
    tests/prismbench/test_emulate.py)."""
    (code,) = _blocks("python")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    iteration_time_s, mfu, peak_reserved_bytes = (ast.literal_eval(v) for v in done.stdout.split())
    assert iteration_time_s > 0 and 0 < mfu < 1 and peak_reserved_bytes > 2**30


def test_the_text_blocks_error_is_the_one_the_cli_prints(tmp_path, monkeypatch, capsys):
    (text,) = _blocks("text")
    command, said = text.strip().splitlines()
    assert command == "$ prismbench explain bad.toml"
    # a 40-head model split 16 ways, the spec otherwise valid
    (tmp_path / "bad.toml").write_text(
        '[model]\nname = "gpt3-13b"\n[parallel]\ntp = 16\n[batch]\nseq_len = 2048\nglobal_batch = 16\n'
    )
    monkeypatch.chdir(tmp_path)
    assert main(["explain", "bad.toml"]) == 2
    assert capsys.readouterr().err.strip() == said
