"""A measured variability table from one's own GPU recordings and profiles
(prismbench/variability_recordings.py), `prismbench variability-table`, and `variability
--preset measured --variability-table` drawing from it."""

import gzip
import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from prismbench.capture import capture_job
from prismbench.cli import main
from prismbench.record import PEAK_MEM_KIND, Recording, write_record
from prismbench.spec import job_spec_from_dict
from prismbench.variability_calibration import (
    VARIABILITY_TABLES,
    resolve_preset,
    write_table,
)
from prismbench.variability_recordings import recorded_table
from tests.prismbench.profiles import synthetic_profile, write_jsonl
from workloads.config import SpecError

ROOT = Path(__file__).resolve().parents[2]
RECORDED = ROOT / "results" / "baselines" / "recorded"
# real H100 recordings (recorded/h100frameworks__<case>.toml) and their profiles, both from
# `record --device cuda --profile` (results/gpu_runs/h100-2026-11-28/README.md)
REPROFILE = ROOT / "results" / "gpu_runs" / "h100-2026-11-28" / "reprofile"
CASES = ("gpt3-125m-s2048-mb8-none", "llama3-8b-l2-s8192-mb2-none")
SHARED_GPU = ROOT.parent / "shared" / "data" / "gpu"
needs_shared = pytest.mark.skipif(
    not SHARED_GPU.is_dir(), reason="../shared/data/gpu is not beside the repo"
)
PROVENANCE = {"kind": "recorded", "machine": "a test", "software": "none", "commit": "abc",
              "dirty": False, "date": "2026-12-01"}  # fmt: skip


def _pairs() -> list[tuple[Path, Path]]:
    return [
        (RECORDED / f"h100frameworks__{c}.toml", REPROFILE / f"{c}.ops.jsonl.gz") for c in CASES
    ]


def _recorded_job(gpu="h100-sxm-80g"):
    """The job of `_recording`'s recordings: gpt-debug on `gpu`."""
    return job_spec_from_dict({"model": {"name": "gpt-debug"}, "cluster": {"gpu": gpu},
                               "batch": {"seq_len": 32, "global_batch": 1}})  # fmt: skip


def _recording(path: Path, *, gpu="h100-sxm-80g", device="cuda", iteration_s=(0.05, 0.04, 0.06)):
    """A gpt-debug recording on `gpu`, written as `record --out path` writes one."""
    job = _recorded_job(gpu)
    cuda = device == "cuda"
    peaks = {"allocated": 600, "reserved": 900} if cuda else None
    recording = Recording(job=job.to_dict(), iteration_s=list(iteration_s), warmup=1,
                          threads_per_rank=1, peak_mem_bytes=900,
                          peak_mem_kind=PEAK_MEM_KIND[device],
                          provenance=PROVENANCE | ({"gpu": "NVIDIA H100 80GB HBM3"} if cuda else {}),
                          device=device, peak_first_iteration=peaks, peak_steady=peaks)  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_record(recording, path)


def _debug_profile(
    path: Path, *, gpu="h100-sxm-80g", measured_on: str | None = None, repeats: bool = True
) -> Path:
    """A profile of `_recording`'s job on `gpu`: what a GPU records for its capture's ops
    (test_profile_ingest; unless `repeats`, each op's kernel of its own name, so that no kernel
    signature repeats); where `measured_on`, with a summary.json beside its profiles/ folder
    naming that GPU, as the shared profiles have."""
    ops = synthetic_profile(capture_job(_recorded_job(gpu)).traces[0])
    if not repeats:
        ops = [replace(op, kernels=((f"kernel_{i}", op.kernel_us),)) for i, op in enumerate(ops)]
    if measured_on is not None:
        path = path.parent / "profiles" / path.name
        path.parent.mkdir(parents=True, exist_ok=True)
        summary = {path.name.split(".ops.")[0]: {"gpu": measured_on}}
        (path.parent.parent / "summary.json").write_text(json.dumps(summary))
    return write_jsonl(path, ops)


