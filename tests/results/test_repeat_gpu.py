"""The repeat runner's checks before anything runs (results/fidelity/repeat_gpu.py); the runs
themselves need a GPU (results/device_checks.sh)."""

import pytest

# the two jobs results/device_checks.sh repeats
DEVICE_CHECK_CASES = ("gpt3-125m-s2048-mb8-none", "llama3-8b-l2-s8192-mb2-none")


@pytest.mark.parametrize("gpu", ["h100-sxm-80g", "h200-141g"])
def test_each_device_check_case_has_a_recorded_baseline_of_its_gpu(repeat, gpu):
    from prismbench.baselines import load_baseline

    for case in DEVICE_CHECK_CASES:
        assert load_baseline(repeat.recorded_path(case, gpu)).job.cluster.gpu == gpu


def test_an_unknown_case_names_itself(repeat):
    with pytest.raises(ValueError, match="CASE 'gpt3-9t': no recorded baseline"):
        repeat.recorded_path("gpt3-9t", "h100-sxm-80g")


def test_fewer_than_two_iterations_is_refused_with_exit_2(repeat, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        repeat.main(["--out", str(tmp_path), "--iterations", "1", DEVICE_CHECK_CASES[0]])
    assert exit_.value.code == 2
    assert "--iterations=1" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_the_device_checks_script_repeats_these_cases(repeat):
    script = (repeat.ROOT / "results" / "device_checks.sh").read_text()
    assert f"for job in {' '.join(DEVICE_CHECK_CASES)}; do" in script
    assert "results/fidelity/repeat_gpu.py" in script
