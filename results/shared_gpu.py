"""The shared GPU measurements (../shared/data/gpu/<gpu>/: an H100 80GB HBM3 and an H200, the same
eight world-size-1 jobs on each): where they are, where the recordings made from them and the
same jobs' runs with production-framework kernels are, the command line the scripts comparing
against them share (--gpu GPU, --only CASE..., --out FILE), and the leave-one-out kernel table
they score with."""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED_GPU = ROOT.parent / "shared" / "data" / "gpu"
# preset name -> its folder of measurements (the folders are named after the presets)
MEASURED_GPUS = ("h100-sxm-80g", "h200-141g")
SHARED = SHARED_GPU / "h100-sxm-80g"
# preset -> name prefix of the recorded baselines made from its measurements
# (results/baselines/recorded/<prefix>__<case>.toml, results/baselines/make_recorded.py)
RECORDED_PREFIX = {"h100-sxm-80g": "h100shared", "h200-141g": "h200shared"}
assert sorted(RECORDED_PREFIX) == sorted(MEASURED_GPUS)
RECORDED = ROOT / "results" / "baselines" / "recorded"
# preset -> the same eight jobs run again on that GPU with their families' production-framework
# kernels (results/calibration/reprofile_gpu.py; issue 15): name prefix of its recordings
# (RECORDED/<prefix>__<case>.toml, `prismbench record`'s own files, kept as written) and the
# folder of rank 0's kernel times (<case>.ops.jsonl.gz)
FRAMEWORKS_PREFIX = {"h100-sxm-80g": "h100frameworks", "h200-141g": "h200frameworks"}
REPROFILED = {
    "h100-sxm-80g": ROOT / "results" / "gpu_runs" / "h100-2026-11-28" / "reprofile",
    "h200-141g": ROOT / "results" / "gpu_runs" / "h200-2026-11-30" / "reprofile",
}
assert sorted(FRAMEWORKS_PREFIX) == sorted(REPROFILED) == sorted(MEASURED_GPUS)


# ef45604 gave torchtitan's op-level SAC policy the name "op" and the workloads' earlier one,
# which recordings made before it ran under "op", the name "op-prism-86a4f47"
POLICY_RENAMED_AT = "ef45604"


def recording_job(recording: dict):
    """The job spec of a `Recording.to_dict()` as this code names it: a recording made before
    POLICY_RENAMED_AT (its provenance's commit) that says selective_recompute "op" ran the
    policy now called "op-prism-86a4f47"."""
    from prismbench.spec import job_spec_from_dict

    job = json.loads(json.dumps(recording["job"]))
    kernels = job.get("kernels", {})
    commit = recording.get("provenance", {}).get("commit")
    if kernels.get("selective_recompute") == "op" and commit and not _descends(commit):
        kernels["selective_recompute"] = "op-prism-86a4f47"
    return job_spec_from_dict(job)


def _descends(commit: str) -> bool:
    """Whether `commit` contains POLICY_RENAMED_AT (git; a commit it does not know is an
    error: a shallow clone cannot say)."""
    done = subprocess.run(["git", "merge-base", "--is-ancestor", POLICY_RENAMED_AT, commit],
                          cwd=ROOT, capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode not in (0, 1):
        raise SystemExit(f"recording made at {commit}: git cannot say whether it contains "
                         f"{POLICY_RENAMED_AT}: {done.stderr.strip()}")  # fmt: skip
    return done.returncode == 0


def recorded_baseline_path(case: str, gpu: str) -> Path:
    """Where the recorded baseline of shared job `case` measured on `gpu` is (or would be)."""
    return RECORDED / f"{RECORDED_PREFIX[gpu]}__{case}.toml"


def recorded_job(case: str, gpu: str):
    """The job spec of shared job `case` as its recorded baseline on `gpu` holds it."""
    from prismbench.baselines import load_baseline

    return load_baseline(recorded_baseline_path(case, gpu)).job


def local_gpu_preset() -> str:
    """The preset of this machine's CUDA GPU, which must be one of the measured GPUs (else it
    exits with the reason: the GPU scripts compare against that GPU's own measurements)."""
    import torch

    from prismbench.record import local_gpu

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device here")
    description, presets = local_gpu()
    measured = [preset for preset in presets if preset in MEASURED_GPUS]
    if not measured:
        raise SystemExit(f"GPU 0, an {description}, is not a measured GPU {MEASURED_GPUS}")
    return measured[0]


def shared_dir(gpu: str) -> Path:
    if gpu not in MEASURED_GPUS:
        raise ValueError(f"gpu={gpu!r}: measured GPUs are {MEASURED_GPUS}")
    return SHARED_GPU / gpu


def cases_from_cli(description: str, extra=None) -> tuple[argparse.Namespace, list[str], dict]:
    """(the parsed arguments, the cases asked for, the GPU's summary.json). `extra(parser)` adds
    a script's own options."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--gpu", default="h100-sxm-80g", choices=MEASURED_GPUS)
    parser.add_argument("--only", action="append", help="case name (repeatable)")
    parser.add_argument("--out", type=Path, help="also write the markdown table here")
    if extra is not None:
        extra(parser)
    args = parser.parse_args()
    summary = shared_dir(args.gpu) / "summary.json"
    measured = json.loads(summary.read_text())
    cases = args.only or list(measured)
    unknown = sorted(set(cases) - set(measured))
    if unknown:
        parser.exit(2, f"--only: {unknown} not in {summary}\n")
    return args, cases, measured


def leave_one_out_table(case: str, gpu: str = "h100-sxm-80g"):
    """The committed kernel table of `gpu` without the rows of `case`'s own profile."""
    from emulator.costs.kernel_table import load_kernel_table
    from prismbench.emulate import KERNEL_TABLES

    return load_kernel_table(KERNEL_TABLES / f"{gpu}.csv", skip_sources=(f"profile:{case}",))


def commit_label() -> str:
    """HEAD's short hash, `-dirty` when tracked files other than markdown (the reports these
    scripts write) differ from it."""

    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout

    dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)*.md")
    return git("rev-parse", "--short", "HEAD").strip() + ("-dirty" if dirty.strip() else "")


def command_line(script: str, argv: list[str] | None) -> str:
    """How `script` (a path from the repository root) was run: for a report's heading."""
    args = argv if argv is not None else sys.argv[1:]
    return f"python {script}" + "".join(f" {shlex.quote(a)}" for a in args)


def report(command: str, lines: list[str], out: Path | None) -> None:
    """Print a table headed by the commit and the command that made it; write it to `out`."""
    text = "\n".join([f"Commit {commit_label()}; `{command}`.", "", *lines])
    print(text)
    if out:
        out.write_text(text + "\n")
