"""Validate the emulator against recorded baselines: emulate, score, store, summarise, gate.

`validate(baselines, ...)` emulates each selected baseline (worker processes, or this process
on one worker; captures are cached by prismbench.capture), scores every metric the baseline
measured with the signed error (predicted - measured) / measured, writes the run to DuckDB
(`prismbench.history`) and, when asked, to MLflow (`prismbench.mlflow_log`), and returns the
cases with their metrics. Metric names are the emulate JSON's field names, so `--gate` thresholds
(`prismbench.thresholds`) name them the same way. With `variability` settings each case also
gets its step-time distribution from the same capture and prices
(`prismbench.validate_variability`).
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import json
import math
import os
import platform
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from prismbench import history
from prismbench.baselines import ALLOCATOR_PEAKS, PEAK_MEMORY_FIELD
from prismbench.capture_sources import ROOT, files_hash
from prismbench.checkout import git_version
from prismbench.fidelity import measured_iteration_s
from prismbench.files import write_atomically
from prismbench.orphans import spawn_pool, stop_workers
from prismbench.thresholds import Threshold
from prismbench.validate_variability import VariabilitySettings, measured_spread
from workloads.config import SpecError

DEFAULT_DB = Path(".prismbench") / "prismbench.duckdb"
# With no case finished for this long, validate names the cases still running: a cold capture of
# a large job runs for minutes with nothing else said (korthikanti's 1T-parameter row on 512 GPUs:
# 489 s before validate's first line, two workers on 2 cores, 2026-11-30)
HEARTBEAT_S = 60.0
# every figure case_metrics scores, as the emulate JSON names it: what --gate may bound
VALIDATED_METRICS = tuple(
    dict.fromkeys(("iteration_time_s", *PEAK_MEMORY_FIELD.values(), *ALLOCATOR_PEAKS))
)
# What `validate` runs when no --select/--all is given: one or two baselines per source, every
# GPU generation, and every parallelism the baselines use (DDP/ZeRO-1, FSDP, TP with SP,
# 1F1B and interleaved pipelines, FP8), cheap captures first. Cold (nothing cached) it runs in
# minutes on 2 cores; `results/perf/validate.md` has the measurement.
DEFAULT_SELECTION = (
    "llmc__gpt2-124m__8g__r228",  # A100, data parallel + ZeRO-1
    "llmc__gpt2-1558m__8g__r231",  # H100 (measured kernel table)
    "llmfoundry__mpt-125m__8g__r124",  # FSDP (MPT with learned positions, as its run)
    "llmfoundry__mpt-1b__8g__r095",  # H100, FP8
    "torchtitan2024__llama3.1-8b__8g__r033",  # FSDP2 Llama, H100 HBM2e; reports peak memory
    "korthikanti2022__megatron-gpt-22b__8g__r014",  # tensor + sequence parallel, selective recompute
    "narayanan2021__megatron-gpt-39.1b__512g__r006",  # TP x PP x DP
    "korthikanti2022__megatron-gpt-175b__64g__r015",  # interleaved 1F1B
    "bigscience__bloom-176b__384g__r162",  # 12 pipeline stages, ALiBi, ZeRO-1
    "megatron-readme2022__megatron-gpt-175b__1024g__r012",  # 16 stages on 1 024 GPUs
    "h100shared__gpt3-125m-s2048-mb8-none",  # recorded on one H100
    "h100shared__llama3-8b-l2-s8192-mb2-none",  # recorded: Llama 3, GQA
    "h200shared__gpt3-125m-s2048-mb8-none",  # recorded on one H200 (its own kernel table)
    "h100frameworks__gpt3-125m-s2048-mb8-none",  # recorded on one H100 with NeMo's kernels
    "h200frameworks__gpt3-125m-s2048-mb8-none",  # the same on one H200 (the same capture)
)
RECORDED_DIR = "recorded"  # recorded baselines live in this sub-folder of the baselines folder


@dataclass(frozen=True)
class MetricResult:
    metric: str  # the emulate JSON field
    predicted: float
    measured: float
    # How far the measurement's own iterations reached below and above their median, over it
    # (Measured.iteration_time_relative_range): a prediction within the measured range is not
    # wrong by more than that, so a gate widens its downward and upward bound by them
    slack_below: float = 0.0
    slack_above: float = 0.0

    @property
    def error(self) -> float:
        return (self.predicted - self.measured) / self.measured


@dataclass(frozen=True)
class CaseResult:
    baseline: str
    source: str
    gpu: str
    world_size: int
    status: str  # "ok" | "failed"
    # the worker's time on this case (with --variability, the sampling too); a failed one:
    # since submission, queue included
    wall_s: float
    error_message: str | None = None
    result: dict | None = None
    metrics: list[MetricResult] = field(default_factory=list)
    # validate --variability: the predicted step-time figures and the measured spread
    # (validate_variability.case_distribution, measured_spread); None without it
    variability: dict | None = None
    # an ok case with no metric: why nothing was scored (shown, not stored: the history has no
    # metric rows for it)
    unscored: str | None = None


def load_all_baselines(directory: str | Path):
    """The published baselines of `directory` and the recorded ones of its `recorded/`."""
    from prismbench.baselines import BaselineError, load_baselines

    if not Path(directory).is_dir():
        raise BaselineError(f"{directory}: no such directory of baselines")
    recorded_dir = Path(directory) / RECORDED_DIR
    published = load_baselines(directory)
    recorded = load_baselines(recorded_dir) if recorded_dir.is_dir() else ()
    twice = sorted({b.name for b in published} & {b.name for b in recorded})
    if twice:  # the history keys a run's cases by name: two of one name would be one case
        raise BaselineError(
            f"{directory}: {twice} in it and in its {RECORDED_DIR}/: a baseline's name (its "
            "file's stem) must be unique; rename one"
        )
    found = published + recorded
    if not found:
        raise BaselineError(f"{directory}: no baseline (*.toml) in it or in its {RECORDED_DIR}/")
    return found


def select_baselines(baselines, expressions: list[str] | None, everything: bool):
    """Baselines whose name matches any glob in `expressions` ("llmfoundry__*", "*mpt-7b*";
    a plain word matches as a substring), all with `everything`, else DEFAULT_SELECTION."""
    if everything and expressions:
        raise SpecError(f"--all selects every baseline; --select {expressions} would be ignored")
    if everything:
        return list(baselines)
    if not expressions:
        by_name = {b.name: b for b in baselines}
        missing = [name for name in DEFAULT_SELECTION if name not in by_name]
        if missing:
            raise SpecError(f"validate: the default selection names baselines not found: {missing}")
        return [by_name[name] for name in DEFAULT_SELECTION]
    empty = [e for e in expressions if not e.strip()]
    if empty:  # as a substring it is in every name: the whole set, for hours, by accident
        raise SpecError(
            f"--select {empty}: an empty or blank expression matches every baseline; use --all"
        )
    patterns = {e: e if any(c in e for c in "*?[") else f"*{e}*" for e in expressions}
    unmatched = [
        e for e, p in patterns.items() if not any(fnmatch.fnmatchcase(b.name, p) for b in baselines)
    ]
    if unmatched:  # one of several that matches nothing is a typo, not a smaller selection
        raise SpecError(f"--select {unmatched}: no baseline name matches")
    return [b for b in baselines if any(fnmatch.fnmatchcase(b.name, p) for p in patterns.values())]


def case_metrics(baseline, result: dict) -> list[MetricResult]:
    """Every figure the baseline measured that the emulation predicts: none of a CPU run's
    (`measured.device = "cpu"`), as the emulation predicts the job's GPU."""
    if not baseline.measured.predicted_by_emulator:
        return []
    metrics = []
    measured = measured_iteration_s(baseline)
    m = baseline.measured
    if measured is not None:
        below, above = m.iteration_time_relative_range
        metrics.append(MetricResult("iteration_time_s", result["iteration_time_s"], measured[0],
                                    slack_below=below, slack_above=above))  # fmt: skip
    if m.peak_mem_bytes is not None and m.peak_mem_kind in PEAK_MEMORY_FIELD:
        name = PEAK_MEMORY_FIELD[m.peak_mem_kind]
        metrics.append(MetricResult(name, float(result[name]), float(m.peak_mem_bytes)))
    for name in ALLOCATOR_PEAKS:  # a GPU recording's other allocator peaks, named as the figure
        if getattr(m, name) is not None:
            metrics.append(MetricResult(name, float(result[name]), float(getattr(m, name))))
    return metrics


