"""`prismbench variability` on small captured jobs: the deterministic limit, a slow GPU, the
CLI's output, plot and errors."""

import json
from dataclasses import replace

import numpy as np
import pytest

from emulator.variability.model import NO_VARIABILITY, PRISM_LOW, VariabilityModel
from prismbench.cli import main
from prismbench.emulate import emulate
from prismbench.spec import job_spec_from_dict
from prismbench.variability import variability

PARALLEL = {"tp": 2, "dp": 2, "sequence_parallel": True}


def _debug_job(tmp_path, parallel: str = "") -> str:
    """A llama-debug job of 64 tokens and 8 sequences, its [parallel] table `parallel` (TOML
    lines), written under `tmp_path`: its path."""
    job = tmp_path / "job.toml"
    job.write_text(
        f'[model]\nname = "llama-debug"\n[parallel]\n{parallel}'
        "[batch]\nseq_len = 64\nglobal_batch = 8\n"
    )
    return str(job)


def _job():
    return job_spec_from_dict(
        {
            "model": {"name": "llama-debug"},
            "parallel": PARALLEL,
            "batch": {"seq_len": 64, "global_batch": 8},
        }
    )


@pytest.mark.integration
def test_without_variability_every_sample_is_emulates_iteration_time():
    job = _job()
    expected = emulate(job, workers=1).iteration_time_s
    d = variability(job, model=NO_VARIABILITY, samples=200, workers=1).distribution
    assert d.deterministic_s == expected
    assert (d.times_s == expected).all()


@pytest.mark.integration
def test_one_slow_gpu_shifts_p95_by_its_extra_compute():
    # Blocking tp collectives every layer and the dp gradient sync put rank 2's compute on the
    # critical path: the step grows by (s - 1) x its compute, a little less where its compute
    # overlaps communication (the overlap slowdown stretches only the overlapped part). The
    # host binds nothing here: with its dispatch time this debug model's microsecond kernels
    # are launch-bound, and a slower GPU costs (almost) nothing, as the second half checks.
    job, slow = _job(), 1.3
    base = emulate(job, workers=1, host_dispatch=None)
    factors = np.ones((2, 1, 1, 2))
    factors[1, 0, 0, 0] = slow
    model = NO_VARIABILITY.with_speed_factors(factors)
    d = variability(job, model=model, samples=200, workers=1, host_dispatch=None).distribution
    hand = (slow - 1) * base.per_class[0].compute_s
    assert 0.99 * hand <= d.p95_s - base.iteration_time_s <= hand
    launch_bound = variability(job, model=model, samples=200, workers=1).distribution
    assert launch_bound.p95_s - launch_bound.deterministic_s < 0.1 * hand


