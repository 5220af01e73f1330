"""The expandable-segments check (results/fidelity/expandable_gpu.py): the measured runs that
--compare scores, read from one file or several."""

import json

import pytest

from tests.results.conftest import ROOT

H100_RUN = ROOT / "results" / "gpu_runs" / "h100-2026-11-28"


def _run(path, *cases, gpu="h100-sxm-80g"):
    peaks = {"allocated": 1, "reserved": 2}
    path.write_text(json.dumps([
        {"case": c, "gpu": gpu, "default": peaks, "expandable": peaks} for c in cases
    ]))  # fmt: skip
    return path


def test_several_runs_are_read_in_order(expandable, tmp_path):
    first = _run(tmp_path / "a.json", "gpt3-125m-s2048-mb8-none", "llama2-7b-l4-s4096-mb1-sel")
    second = _run(tmp_path / "b.json", "llama3-8b-l2-s8192-mb2-none")
    rows = expandable.measured_rows([first, second])
    assert [r["case"] for r in rows] == [
        "gpt3-125m-s2048-mb8-none", "llama2-7b-l4-s4096-mb1-sel", "llama3-8b-l2-s8192-mb2-none",
    ]  # fmt: skip


def test_a_case_in_two_runs_on_one_gpu_is_refused(expandable, tmp_path):
    first = _run(tmp_path / "a.json", "gpt3-125m-s2048-mb8-none")
    again = _run(tmp_path / "b.json", "gpt3-125m-s2048-mb8-none")
    other_gpu = _run(tmp_path / "c.json", "gpt3-125m-s2048-mb8-none", gpu="h200-141g")
    assert len(expandable.measured_rows([first, other_gpu])) == 2
    with pytest.raises(ValueError, match="gpt3-125m-s2048-mb8-none on h100-sxm-80g"):
        expandable.measured_rows([first, again])


def test_the_committed_h100_runs_join_into_the_four_cases(expandable):
    rows = expandable.measured_rows([
        H100_RUN / "checks" / "expandable_gpu.json", H100_RUN / "second" / "exp" / "expandable_gpu.json",
    ])  # fmt: skip
    assert [r["case"] for r in rows] == list(expandable.CASES)


def test_a_case_given_twice_exits_2(expandable, tmp_path, capsys):
    run = _run(tmp_path / "a.json", "gpt3-125m-s2048-mb8-none")
    with pytest.raises(SystemExit) as stop:
        expandable.main(["--compare", str(run), str(run)])
    assert stop.value.code == 2
    assert "--compare" in capsys.readouterr().err