@functools.cache
def _source_hash(packages: tuple[str, ...]) -> str:
    """Hash of every Python file of `packages`; read once per process."""
    return files_hash(path for package in packages for path in (ROOT / package).rglob("*.py"))


def result_cache_key(job, kernel_tables: tuple[str, ...] = ()) -> str:
    """What an emulation result depends on: the job spec, every source file of the three
    packages, the libraries the capture calls, the committed kernel tables, the user's
    `kernel_tables` merged over them (contents and order: a later file wins) and the result
    schema; the measured host dispatch figures."""
    from prismbench.capture import library_versions
    from prismbench.emulate_inputs import HOST_DISPATCH, KERNEL_TABLES, RESULT_SCHEMA_VERSION

    digest = hashlib.sha256(json.dumps(job.to_dict(), sort_keys=True).encode())
    digest.update(_source_hash(("prismbench", "emulator", "workloads")).encode())
    digest.update(library_versions().encode())
    for path in [*sorted(KERNEL_TABLES.glob("*.csv")), HOST_DISPATCH, *map(Path, kernel_tables)]:
        digest.update(path.name.encode() + path.read_bytes())
    digest.update(str(RESULT_SCHEMA_VERSION).encode())
    return digest.hexdigest()[:24]


def _emulate_one(
    job,
    name: str,
    use_cache: bool,
    artifact_dir: Path | None,
    variability: VariabilitySettings | None = None,
    plot_dir: Path | None = None,
    kernel_tables: tuple[str, ...] = (),
) -> dict:
    """emulate(job).to_dict(), from the result cache when the same job was emulated by the
    same code and tables (`result_cache_key`); the result says which (`from_cache`). With
    `artifact_dir` (and no cache hit), the Perfetto timeline and memory plots go there. With
    `variability`, its step-time figures under "variability" (never cached; the capture is
    loaded from the capture cache on a result-cache hit) and their plot in `plot_dir`.
    kernel_tables: CSVs merged over the job's GPU's table (`emulate.kernel_table_for`)."""
    from prismbench.capture import default_cache_dir

    started = time.perf_counter()
    path = default_cache_dir().parent / "results" / f"{result_cache_key(job, kernel_tables)}.json"
    cached = use_cache and path.is_file() and artifact_dir is None
    # the tables are read only where something is priced (a cached result needs none)
    table = _kernel_table(job, kernel_tables) if variability or not cached else None
    priced = _priced(job, use_cache, table) if variability else None
    if cached:
        result = json.loads(path.read_text()) | {"job": name, "from_cache": True}
    else:
        fresh = _emulate_fresh(job, name, artifact_dir, priced, table)
        write_atomically(path, lambda tmp: tmp.write_text(json.dumps(fresh)))
        result = fresh | {"from_cache": False}
    if variability is not None:
        from prismbench.validate_variability import PLOT_NAME, case_distribution

        plot = plot_dir / PLOT_NAME if plot_dir is not None else None
        result["variability"] = case_distribution(
            priced,
            variability,
            name=name,
            world_size=job.world_size,
            gpu=job.cluster.gpu,
            plot_path=plot,
        )
    return result | {"case_wall_s": time.perf_counter() - started}


