"""Measure a GPU's temporal variation from profiled jobs; the `measured` variability preset.

A GPU directory laid out as ../shared/data/gpu/<gpu>/ holds, per job, one profiled iteration
(`profiles/<job>.ops.jsonl.gz` or a Chrome trace: prismbench.profile_readers) and the times of
n repeated iterations (`summary.json`: iteration_s_min|median|max, iterations).
`read_jobs` reads them and `calibrate_jobs` turns them into the figures of
emulator.variability.calibration:
- kernel noise per class and the jitter floor, from every signature that repeats at least
  MIN_SAMPLES times in a profile;
- per job, the iteration's CV measured (range of n iterations over d2(n), over the median)
  and the CV independent kernel noise would give (the model applied to the profile's own op
  durations); their difference is that job's per-step CV; `step_cv` is the median over jobs;
- `step_cv_dispersion`: how much the per-step CV varies between runs (jobs, sessions): the
  standard deviation of its log, lognormal around `step_cv`, most likely given every job's
  measured range (emulator.variability.calibration.step_cv_dispersion_of). Tables written
  before it existed lack it: the preset then reads 0 (one step CV for every run).

`write_table` keeps the result in results/variability/<gpu>.json with its provenance (or
wherever `prismbench variability-table` writes one built from your own recordings:
prismbench.variability_recordings); `read_table` reads one from any path; `measured_model`
builds the VariabilityModel a `measured` preset uses: the temporal figures from the table;
the spatial, collective and network figures cannot be measured on one GPU and stay
PRISM_LOW's (emulator.variability.model, cited there).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from emulator.capture.opmap import normalized_name
from emulator.variability.calibration import (
    KernelNoise,
    SignatureFit,
    estimate_kernel_noise,
    fit_signatures,
    iteration_kernel_cv,
    range_to_std,
    step_cv_dispersion_of,
    step_cv_of,
)
from emulator.variability.model import (
    MEASURED_PRESET,
    PRESET_NAMES,
    PRESETS,
    PRISM_LOW,
    VariabilityModel,
    noise_class,
)
from prismbench.checkout import REPO
from prismbench.files import write_atomically
from prismbench.profile_ingest import aten_packet
from prismbench.profile_readers import ProfiledOp, ProfileError, read_profile_iterations
from workloads.config import SpecError, is_finite_number

VARIABILITY_TABLES = REPO / "results" / "variability"
TABLE_SCHEMA_VERSION = 1
PROFILE_SUFFIXES = (".ops.jsonl.gz", ".json", ".json.gz")
# what `measured_model` draws from a table, and the GPU it was measured on
TABLE_FIGURES = ("gpu", "temporal_cv_by_class", "temporal_floor_s", "step_cv")


def op_noise_class(op: ProfiledOp) -> str:
    """The noise class of a profiled op, through the capture's op vocabulary."""
    return noise_class(normalized_name(aten_packet(op.op)))


def profile_durations(ops: list[ProfiledOp]) -> tuple[np.ndarray, list[str]]:
    """Each profiled op's GPU time (s, its kernels summed) and noise class."""
    return (
        np.array([op.kernel_us * 1e-6 for op in ops]),
        [op_noise_class(op) for op in ops],
    )


def op_signature(op: ProfiledOp) -> tuple:
    """What a pool's durations share: the op, its input shapes and the kernels it launched."""
    return (op.op, op.shapes, tuple(name for name, _ in op.kernels))


def profile_pools(ops: list[ProfiledOp]) -> dict[tuple, tuple[str, list[float]]]:
    """{(op, input shapes, kernel names): (noise class, durations s)} over one profiled
    iteration: every occurrence of a signature, so positions in the step mix with time."""
    pools: dict[tuple, tuple[str, list[float]]] = {}
    for op in ops:
        klass, durations = pools.setdefault(op_signature(op), (op_noise_class(op), []))
        durations.append(op.kernel_us * 1e-6)
    return pools


