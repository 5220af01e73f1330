"""The selective-recompute host check (results/calibration/sac_host_gpu.py), run on meta tensors:
its plumbing, not its figures (those need the GPU that results/device_checks.sh runs it on)."""

import json

import pytest


def test_each_mode_is_timed_and_the_profile_shows_the_checkpoint_mode(sac_host, tmp_path):
    code = sac_host.main(["--out", str(tmp_path), "--device", "meta", "--gpu", "h100-sxm-80g",
                          "--layers", "1", "--iterations", "1"])  # fmt: skip
    assert code == 0
    figures = json.loads((tmp_path / "sac_host.json").read_text())
    assert set(figures["modes"]) == {"none", "selective", "full"}
    for mode in figures["modes"].values():
        assert mode["median_s"] > 0 and mode["per_block_us"] == pytest.approx(
            1e6 * mode["median_s"]
        )
    # selective checkpointing's dispatch mode is on the profiled forward's stacks
    assert "checkpoint.py" in (tmp_path / "sac_host.txt").read_text()


def test_the_selected_recompute_and_layers_reach_the_job(sac_host):
    job = sac_host.job_of("gpt3-760m-s2048-mb4-sel", "h200-141g", "full", 3)
    assert (job.train.recompute, job.model.layers, job.cluster.gpu) == ("full", 3, "h200-141g")


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--layers", "0"], "--layers=0"), (["--case", "gpt3-9t"], "--case 'gpt3-9t'")],
)
def test_bad_input_exits_2_and_writes_nothing(sac_host, tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exit_:
        sac_host.main(["--out", str(tmp_path / "out"), "--device", "meta", "--gpu",
                       "h100-sxm-80g", *args])  # fmt: skip
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