def _kernel_table(job, kernel_tables: tuple[str, ...]):
    """ "preset", or the job's GPU's table with `kernel_tables` merged over it."""
    from prismbench.emulate import kernel_table_for

    return kernel_table_for(job.cluster.gpu, extra=kernel_tables) if kernel_tables else "preset"


def check_kernel_tables(baselines, kernel_tables: tuple[str, ...]) -> None:
    """Refuse the run up front, rather than fail cases one by one, when `kernel_tables`
    cannot price every one of `baselines`: unreadable, or measured on another GPU than a
    baseline's (`emulate.check_table_gpu`; the error names that GPU's baselines)."""
    from emulator.costs.kernel_table import read_rows
    from prismbench.emulate import kernel_table_for

    for path in kernel_tables:  # a file no case can use: no selection of cases would help
        try:
            read_rows(path)
        except (OSError, ValueError) as err:
            raise SpecError(f"--kernel-table: {err}") from None
    for gpu in sorted({b.job.cluster.gpu for b in baselines}):
        try:
            kernel_table_for(gpu, extra=kernel_tables)
        except (OSError, ValueError) as err:
            names = ", ".join(b.name for b in baselines if b.job.cluster.gpu == gpu)
            raise SpecError(
                f"--kernel-table: {err}; select cases on the table's GPU (cases on {gpu}: {names})"
            ) from None


