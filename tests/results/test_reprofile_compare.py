"""The scoring of the production-kernel recordings (results/calibration/reprofile_compare.py):
its inputs, not its emulations (those are the script's run)."""


def test_every_committed_recording_has_its_profile_beside_it(reprofile_compare):
    from prismbench.baselines import load_baselines

    compare = reprofile_compare
    recordings = [
        b for b in load_baselines(compare.RECORDINGS) if b.name.startswith(f"{compare.PREFIX}__")
    ]
    assert len(recordings) == 8
    for b in recordings:
        case = b.name.split("__", 1)[1]
        assert (compare.PROFILES / f"{case}.ops.jsonl.gz").is_file(), case


def test_no_recording_of_the_prefix_is_refused_with_exit_2(reprofile_compare, tmp_path, capsys):
    assert reprofile_compare.main(["--recordings", str(tmp_path)]) == 2
    assert "no h100frameworks__*.toml" in capsys.readouterr().err