def _ops_profile(path: Path, ops: list[dict]) -> Path:
    with gzip.open(path, "wt") as handle:
        handle.writelines(json.dumps(op) + "\n" for op in ops)
    return path


def test_a_table_from_recordings_measures_each_job_and_says_where_it_comes_from():
    table = recorded_table(_pairs())
    assert table["gpu"] == "h100-sxm-80g"
    assert list(table["jobs"]) == [f"h100frameworks__{c}" for c in CASES]
    assert set(table["temporal_cv_by_class"]) == {"gemm", "attention", "memory"}
    assert all(cv > 0 for cv in table["temporal_cv_by_class"].values())
    assert table["temporal_floor_s"] > 0 and table["step_cv"] > 0
    recorded = table["provenance"]["recordings"]
    first = recorded[0]
    assert [r["recording"] for r in recorded] == [str(r) for r, _ in _pairs()]
    assert [r["profile"] for r in recorded] == [str(p) for _, p in _pairs()]
    assert first["machine"] == "vm: Intel(R) Xeon(R) Processor, 16 cores"
    assert first["commit"] == "6a9c814d9d7cf701d46cb0077262e48040341d06"
    assert first["date"] == "2026-11-28T04:02:13+00:00" and first["software"].startswith("torch")
    assert table["provenance"]["built_by"] == "prismbench variability-table"
    assert table["provenance"]["commit"] and "dirty" in table["provenance"]


def test_each_profile_is_read_once(monkeypatch):
    # a real run's profile is tens of MB of JSON: the table's measurement and the check that it
    # is one of its recording's job share one read
    from prismbench import (
        profile_ingest,
        profile_readers,
        variability_calibration,
        variability_recordings,
    )

    read = []
    real = profile_readers.read_profile_iterations
    for module in (profile_ingest, profile_readers, variability_calibration, variability_recordings):
        monkeypatch.setattr(module, "read_profile_iterations",
                            lambda path: read.append(path) or real(path))  # fmt: skip
    recorded_table(_pairs())
    assert read == [profile for _, profile in _pairs()]


def test_the_measured_preset_draws_a_recorded_table_written_anywhere(tmp_path):
    path = write_table(recorded_table(_pairs()), tmp_path / "mine.json")
    model = resolve_preset("measured", "h100-sxm-80g", path)
    committed = resolve_preset("measured", "h100-sxm-80g")
    assert model.temporal_cv_by_class == json.loads(path.read_text())["temporal_cv_by_class"]
    assert model.temporal_cv_by_class != committed.temporal_cv_by_class


@pytest.mark.slow  # ~65 s on 2 cores: the eight shared profiles read again (tens of MB each)
@needs_shared
def test_recordings_of_the_shared_jobs_give_the_committed_table():
    # the h100shared__ recordings hold summary.json's iteration times, job by job
    # (results/baselines/make_recorded.py): with the same profiles, what build.py reads
    profiles = sorted((SHARED_GPU / "h100-sxm-80g" / "profiles").glob("*.ops.jsonl.gz"))
    pairs = [(RECORDED / f"h100shared__{p.name.removesuffix('.ops.jsonl.gz')}.toml", p)
             for p in profiles]  # fmt: skip
    table = recorded_table(pairs)
    committed = json.loads((VARIABILITY_TABLES / "h100-sxm-80g.json").read_text())
    for figure in ("temporal_cv_by_class", "temporal_floor_s", "step_cv", "step_cv_dispersion"):
        assert table[figure] == pytest.approx(committed[figure], rel=1e-6), figure
    for count in ("pools_by_class", "short_pools", "families", "gpu"):
        assert table[count] == committed[count], count
    jobs = {job.removeprefix("h100shared__"): cvs for job, cvs in table["jobs"].items()}
    assert jobs.keys() == committed["jobs"].keys()
    for job, cvs in jobs.items():
        expected = committed["jobs"][job]
        assert cvs.keys() == expected.keys(), job
        # a figure not measured (kernel_cv_measured of a profile of one iteration) is None on
        # both sides; approx takes numbers only
        unmeasured = [k for k, v in expected.items() if v is None]
        assert [cvs[k] for k in unmeasured] == [None] * len(unmeasured), job
        figures = [k for k in expected if k not in unmeasured]
        assert [cvs[k] for k in figures] == pytest.approx([expected[k] for k in figures], rel=1e-6), job


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda tmp: _recording(tmp / "cpu.toml", device="cpu"), "measured.device='cpu'"),
        (lambda tmp: _recording(tmp / "one.toml", iteration_s=[0.05]), "measured.iterations=1"),
        (
            lambda tmp: ROOT / "results" / "baselines" / "bigscience__bloom-176b__384g__r162.toml",
            "provenance.kind='published'",
        ),
        (lambda tmp: tmp / "none.toml", "--recording: baseline '{path}': no such file"),
    ],
)
def test_a_recording_that_cannot_measure_a_spread_is_refused_naming_the_field(
    tmp_path, make, message
):
    path = make(tmp_path)
    profile = _pairs()[0][1]
    with pytest.raises(SpecError, match=re.escape(message.format(path=path))) as refused:
        recorded_table([(path, profile)])
    assert str(path) in str(refused.value)


