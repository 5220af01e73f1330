"""The re-profiling script's jobs (results/calibration/reprofile_gpu.py): the eight shared jobs,
each with its family's production kernels. Its runs need a GPU."""

import pytest


@pytest.mark.parametrize("gpu", ["h100-sxm-80g", "h200-141g"])
def test_every_shared_job_gets_its_family_s_framework_and_keeps_the_rest(reprofile, gpu):
    from prismbench.baselines import load_baseline

    cases = reprofile.shared_cases(gpu)
    assert len(cases) == 8
    for case in cases:
        job = reprofile.production_job(case, gpu)
        recorded = load_baseline(
            reprofile.RECORDED / f"{reprofile.RECORDED_PREFIX[gpu]}__{case}.toml"
        ).job
        assert (
            job.kernels.framework
            == {"mpt": "llm-foundry", "lla": "torchtitan", "gpt": "nemo"}[case[:3]]
        )
        assert (job.model, job.parallel, job.batch, job.train) == (
            recorded.model,
            recorded.parallel,
            recorded.batch,
            recorded.train,
        )
    assert reprofile.production_job("mpt-7b-l4-s2048-mb4-none", gpu).kernels.attention != "unfused"


def test_an_unknown_case_is_refused_before_anything_runs(reprofile, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        reprofile.main(["--out", str(tmp_path), "--gpu", "h200-141g", "--only", "gpt-5"])
    assert exit_.value.code == 2 and "--only ['gpt-5']" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