def _priced(job, use_cache: bool, table):
    from prismbench.emulate import price_job

    return price_job(job, use_cache=use_cache, kernel_table=table)


def _emulate_fresh(job, name: str, artifact_dir: Path | None, priced, table) -> dict:
    from prismbench.emulate import emulate

    extra = {}
    if artifact_dir is not None:
        artifact_dir.mkdir(parents=True, exist_ok=True)
        extra = {
            "trace_path": artifact_dir / "timeline.json",
            "memory_dir": artifact_dir / "memory",
        }
    return emulate(job, name=name, priced=priced, kernel_table=table, **extra).to_dict()


@dataclass
class ValidationRun:
    run_id: str
    cases: list[CaseResult]
    db_path: Path
    status: str


def validate(
    baselines,
    *,
    db_path: Path = DEFAULT_DB,
    workers: int | None = None,
    log_mlflow: Callable[[ValidationRun, dict], None] | None = None,
    progress: Callable[[str], None] | None = None,
    use_cache: bool = True,
    artifacts: bool = False,
    variability: VariabilitySettings | None = None,
    kernel_tables: tuple[str, ...] = (),
) -> ValidationRun:
    """Emulate and score `baselines`, recording the run; see the module docstring.
    artifacts: also write each case's Perfetto timeline and memory plots beside the database
    (<db folder>/artifacts/<run id>/<baseline>/; MLflow logs them); emulates every case again.
    variability: also sample each case's step-time distribution (stored in the history's
    case_variability table; its histogram and CDF go to the same artifact folder).
    kernel_tables: CSVs of kernel rows merged over each case's GPU table (`check_kernel_tables`
    first)."""
    say = progress or (lambda _msg: None)
    workers = workers or min(len(baselines), os.cpu_count() or 1)
    commit, dirty = git_version()
    settings = {"baselines": [b.name for b in baselines], "workers": workers, "use_cache": use_cache,
                "artifacts": artifacts}  # fmt: skip
    if kernel_tables:
        check_kernel_tables(baselines, kernel_tables)
        settings["kernel_tables"] = list(kernel_tables)
    if variability is not None:
        variability.check_gpus(baselines)
        settings["variability"] = variability.to_dict()
    run = ValidationRun(uuid.uuid4().hex[:12], [], Path(db_path), "running")
    abandoned = history.start_run(run.db_path, run.run_id, commit=commit, dirty=dirty,
                                  machine=f"{platform.node()} ({os.cpu_count()} cores)",
                                  settings=settings)  # fmt: skip
    if abandoned:
        say(f"history {run.db_path}: marked {len(abandoned)} earlier run(s) of this host "
            f"'abandoned' (left 'running' by a process that has ended): {', '.join(abandoned)}")  # fmt: skip
    started = time.perf_counter()
    calls = [
        (b, functools.partial(_emulate_one, b.job, b.name, use_cache,
                              _artifact_dir(run, b.name) if artifacts else None, variability,
                              _artifact_dir(run, b.name) if variability else None, kernel_tables))
        for b in baselines
    ]  # fmt: skip
    # One worker runs the cases in this process, in turn: a spawned one would add only its
    # start-up, a fresh interpreter importing the emulator and torch (`validate --workers 1` of
    # two cached cases: 4.4 s with one, 3.1 s without)
    pool = spawn_pool(workers) if workers > 1 else None
    with pool or nullcontext():
        try:
            def still_running(names: list[str]) -> None:
                say(f"... still running after {time.perf_counter() - started:.0f} s: "
                    f"{', '.join(names)}")  # fmt: skip

            finished = _finished(pool, workers, calls, still_running, HEARTBEAT_S)
            for done, (baseline, future, waited_s) in enumerate(finished, 1):
                case = _case(baseline, future, waited_s)
                history.add_case(run.db_path, run.run_id, case)
                run.cases.append(case)
                elapsed = time.perf_counter() - started
                eta = elapsed / done * (len(baselines) - done)
                say(f"[{done}/{len(baselines)}] {baseline.name}: {_brief(case)} "
                    f"(elapsed {elapsed:.0f} s, ETA {eta:.0f} s)")  # fmt: skip
        except KeyboardInterrupt:  # Ctrl-C, and SIGTERM in the CLI (cli.Terminated is one)
            if pool is not None:
                stop_workers(pool)
            history.finish_run(run.db_path, run.run_id, "interrupted")
            run.status = "interrupted"
            raise
        except Exception:  # a case the history could not store: the run cannot finish whole
            if pool is not None:
                stop_workers(pool)  # else leaving the pool waits for every queued case first
            run.status = "failed"
            history.finish_run(run.db_path, run.run_id, run.status)
            raise
    run.status = "complete"
    history.finish_run(run.db_path, run.run_id, run.status)
    if log_mlflow is not None:  # after the history has the run whole: a failure here loses no case
        log_mlflow(run, settings | {"commit": commit, "dirty": dirty})
    return run


