"""`prismbench variability --rank-sources --placement K:FACTOR` on a small captured job: the
hand-calculated slow-GPU cost at every placement, the CLI's tables and JSON, bad values."""

import json

import pytest

from emulator.variability.model import NO_VARIABILITY
from prismbench.cli import main
from prismbench.emulate import emulate
from prismbench.spec import job_spec_from_dict
from prismbench.variability import variability

JOB_TOML = (
    '[model]\nname = "llama-debug"\n[parallel]\ntp = 2\ndp = 2\nsequence_parallel = true\n'
    "[batch]\nseq_len = 64\nglobal_batch = 8\n"
)


@pytest.fixture
def job_toml(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text(JOB_TOML)
    return path


@pytest.mark.integration
def test_two_slow_gpus_cost_their_extra_compute_at_every_placement():
    # tp collectives every layer and the dp gradient sync: in one TP group or one per replica,
    # the slowest GPU's compute is on the critical path, (s - 1) x the class's compute, a little
    # less where it overlaps communication (test_variability.py's single slow GPU). The host
    # binds nothing: with its dispatch time this debug model is launch-bound (ibid.).
    job = job_spec_from_dict(
        {
            "model": {"name": "llama-debug"},
            "parallel": {"tp": 2, "dp": 2, "sequence_parallel": True},
            "batch": {"seq_len": 64, "global_batch": 8},
        }
    )
    base, slow = emulate(job, workers=1, host_dispatch=None), 1.3
    study = variability(
        job, model=NO_VARIABILITY, samples=200, workers=1, slow_gpus=(2, slow), host_dispatch=None
    ).placement
    hand = (slow - 1) * base.per_class[0].compute_s
    assert study.reference.p95_s == base.iteration_time_s
    assert [p.placement for p in study.placements] == [
        "tp-group = stage",
        "stage-across-replicas",
        "spread",
    ]
    for p in study.placements:
        assert 0.99 * hand <= p.p95_s - base.iteration_time_s <= hand
        assert p.p95_s == p.deterministic_s


@pytest.mark.integration
def test_cli_ranks_sources_and_places_slow_gpus_in_tables_and_json(job_toml, capsys):
    argv = ["variability", str(job_toml), "--samples", "200", "--workers", "1"]
    argv += ["--rank-sources", "--placement", "2:1.2"]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    sources = out["attribution"]["sources"]
    assert {s["category"] for s in sources} >= {"compute", "collective", "spatial"}
    # 4 GPUs on one node: no call crosses nodes, so the network regime (on inter-node calls)
    # is listed as left out, not run
    skipped = out["attribution"]["skipped"]
    assert {s["category"] for s in skipped} == {"network"} and "network regime" in {
        s["source"] for s in skipped
    }
    assert not {s["source"] for s in skipped} & {s["source"] for s in sources}
    assert [s["std_s"] for s in sources] == sorted((s["std_s"] for s in sources), reverse=True)
    assert out["attribution"]["total"]["std_s"] == pytest.approx(out["std_s"])
    placements = out["placement"]["placements"]
    assert out["placement"]["slow_gpus"] == 2 and out["placement"]["factor"] == 1.2
    assert all(p["p95_ratio"] > 1 for p in placements)
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "Noise sources alone" in text and "compute gemm" in text
    assert f"not run, {len(skipped)} source(s) that provably add no noise" in text
    assert "by placement" in text and "p95 / no slow GPU" in text and " ms" in text


@pytest.mark.integration
def test_cli_splits_the_top_sources_into_signatures_in_tables_and_json(job_toml, capsys):
    argv = ["variability", str(job_toml), "--samples", "100", "--steps-per-allocation", "1"]
    argv += ["--workers", "1", "--rank-signatures", "2", "--signatures-per-source", "2"]
    assert main([*argv, "--json"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)["attribution"]
    said = [line for line in captured.err.splitlines() if line.startswith("signature ")]
    assert len(said) == out["signature_runs"]
    assert said[-1].startswith(f"signature {len(said)}/{len(said)} alone: ")
    split = [s for s in out["sources"] if any(x["own_run"] for x in s["signatures"])]
    assert 1 <= len(split) <= 2 and 1 <= out["signature_runs"] <= 2 * (2 + 1)
    assert sum(len(s["signatures"]) for s in split) == out["signature_runs"]
    for s in split:  # the top sources of several signatures, ranked by std under each
        stds = [x["std_s"] for x in s["signatures"]]
        assert stds == sorted(stds, reverse=True) and len(stds) <= 3
        assert sum(x["lumped"] for x in s["signatures"]) >= 2
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "└" in text and f"signatures: {out['signature_runs']} more Monte Carlo runs" in text


def test_the_help_states_the_default_signatures_per_source(capsys):
    from emulator.variability.attribution import SIGNATURES_PER_SOURCE

    assert main(["variability", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert f"lumped as 'other' ({SIGNATURES_PER_SOURCE})" in text


def test_signatures_per_source_without_rank_signatures_exits_2(job_toml, capsys):
    assert main(["variability", str(job_toml), "--signatures-per-source", "3"]) == 2
    assert "--rank-signatures" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["2", "0:1.1", "2:0", "2:0.5", "2:1", "2:x", "x:1.1", "2:inf"])
def test_a_bad_placement_exits_2_naming_the_option(value, job_toml, capsys):
    assert main(["variability", str(job_toml), "--placement", value]) == 2
    assert "--placement" in capsys.readouterr().err


def test_slow_gpus_that_fit_no_placement_exit_2_before_capturing(job_toml, capsys):
    assert main(["variability", str(job_toml), "--placement", "3:1.1"]) == 2
    err = capsys.readouterr().err
    assert "--placement" in err and "3 slow GPUs fit no placement" in err
