"""Profile the shared jobs again on this machine's GPU with the production frameworks' kernels.

    python3 results/calibration/reprofile_gpu.py --out DIR          (on a CUDA machine)
    python3 results/calibration/reprofile_gpu.py --out DIR --dry-run --gpu h100-sxm-80g  (anywhere)

The shared profiles (`../shared/data/gpu/<gpu>/profiles/`) ran the workloads at 86a4f47, the
`prism-86a4f47` framework setting: ALiBi attention as float32 math, unfused FP8 casts, the
unfused float32 loss. Issue 15 asks for the same jobs profiled again with the kernels the
production frameworks run, committed beside the old measurements. For each of the eight shared
jobs (its recorded baseline on this GPU, results/baselines/recorded/), the job with
`kernels.framework` set to its family's framework (FRAMEWORK_OF, every other kernel field that
framework's default) trains for real (`prismbench.record` on cuda: WARMUP, then ITERATIONS timed,
then PROFILED_ITERATIONS profiled ones), and DIR/reprofile.tar.gz holds, per job, the recorded
baseline (`<case>.toml`: iteration times, allocator peaks, the machine) and rank 0's kernel
times (`<case>.ops.jsonl.gz`, the shared profiles' format, each record numbered with its
iteration: `prismbench compare` reads the first, `prismbench ingest-profile` and the measured
variability tables all of them). One archive, because the device tool brings back at most 8 files.
A job that fails is reported with its last line and the others go on. --dry-run builds and
prints the jobs only.
"""

from __future__ import annotations

import argparse
import sys
import tarfile
import tempfile
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "results"))
from shared_gpu import RECORDED, RECORDED_PREFIX, local_gpu_preset, recorded_job  # noqa: E402

# model name prefix -> the framework whose kernels the production runs of that family use; GPT
# takes NeMo's (Megatron-Core: flash attention, fused optimizer, padded vocabulary), not the
# `megatron` setting, which is the 2021 code of the Megatron papers (unfused attention)
FRAMEWORK_OF = {"mpt": "llm-foundry", "llama": "torchtitan", "gpt": "nemo"}
WARMUP, ITERATIONS = 3, 5
# Profiled iterations after the timed ones: each kernel followed at its place over this many
# gives its spread over time alone (issue 18: variability_calibration.temporal_pools), at least
# distributions.MIN_SAMPLES so that one place's durations fit a distribution of their own. The
# scored kernel times stay the first iteration's (read_profile), as with one.
PROFILED_ITERATIONS = 8


def shared_cases(gpu: str) -> list[str]:
    prefix = f"{RECORDED_PREFIX[gpu]}__"
    return sorted(p.stem.removeprefix(prefix) for p in RECORDED.glob(f"{prefix}*.toml"))


def production_job(case: str, gpu: str):
    """The shared job `case` as recorded on `gpu`, with its family's framework kernels."""
    from prismbench.spec import job_spec_from_dict

    job = recorded_job(case, gpu)
    name = job.model.name
    framework = next(fw for prefix, fw in FRAMEWORK_OF.items() if name.startswith(prefix))
    return job_spec_from_dict(job.to_dict() | {"kernels": {"framework": framework}})


def profile_case(case: str, gpu: str, folder: Path) -> str:
    """Record and profile one job into `folder`; a line saying how it went."""
    from prismbench.calibrate_job import write_ops_jsonl_iterations
    from prismbench.record import record, write_record

    job = production_job(case, gpu)
    recording = record(job, iterations=ITERATIONS, warmup=WARMUP, device="cuda", profile=True,
                       profile_iterations=PROFILED_ITERATIONS)  # fmt: skip
    write_record(recording, folder / f"{case}.toml")
    write_ops_jsonl_iterations(recording.profiled_iterations, folder / f"{case}.ops.jsonl.gz")
    return (f"{case} ({job.kernels.framework}): median {recording.iteration_s_median:.4f} s, "
            f"{len(recording.profile)} ops profiled in each of {PROFILED_ITERATIONS} iterations")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--gpu", choices=sorted(RECORDED_PREFIX), help="default: detected")
    parser.add_argument("--only", action="append", metavar="CASE", help="repeatable")
    parser.add_argument("--dry-run", action="store_true", help="build and print the jobs only")
    args = parser.parse_args(argv)
    gpu = args.gpu or local_gpu_preset()
    cases = shared_cases(gpu)
    unknown = sorted(set(args.only or ()) - set(cases))
    if unknown:
        parser.error(f"--only {unknown}: the shared cases are {cases}")
    cases = args.only or cases
    if args.dry_run:
        for case in cases:
            job = production_job(case, gpu)
            print(f"{case}: framework {job.kernels.framework}, attention {job.kernels.attention}, "
                  f"loss {job.kernels.loss}, fp8 casts {job.kernels.fp8_casts}")  # fmt: skip
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / f"reprofile-{gpu}"
        folder.mkdir()
        for case in cases:
            try:
                print(profile_case(case, gpu, folder), flush=True)
            except Exception:  # noqa: BLE001  (one job's failure must not lose the others)
                last = traceback.format_exc().strip().splitlines()[-1]
                print(f"{case}: failed: {last}", flush=True)
                (folder / f"{case}.error.txt").write_text(traceback.format_exc())
            # after every job, so a run cut at its limit keeps what it measured
            with tarfile.open(args.out / "reprofile.tar.gz", "w:gz") as archive:
                archive.add(folder, arcname=folder.name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