@pytest.mark.integration
def test_cli_prints_json_and_draws_the_plot(tmp_path, capsys):
    job = _debug_job(tmp_path, "dp = 2\n")
    plot = tmp_path / "steps.png"
    argv = ["variability", job, "--samples", "200", "--seed", "3", "--workers", "1"]
    assert main([*argv, "--json", "--plot", str(plot)]) == 0
    first = json.loads(capsys.readouterr().out)
    assert plot.stat().st_size > 0
    assert first["samples"] == 200 and first["seed"] == 3
    assert first["p5_s"] <= first["p50_s"] <= first["p95_s"] <= first["p99_s"]
    assert main([*argv, "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert {k: v for k, v in again.items() if k != "monte_carlo_wall_s"} == {
        k: v for k, v in first.items() if k != "monte_carlo_wall_s"
    }
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "p95" in table and " ms" in table
    assert "20 of 10 steps" in table and "std within an allocation" in table
    assert first["steps_per_allocation"] == 10 and first["within_allocation_std_s"] > 0


@pytest.mark.integration
def test_ranking_sources_and_placing_slow_gpus_say_each_run_as_it_ends(tmp_path, capsys):
    # each of those runs takes as long as the Monte Carlo itself (minutes on the README's 8 192
    # GPUs): one line a run on stderr, or the command sits silent for as many times that
    job = _debug_job(tmp_path, "tp = 2\ndp = 2\n")
    argv = ["variability", job, "--samples", "20", "--steps-per-allocation", "1",
            "--workers", "1", "--rank-sources", "--placement", "2:1.2", "--json"]  # fmt: skip
    assert main(argv) == 0
    captured = capsys.readouterr()
    out, err = json.loads(captured.out), captured.err.splitlines()
    sources = [s["source"] for s in out["attribution"]["sources"]]
    said = [line.split(": ", 1)[1] for line in err if line.startswith("noise source ")]
    assert sorted(said) == sorted(sources)
    assert f"noise source {len(sources)}/{len(sources)} alone: {said[-1]}" in err
    placements = [out["placement"]["reference"], *out["placement"]["placements"]]
    n = len(placements)
    assert [line for line in err if line.startswith("placement ")] == [
        f"placement {i}/{n}: {p['placement']}" for i, p in enumerate(placements, start=1)
    ]


@pytest.mark.integration
def test_plot_into_a_directory_not_yet_made_makes_it(tmp_path, capsys):
    job = _debug_job(tmp_path)
    plot = tmp_path / "new" / "sub" / "steps.png"
    argv = ["variability", job, "--samples", "200", "--workers", "1", "--plot", str(plot)]
    assert main(argv) == 0
    assert plot.read_bytes().startswith(b"\x89PNG")
    assert [p.name for p in plot.parent.iterdir()] == ["steps.png"]  # no temporary left


@pytest.mark.parametrize(
    ("option", "value", "needle"),
    [
        ("--samples", "0", "--samples"),
        ("--seed", "-1", "--seed"),
        ("--threshold", "0", "--threshold"),
        # an infinite one printed "P(step > inf h)" and `--json` "threshold_s": Infinity
        ("--threshold", "inf", "--threshold=inf: a step time in seconds must be a finite number > 0"),
        ("--threshold", "nan", "--threshold=nan: a step time in seconds must be a finite number > 0"),
        ("--steps-per-allocation", "0", "--steps-per-allocation"),
        ("--samples", "190", "--samples=190 makes 19 allocation(s) of --steps-per-allocation=10"),
        ("--samples", "190", "--samples >= 191,"),  # 191 makes the 20 allocations (one short)
        ("--plot", "steps.txt", "--plot steps.txt: cannot draw a .txt file"),
    ],
)
def test_bad_options_exit_2_naming_the_option(option, value, needle, tmp_path, capsys):
    assert main(["variability", _debug_job(tmp_path), option, value]) == 2
    assert needle in capsys.readouterr().err


def test_a_bad_job_spec_exits_2_naming_the_field(tmp_path, capsys):
    assert main(["variability", _debug_job(tmp_path, "tp = 0\n")]) == 2
    assert "tp" in capsys.readouterr().err


def test_a_tail_of_slow_network_steps_is_said_to_restate_the_assumed_regimes():
    from io import StringIO

    from rich.console import Console

    from emulator.variability.model import PRISM_LOW
    from emulator.variability.summary import summarize
    from prismbench.report import render_variability
    from prismbench.variability import VariabilityResult, tail_slow_network_share

    # the 10 slowest of 100 steps are the 10 drawn in the 1.4x regime
    times = np.r_[np.full(90, 1.0), np.linspace(1.1, 1.2, 10)]
    network = np.r_[np.ones(90), np.full(10, 1.4)]
    d = summarize(times, 1.0, seed=0)
    share = tail_slow_network_share(times, network, d.p95_s, PRISM_LOW, regime_nodes=3)
    assert share == 1.0
    assert tail_slow_network_share(times, np.ones(100), d.p95_s, PRISM_LOW, 3) == 0.0
    # no communication the regime slows, or one regime: nothing to say
    assert tail_slow_network_share(times, network, d.p95_s, PRISM_LOW, regime_nodes=0) is None
    assert tail_slow_network_share(times, network, d.p95_s, NO_VARIABILITY, 3) is None
    out = StringIO()
    result = VariabilityResult(job="j", world_size=16, preset="prism-low", distribution=d,
                               monte_carlo_wall_s=0.1, network=PRISM_LOW.network,
                               tail_slow_network_share=share)  # fmt: skip
    render_variability(result, Console(file=out, width=300))
    printed = out.getvalue()
    assert "steps above p95 in a slower network regime │ 100.0 %" in " ".join(printed.split())
    assert "restate the regimes prism-low assumes" in printed
    assert "90.0 % at 1.000x, 10.0 % at 1.400x; assumed by prism-low" in " ".join(printed.split())
    assert result.to_dict()["tail_slow_network_share"] == 1.0


@pytest.mark.integration
def test_network_regimes_measured_on_a_run_replace_the_assumed_ones(tmp_path, capsys):
    # 16 GPUs of 8 a node: the gradient all-reduce crosses the network, so the regime applies
    steps = tmp_path / "comm_s.txt"
    steps.write_text("# all-reduce time of each step (s)\n" + "0.010\n" * 28 + "0.030\n" * 12)
    job = tmp_path / "job.toml"
    job.write_text('[model]\nname = "llama-debug"\n[parallel]\ndp = 16\n[batch]\nseq_len = 64\nglobal_batch = 16\n')
    argv = ["variability", str(job), "--samples", "200", "--workers", "1", "--network-steps", str(steps)]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["network_regimes"] == [{"probability": 0.7, "factor": 1.0}, {"probability": 0.3, "factor": 3.0}]
    assert out["network_measured"]["steps"] == 40 and out["network_measured"]["median_s"] == 0.01
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "70.0 % at 1.000x, 30.0 % at 3.000x; measured in" in table
    assert "restate the regimes" not in table


@pytest.mark.integration
def test_a_transfer_cv_above_the_collectives_widens_a_pipelined_step_alone():
    # no host dispatch: with it the debug model's microsecond kernels wait on their launches
    # and no transfer is on the critical path
    collectives = VariabilityModel(spatial_cv=0.0, temporal_cv=0.0, collective_cv=0.01)
    transfers = replace(collectives, transfer_cv=0.1)

    def times(parallel: dict, model) -> np.ndarray:
        job = job_spec_from_dict({"model": {"name": "llama-debug"}, "parallel": parallel,
                                  "batch": {"seq_len": 64, "global_batch": 8}})  # fmt: skip
        d = variability(job, model=model, samples=200, workers=1, host_dispatch=None).distribution
        return d.times_s

    assert times({"pp": 2}, transfers).std() > 3 * times({"pp": 2}, collectives).std()
    assert np.array_equal(times({"dp": 2}, transfers), times({"dp": 2}, collectives))


@pytest.mark.integration
def test_transfers_measured_on_a_run_are_drawn_and_said(tmp_path, capsys):
    # 32 calls of the transfer alone (2.0 or 2.1 ms), 8 that waited for their peer (9 ms)
    transfers = tmp_path / "sendrecv_s.txt"
    transfers.write_text("# SendRecv kernels, stage 0 -> 1 (s)\n" + "2.0e-3\n2.1e-3\n" * 16 + "9e-3\n" * 8)
    job = _debug_job(tmp_path, "pp = 2\n")
    argv = ["variability", job, "--samples", "200", "--workers", "1"]
    assert main([*argv, "--json"]) == 0
    assumed = json.loads(capsys.readouterr().out)
    assert assumed["transfer_cv"] == PRISM_LOW.collective_cv and assumed["transfers_measured"] is None
    assert assumed["transfer_modelled_s"] is None
    assert main([*argv, "--json", "--pipeline-transfers", str(transfers)]) == 0
    out = json.loads(capsys.readouterr().out)
    measured = out["transfers_measured"]
    assert {k: measured[k] for k in ("source", "transfers", "bubble_fraction")} == {
        "source": str(transfers), "transfers": 40, "bubble_fraction": 0.2}  # fmt: skip
    assert 2.1e-3 < measured["threshold_s"] < 9e-3
    assert measured["no_bubble_mean_s"] == pytest.approx(2.05e-3)
    assert out["transfer_cv"] == measured["no_bubble_cv"] == pytest.approx(0.05 / 2.05, rel=0.05)
    # the debug job's activations, priced: far under 2 ms; its two stages share a node
    assert out["transfer_modelled_s"].keys() == {"within_node"}
    modelled = out["transfer_modelled_s"]["within_node"]
    assert 0 < modelled < 2e-3
    assert main(argv) == 0
    assert "0.98 %: the collectives', assumed by prism-low" in capsys.readouterr().out
    assert main([*argv, "--pipeline-transfers", str(transfers)]) == 0
    table = " ".join(capsys.readouterr().out.split())
    cv = f"{100 * measured['no_bubble_cv']:.2f} %"
    assert f"pipeline transfer CV (one send/recv, no bubble) │ {cv} (no-bubble median 0.00205 s)" in table
    ratio = measured["no_bubble_mean_s"] / modelled
    assert "pipeline transfer (no bubble): measured / modelled │ 2.05 ms / " in table
    assert f"within node ({ratio:.2f}x); medians over the job's boundaries │" in table


@pytest.mark.integration
def test_a_measured_transfer_is_set_beside_the_price_of_each_link_the_boundaries_cross(tmp_path, capsys):
    """Four stages on nodes of two GPUs: boundaries 0-1 and 2-3 stay inside a node, 1-2 crosses
    the network; a measurement is of one boundary, so the report prices both links apart
    rather than one median over a mix."""
    transfers = tmp_path / "sendrecv_s.txt"
    transfers.write_text("2.0e-3\n2.1e-3\n" * 16 + "9e-3\n" * 8)
    job = tmp_path / "job.toml"
    job.write_text('[model]\nname = "llama-debug"\n[parallel]\npp = 4\n[batch]\nseq_len = 64\n'
                   "global_batch = 8\n[cluster]\ngpus_per_node = 2\n")  # fmt: skip
    argv = ["variability", str(job), "--samples", "200", "--workers", "1", "--pipeline-transfers", str(transfers)]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    modelled, measured_s = out["transfer_modelled_s"], out["transfers_measured"]["no_bubble_mean_s"]
    assert modelled.keys() == {"within_node", "across_nodes"}
    assert 0 < modelled["within_node"] < modelled["across_nodes"]  # NVLink is the faster link
    assert main(argv) == 0
    table = " ".join(capsys.readouterr().out.split())
    assert f"within node ({measured_s / modelled['within_node']:.2f}x); " in table
    assert f"across nodes ({measured_s / modelled['across_nodes']:.2f}x); " in table
    assert "(read the link your boundary crosses)" in table
