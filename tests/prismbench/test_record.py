"""Tests for prismbench/record.py and `prismbench record`: a real two-process CPU run."""

from __future__ import annotations

import gzip
import json
import signal
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch

from emulator.hardware import gpu_preset
from prismbench.baselines import load_baseline, load_baselines
from prismbench.cli import main
from prismbench.record import (
    Recording,
    local_gpu,
    oversubscription_note,
    provenance,
    record,
    to_baseline,
    write_record,
)
from prismbench.spec import job_spec_from_dict
from prismbench.validate import case_metrics
from workloads.config import SpecError

TWO_RANKS = (
    '[model]\nname = "gpt-debug"\n[parallel]\ndp = 2\n[batch]\nseq_len = 32\nglobal_batch = 2\n'
)


@pytest.mark.integration
def test_record_times_a_real_two_process_run(tmp_path, capsys):
    job = tmp_path / "two.toml"
    job.write_text(TWO_RANKS)
    out = tmp_path / "recorded" / "two.toml"
    assert main(["record", str(job), "--out", str(out), "--iterations", "3", "--warmup", "1"]) == 0
    printed = capsys.readouterr().out
    assert "not a GPU allocator's" in printed and "validate runs it but scores nothing" in printed
    (baseline,) = load_baselines(out.parent)  # a recorded baseline validate can score
    measured, provenance = baseline.measured, baseline.provenance
    assert baseline.name == "two" and baseline.job.parallel.dp == 2
    assert measured.iterations == 3
    assert (
        measured.iteration_time_s_min <= measured.iteration_time_s <= measured.iteration_time_s_max
    )
    assert measured.peak_mem_kind == "cpu_max_rss" and measured.peak_mem_bytes > 10 * 2**20
    assert measured.device == "cpu"
    assert provenance.kind == "recorded" and "1 torch thread(s)" in provenance.notes
    assert provenance.machine and provenance.software and provenance.commit and provenance.date


@pytest.mark.slow  # a two-process record of its own (~14 s on 2 cores) for a warning's absence
@pytest.mark.integration
def test_a_tensor_parallel_record_prints_no_dtensor_rng_warning(tmp_path, capfd):
    # each rank printed torch's "DTensor random operators may not have complete support on
    # cpu device mesh" while it initialised its tensor-parallel shards
    job = tmp_path / "tp.toml"
    job.write_text(TWO_RANKS.replace("dp = 2", "tp = 2"))
    out = tmp_path / "tp_out.toml"
    assert main(["record", str(job), "--out", str(out), "--iterations", "1", "--warmup", "0"]) == 0
    assert "DTensor random operators" not in capfd.readouterr().err


# (dp, train.model_init, the init_device a rank builds with)
BUILDS = [(2, "auto", "meta"), (1, "auto", None), (2, "device", None), (1, "meta", "meta")]


