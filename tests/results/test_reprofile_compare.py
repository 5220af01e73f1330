"""The scoring of the production-kernel recordings (results/calibration/reprofile_compare.py):
its inputs, not its emulations (those are the script's run)."""

import pytest

GPUS = ("h100-sxm-80g", "h200-141g")  # each GPU's run: results/shared_gpu.py FRAMEWORKS_PREFIX


@pytest.mark.parametrize("gpu", GPUS)
def test_every_committed_recording_has_its_profile_beside_it(reprofile_compare, gpu):
    from prismbench.baselines import load_baselines

    compare = reprofile_compare
    prefix = compare.FRAMEWORKS_PREFIX[gpu]
    recordings = [b for b in load_baselines(compare.RECORDED) if b.name.startswith(f"{prefix}__")]
    assert len(recordings) == 8
    for b in recordings:
        case = b.name.split("__", 1)[1]
        assert b.job.cluster.gpu == gpu, b.name
        assert (compare.REPROFILED[gpu] / f"{case}.ops.jsonl.gz").is_file(), case


def test_every_measured_gpu_has_its_run(reprofile_compare):
    assert sorted(reprofile_compare.FRAMEWORKS_PREFIX) == sorted(GPUS)


@pytest.mark.parametrize("gpu", GPUS)
def test_no_recording_of_the_prefix_is_refused_with_exit_2(
    reprofile_compare, gpu, tmp_path, capsys
):
    assert reprofile_compare.main(["--gpu", gpu, "--recordings", str(tmp_path)]) == 2
    assert f"no {reprofile_compare.FRAMEWORKS_PREFIX[gpu]}__*.toml" in capsys.readouterr().err


def test_a_prefix_and_profiles_given_override_the_gpu_s_run(reprofile_compare, tmp_path, capsys):
    compare = reprofile_compare
    args = ["--recordings", str(compare.RECORDED), "--prefix", "h200frameworks", "--profiles"]
    assert compare.main([*args, str(tmp_path)]) == 2
    assert f"--profiles {tmp_path}: no " in capsys.readouterr().err