def test_recordings_of_two_gpus_are_refused_naming_both(tmp_path):
    profile = _pairs()[0][1]
    h100 = _recording(tmp_path / "h100.toml")
    h200 = _recording(tmp_path / "h200.toml", gpu="h200-141g")
    with pytest.raises(SpecError, match="job.cluster.gpu differs") as refused:
        recorded_table([(h100, profile), (h200, profile)])
    assert f"{h100}: h100-sxm-80g" in str(refused.value)
    assert f"{h200}: h200-141g" in str(refused.value)


def test_two_recordings_of_one_file_name_are_refused(tmp_path):
    profile = _pairs()[0][1]
    pairs = [(_recording(tmp_path / d / "run.toml"), profile) for d in ("a", "b")]
    with pytest.raises(SpecError, match="each is job 'run'"):
        recorded_table(pairs)


def test_a_profile_that_cannot_be_read_or_has_no_ops_is_refused_naming_it(tmp_path):
    recording = _recording(tmp_path / "run.toml")
    missing = tmp_path / "missing.ops.jsonl.gz"
    with pytest.raises(SpecError, match=re.escape(f"--profile {missing}: no such profile file")):
        recorded_table([(recording, missing)])
    empty = _ops_profile(tmp_path / "empty.ops.jsonl.gz",
                         [{"op": "Activity Buffer Request", "kernels": [["k", 1.0]]}])  # fmt: skip
    with pytest.raises(SpecError, match=re.escape(f"--profile {empty}: no op with GPU time")):
        recorded_table([(recording, empty)])


def test_profiles_with_too_few_repeated_kernels_are_refused_naming_them(tmp_path):
    # a profile of the recording's job, each op launching a kernel of its own: no signature repeats
    recording = _recording(tmp_path / "run.toml")
    profile = _debug_profile(tmp_path / "small.ops.jsonl.gz", repeats=False)
    with pytest.raises(SpecError, match=re.escape(f"--profile {profile}: no pool shorter")):
        recorded_table([(recording, profile)])


def test_a_profile_of_another_job_is_refused_naming_both_and_the_coverage(tmp_path):
    # the gpt3-125m profile given with a gpt-debug recording
    recording = _recording(tmp_path / "run.toml")
    profile = _pairs()[0][1]
    with pytest.raises(SpecError, match="not a profile of") as refused:
        recorded_table([(recording, profile)])
    message = str(refused.value)
    assert message.startswith(f"--profile {profile}: not a profile of --recording {recording}'s job")
    assert "compute rows (" in message and "of kernel time (" in message


