"""Network regimes from a real run's per-step communication times (`--network-steps`)."""

import numpy as np
import pytest

from emulator.variability.model import NetworkRegime
from prismbench.cli import main
from prismbench.network_steps import MIN_NETWORK_STEPS, measured_network, read_step_times
from workloads.config import SpecError


def _steps(tmp_path, lines: list[str]):
    path = tmp_path / "comm_s.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_congested_tenth_of_the_steps_is_split_off_as_its_own_regime(tmp_path):
    rng = np.random.default_rng(0)
    nominal = 0.050 * (1 + 0.01 * rng.standard_normal(90))
    congested = 0.075 * (1 + 0.01 * rng.standard_normal(10))
    path = _steps(tmp_path, [f"{t:.6f}" for t in rng.permutation(np.r_[nominal, congested])])
    network = measured_network(path)
    (fast, slow) = network.regimes
    assert (fast.probability, fast.factor) == (0.9, 1.0)
    assert slow.probability == pytest.approx(0.1) and slow.factor == pytest.approx(1.5, rel=0.01)
    assert 1.02 < network.threshold_factor < 1.45 and network.steps == 100


def test_steps_that_never_vary_are_one_regime(tmp_path):
    network = measured_network(_steps(tmp_path, ["0.02"] * MIN_NETWORK_STEPS))
    assert network.regimes == (NetworkRegime(1.0, 1.0),)


def test_comments_and_blank_lines_are_skipped_and_nothing_else(tmp_path):
    path = _steps(tmp_path, ["# step, comm time", "", *["1e-3"] * MIN_NETWORK_STEPS, "  "])
    assert list(read_step_times(path)) == [1e-3] * MIN_NETWORK_STEPS
    with pytest.raises(SpecError, match=r"comm_s.txt, line 3: '12,3e-3' is not a number"):
        read_step_times(_steps(tmp_path, ["1e-3", "1e-3", "12,3e-3"]))


@pytest.mark.parametrize(
    ("lines", "needle"),
    [
        (["0.01"] * (MIN_NETWORK_STEPS - 1), f"19 step(s); give at least {MIN_NETWORK_STEPS}"),
        (["0.01", "0"], "line 2: '0': a time in seconds must be > 0"),
        (["nan"], "line 1: 'nan': a time in seconds must be > 0"),
        (["0.01 0.02"], "line 1: '0.01 0.02' is not a number"),
    ],
)
def test_bad_step_files_exit_2_before_any_capture(tmp_path, capsys, monkeypatch, lines, needle):
    import prismbench.variability

    monkeypatch.setattr(prismbench.variability, "price_job", lambda *a, **k: pytest.fail("captured"))
    job = tmp_path / "job.toml"
    job.write_text('[model]\nname = "gpt-debug"\n[batch]\nseq_len = 32\nglobal_batch = 2\n')
    path = _steps(tmp_path, lines)
    assert main(["variability", str(job), "--network-steps", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --network-steps {path}") and needle in err


def test_a_missing_file_is_named(tmp_path, capsys):
    job = tmp_path / "job.toml"
    job.write_text('[model]\nname = "gpt-debug"\n[batch]\nseq_len = 32\nglobal_batch = 2\n')
    assert main(["variability", str(job), "--network-steps", str(tmp_path / "none.txt")]) == 2
    assert f"--network-steps {tmp_path / 'none.txt'}: cannot be read" in capsys.readouterr().err


def test_measurements_of_communication_the_job_lacks_are_refused_not_ignored(tmp_path, capsys, monkeypatch):
    import prismbench.variability

    monkeypatch.setattr(prismbench.variability, "price_job", lambda *a, **k: pytest.fail("captured"))
    job = tmp_path / "job.toml"
    job.write_text('[model]\nname = "gpt-debug"\n[parallel]\ndp = 8\n[batch]\nseq_len = 32\nglobal_batch = 8\n')
    steps = _steps(tmp_path, ["0.01"] * MIN_NETWORK_STEPS)
    assert main(["variability", str(job), "--network-steps", str(steps)]) == 2
    assert "the job's 8 GPU(s) fit one node (cluster.gpus_per_node=8)" in capsys.readouterr().err
    transfers = tmp_path / "sendrecv_s.txt"
    transfers.write_text("0.002\n" * 100)
    assert main(["variability", str(job), "--pipeline-transfers", str(transfers)]) == 2
    assert "--pipeline-transfers: parallel.pp=1: the job has no pipeline transfers" in capsys.readouterr().err
