"""The no-bubble CV of a real run's pipeline send/recv durations (`--pipeline-transfers`)."""

import numpy as np
import pytest

from emulator.variability.distributions import MIN_SAMPLES
from prismbench.cli import main
from prismbench.pipeline_transfers import MIN_PIPELINE_TRANSFERS, measured_transfers
from workloads.config import SpecError


def _transfers(tmp_path, durations_s) -> str:
    path = tmp_path / "sendrecv_s.txt"
    path.write_text(
        "# SendRecv kernels, stage 0 -> 1 (s)\n" + "".join(f"{float(d)!r}\n" for d in durations_s)
    )
    return str(path)


def test_the_calls_that_waited_are_split_off_and_the_others_cv_is_the_transfers(tmp_path):
    # 80 % of the calls are the transfer alone (2 ms +- 2 %), 20 % waited 5-20 ms for the peer
    rng = np.random.default_rng(3)
    own = 2e-3 * (1 + 0.02 * rng.standard_normal(400))
    waited = rng.random(400) < 0.2
    durations = own + np.where(waited, rng.uniform(5e-3, 20e-3, 400), 0)
    measured = measured_transfers(_transfers(tmp_path, durations))
    assert measured.transfers == 400 and measured.bubble_fraction == waited.mean()
    assert measured.no_bubble_cv == pytest.approx(0.02, rel=0.2)
    assert measured.no_bubble_mean_s == pytest.approx(2e-3, rel=0.005)
    assert own.max() < measured.threshold_s < durations[waited].min()
    said = measured.describe()
    assert said.startswith(f"{100 * measured.no_bubble_cv:.2f} % (no-bubble median 0.002")
    assert ": 400 transfers, " in said
    assert f"{100 * waited.mean():.1f} % above {measured.threshold_s:.4g} s, 5 spreads" in said


def test_waits_shorter_than_the_transfer_leave_its_cv(tmp_path):
    # half the calls of 2 ms +- 2 % waited 0-1 ms more, many less than the transfer's own spread:
    # the std of Otsu's lower class read ~2x the 2 % (pipeline_transfer_split_baseline.md)
    rng = np.random.default_rng(5)
    own = 2e-3 * (1 + 0.02 * rng.standard_normal(400))
    waited = rng.random(400) < 0.5
    durations = own + np.where(waited, rng.uniform(0, 1e-3, 400), 0)
    measured = measured_transfers(_transfers(tmp_path, durations))
    assert measured.no_bubble_cv == pytest.approx(0.02, rel=0.2)
    assert measured.no_bubble_mean_s == pytest.approx(2e-3, rel=0.01)


def test_transfers_that_never_vary_are_one_regime_of_no_spread(tmp_path):
    measured = measured_transfers(_transfers(tmp_path, [3e-3] * MIN_PIPELINE_TRANSFERS))
    assert (measured.bubble_fraction, measured.no_bubble_cv) == (0.0, 0.0)
    assert measured.no_bubble_mean_s == 3e-3
    said = measured.describe()
    assert "40 transfers, one regime (none 5 spreads above the median: no wait seen)" in said


def test_a_no_bubble_regime_too_small_to_read_a_spread_from_is_refused(tmp_path):
    # most calls waited: 5 transfers alone, the spread would rest on the 2 below their median
    rng = np.random.default_rng(4)
    alone = 2e-3 * (1 + 0.03 * rng.standard_normal(5))
    waited = 12e-3 * (1 + 0.01 * rng.standard_normal(MIN_PIPELINE_TRANSFERS - 5))
    assert len(alone) < MIN_SAMPLES
    with pytest.raises(SpecError, match=r": 5 of the 40 calls did not wait for the peer, too few"):
        measured_transfers(_transfers(tmp_path, np.r_[waited, alone]))