def temporal_pools(iterations: list[list[ProfiledOp]]) -> dict[tuple, tuple[str, list[float]]]:
    """Pools of the same form over several profiled iterations of one job, their spread over
    time alone: an op's *position* is its signature and occurrence (the k-th `aten::mm` of that
    shape and kernel), followed across the iterations that all have it; each duration is taken
    relative to its position's mean and scaled to the signature's mean, so positions that differ
    systematically (results/fidelity/variability.md, "Per-signature spreads") do not widen the
    pool. Each position's mean is estimated from its own T durations, so the P x T deviations
    hold P (T - 1) degrees of freedom where the pool's std (ddof 1, `SignatureFit.std_s`)
    divides by P T - 1: they are widened by sqrt((P T - 1) / (P (T - 1))), which makes that std
    read the temporal spread without bias (1 for one position; T / (T - 1) read one position over
    8 iterations 7 % high)."""
    if len(iterations) < 2:
        raise ValueError(f"{len(iterations)} iteration(s): temporal pools need at least 2")
    positions: dict[tuple, list[list[float]]] = {}
    classes: dict[tuple, str] = {}
    for t, ops in enumerate(iterations):
        seen: Counter = Counter()
        for op in ops:
            signature = op_signature(op)
            key = (signature, seen[signature])
            seen[signature] += 1
            classes.setdefault(signature, op_noise_class(op))
            durations = positions.setdefault(key, [])
            if len(durations) == t:  # present in every iteration so far
                durations.append(op.kernel_us * 1e-6)
    count = len(iterations)
    by_signature: dict[tuple, list[np.ndarray]] = {}
    for (signature, _), durations in positions.items():
        if len(durations) == count:
            by_signature.setdefault(signature, []).append(np.asarray(durations))
    pools = {}
    for signature, rows in by_signature.items():
        rows = np.stack(rows)  # positions x iterations
        means = rows.mean(axis=1, keepdims=True)
        widen = np.sqrt((rows.size - 1) / (len(rows) * (count - 1)))
        relative = 1 + (rows / means - 1) * widen
        pools[signature] = (classes[signature], list((relative * means.mean()).ravel()))
    return pools


@dataclass(frozen=True)
class JobVariation:
    """One profiled job: its pools' fits and its iteration spread, measured and modelled."""

    job: str
    fits: list[SignatureFit]
    durations_s: np.ndarray
    classes: list[str]
    iterations: int
    iteration_s_min: float
    iteration_s_median: float
    iteration_s_max: float
    # each profiled iteration's kernel time (s): more than one where the profile holds several
    profiled_kernel_s: tuple[float, ...] = ()

    @property
    def kernel_cv_measured(self) -> float | None:
        """Measured: the CV of the profiled iterations' summed kernel time, None under two."""
        if len(self.profiled_kernel_s) < 2:
            return None
        times = np.asarray(self.profiled_kernel_s)
        return float(times.std(ddof=1) / times.mean())

    @property
    def iteration_cv(self) -> float:
        """Measured: the range of the timed iterations over d2(n), over their median."""
        std = range_to_std(self.iteration_s_min, self.iteration_s_max, self.iterations)
        return std / self.iteration_s_median

    def kernel_cv(self, noise: KernelNoise) -> float:
        return iteration_kernel_cv(self.durations_s, self.classes, noise)


def job_profile(gpu_dir: Path, job: str) -> Path:
    """The profile of `job` under `gpu_dir`/profiles/ (any of PROFILE_SUFFIXES)."""
    for suffix in PROFILE_SUFFIXES:
        path = gpu_dir / "profiles" / f"{job}{suffix}"
        if path.exists():
            return path
    raise FileNotFoundError(f"{gpu_dir}: no profile for job {job!r} under profiles/")


def job_variation(
    job: str,
    profile: Path,
    *,
    iterations: int,
    iteration_s_min: float,
    iteration_s_median: float,
    iteration_s_max: float,
    profiled: list[list[ProfiledOp]] | None = None,
) -> JobVariation:
    """`job` measured: its profile's pools and op durations, with the times of its iterations;
    a profile with no op that ran on the GPU is refused naming it (nothing to measure). A
    profile of several iterations (`record --profile-iterations N`) gives temporal pools (each
    op followed at its position: its spread over time alone) and each iteration's kernel time;
    one iteration gives pools over positions (`profile_pools`); the op durations are the first
    iteration's either way. `profiled`: the profile's iterations where the caller has read
    them (`read_profile_iterations(profile)`), else they are read here."""
    if profiled is None:
        profiled = read_profile_iterations(profile)
    ops = profiled[0]
    if not ops:
        raise ProfileError(f"{profile}: no op with GPU time; a profiled iteration has kernels")
    durations, classes = profile_durations(ops)
    several = len(profiled) > 1
    return JobVariation(
        job=job,
        fits=fit_signatures(temporal_pools(profiled) if several else profile_pools(ops)),
        durations_s=durations,
        classes=classes,
        iterations=iterations,
        iteration_s_min=iteration_s_min,
        iteration_s_median=iteration_s_median,
        iteration_s_max=iteration_s_max,
        profiled_kernel_s=tuple(sum(op.kernel_us for op in it) * 1e-6 for it in profiled)
        if several
        else (),
    )