def _finished(
    pool: ProcessPoolExecutor | None,
    workers: int,
    calls,
    still_running: Callable[[list[str]], None],
    every_s: float,
) -> Iterator[tuple[object, Future, float]]:
    """(baseline, the future of its call, seconds since the call was submitted) for each
    (baseline, call) of `calls` as it finishes: on `pool`'s workers, or here in turn. Whenever
    `every_s` pass with none finished, `still_running` gets the names of the cases running:
    the first `workers` the pool marks running, in the order submitted (it marks one more, the
    call it has queued next)."""
    if pool is None:
        for baseline, call in calls:
            submitted, future = time.perf_counter(), Future()
            with _while_quiet(lambda name=baseline.name: still_running([name]), every_s):
                try:
                    future.set_result(call())
                except Exception as err:  # a failed emulation is recorded (`_case`), as a worker's is
                    future.set_exception(err)
            yield baseline, future, time.perf_counter() - submitted
        return
    futures = {pool.submit(call): (b, time.perf_counter()) for b, call in calls}
    pending = set(futures)
    while pending:
        done, pending = wait(pending, timeout=every_s, return_when=FIRST_COMPLETED)
        if not done:
            still_running([futures[f][0].name for f in futures if f.running()][:workers])
        for future in sorted(done, key=lambda f: futures[f][0].name):
            baseline, submitted = futures[future]
            yield baseline, future, time.perf_counter() - submitted


@contextmanager
def _while_quiet(notice: Callable[[], None], every_s: float) -> Iterator[None]:
    """Call `notice` every `every_s` seconds until the block ends (from a thread: the block is
    this process's one case, emulated in turn)."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(every_s):
            notice()

    watcher = threading.Thread(target=beat, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join()


def _artifact_dir(run: ValidationRun, baseline: str) -> Path:
    return run.db_path.parent / "artifacts" / run.run_id / baseline


def _case(baseline, future, since_submitted_s: float) -> CaseResult:
    common = dict(baseline=baseline.name, source=baseline.name.split("__")[0],
                  gpu=baseline.job.cluster.gpu, world_size=baseline.job.world_size)  # fmt: skip
    try:
        result = future.result()
    except Exception as err:  # a failed emulation is a result to record, not a crash
        return CaseResult(status="failed", error_message=f"{type(err).__name__}: {err}",
                          wall_s=since_submitted_s, **common)  # fmt: skip
    spread = result.pop("variability", None)
    if spread is not None:
        spread |= measured_spread(baseline)
    metrics = case_metrics(baseline, result)
    return CaseResult(status="ok", result=result, metrics=metrics, wall_s=result["case_wall_s"],
                      variability=spread, unscored=None if metrics else _unscored(baseline),
                      **common)  # fmt: skip


def _unscored(baseline) -> str:
    if not baseline.measured.predicted_by_emulator:
        return f"measured on a CPU; the emulator predicts {baseline.job.cluster.gpu}"
    return "it gives no figure the emulator predicts"


def _brief(case: CaseResult) -> str:
    if case.status != "ok":
        return f"FAILED ({case.error_message})"
    cached = " (cached)" if case.result and case.result.get("from_cache") else ""
    steps = ""
    if case.variability is not None:
        steps = f"; step p95 {case.variability['p95_s']:.4g} s ({case.variability['preset']})"
    scores = ", ".join(f"{m.metric} {m.error:+.1%}" for m in case.metrics)
    return (scores or f"not scored ({case.unscored})") + steps + cached


@dataclass(frozen=True)
class SummaryRow:
    """PrismLLM's summary for one (source, GPU, metric): mean and max |error|, mean signed."""

    source: str
    gpu: str
    metric: str
    cases: int
    mean_error: float
    mean_abs_error: float
    max_abs_error: float