def test_a_profile_measured_on_another_gpu_is_refused(tmp_path):
    # a profile of the job on the H200, whose summary.json says it ran on an H100
    recording = _recording(tmp_path / "run.toml", gpu="h200-141g")
    profile = _debug_profile(tmp_path / "run.ops.jsonl.gz", gpu="h200-141g",
                             measured_on="NVIDIA H100 80GB HBM3")  # fmt: skip
    with pytest.raises(SpecError, match=re.escape(f"--profile {profile}: measured on 'NVIDIA H100")):
        recorded_table([(recording, profile)])


def test_no_recording_is_refused():
    with pytest.raises(SpecError, match="at least one recording"):
        recorded_table([])


def _cli_pairs() -> list[str]:
    return [a for r, p in _pairs() for a in ("--recording", str(r), "--profile", str(p))]


def _one_line_error(capsys, *needles: str) -> None:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for needle in needles:
        assert needle in err, err


def test_cli_writes_the_table_and_prints_its_figures_with_units(tmp_path, capsys):
    out = tmp_path / "mine.json"
    assert main(["variability-table", *_cli_pairs(), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    table = json.loads(out.read_text())
    assert table == recorded_table(_pairs()) | {"provenance": table["provenance"]}
    gemm = table["temporal_cv_by_class"]["gemm"]
    assert f"{100 * gemm:.2f} %" in printed
    assert f"{table['temporal_floor_s'] * 1e6:.3f} us" in printed
    assert f"{100 * table['step_cv']:.3f} %" in printed
    assert all(job in printed for job in table["jobs"]) and f"wrote {out}" in printed


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["--recording", "a.toml", "--profile", "a.gz", "--recording", "b.toml", "--out", "t.json"],
         ["--recording is given 2 time(s), --profile 1"]),
        (["--recording", "a.toml", "--profile", "a.gz", "--out", "{tmp}/t.csv"],
         ["--out {tmp}/t.csv: a variability table is a .json file"]),
        (["--recording", "a.toml", "--profile", "{tmp}/t.json", "--out", "{tmp}/t.json"],
         ["--out {tmp}/t.json: is the input"]),
        (["--recording", "{tmp}/cpu.toml", "--profile", str(_pairs()[0][1]), "--out", "{tmp}/t.json"],
         ["--recording {tmp}/cpu.toml: measured.device='cpu'"]),
    ],
)  # fmt: skip
def test_cli_refusals_exit_2_in_one_line_and_write_nothing(tmp_path, capsys, argv, needles):
    _recording(tmp_path / "cpu.toml", device="cpu")
    argv = [a.format(tmp=tmp_path) for a in argv]
    assert main(["variability-table", *argv]) == 2
    _one_line_error(capsys, *(n.format(tmp=tmp_path) for n in needles))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cpu.toml"]


def test_cli_refuses_a_profile_of_another_job_after_saying_it_captures_and_writes_nothing(
    tmp_path, capsys
):
    recording = _recording(tmp_path / "run.toml")
    profile = _pairs()[0][1]  # gpt3-125m's, the recording gpt-debug's
    out = tmp_path / "mine.json"
    argv = ["--recording", str(recording), "--profile", str(profile), "--out", str(out)]
    assert main(["variability-table", *argv]) == 2
    # the capture's own progress follows where it is not cached yet
    said, *_, error = capsys.readouterr().err.splitlines()
    assert said == (f"capturing run (--recording {recording}) to check that --profile {profile} "
                    "is a profile of its job")  # fmt: skip
    assert error.startswith(f"error: --profile {profile}: not a profile of --recording {recording}")
    assert not out.exists()


def test_cli_writes_the_table_of_a_profile_of_its_recordings_job(tmp_path, capsys):
    recording = _recording(tmp_path / "run.toml")
    profile = _debug_profile(tmp_path / "run.ops.jsonl.gz")
    out = tmp_path / "mine.json"
    argv = ["--recording", str(recording), "--profile", str(profile), "--out", str(out)]
    assert main(["variability-table", *argv]) == 0
    assert list(json.loads(out.read_text())["jobs"]) == ["run"]
    assert "capturing run" in capsys.readouterr().err