def read_jobs(gpu_dir: str | Path) -> list[JobVariation]:
    """Every job of `gpu_dir`'s summary.json with a profile (module docstring)."""
    gpu_dir = Path(gpu_dir)
    summary_path = gpu_dir / "summary.json"
    try:
        summary = json.loads(summary_path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(
            f"{summary_path}: cannot read the jobs' iteration times: {error}"
        ) from None
    jobs = []
    for job, figures in sorted(summary.items()):
        missing = [
            k
            for k in ("iterations", "iteration_s_min", "iteration_s_median", "iteration_s_max")
            if k not in figures
        ]
        if missing:
            raise ValueError(f"{summary_path}: job {job!r} lacks {', '.join(missing)}")
        jobs.append(
            job_variation(
                job,
                job_profile(gpu_dir, job),
                iterations=int(figures["iterations"]),
                iteration_s_min=float(figures["iteration_s_min"]),
                iteration_s_median=float(figures["iteration_s_median"]),
                iteration_s_max=float(figures["iteration_s_max"]),
            )
        )
    if not jobs:
        raise ValueError(f"{summary_path}: no job to calibrate from")
    return jobs


@dataclass(frozen=True)
class GpuVariation:
    """What `calibrate_jobs` measured (module docstring)."""

    noise: KernelNoise
    step_cv: float
    step_cv_dispersion: float
    step_cv_by_job: dict[str, float]
    iteration_cv_by_job: dict[str, float]
    kernel_cv_by_job: dict[str, float]
    # measured over the profiled iterations where a profile holds several, else None
    kernel_cv_measured_by_job: dict[str, float | None]


def calibrate_jobs(jobs: list[JobVariation]) -> GpuVariation:
    """Kernel noise from all `jobs`' pools; the step CV as the median of the jobs'."""
    noise = estimate_kernel_noise([f for job in jobs for f in job.fits])
    kernel_cv = {job.job: job.kernel_cv(noise) for job in jobs}
    iteration_cv = {job.job: job.iteration_cv for job in jobs}
    step = {j: step_cv_of(iteration_cv[j], kernel_cv[j]) for j in kernel_cv}
    step_cv = float(np.median(list(step.values())))
    dispersion = step_cv_dispersion_of(
        [(j.iteration_s_max - j.iteration_s_min) / j.iteration_s_median for j in jobs],
        [j.iterations for j in jobs],
        [kernel_cv[j.job] for j in jobs],
        step_cv,
    )
    return GpuVariation(
        noise=noise,
        step_cv=step_cv,
        step_cv_dispersion=dispersion,
        step_cv_by_job=step,
        iteration_cv_by_job=iteration_cv,
        kernel_cv_by_job=kernel_cv,
        kernel_cv_measured_by_job={job.job: job.kernel_cv_measured for job in jobs},
    )


def table_dict(gpu: str, variation: GpuVariation, provenance: dict) -> dict:
    """The JSON form of results/variability/<gpu>.json."""
    noise = variation.noise
    return {
        "schema_version": TABLE_SCHEMA_VERSION,
        "gpu": gpu,
        "temporal_cv_by_class": noise.cv_by_class,
        "temporal_floor_s": noise.floor_s,
        "step_cv": variation.step_cv,
        "step_cv_dispersion": variation.step_cv_dispersion,
        "pools_by_class": noise.pools_by_class,
        "short_pools": noise.short_pools,
        "families": noise.families,
        "jobs": {
            job: {
                "iteration_cv": variation.iteration_cv_by_job[job],
                "kernel_cv": variation.kernel_cv_by_job[job],
                "step_cv": variation.step_cv_by_job[job],
                "kernel_cv_measured": variation.kernel_cv_measured_by_job[job],
            }
            for job in sorted(variation.step_cv_by_job)
        },
        "provenance": provenance,
    }


def write_table(table: dict, path: str | Path) -> Path:
    text = json.dumps(table, indent=1, sort_keys=True) + "\n"
    return write_atomically(path, lambda tmp: tmp.write_text(text))


def measured_gpus(directory: Path = VARIABILITY_TABLES) -> list[str]:
    """The GPU presets with a measured variability table."""
    return sorted(p.stem for p in directory.glob("*.json"))


def read_table(path: str | Path) -> dict:
    """A variability table from `path` (table_dict's form), refused naming the file when it
    cannot be read, is of another schema version or lacks a figure the preset draws."""
    path = Path(path)
    try:
        table = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SpecError(f"{path}: cannot read a variability table: {error}") from None
    if not isinstance(table, dict) or table.get("schema_version") != TABLE_SCHEMA_VERSION:
        version = table.get("schema_version") if isinstance(table, dict) else None
        raise SpecError(
            f"{path}: schema_version {version!r}, expected {TABLE_SCHEMA_VERSION}; rebuild it "
            "(results/variability/build.py, or `prismbench variability-table` for your own)"
        )
    missing = [key for key in TABLE_FIGURES if key not in table]
    if missing:
        raise SpecError(f"{path}: a variability table needs {', '.join(missing)}")
    _check_figures(table, path)
    return table


def _check_figures(table: dict, path: Path) -> None:
    """Refuse, naming the file and the figure, a figure the model cannot draw: each a finite
    number, in the range VariabilityModel checks (a table edited by hand, or cut short, would
    otherwise end in a traceback, or in samples of no finite time)."""
    by_class = table["temporal_cv_by_class"]
    if not isinstance(by_class, dict):
        raise SpecError(f"{path}: temporal_cv_by_class must be an object of a CV per noise "
                        f"class, got {by_class!r}")  # fmt: skip
    figures = {name: table.get(name, 0.0) for name in ("temporal_floor_s", "step_cv",
                                                       "step_cv_dispersion")}  # fmt: skip
    figures |= {f"temporal_cv_by_class[{name!r}]": cv for name, cv in by_class.items()}
    for name, value in figures.items():
        if not is_finite_number(value):
            raise SpecError(f"{path}: {name}={value!r} must be a finite number")
    try:
        measured_model(table)
    except ValueError as err:  # the model's own checks name the figure and its range
        raise SpecError(f"{path}: {err}") from None


def load_table(gpu: str, directory: Path = VARIABILITY_TABLES) -> dict:
    """The committed table of `gpu`."""
    path = directory / f"{gpu}.json"
    if not path.exists():
        known = measured_gpus(directory)
        raise SpecError(
            f"preset {MEASURED_PRESET!r}: no measured variability for gpu {gpu!r} "
            f"({path} missing; measured: {', '.join(known) or 'none'})"
        )
    return read_table(path)


def table_of_gpu(path: str | Path, gpu: str) -> dict:
    """The table at `path`, refused unless measured on `gpu` (a job's cluster.gpu): another
    GPU's kernel and step spread are not this one's."""
    table = read_table(path)
    if table["gpu"] != gpu:
        raise SpecError(
            f"--variability-table {path}: measured on gpu {table['gpu']!r}, the job's "
            f"cluster.gpu is {gpu!r}; build a table from recordings on {gpu} "
            "(`prismbench variability-table`)"
        )
    return table


def measured_model(table: dict) -> VariabilityModel:
    """Temporal figures from `table`; spatial, collective, network as PRISM_LOW."""
    return replace(
        PRISM_LOW,
        temporal_cv_by_class=table["temporal_cv_by_class"],
        temporal_floor_s=float(table["temporal_floor_s"]),
        step_cv=float(table["step_cv"]),
        step_cv_dispersion=float(table.get("step_cv_dispersion", 0.0)),
    )


def resolve_preset(preset: str, gpu: str, table: str | Path | None = None) -> VariabilityModel:
    """The model a preset name stands for; `measured` reads `table` (a file measured on `gpu`),
    or the job's GPU's committed table without one."""
    if table is not None and preset != MEASURED_PRESET:
        raise SpecError(
            f"--variability-table {table}: holds the {MEASURED_PRESET!r} preset's figures, "
            f"which --preset {preset} does not draw; give --preset {MEASURED_PRESET}"
        )
    if preset == MEASURED_PRESET:
        return measured_model(load_table(gpu) if table is None else table_of_gpu(table, gpu))
    if preset not in PRESETS:
        raise SpecError(f"preset {preset!r} must be one of {', '.join(PRESET_NAMES)}")
    return PRESETS[preset]