def test_a_rank_builds_as_the_emulator_takes_its_program_to():
    # by default several ranks materialise their own shards only, a one-GPU job builds whole
    # on its device, as the shared H100 measurements ran it; `train.model_init` says otherwise
    # (TrainingJob.builds_on_meta). One process (torch's import is most of its time) runs the
    # four builds in turn, each on a fake process group of its own.
    specs = [
        TWO_RANKS.replace("dp = 2", f"dp = {dp}") + f'[train]\nmodel_init = "{model_init}"\n'
        for dp, model_init, _ in BUILDS
    ]
    script = textwrap.dedent(
        f"""
        import torch.distributed as dist, workloads
        from torch.testing._internal.distributed.fake_pg import FakeStore
        from prismbench.record import _rank_run
        from prismbench.spec import load_job_spec
        import pathlib, tempfile

        class Built(Exception):
            pass

        def build_training(job, mesh, **kwargs):
            print("init_device", kwargs.get("init_device"))
            raise Built

        workloads.build_training = build_training
        for text in {specs!r}:
            spec = pathlib.Path(tempfile.mkdtemp()) / "job.toml"
            spec.write_text(text)
            job = load_job_spec(spec)
            dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=job.world_size)
            try:
                _rank_run(job, 0, 1)
            except Built:
                pass
            dist.destroy_process_group()
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    printed = [line for line in done.stdout.splitlines() if line.startswith("init_device")]
    assert printed == [f"init_device {init_device}" for _, _, init_device in BUILDS]


def test_refuses_what_cannot_run_here(tmp_path):
    big = job_spec_from_dict(
        {
            "model": {"name": "gpt-debug"},
            "parallel": {"dp": 32},
            "batch": {"seq_len": 32, "global_batch": 32},
        }
    )
    with pytest.raises(SpecError, match="world size 32 is above 16"):
        record(big)
    small = job_spec_from_dict(
        {"model": {"name": "gpt-debug"}, "batch": {"seq_len": 32, "global_batch": 1}}
    )
    with pytest.raises(SpecError, match="iterations=0"):
        record(small, iterations=0)
    job = tmp_path / "one.toml"
    job.write_text(TWO_RANKS)
    assert main(["record", str(job), "--out", str(tmp_path / "one.json")]) == 2  # not a .toml


def test_a_refused_record_does_not_say_it_is_recording(tmp_path, capsys):
    # "recording ... 32 process(es)" was said before the world size was refused
    job = tmp_path / "big.toml"
    job.write_text(TWO_RANKS.replace("dp = 2", "dp = 32").replace("global_batch = 2", "global_batch = 32"))
    assert main(["record", str(job), "--out", str(tmp_path / "big_out.toml")]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: parallel: record runs every rank as a process on this machine; world size 32 is above 16"
    ]


def test_more_threads_than_cores_is_said_before_the_run(tmp_path, capsys, monkeypatch):
    # 2 ranks x 4 threads on 2 cores timed their contention with no word of it
    import prismbench.launch

    assert oversubscription_note(2, 1, 2) is None
    assert "8 threads on 2 usable core(s)" in oversubscription_note(2, 4, 2)
    monkeypatch.setattr(prismbench.launch, "run_ranks", lambda *a, **k: pytest.fail("ran"))
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    with pytest.raises(pytest.fail.Exception):
        record(job_spec_from_dict({"model": {"name": "gpt-debug"}, "parallel": {"dp": 2},
                                   "batch": {"seq_len": 32, "global_batch": 2}}),
               threads=4, progress=lambda line: print(line))  # fmt: skip
    assert "note: 2 process(es) x 4 thread(s) = 8 threads" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_ranks_the_out_of_memory_killer_ended_are_a_job_too_large_for_the_machine(
    tmp_path, capsys, monkeypatch
):
    # a rank killed by SIGKILL (the kernel's out-of-memory killer) was RanksDied's traceback
    import prismbench.launch

    def killed(*_args, **_kwargs):
        raise prismbench.launch.RanksDied({0: -signal.SIGKILL, 1: 0})

    monkeypatch.setattr(prismbench.launch, "run_ranks", killed)
    job = tmp_path / "two.toml"
    job.write_text(TWO_RANKS)
    out = tmp_path / "two_out.toml"
    assert main(["record", str(job), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "rank(s) [0] of the job's 2 process(es) were killed" in err and "Traceback" not in err
    assert not out.exists()


def test_a_cuda_record_without_a_gpu_is_refused_naming_the_option(tmp_path, capsys):
    job = tmp_path / "one.toml"
    job.write_text('[model]\nname = "gpt-debug"\n[batch]\nseq_len = 32\nglobal_batch = 1\n')
    out = tmp_path / "one.toml.out.toml"
    with pytest.raises(SpecError, match="--device cuda: no CUDA GPU"):
        record(
            job_spec_from_dict(
                {"model": {"name": "gpt-debug"}, "batch": {"seq_len": 32, "global_batch": 1}}
            ),
            device="cuda",
        )
    assert main(["record", str(job), "--out", str(out), "--device", "cuda"]) == 2
    assert "--device cuda" in capsys.readouterr().err
    assert not out.exists()


def _fake_gpu(monkeypatch, capability, sm_count, total_bytes, name):
    """This CPU machine's torch.cuda answering as one GPU of that kind would (its properties
    only: record must open no CUDA context in the ranks' parent)."""
    gpu = torch.cuda
    monkeypatch.setattr(gpu, "is_available", lambda: True)
    monkeypatch.setattr(gpu, "device_count", lambda: 1)
    properties = SimpleNamespace(name=name, major=capability[0], minor=capability[1],
                                 multi_processor_count=sm_count, total_memory=total_bytes)  # fmt: skip
    monkeypatch.setattr(gpu, "get_device_properties", lambda index: properties)
    monkeypatch.setattr(gpu, "mem_get_info", None)  # opens a context: must not be called


def test_a_cuda_record_runs_only_on_the_job_s_gpu(monkeypatch):
    """The recording is scored against the prediction for cluster.gpu: an H200 cannot record
    an H100 job, and the refusal says which preset the GPU is."""
    h200 = gpu_preset("h200-141g").usable_capacity_bytes
    _fake_gpu(monkeypatch, (9, 0), 132, h200, "NVIDIA H200")
    h100_job = job_spec_from_dict(
        {"model": {"name": "gpt-debug"}, "batch": {"seq_len": 32, "global_batch": 1},
         "cluster": {"gpu": "h100-sxm-80g"}}
    )  # fmt: skip
    with pytest.raises(SpecError, match=r"cluster.gpu='h100-sxm-80g': GPU 0 here is an NVIDIA "
                       r"H200 \(compute capability 9.0, 132 SMs, 139.80 GiB\).*set cluster.gpu = "
                       "'h200-141g'"):  # fmt: skip
        record(h100_job, device="cuda")
    h200_job = job_spec_from_dict(h100_job.to_dict() | {"cluster": {"gpu": "h200-141g"}})
    with pytest.raises(SpecError, match="--warmup 0"):  # past the GPU check, to the next one
        record(h200_job, device="cuda", warmup=0)
    _fake_gpu(monkeypatch, (9, 0), 132, h200 // 7, "NVIDIA H200 MIG 1g.18gb")
    with pytest.raises(SpecError, match="no GPU preset describes it"):
        record(h200_job, device="cuda")


def test_a_cuda_record_of_more_ranks_than_gpus_says_what_can_be_done(monkeypatch):
    _fake_gpu(monkeypatch, (9, 0), 132, gpu_preset("h200-141g").usable_capacity_bytes, "NVIDIA H200")
    two_ranks = job_spec_from_dict(
        {"model": {"name": "gpt-debug"}, "parallel": {"dp": 2},
         "batch": {"seq_len": 32, "global_batch": 2}, "cluster": {"gpu": "h200-141g"}}
    )  # fmt: skip
    with pytest.raises(SpecError, match="world size 2 needs one GPU per rank") as refused:
        record(two_ranks, device="cuda")
    assert "`prismbench emulate`" in str(refused.value)
    assert "device mode" not in str(refused.value)  # no such mode exists


def test_a_cpu_recording_says_so_and_validate_scores_none_of_it():
    recording = Recording(job=job_spec_from_dict(
        {"model": {"name": "gpt-debug"}, "batch": {"seq_len": 32, "global_batch": 1}}).to_dict(),
        iteration_s=[0.05, 0.04, 0.06], warmup=1, threads_per_rank=1, peak_mem_bytes=2**30,
        peak_mem_kind="cpu_max_rss", provenance=provenance())  # fmt: skip
    baseline = to_baseline(recording, "mine")
    assert baseline.measured.device == "cpu" and recording.to_dict()["device"] == "cpu"
    emulated = {"iteration_time_s": 0.001, "peak_memory_reserved_bytes": 2**20}
    assert case_metrics(baseline, emulated) == []  # a GPU's prediction against a CPU's time


def test_a_cuda_recording_s_four_allocator_peaks_are_each_scored(tmp_path):
    job = job_spec_from_dict(
        {"model": {"name": "gpt-debug"}, "batch": {"seq_len": 32, "global_batch": 1},
         "cluster": {"gpu": "h100-sxm-80g"}}
    )  # fmt: skip
    recording = Recording(job=job.to_dict(), iteration_s=[0.05, 0.04, 0.06], warmup=1,
                          threads_per_rank=1, peak_mem_bytes=900, peak_mem_kind="allocator_reserved",
                          provenance=provenance() | {"gpu": "NVIDIA H100 80GB HBM3"}, device="cuda",
                          peak_first_iteration={"allocated": 500, "reserved": 800},
                          peak_steady={"allocated": 600, "reserved": 900})  # fmt: skip
    baseline = load_baseline(write_record(recording, tmp_path / "cuda.toml"))
    emulated = {"iteration_time_s": 0.05, "peak_memory_reserved_bytes": 990,
                "peak_memory_allocated_bytes": 600, "first_iteration_peak_memory_reserved_bytes": 880,
                "first_iteration_peak_memory_allocated_bytes": 450}  # fmt: skip
    errors = {m.metric: m.error for m in case_metrics(baseline, emulated)}
    assert errors == pytest.approx({
        "iteration_time_s": 0.0, "peak_memory_reserved_bytes": 0.1,
        "peak_memory_allocated_bytes": 0.0, "first_iteration_peak_memory_reserved_bytes": 0.1,
        "first_iteration_peak_memory_allocated_bytes": -0.1,
    })  # fmt: skip


@pytest.mark.gpu
@pytest.mark.integration
def test_a_cuda_record_keeps_the_allocator_peaks_of_both_iterations(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    description, presets = local_gpu()
    if not presets:
        pytest.skip(f"no GPU preset describes this GPU, an {description}")
    job = job_spec_from_dict(
        {"model": {"name": "gpt-debug"}, "batch": {"seq_len": 64, "global_batch": 2},
         "cluster": {"gpu": presets[0]}}
    )  # fmt: skip
    recording = record(job, iterations=3, warmup=2, device="cuda", profile=True)
    measured = recording.to_dict()["measured"]
    assert measured["peak_mem_kind"] == "allocator_reserved"
    steady, first = measured["peak_steady"], measured["peak_first_iteration"]
    assert measured["peak_mem_bytes"] == steady["reserved"] >= steady["allocated"] > 0
    assert first["reserved"] >= first["allocated"] > 0
    baseline = load_baseline(write_record(recording, tmp_path / "cuda.toml"))
    assert "CUDA run on" in baseline.provenance.notes
    assert any(op["op"] == "aten::mm" and op["kernels"] for op in recording.profile)


def test_a_profile_needs_cuda():
    job = job_spec_from_dict(
        {"model": {"name": "gpt-debug"}, "batch": {"seq_len": 32, "global_batch": 1}}
    )
    with pytest.raises(SpecError, match="--profile"):
        record(job, profile=True)


@pytest.mark.filterwarnings("ignore:CUDA is not available, disabling CUDA profiling")
def test_a_profiler_that_records_no_kernels_is_an_error_and_writes_nothing(
    tmp_path, capsys, monkeypatch
):
    """A CUDA build without CUPTI: the profiler sees the iterations but none of their kernels.
    Stood in for on this CPU: past the GPU checks, the rank runs here, in a world of one, on
    the CPU, and its profiler is asked for CUDA kernels, which a CPU build's profiler drops as a
    CUDA build without CUPTI does. It was every rank's RuntimeError traceback."""
    import torch.distributed as dist

    import prismbench.launch

    def one_rank_here(world_size, fn, job, warmup, iterations, device, *rest, **_options):
        dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
        try:
            return [fn(job, warmup, iterations, "cpu", *rest)]
        finally:
            dist.destroy_process_group()

    monkeypatch.setattr("prismbench.record._check_device", lambda job, device, warmup: None)
    monkeypatch.setattr(prismbench.launch, "run_ranks", one_rank_here)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    spec = tmp_path / "one.toml"
    spec.write_text('[model]\nname = "gpt-debug"\n[batch]\nseq_len = 32\nglobal_batch = 1\n'
                    '[cluster]\ngpu = "h200-141g"\n')  # fmt: skip
    out, profile = tmp_path / "out.toml", tmp_path / "p.ops.jsonl.gz"
    assert main(["record", str(spec), "--out", str(out), "--device", "cuda", "--warmup", "1",
                 "--iterations", "1", "--profile", str(profile)]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "\nerror: --profile: the profiler saw no kernel in iteration(s) [0] of 1" in err
    assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one.toml"]


def test_profile_iterations_need_a_profile_and_at_least_one(tmp_path, capsys):
    job = job_spec_from_dict(
        {"model": {"name": "gpt-debug"}, "batch": {"seq_len": 32, "global_batch": 1}}
    )
    with pytest.raises(SpecError, match="--profile-iterations 0: profile at least 1 iteration"):
        record(job, profile=True, profile_iterations=0)
    with pytest.raises(SpecError, match="--profile-iterations 2 given without --profile FILE"):
        record(job, profile_iterations=2)
    with pytest.raises(SpecError, match="--profile-iterations 1 given without --profile FILE"):
        record(job, profile_iterations=1)  # given, even as the default, it would be ignored
    spec = tmp_path / "one.toml"
    spec.write_text('[model]\nname = "gpt-debug"\n[batch]\nseq_len = 32\nglobal_batch = 1\n')
    out, profile = tmp_path / "out.toml", tmp_path / "p.ops.jsonl.gz"
    given = ["record", str(spec), "--out", str(out)]
    assert main([*given, "--profile", str(profile), "--profile-iterations", "0"]) == 2
    assert "argument --profile-iterations: '0' must be a positive integer" in capsys.readouterr().err
    assert main([*given, "--profile-iterations", "2"]) == 2
    assert "--profile-iterations 2 given without --profile FILE" in capsys.readouterr().err
    assert main([*given, "--profile-iterations", "1"]) == 2
    assert "--profile-iterations 1 given without --profile FILE" in capsys.readouterr().err
    assert not out.exists() and not profile.exists()


def test_record_writes_every_profiled_iteration_numbered(tmp_path, monkeypatch):
    """The CLI's side of `--profile-iterations` (a CPU has no kernels to profile: `record` is
    replaced by one returning what a CUDA run of two profiled iterations would)."""
    from prismbench.profile_readers import read_profile, read_profile_iterations

    mm = {"op": "aten::mm", "shapes": [[8, 8], [8, 8]], "self_cuda_us": 3.0,
          "kernels": [["gemm", 3.0]], "cpu_start_us": 0.0}  # fmt: skip
    asked = {}

    def recorded(job, **options):
        asked.update(options)
        return Recording(job=job.to_dict(), iteration_s=[0.05], warmup=1, threads_per_rank=1,
                         peak_mem_bytes=1, peak_mem_kind="cpu_max_rss", provenance=provenance(),
                         profiled_iterations=[[mm], [mm | {"kernels": [["gemm", 4.0]]}]])  # fmt: skip

    monkeypatch.setattr("prismbench.record.record", recorded)
    spec = tmp_path / "one.toml"
    spec.write_text('[model]\nname = "gpt-debug"\n[batch]\nseq_len = 32\nglobal_batch = 1\n')
    profile = tmp_path / "p.ops.jsonl.gz"
    assert main(["record", str(spec), "--out", str(tmp_path / "out.toml"),
                 "--profile", str(profile), "--profile-iterations", "2"]) == 0  # fmt: skip
    assert asked["profile"] is True and asked["profile_iterations"] == 2
    first, second = read_profile_iterations(profile)
    assert (first[0].kernel_us, second[0].kernel_us) == (3.0, 4.0)
    assert read_profile(profile) == first


def test_a_recording_s_profile_is_its_first_profiled_iteration():
    job = job_spec_from_dict(
        {"model": {"name": "gpt-debug"}, "batch": {"seq_len": 32, "global_batch": 1}}
    )
    common = dict(job=job.to_dict(), iteration_s=[0.05], warmup=1, threads_per_rank=1,
                  peak_mem_bytes=1, peak_mem_kind="cpu_max_rss", provenance={})  # fmt: skip
    assert Recording(**common).profile is None
    first = [{"op": "aten::mm"}]
    assert Recording(**common, profiled_iterations=[first, [{"op": "aten::add"}]]).profile == first


@pytest.mark.gpu
@pytest.mark.integration
def test_a_cuda_record_profiles_each_asked_iteration(tmp_path):
    """`record --device cuda --profile FILE --profile-iterations 2` writes iterations 0 and 1,
    the same ops in the same order in each (what a signature's spread over time is read from)."""
    from prismbench.profile_readers import read_profile_iterations

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    description, presets = local_gpu()
    if not presets:
        pytest.skip(f"no GPU preset describes this GPU, an {description}")
    spec = tmp_path / "tiny.toml"
    spec.write_text('[model]\nname = "gpt-debug"\n[batch]\nseq_len = 64\nglobal_batch = 2\n'
                    f'[cluster]\ngpu = "{presets[0]}"\n')  # fmt: skip
    profile = tmp_path / "tiny.ops.jsonl.gz"
    assert main(["record", str(spec), "--out", str(tmp_path / "tiny_out.toml"), "--device", "cuda",
                 "--iterations", "2", "--warmup", "2", "--profile", str(profile),
                 "--profile-iterations", "2"]) == 0  # fmt: skip
    with gzip.open(profile, "rt") as handle:
        numbers = [json.loads(line)["iteration"] for line in handle]
    assert sorted(set(numbers)) == [0, 1] and numbers == sorted(numbers)
    first, second = read_profile_iterations(profile)
    assert any(op.op == "aten::mm" for op in first)
    assert [op.op for op in first] == [op.op for op in second]


def test_a_recording_s_provenance_needs_no_harness_storage():
    # GPU machines run `record` with torch alone installed: it must not import duckdb
    code = "import sys; from prismbench.record import provenance; provenance(); print('duckdb' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_a_profile_at_the_recording_s_own_path_is_refused_as_two_outputs_in_one_file(tmp_path, capsys):
    spec = tmp_path / "one.toml"
    spec.write_text('[model]\nname = "gpt-debug"\n[batch]\nseq_len = 32\nglobal_batch = 1\n')
    out = tmp_path / "rec.toml"
    assert main(["record", str(spec), "--out", str(out), "--profile", str(out)]) == 2
    assert f"--profile {out}: is --out's file too; give each its own" in capsys.readouterr().err
    assert not out.exists()