def _debug_job(tmp_path, gpu="h100-sxm-80g") -> str:
    job = tmp_path / "job.toml"
    job.write_text(f'[model]\nname = "llama-debug"\n[batch]\nseq_len = 64\nglobal_batch = 8\n'
                   f'[cluster]\ngpu = "{gpu}"\n')  # fmt: skip
    return str(job)


@pytest.mark.parametrize(
    ("preset", "gpu", "table", "needles"),
    [
        ("prism-low", "h100-sxm-80g", {}, ["--variability-table", "give --preset measured"]),
        ("measured", "h200-141g", {},
         ["measured on gpu 'h100-sxm-80g', the job's cluster.gpu is 'h200-141g'"]),
        ("measured", "h100-sxm-80g", {"schema_version": 2}, ["schema_version 2, expected 1"]),
    ],
)  # fmt: skip
def test_cli_variability_refuses_a_table_it_cannot_draw_before_any_work(
    tmp_path, capsys, monkeypatch, preset, gpu, table, needles
):
    import prismbench.variability

    monkeypatch.setattr(prismbench.variability, "variability", lambda *a, **k: pytest.fail("ran"))
    committed = json.loads((VARIABILITY_TABLES / "h100-sxm-80g.json").read_text())
    path = write_table(committed | table, tmp_path / "mine.json")
    argv = [_debug_job(tmp_path, gpu), "--preset", preset, "--variability-table", str(path)]
    assert main(["variability", *argv]) == 2
    _one_line_error(capsys, str(path), *needles)


@pytest.mark.integration
def test_cli_variability_draws_from_the_table_built(tmp_path, capsys):
    out = tmp_path / "mine.json"
    assert main(["variability-table", *_cli_pairs(), "--out", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(out.read_text())
    argv = ["variability", _debug_job(tmp_path), "--preset", "measured", "--samples", "200",
            "--workers", "1", "--json"]  # fmt: skip
    assert main([*argv, "--variability-table", str(out)]) == 0
    mine = json.loads(capsys.readouterr().out)
    assert main(argv) == 0
    committed = json.loads(capsys.readouterr().out)
    assert mine["preset"] == committed["preset"] == "measured"
    assert mine["variability_table"] == str(out) and committed["variability_table"] is None
    assert mine["deterministic_s"] == committed["deterministic_s"]
    assert mine["std_s"] != committed["std_s"]
    assert main([*argv[:-1], "--variability-table", str(out)]) == 0
    assert str(out) in capsys.readouterr().out  # the table says whose figures it drew


def test_a_profile_of_several_iterations_gives_the_measured_kernel_time_cv(tmp_path, capsys):
    """`record --profile-iterations 3`, here the H100 recording's profile as three iterations
    whose kernels ran 1 % slower, as profiled and 1 % faster: the table prints the CV of their
    kernel time (1 %), beside the model's kernel noise alone."""
    from prismbench.calibrate_job import write_ops_jsonl_iterations

    recording, profile = _pairs()[0]
    with gzip.open(profile, "rt") as handle:
        records = [json.loads(line) for line in handle if line.strip()]

    def scaled(factor):
        return [r | {"self_cuda_us": r["self_cuda_us"] * factor,
                     "kernels": [[name, us * factor] for name, us in r["kernels"]]} for r in records]  # fmt: skip

    three = write_ops_jsonl_iterations([scaled(1.01), scaled(1.0), scaled(0.99)], tmp_path / "three.ops.jsonl.gz")
    out = tmp_path / "mine.json"
    assert main(["variability-table", "--recording", str(recording), "--profile", str(three), "--out", str(out)]) == 0
    (job,) = json.loads(out.read_text())["jobs"].values()
    assert job["kernel_cv_measured"] == pytest.approx(0.01, rel=1e-6)
    assert "1.000 %" in capsys.readouterr().out