def summarize(cases: list[CaseResult]) -> list[SummaryRow]:
    groups: dict[tuple[str, str, str], list[float]] = {}
    for case in cases:
        for m in case.metrics:
            groups.setdefault((case.source, case.gpu, m.metric), []).append(m.error)
    return [
        SummaryRow(
            source,
            gpu,
            metric,
            len(errors),
            statistics.fmean(errors),
            statistics.fmean(abs(e) for e in errors),
            max(abs(e) for e in errors),
        )  # fmt: skip
        for (source, gpu, metric), errors in sorted(groups.items())
    ]


PREDICTED_OOM = "predicted out of memory, where the measured run completed"


def gate_failures(
    cases: list[CaseResult], thresholds: list[Threshold]
) -> list[tuple[str, str, float, str]]:
    """(baseline, metric, error, threshold) for every case metric that crosses a threshold on
    its field, the bound widened by the measurement's own range (`MetricResult.slack_below`,
    `slack_above`); a failed emulation fails the gate too (metric "emulation"), so does a case
    predicted to run out of memory (metric "oom": every baseline records a run that completed,
    so the job fit), and so does a threshold no case measures (baseline "-"): a gate that
    checks nothing must not pass."""
    failures = []
    measured = {m.metric for case in cases for m in case.metrics}
    for t in thresholds:
        if t.field not in measured:
            failures.append(("-", t.field, float("nan"), f"{t}: no selected case measures it"))
    for case in cases:
        if case.status != "ok":
            failures.append((case.baseline, "emulation", float("nan"), "must run"))
            continue
        if case.result is not None and case.result.get("oom"):
            failures.append((case.baseline, "oom", float("nan"), PREDICTED_OOM))
        for m in case.metrics:
            for t in thresholds:
                if t.field == m.metric and t.crossed(
                    m.error, slack_below=m.slack_below, slack_above=m.slack_above
                ):
                    failures.append((case.baseline, m.metric, m.error, str(t)))
    return failures


def run_to_dict(run: ValidationRun, failures) -> dict:
    """The `validate --json` object: run, per-case metrics, summary, gate failures."""
    return {
        "run_id": run.run_id,
        "status": run.status,
        "db": str(run.db_path),
        "cases": [
            {
                "baseline": c.baseline,
                "source": c.source,
                "gpu": c.gpu,
                "status": c.status,
                "error_message": c.error_message,
                "unscored": c.unscored,
                "wall_s": c.wall_s,
                "metrics": [
                    {
                        "metric": m.metric,
                        "predicted": m.predicted,
                        "measured": m.measured,
                        "error": m.error,
                        "slack_below": m.slack_below,
                        "slack_above": m.slack_above,
                    }
                    for m in c.metrics
                ],
                **({"variability": c.variability} if c.variability is not None else {}),
            }  # fmt: skip
            for c in run.cases
        ],
        "summary": [vars(row) for row in summarize(run.cases)],
        # a failed emulation or a threshold no case measures has no error: null, as NaN is
        # not JSON (strict parsers such as jq refuse it)
        "gate_failures": [
            {"baseline": b, "metric": m, "error": None if math.isnan(e) else e, "threshold": t}
            for b, m, e, t in failures
        ],
    }