def test_the_figures_go_to_json_under_their_units(tmp_path):
    measured = measured_transfers(_transfers(tmp_path, [2e-3] * 32 + [9e-3] * 8))
    assert measured.to_dict() == {
        "source": str(tmp_path / "sendrecv_s.txt"),
        "transfers": 40,
        "threshold_s": 2e-3,  # the median plus 5 spreads of 0
        "bubble_fraction": 0.2,
        "no_bubble_mean_s": 2e-3,
        "no_bubble_cv": 0.0,
    }


def _spread_over_decades() -> list[float]:
    """40 durations spaced evenly in log from 1 ms to 100 ms: no gap for Otsu to find."""
    return np.geomspace(1e-3, 0.1, MIN_PIPELINE_TRANSFERS).tolist()


def test_a_no_bubble_cv_the_monte_carlo_cannot_draw_is_refused(tmp_path):
    with pytest.raises(SpecError, match=r"^--pipeline-transfers .*: the no-bubble regime's CV is"):
        measured_transfers(_transfers(tmp_path, _spread_over_decades()))


@pytest.mark.parametrize(
    ("lines", "needle"),
    [
        (
            ["2e-3"] * (MIN_PIPELINE_TRANSFERS - 1),
            f"39 transfer(s); give at least {MIN_PIPELINE_TRANSFERS}",
        ),
        (["2e-3", "0"], "line 3: '0': a time in seconds must be > 0"),
        (["2e-3", "2 ms"], "line 3: '2 ms' is not a number"),
        ([repr(d) for d in _spread_over_decades()], "above the 15 % a normal draw keeps positive"),
    ],
)
def test_bad_transfer_files_exit_2_before_any_capture(tmp_path, capsys, monkeypatch, lines, needle):
    import prismbench.variability

    monkeypatch.setattr(
        prismbench.variability, "price_job", lambda *a, **k: pytest.fail("captured")
    )
    job = tmp_path / "job.toml"
    job.write_text(
        '[model]\nname = "llama-debug"\n[parallel]\npp = 2\n[batch]\nseq_len = 64\nglobal_batch = 8\n'
    )
    path = tmp_path / "sendrecv_s.txt"
    path.write_text("# SendRecv (s)\n" + "\n".join(lines) + "\n")
    assert main(["variability", str(job), "--pipeline-transfers", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --pipeline-transfers {path}") and needle in err
    assert len(err.strip().splitlines()) == 1


def test_a_missing_transfer_file_is_named(tmp_path, capsys):
    job = tmp_path / "job.toml"
    job.write_text(
        '[model]\nname = "llama-debug"\n[parallel]\npp = 2\n[batch]\nseq_len = 64\nglobal_batch = 8\n'
    )
    assert main(["variability", str(job), "--pipeline-transfers", str(tmp_path / "none.txt")]) == 2
    assert (
        f"--pipeline-transfers {tmp_path / 'none.txt'}: cannot be read" in capsys.readouterr().err
    )


@pytest.mark.parametrize("unit_s", [1e-300, 1e300])
def test_the_same_calls_read_the_same_cv_in_any_unit(tmp_path, unit_s):
    # read in seconds, calls of 1e300 "s" overflowed the spread's squares (a NaN CV, then a
    # traceback in `variability`) and calls of 1e-300 underflowed them (a CV of 0, most calls
    # read as waits): an extreme file gives the figures of the same calls in ms
    rng = np.random.default_rng(3)
    calls = 2 * (1 + 0.02 * rng.standard_normal(200))
    calls[::5] += rng.uniform(10, 40, 40)  # a fifth waited 5-20 transfers
    in_ms = measured_transfers(_transfers(tmp_path, calls))
    scaled = measured_transfers(_transfers(tmp_path, calls * unit_s))
    assert scaled.bubble_fraction == in_ms.bubble_fraction == 0.2
    assert scaled.no_bubble_cv == pytest.approx(in_ms.no_bubble_cv, rel=1e-9)
    assert scaled.no_bubble_mean_s == pytest.approx(in_ms.no_bubble_mean_s * unit_s, rel=1e-9)
    assert scaled.threshold_s == pytest.approx(in_ms.threshold_s * unit_s, rel=1e-9)
