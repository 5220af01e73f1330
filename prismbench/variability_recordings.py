"""A measured variability table from your own GPU's recordings (`prismbench variability-table`).

A recording is a pair: a recorded baseline (`prismbench record JOB.toml --device cuda
--profile PROFILE --out REC.toml`: the job, and the median, min and max of its n timed
iterations) and the profile of one more iteration of the job (PROFILE). Per job they hold what
the shared layout results/variability/build.py reads does (summary.json's iteration times, a
profile under profiles/), so the table is measured the same way
(prismbench.variability_calibration: `job_variation`, `calibrate_jobs`, `table_dict`), each
job named by its recording's file name. The table describes one GPU preset, the recordings'
`job.cluster.gpu` (`record --device cuda` runs only on GPUs of that preset); `prismbench
variability JOB.toml --preset measured --variability-table TABLE.json` draws from it.

Each profile must be one of its recording's job, as `ingest-profile` and `compare` take one
(`profile_ingest.check_profile_of_job`: aligned with the job's capture, and measured on the
job's GPU where a summary.json beside it says which): a table measured from another job's
kernels would be named after jobs it never measured.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from datetime import date
from pathlib import Path

from emulator.variability.distributions import MIN_SAMPLES
from prismbench.baselines import RECORDED_FIELDS, Baseline, BaselineError, load_baseline
from prismbench.checkout import git_version
from prismbench.profile_ingest import check_profile_of_job
from prismbench.profile_readers import ProfiledOp, ProfileError, read_profile_iterations
from prismbench.variability_calibration import (
    JobVariation,
    calibrate_jobs,
    job_variation,
    table_dict,
)
from workloads.config import SpecError


def _recorded_baseline(path: Path) -> Baseline:
    """The recorded baseline at `path`, refused unless it is a GPU run timed over several
    iterations: their range is the step spread the table measures."""
    try:
        baseline = load_baseline(path)
    except BaselineError as err:
        raise SpecError(f"--recording: {err}") from None
    measured = baseline.measured
    if baseline.provenance.kind != "recorded":
        raise SpecError(f"--recording {path}: provenance.kind={baseline.provenance.kind!r}: a "
                        "table is built from your own runs (`prismbench record`)")  # fmt: skip
    if measured.device != "gpu":
        raise SpecError(f"--recording {path}: measured.device={measured.device!r}: a table is "
                        "measured on the GPU (`prismbench record --device cuda`)")  # fmt: skip
    # Measured gives iterations, min and max together, with the median (iteration_time_s)
    if measured.iterations is None or measured.iterations < 2:
        raise SpecError(
            f"--recording {path}: measured.iterations={measured.iterations!r}: the spread of "
            "iterations needs iterations >= 2 with iteration_time_s_min and iteration_time_s_max "
            "(`prismbench record --iterations N`)"
        )
    return baseline


def _one_gpu(baselines: Sequence[Baseline], paths: Sequence[Path]) -> str:
    gpus = {b.job.cluster.gpu for b in baselines}
    if len(gpus) != 1:
        each = ", ".join(f"{p}: {b.job.cluster.gpu}" for p, b in zip(paths, baselines, strict=True))
        raise SpecError(f"--recording: job.cluster.gpu differs ({each}); a table describes one "
                        "GPU preset: build one per GPU")  # fmt: skip
    return gpus.pop()


def _refuse_same_names(paths: Sequence[Path]) -> None:
    """A table keys its jobs by the recordings' file names: two of one name would be one job."""
    repeated = [name for name, n in Counter(p.stem for p in paths).items() if n > 1]
    if repeated:
        given = ", ".join(str(p) for p in paths if p.stem == repeated[0])
        raise SpecError(f"--recording {given}: each is job {repeated[0]!r}; a table names its "
                        "jobs by their recordings' file names: give each its own")  # fmt: skip


def _read_profile(profile: Path) -> list[list[ProfiledOp]]:
    try:
        return read_profile_iterations(profile)
    except ProfileError as err:
        raise SpecError(f"--profile {err}") from None


def _job_of(baseline: Baseline, profile: Path, profiled: list[list[ProfiledOp]]) -> JobVariation:
    measured = baseline.measured
    try:
        return job_variation(
            baseline.name,
            profile,
            iterations=measured.iterations,
            iteration_s_min=measured.iteration_time_s_min,
            iteration_s_median=measured.iteration_time_s,
            iteration_s_max=measured.iteration_time_s_max,
            profiled=profiled,
        )
    except ProfileError as err:
        raise SpecError(f"--profile {err}") from None


def _check_profile(
    baseline: Baseline,
    recording: Path,
    profile: Path,
    ops: list[ProfiledOp],
    progress: Callable[[str], None] | None,
) -> None:
    """Refuse a profile that is not one of the recording's job (its first iteration, as
    ingest-profile checks one) or was measured on another GPU
    (`profile_ingest.check_profile_of_job`, which captures the job: cached, but a big job's
    first capture takes a while, so it is said)."""
    if progress is not None:
        progress(f"capturing {baseline.name} (--recording {recording}) to check that "
                 f"--profile {profile} is a profile of its job")  # fmt: skip
    try:
        check_profile_of_job(profile, ops, baseline.job,
                             f"--recording {recording}'s job", progress)  # fmt: skip
    except ProfileError as err:
        raise SpecError(f"--profile {err}") from None


def _provenance(
    pairs: Sequence[tuple[Path, Path]], baselines: Sequence[Baseline], jobs: list[JobVariation]
) -> dict:
    """The recordings (paths, and where, with what and when each was measured) and this build."""
    commit, dirty = git_version()
    return {
        "source": "recordings (prismbench record --device cuda --profile)",
        "recordings": [
            {"recording": str(recording), "profile": str(profile)}
            | {name: getattr(b.provenance, name) for name in RECORDED_FIELDS}
            for (recording, profile), b in zip(pairs, baselines, strict=True)
        ],
        "jobs": [job.job for job in jobs],
        "built_by": "prismbench variability-table",
        "commit": commit,
        "dirty": dirty,
        "date": date.today().isoformat(),
    }


def recorded_table(
    pairs: Sequence[tuple[str | Path, str | Path]],
    progress: Callable[[str], None] | None = None,
) -> dict:
    """The variability table (table_dict's form) of (recorded baseline, its profile) pairs.
    Every profile is read (one with no kernel refused) before any job is captured to check
    that its profile is one of it (`_check_profile`, each capture said to `progress`)."""
    pairs = [(Path(recording), Path(profile)) for recording, profile in pairs]
    if not pairs:
        raise SpecError("--recording: give at least one recording with its --profile")
    paths = [recording for recording, _ in pairs]
    baselines = [_recorded_baseline(path) for path in paths]
    gpu = _one_gpu(baselines, paths)
    _refuse_same_names(paths)
    profiled = [_read_profile(profile) for _, profile in pairs]
    jobs = [
        _job_of(b, profile, its)
        for b, (_, profile), its in zip(baselines, pairs, profiled, strict=True)
    ]
    for b, (recording, profile), its in zip(baselines, pairs, profiled, strict=True):
        _check_profile(b, recording, profile, its[0], progress)
    try:
        variation = calibrate_jobs(jobs)
    except ValueError as err:  # too few repeated kernels to measure the noise
        raise SpecError(
            f"--profile {', '.join(str(p) for _, p in pairs)}: {err} (a kernel signature counts "
            f"once it repeats {MIN_SAMPLES} times in a profile): profile larger jobs"
        ) from None
    return table_dict(gpu, variation, _provenance(pairs, baselines, jobs))
