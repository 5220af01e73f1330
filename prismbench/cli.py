"""The `prismbench` command line: argparse wiring, one small handler per subcommand.

Handlers call a library function and print its result (rich tables, or one JSON object with
`--json`). Exit codes: 0 success, 1 a gate crossed or a predicted out of memory (`gate`'s
candidate, `validate`'s cases; `validate` also for a case that fails to emulate), 2 bad input
(spec errors, missing or malformed files, usage errors, no CUDA for `calibrate`, a job too large
for this machine: `record`'s ranks or a capture's workers killed, the capturing source edited
while a capture ran), 130 Ctrl-C,
143 SIGTERM; errors are one line `error: <message>` on stderr. SIGTERM (`kill`, `timeout`, CI
runners, job schedulers) ends a command as Ctrl-C does: `validate` records its run as
interrupted, and it and the capture stop their workers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from emulator.costs.kernel_timing import KernelsNotRecorded
from prismbench import __version__, report
from prismbench.capture_sources import SourceChangedError
from prismbench.explain import explain, explanation_to_dict, flavor_rows
from prismbench.redelivery import redelivered
from prismbench.spec import SpecError, load_job_spec, moot_model_fields

EXIT_OK = 0
EXIT_BAD_INPUT = 2
EXIT_GATE_FAILED = 1
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports Ctrl-C
EXIT_TERMINATED = 143  # 128 + SIGTERM, as a shell reports a process ended by `kill`
ALLOC_CONF_HELP = (
    "PYTORCH_ALLOC_CONF to model, e.g. expandable_segments:True (default: none, torch's "
    "default allocator)"
)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread while a command runs. A KeyboardInterrupt, so every
    cleanup written for Ctrl-C (validate's run marked interrupted, its workers stopped) runs
    for it too."""


def _console() -> Console:
    """Rich console; when piped, wide enough that tables do not wrap (rich assumes 80). No
    markup: what it prints holds paths and names, in which "[h100]" is no style tag."""
    console = Console(highlight=False, markup=False)
    if not console.is_terminal:
        console.width = 160
    return console


def _print_json(data: object) -> None:
    print(json.dumps(data, indent=2))


def _cmd_workloads(args: argparse.Namespace) -> int:
    rows = flavor_rows()
    if args.json:
        _print_json(rows)
    else:
        report.render_workloads(rows, _console())
    return EXIT_OK


def _load_job(path: str):
    """The job spec at `path`, or the `[job]` table of the baseline file at `path` (said on
    stderr); each `[kernels]` override and model field that changes nothing for the job is
    said on stderr (workloads.kernels.moot_overrides, prismbench.spec.moot_model_fields):
    nothing is ignored silently; so is a framework choice that gave way for the job
    (`framework_fallback_notes`) and what the default framework runs that production
    frameworks do not (`research_program_notes`)."""
    from prismbench.baselines import BaselineError, is_baseline_file, load_baseline
    from workloads.kernels import framework_fallback_notes, moot_overrides, research_program_notes

    if is_baseline_file(path):
        try:
            job = load_baseline(path).job
        except BaselineError as err:
            raise SpecError(str(err)) from None
        _progress(f"note: {path} is a baseline: its [job] table is the job")
    else:
        job = load_job_spec(path)
    notes = (*moot_model_fields(job.model), *moot_overrides(job), *framework_fallback_notes(job),
             *research_program_notes(job))  # fmt: skip
    for note in notes:
        _progress(f"note: {path}: {note}")
    return job


def _cmd_explain(args: argparse.Namespace) -> int:
    explanation = explain(_load_job(args.job))
    if args.json:
        _print_json(explanation_to_dict(explanation))
    else:
        report.render_explanation(explanation, _console())
    return EXIT_OK


def _cmd_calibrate(args: argparse.Namespace) -> int:
    import torch

    if args.job is None and args.profile_out:
        raise SpecError(
            "--profile-out names the profile of --job's iteration; the grid writes none"
        )
    if args.job is None and args.profile_iterations is not None:  # given, even as 1
        raise SpecError(
            f"--profile-iterations {args.profile_iterations}: says how many of --job's "
            "iterations to profile; the grid profiles none"
        )
    if args.job is not None and args.quick:
        raise SpecError("--quick shortens the grid's sweep; --job profiles the job's iterations instead")
    if args.job is None and args.json:
        raise SpecError("--json prints --job's ingest result; the grid writes its table to --out")
    if not torch.cuda.is_available():
        print("error: calibrate measures kernels on a CUDA GPU; none is available", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.job is None:
        from emulator.costs.calibrate import run_calibration
        from prismbench.calibrate_grid import measure_grid

        _check_output(args.out, "--out")
        path = run_calibration(
            Path(args.out), quick=args.quick, progress=_progress,
            extra=lambda: measure_grid(args.quick, progress=_progress),
        )  # fmt: skip
        print(f"wrote {path}")
        return EXIT_OK
    from emulator.costs.calibrate import gpu_provenance
    from prismbench.calibrate_job import calibrate_job

    job = _load_job(args.job)
    _check_output(args.out, "--out", inputs=(args.job,))
    _check_output(args.profile_out, "--profile-out", inputs=(args.job,),
                  outputs=(("--out", args.out),))  # fmt: skip
    profile_out = Path(args.profile_out or Path(args.out).with_suffix(".ops.jsonl.gz"))
    result = calibrate_job(job, Path(args.out), profile_out, provenance=gpu_provenance(),
                           iterations=args.profile_iterations or 1)  # fmt: skip
    if args.json:
        _print_json(result.to_dict() | {"profile": str(profile_out), "out": args.out})
        return EXIT_OK
    report.render_ingest(result, _console())
    print(f"wrote the profile {profile_out} and {len(result.rows)} kernel rows to {args.out}")
    return EXIT_OK


def _provenance(items: list[str]) -> dict[str, str]:
    """--provenance KEY=VALUE items as a dict: each key one of the kernel table's provenance
    columns, given once (a later value silently replacing an earlier one would hide a typo)."""
    from emulator.costs.kernel_table import PROVENANCE_FIELDS

    provenance: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SpecError(f"--provenance {item!r} must be KEY=VALUE")
        if key not in PROVENANCE_FIELDS:
            raise SpecError(
                f"--provenance {item!r}: unknown key {key!r}; the keys are "
                f"{', '.join(PROVENANCE_FIELDS)}"
            )
        if key in provenance:
            raise SpecError(f"--provenance {key} is given twice: give each key once")
        provenance[key] = value
    return provenance


def _cmd_ingest_profile(args: argparse.Namespace) -> int:
    from prismbench.profile_ingest import ingest_profile, write_rows_csv
    from prismbench.profile_readers import ProfileError

    job = _load_job(args.job)
    _check_output(args.out, "--out", inputs=(args.job, args.profile))
    provenance = _provenance(args.provenance)
    try:
        result = ingest_profile(
            Path(args.profile), job, provenance=provenance, job_label=f"--job {args.job}"
        )
    except ProfileError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    write_rows_csv(result.rows, Path(args.out))
    if args.json:
        _print_json(result.to_dict())
    else:
        report.render_ingest(result, _console())
        print(
            f"wrote {len(result.rows)} kernel rows to {args.out} (matched "
            f"{result.trace_coverage:.1%} of the capture's compute rows and "
            f"{result.kernel_time_coverage:.1%} of "
            f"{report.profiled_time_label(result.profile_iterations)} kernel time; source "
            f"{result.rows[0]['source'] if result.rows else '-'}: `compare --skip-source` "
            "takes it)"
        )
    return EXIT_OK


def _kernel_table(job, paths: Sequence[str], skip: tuple[str, ...] = ()):
    """The table that prices `job`: "preset" (its GPU's committed table) when no --kernel-table
    or --skip-source is given, else that table with the --kernel-table files merged over it
    (`prismbench.emulate.kernel_table_for`), less the --skip-source rows; a file that cannot
    be read, or was measured on another GPU, is refused naming the option."""
    from prismbench.emulate import kernel_table_for

    if not paths and not skip:
        return "preset"
    try:
        table = kernel_table_for(job.cluster.gpu, extra=paths, skip_sources=skip)
    except (OSError, ValueError) as err:
        raise SpecError(f"{'--kernel-table' if paths else '--skip-source'}: {err}") from None
    if table is None:
        raise SpecError(
            f"--skip-source: cluster.gpu={job.cluster.gpu!r} has no committed kernel table"
        )
    return table


def _cmd_compare(args: argparse.Namespace) -> int:
    from prismbench.compare import compare_profile
    from prismbench.profile_readers import ProfileError

    job = _load_job(args.job)
    skip = tuple(args.skip_source)
    if args.no_kernel_table and (args.kernel_table or skip):
        given = "--kernel-table" if args.kernel_table else "--skip-source"
        print(
            f"error: --no-kernel-table prices with the roofline alone; {given} would be "
            "ignored: give one or the other",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    table = None if args.no_kernel_table else _kernel_table(job, args.kernel_table, skip)
    try:
        result = compare_profile(
            job, Path(args.profile), name=Path(args.job).stem, kernel_table=table
        )
    except ProfileError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if result.in_sample_source:
        _progress(
            f"note: the kernel table holds this profile's own rows (source "
            f"{result.in_sample_source}): the comparison is in-sample; pass --skip-source "
            f"{result.in_sample_source} to leave them out"
        )
    if args.json:
        _print_json(result.to_dict())
    else:
        report.render_comparison(result, _console(), top=args.top)
    return EXIT_OK


def _cmd_gate(args: argparse.Namespace) -> int:
    from prismbench.gate import check_fields, gate, read_side, result_of
    from prismbench.thresholds import parse_thresholds

    thresholds = [t for text in args.fail for t in parse_thresholds(text)]
    # both checked, then run; a baseline file is its [job] table, as everywhere a job spec goes
    sides = [read_side(path, load_job=_load_job) for path in (args.reference, args.candidate)]
    for side, path in zip(sides, (args.reference, args.candidate), strict=True):
        check_fields(side, path, thresholds)
    reference, candidate = (
        result_of(side, path, progress=lambda message, name=name: _progress(f"{name}: {message}"))
        for side, path, name in zip(
            sides, (args.reference, args.candidate), ("reference", "candidate"), strict=True
        )
    )
    result = gate(reference, candidate, thresholds, names=(args.reference, args.candidate))
    if args.json:
        _print_json(result.to_dict())
    else:
        report.render_gate(result, _console())
    return EXIT_OK if result.passed else EXIT_GATE_FAILED


def _cmd_validate(args: argparse.Namespace) -> int:
    from prismbench import history
    from prismbench import validate as v
    from prismbench.baselines import BaselineError
    from prismbench.thresholds import parse_thresholds

    thresholds = [t for text in args.gate or () for t in parse_thresholds(text, option="--gate")]
    unknown = sorted({t.field for t in thresholds} - set(v.VALIDATED_METRICS))
    if unknown:
        raise SpecError(
            f"--gate: {unknown} are not validated metrics; known: {', '.join(v.VALIDATED_METRICS)}"
        )
    try:
        baselines = v.load_all_baselines(args.baselines)
    except BaselineError as err:
        raise SpecError(f"--baselines: {err}") from None
    chosen = v.select_baselines(baselines, args.select, args.all)
    spread = _variability_settings(args)
    # validate checks these too; here they come before MLflow's store is made beside --db
    v.check_kernel_tables(chosen, tuple(args.kernel_table))
    if spread is not None:
        spread.check_gpus(chosen)
    log, logging_failed = None, []
    if args.no_mlflow and args.tracking_uri:
        raise SpecError("--tracking-uri names an MLflow store that --no-mlflow would not use")
    history.check_openable(Path(args.db))  # before MLflow's store is made beside it
    if not args.no_mlflow:
        from prismbench.mlflow_log import default_tracking_uri, log_run, open_experiment

        uri = args.tracking_uri or default_tracking_uri(args.db)
        artifact_dir = Path(args.db).parent / "mlartifacts"
        try:  # before any emulation: a store MLflow cannot open must not fail the run last
            open_experiment(uri, artifact_dir)
        except Exception as err:  # MLflow raises many kinds, from URI parsing to sqlite
            raise SpecError(f"--tracking-uri {uri}: MLflow cannot open it: {err}") from None

        def log(run, settings):
            try:
                log_run(run, settings, tracking_uri=uri, artifact_dir=artifact_dir)
            except Exception as err:  # the run is whole in DuckDB: its figures and gate still said
                logging_failed.append(f"--tracking-uri {uri}: logging run {run.run_id} failed "
                                      f"({err}); the run is complete in {args.db}")  # fmt: skip

    run = v.validate(chosen, db_path=Path(args.db), workers=args.workers, log_mlflow=log,
                     progress=_progress, use_cache=not args.no_cache, artifacts=args.artifacts,
                     variability=spread, kernel_tables=tuple(args.kernel_table))  # fmt: skip
    failures = v.gate_failures(run.cases, thresholds)
    if args.json:
        _print_json(v.run_to_dict(run, failures))
    else:
        report.render_validation(run, v.summarize(run.cases), failures, _console(), thresholds)
    for message in logging_failed:
        print(f"error: {message}", file=sys.stderr)
    return EXIT_GATE_FAILED if failures or logging_failed else EXIT_OK


def _variability_settings(args: argparse.Namespace):
    """validate's --variability options as settings, None without --variability."""
    from prismbench.validate_variability import VariabilitySettings

    if args.variability is None:
        given = [o for o, v in (("--variability-samples", args.variability_samples),
                                ("--variability-seed", args.variability_seed),
                                ("--variability-steps-per-allocation",
                                 args.variability_steps_per_allocation),
                                ("--variability-table", args.variability_table)) if v is not None]  # fmt: skip
        if given:
            raise SpecError(f"{', '.join(given)} given without --variability PRESET")
        return None
    steps = args.variability_steps_per_allocation
    return VariabilitySettings(
        preset=args.variability,
        samples=1000 if args.variability_samples is None else args.variability_samples,
        seed=args.variability_seed or 0,
        **({} if steps is None else {"steps_per_allocation": steps}),
        table=args.variability_table,
    )


def _cmd_dashboard(args: argparse.Namespace) -> int:
    from prismbench.dashboard import write_dashboard

    _check_output(args.out, "--out", directory=True)
    try:
        page = write_dashboard(Path(args.db), Path(args.out), run_id=args.run)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"wrote {page} (open it in a browser; no server needed)")
    return EXIT_OK


def _cmd_record(args: argparse.Namespace) -> int:
    from prismbench.record import record, write_record

    job = _load_job(args.job)
    if Path(args.out).suffix != ".toml":
        raise SpecError(f"--out {args.out}: a recorded baseline is a .toml file")
    _check_output(args.out, "--out", inputs=(args.job,))
    if args.profile:
        _check_output(args.profile, "--profile", inputs=(args.job,), outputs=(("--out", args.out),))
    recording = record(
        job,
        iterations=args.iterations,
        warmup=args.warmup,
        threads=args.threads,
        device=args.device,
        profile=args.profile is not None,
        profile_iterations=args.profile_iterations,
        progress=_progress,
    )
    path = write_record(recording, Path(args.out))
    if args.profile:
        from prismbench.calibrate_job import write_ops_jsonl_iterations

        written = write_ops_jsonl_iterations(recording.profiled_iterations, args.profile)
        _progress(f"wrote {written} ({len(recording.profiled_iterations)} profiled iteration(s))")
    if args.json:
        _print_json(recording.to_dict())
        return EXIT_OK
    m = recording.to_dict()["measured"]
    memory = (
        f"peak resident memory {report.format_bytes(m['peak_mem_bytes'])} (the largest "
        "process's max RSS, not a GPU allocator's)"
        if args.device == "cpu"
        else f"steady peak reserved {report.format_bytes(m['peak_steady']['reserved'])}, "
        f"allocated {report.format_bytes(m['peak_steady']['allocated'])}; first iteration "
        f"reserved {report.format_bytes(m['peak_first_iteration']['reserved'])} (the largest "
        "rank's caching-allocator peaks)"
    )
    print(f"iteration time median {m['iteration_time_s']:.4f} s (min {m['iteration_time_s_min']:.4f} s, "
          f"max {m['iteration_time_s_max']:.4f} s, stdev {m['iteration_time_s_stdev']:.4f} s over "
          f"{m['iterations']}); {memory}; wrote {path}")  # fmt: skip
    if args.device == "cpu":
        print(f"a CPU recording: validate runs it but scores nothing (the emulator predicts "
              f"{job.cluster.gpu}, not this CPU)")  # fmt: skip
    return EXIT_OK


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive integer")
    return value


def _same_file(target: Path, given: Path) -> bool:
    linked = target.exists() and given.exists() and os.path.samefile(target, given)
    return linked or target.resolve() == given.resolve()


def _check_output(
    path: str | None,
    option: str,
    *,
    directory: bool = False,
    inputs: Sequence[str | None] = (),
    outputs: Sequence[tuple[str, str | None]] = (),
) -> None:
    """Refuse an output path that cannot be written, before any work starts: a directory where
    a file goes (or a file where a directory goes), a parent that is a file or not writable,
    one of the command's own `inputs` (the job spec, a profile), which it would overwrite, or
    the file of another of its `outputs` ((option, path) pairs), which one would overwrite."""
    if path is None:
        return
    target = Path(path)
    for given in (Path(g) for g in inputs if g is not None):
        if _same_file(target, given):
            raise SpecError(f"{option} {path}: is the input {given}; it would be overwritten")
    for other, given in ((o, Path(g)) for o, g in outputs if g is not None):
        if _same_file(target, given):
            raise SpecError(f"{option} {path}: is {other}'s file too; give each its own")
    if directory and target.exists() and not target.is_dir():
        raise SpecError(f"{option} {path}: exists and is not a directory")
    if directory and target.is_dir() and not os.access(target, os.W_OK):
        raise SpecError(f"{option} {path}: is not writable")
    if not directory and target.is_dir():
        raise SpecError(f"{option} {path}: is a directory; give a file path")
    if not directory and path.endswith(("/", os.sep)):  # Path() drops the slash: a file "out"
        raise SpecError(
            f"{option} {path}: names a directory (it ends with a slash); give a file path"
        )
    parent = target.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise SpecError(f"{option} {path}: {parent} is a file, not a directory")
    if not os.access(parent, os.W_OK):
        raise SpecError(f"{option} {path}: {parent} is not writable")


def _check_image_format(path: str | None, option: str) -> None:
    """Refuse, before any work, an image path whose suffix matplotlib cannot write (it would
    fail only once the figure is drawn, the work done); no suffix is a PNG."""
    if path is None:
        return
    from matplotlib.backend_bases import FigureCanvasBase

    kind = Path(path).suffix[1:]
    supported = FigureCanvasBase.get_supported_filetypes()
    if kind and kind.lower() not in supported:
        raise SpecError(
            f"{option} {path}: cannot draw a .{kind} file; give one of "
            f"{', '.join('.' + k for k in sorted(supported))} (no suffix: PNG)"
        )


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _cmd_capture(args: argparse.Namespace) -> int:
    from prismbench.capture import capture_job, summarize, write_capture

    job = _load_job(args.job)
    _check_output(args.out, "--out", directory=True)
    capture = capture_job(
        job, workers=args.workers, use_cache=not args.no_cache, progress=_progress
    )
    summary = summarize(capture)
    write_capture(capture, summary, Path(args.out))
    if args.json:
        _print_json(summary)
    else:
        report.render_capture(summary, _console())
        print(f"wrote {len(capture.traces)} trace(s) and summary.json to {args.out}")
    return EXIT_OK


def _parse_ranks(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        ranks = [int(r) for r in text.split(",")]
    except ValueError:
        raise SpecError(f"--ranks={text!r} must be comma-separated integers") from None
    repeated = sorted({r for r in ranks if ranks.count(r) > 1})
    if repeated:  # each would be drawn twice over itself, its events and flows doubled
        raise SpecError(f"--ranks={text!r}: rank(s) {repeated} given more than once")
    return ranks


def _cmd_emulate(args: argparse.Namespace) -> int:
    from emulator.memory import parse_alloc_conf
    from prismbench.emulate import emulate

    job = _load_job(args.job)
    try:
        parse_alloc_conf(args.alloc_conf)
    except ValueError as err:  # checked before anything runs, like the job spec
        raise SpecError(f"--alloc-conf: {err}") from None
    _check_output(args.trace, "--trace", inputs=(args.job,))
    _check_output(args.memory_out, "--memory-out", directory=True)
    _check_trace_beside_memory_out(args.trace, args.memory_out)
    if args.ranks is not None and args.trace is None:
        raise SpecError("--ranks picks the ranks of --trace's timeline; give --trace FILE too")
    ranks = _parse_ranks(args.ranks)
    for rank in ranks or ():
        if not 0 <= rank < job.world_size:
            raise SpecError(f"--ranks: rank {rank} is outside the world [0, {job.world_size})")
    result = emulate(
        job,
        name=job.model.name,
        use_cache=not args.no_cache,
        workers=args.workers,
        alloc_conf=args.alloc_conf,
        trace_path=Path(args.trace) if args.trace else None,
        trace_ranks=ranks,
        memory_dir=Path(args.memory_out) if args.memory_out else None,
        progress=_progress,
        host_dispatch=None if args.no_host_dispatch else "preset",
        kernel_table=_kernel_table(job, args.kernel_table),
    )
    for c in result.per_class:
        if not c.steady_converged:
            print(report.steady_warning(f"pipeline rank {c.pp}", c.steady_iterations),
                  file=sys.stderr)  # fmt: skip
    if args.json:
        _print_json(result.to_dict())
    else:
        report.render_emulation(result, _console())
    return EXIT_OK


def _check_trace_beside_memory_out(trace: str | None, memory_out: str | None) -> None:
    """Refuse a --trace file that is --memory-out or a folder above it: the timeline is written
    first, so the folder could not be made after it, and the error would leave the timeline
    behind."""
    if trace is None or memory_out is None:
        return
    trace_path, memory_dir = Path(trace).resolve(), Path(memory_out).resolve()
    if trace_path == memory_dir or trace_path in memory_dir.parents:
        raise SpecError(
            f"--trace {trace}: is --memory-out {memory_out} or a folder above it; give the "
            "timeline a file of its own (inside --memory-out is fine)"
        )


def _cmd_variability(args: argparse.Namespace) -> int:
    from emulator.variability.attribution import SIGNATURES_PER_SOURCE
    from emulator.variability.summary import check_allocations
    from prismbench.network_steps import measured_network
    from prismbench.pipeline_transfers import measured_transfers
    from prismbench.variability import plot_distribution, variability
    from prismbench.variability_calibration import resolve_preset

    job = _load_job(args.job)
    network = None if args.network_steps is None else measured_network(args.network_steps)
    transfers = (
        None if args.pipeline_transfers is None else measured_transfers(args.pipeline_transfers)
    )
    _check_output(args.plot, "--plot", inputs=(args.job,))
    _check_image_format(args.plot, "--plot")
    if args.threshold is not None and not 0 < args.threshold < float("inf"):
        raise SpecError(
            f"--threshold={args.threshold!r}: a step time in seconds must be a finite number > 0"
        )
    if args.placement is not None:
        _check_placement(job, slow_gpus=args.placement[0])
    if args.signatures_per_source is not None and args.rank_signatures is None:
        raise SpecError("--signatures-per-source given without --rank-signatures K")
    try:
        check_allocations(args.samples, args.steps_per_allocation, samples_name="--samples",
                          steps_name="--steps-per-allocation")  # fmt: skip
    except ValueError as err:
        raise SpecError(str(err)) from None
    model = resolve_preset(args.preset, job.cluster.gpu, args.variability_table)
    _check_measured_communication(job, model, network, transfers)
    result = variability(
        job,
        name=job.model.name,
        model=model,
        preset=args.preset,
        variability_table=args.variability_table,
        samples=args.samples,
        seed=args.seed,
        threshold_s=args.threshold,
        k_steps=args.k_steps,
        use_cache=not args.no_cache,
        workers=args.workers,
        progress=_progress,
        rank_sources=args.rank_sources,
        rank_signatures=args.rank_signatures or 0,
        signatures_per_source=args.signatures_per_source or SIGNATURES_PER_SOURCE,
        slow_gpus=args.placement,
        steps_per_allocation=args.steps_per_allocation,
        kernel_table=_kernel_table(job, args.kernel_table),
        network=network,
        transfers=transfers,
    )
    if args.plot:
        plot_distribution(result, Path(args.plot))
        _progress(f"wrote {args.plot}")
    if args.json:
        _print_json(result.to_dict())
    else:
        report.render_variability(result, _console())
    return EXIT_OK


def _cmd_variability_table(args: argparse.Namespace) -> int:
    from prismbench.variability_calibration import write_table
    from prismbench.variability_recordings import recorded_table

    if len(args.recording) != len(args.profile):
        raise SpecError(
            f"--recording is given {len(args.recording)} time(s), --profile "
            f"{len(args.profile)}: give each recording's profile, one --profile per --recording"
        )
    if Path(args.out).suffix != ".json":
        raise SpecError(f"--out {args.out}: a variability table is a .json file")
    _check_output(args.out, "--out", inputs=(*args.recording, *args.profile))
    table = recorded_table(list(zip(args.recording, args.profile, strict=True)), _progress)
    path = write_table(table, args.out)
    if args.json:
        _print_json(table)
        return EXIT_OK
    report.render_variability_table(table, _console())
    print(f"wrote {path}: `prismbench variability JOB.toml --preset measured "
          f"--variability-table {path}` draws from it for a job on {table['gpu']}")  # fmt: skip
    return EXIT_OK


def _check_measured_communication(job, model, network, transfers) -> None:
    """A measurement of communication the job does not have would change nothing: refused, not
    silently ignored."""
    one_node = job.world_size <= job.cluster.gpus_per_node
    if network is not None and model.network_scope == "inter-node" and one_node:
        raise SpecError(
            f"--network-steps: the job's {job.world_size} GPU(s) fit one node (cluster."
            f"gpus_per_node={job.cluster.gpus_per_node}): no communication crosses the network, "
            "so its regimes would change nothing"
        )
    if transfers is not None and job.parallel.pp == 1:
        raise SpecError(
            "--pipeline-transfers: parallel.pp=1: the job has no pipeline transfers, so their "
            "CV would change nothing"
        )


def _check_placement(job, *, slow_gpus: int) -> None:
    from emulator.variability.placement import placement_ranks
    from prismbench.capture import world_of

    world = world_of(job)
    if not placement_ranks(world, slow_gpus):
        raise SpecError(
            f"--placement: {slow_gpus} slow GPUs fit no placement of mesh "
            f"{dict(zip(world.names, world.shape, strict=True))} (at most tp, cp x tp or the "
            f"DP replicas)"
        )


def _placement(text: str) -> tuple[int, float]:
    """K:FACTOR, K slow GPUs (an integer >= 1) FACTOR x slower (a number > 1: at 1 they are no
    slower, below 1 faster, and the study compares slow GPUs' placements)."""
    k, _, factor = text.partition(":")
    try:
        value = (int(k), float(factor))
    except ValueError:
        value = (0, 0.0)
    if value[0] < 1 or not 1 < value[1] < float("inf"):
        raise argparse.ArgumentTypeError(
            f"{text!r} must be K:FACTOR, K slow GPUs (an integer >= 1) FACTOR x slower (> 1), "
            "e.g. 8:1.1"
        )
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be an integer >= 0")
    return value


def _cmd_fit(args: argparse.Namespace) -> int:
    from emulator.memory import parse_alloc_conf
    from emulator.memory.replay import MAX_STEADY_ITERATIONS
    from prismbench.fit import fit

    job = _load_job(args.job)
    try:
        parse_alloc_conf(args.alloc_conf)
    except ValueError as err:
        raise SpecError(f"--alloc-conf: {err}") from None
    result = fit(
        job,
        args.vary,
        step=args.step,
        maximum=args.max,
        alloc_conf=args.alloc_conf,
        progress=_progress,
    )
    unsettled = [f"{p.value:,}" for p in result.probes if not p.memory.steady_converged]
    if unsettled:
        what = f"{args.vary} = {', '.join(unsettled)}"
        print(report.steady_warning(what, MAX_STEADY_ITERATIONS), file=sys.stderr)
    if args.json:
        _print_json(result.to_dict())
    else:
        report.render_fit(result, _console())
    return EXIT_OK


class _StoreOnce(argparse._StoreAction):
    """An option that takes one value refuses a second: argparse would keep the last
    (`--db a --db b` validating into b), silently dropping the first."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = namespace.__dict__.setdefault(_GIVEN, {})
        if self.dest in given:
            raise argparse.ArgumentError(
                self, f"given twice ({given[self.dest]!r}, then {values!r}): give it once"
            )
        given[self.dest] = values
        super().__call__(parser, namespace, values, option_string)


# where _StoreOnce keeps, during one parse, the options it has seen (removed after parsing)
_GIVEN = "_options_given"


class _CommandParser(argparse.ArgumentParser):
    """A subcommand's parser: its single-valued options are `_StoreOnce`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register("action", None, _StoreOnce)
        self.register("action", "store", _StoreOnce)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="prismbench",
        description="Emulate LLM training jobs and check the predictions against baselines.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_CommandParser
    )
    for add_command in (
        _add_workloads,
        _add_explain,
        _add_capture,
        _add_emulate,
        _add_variability,
        _add_variability_table,
        _add_fit,
        _add_calibrate,
        _add_ingest_profile,
        _add_compare,
        _add_gate,
        _add_validate,
        _add_dashboard,
        _add_record,
    ):
        add_command(commands)
    return parser


def _add_workloads(commands) -> None:
    workloads = commands.add_parser("workloads", help="list the registered model flavors")
    workloads.add_argument("--json", action="store_true", help="print one JSON array")
    workloads.set_defaults(handler=_cmd_workloads)


def _add_explain(commands) -> None:
    explain_cmd = commands.add_parser(
        "explain", help="world layout, parameters, FLOPs and model-state memory of a job spec"
    )
    explain_cmd.add_argument("job", metavar="JOB.toml", help="job spec (TOML)")
    explain_cmd.add_argument("--json", action="store_true", help="print one JSON object")
    explain_cmd.set_defaults(handler=_cmd_explain)


def _add_capture_options(command, workers_help: str = "capture processes (default: cores)"):
    """What capture and emulate share: the cache and the worker processes."""
    command.add_argument("--no-cache", action="store_true", help="capture again even if cached")
    command.add_argument(
        "--workers", type=_positive_int, default=None, metavar="N", help=workers_help
    )


def _add_kernel_table_option(command) -> None:
    """--kernel-table, the same for every command that prices a job (`_kernel_table`)."""
    command.add_argument(
        "--kernel-table",
        action="append",
        default=[],
        metavar="CSV",
        help="kernel rows measured on the job's GPU (calibrate --job, ingest-profile), merged "
        "over its committed table: a row of the same op and shape replaces the table's; "
        "repeatable, a later file's row winning",
    )


def _add_capture(commands) -> None:
    capture = commands.add_parser(
        "capture", help="record one iteration of every class of ranks (one trace per class)"
    )
    capture.add_argument("job", metavar="JOB.toml", help="job spec (TOML)")
    capture.add_argument(
        "--out", required=True, metavar="DIR", help="where traces and summary.json go"
    )
    capture.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    _add_capture_options(capture)
    capture.set_defaults(handler=_cmd_capture)


def _add_emulate(commands) -> None:
    emulate_cmd = commands.add_parser(
        "emulate", help="predict iteration time, breakdown and peak memory of a job spec"
    )
    emulate_cmd.add_argument("job", metavar="JOB.toml", help="job spec (TOML)")
    emulate_cmd.add_argument("--json", action="store_true", help="print one JSON object")
    emulate_cmd.add_argument("--trace", metavar="FILE", help="write a Perfetto/Chrome trace (JSON)")
    emulate_cmd.add_argument(
        "--ranks", metavar="R,...", help="ranks in the trace (default: one per class)"
    )
    emulate_cmd.add_argument("--alloc-conf", default="", metavar="CONF", help=ALLOC_CONF_HELP)
    emulate_cmd.add_argument(
        "--memory-out",
        metavar="DIR",
        help="write per-class memory timelines (PNG) and memory_viz snapshots here",
    )
    emulate_cmd.add_argument(
        "--no-host-dispatch",
        action="store_true",
        help="kernels run back to back: no host time per op (docs/MODELS.md, host dispatch)",
    )
    _add_kernel_table_option(emulate_cmd)
    _add_capture_options(emulate_cmd)
    emulate_cmd.set_defaults(handler=_cmd_emulate)


def _add_variability(commands) -> None:
    from emulator.variability.model import DEFAULT_NETWORK, MEASURED_PRESET, PRESET_NAMES
    from emulator.variability.regimes import BUBBLE_SIGMAS
    from emulator.variability.summary import DEFAULT_STEPS_PER_ALLOCATION, MIN_ALLOCATIONS
    from prismbench.network_steps import MIN_NETWORK_STEPS
    from prismbench.pipeline_transfers import MIN_PIPELINE_TRANSFERS

    cmd = commands.add_parser(
        "variability",
        help="sample the distribution of a job's step time (PRISM: per-GPU, per-kernel, network)",
    )
    cmd.add_argument("job", metavar="JOB.toml", help="job spec (TOML)")
    cmd.add_argument(
        "--samples", type=_positive_int, default=1000, help="Monte Carlo samples (1000)"
    )
    cmd.add_argument("--seed", type=_non_negative_int, default=0, help="random seed (0)")
    cmd.add_argument(
        "--preset",
        choices=sorted(PRESET_NAMES),
        default="prism-low",
        help=f"variability magnitudes: PRISM's low or high end (emulator/variability/model.py), "
        f"none, or {MEASURED_PRESET!r}: the temporal variation measured on the job's GPU "
        f"(results/variability/<gpu>.json, or --variability-table) with PRISM's low-end "
        f"spatial and network figures (default: prism-low)",
    )
    cmd.add_argument(
        "--variability-table",
        metavar="TABLE.json",
        help=f"with --preset {MEASURED_PRESET}: the temporal variation measured on your own GPU "
        "(`prismbench variability-table`), in place of the committed table of the job's "
        "cluster.gpu; measured on that GPU preset",
    )
    cmd.add_argument(
        "--threshold",
        type=float,
        metavar="SECONDS",
        help="report P(step > SECONDS) (default: the deterministic prediction)",
    )
    cmd.add_argument(
        "--k-steps", type=_positive_int, default=1000, help="steps of the run-time bound (1000)"
    )
    cmd.add_argument(
        "--steps-per-allocation",
        type=_positive_int,
        default=DEFAULT_STEPS_PER_ALLOCATION,
        metavar="S",
        help="consecutive samples drawn on one allocation's per-GPU speed factors, as the steps "
        "of one run share their GPUs; splits the spread into between and within allocations "
        f"for the K-step bound; --samples must make at least {MIN_ALLOCATIONS} allocations "
        f"({DEFAULT_STEPS_PER_ALLOCATION}; 1: every sample a fresh allocation, steps taken as "
        "independent)",
    )
    cmd.add_argument(
        "--rank-sources",
        action="store_true",
        help="also run every noise source alone and rank them by step-time variance (a source "
        "that provably applies no noise, e.g. the network regime on calls that never leave a "
        "node, is listed, not run)",
    )
    cmd.add_argument(
        "--rank-signatures",
        type=_positive_int,
        metavar="K",
        help="after --rank-sources (implied), split the K top-ranked sources that hold more than "
        "one signature (compute: op class and input shapes; collective: kind, group, members, "
        "bytes and, where pipelined, stage) into their N largest signatures by a pre-rank (their "
        "variance along the deterministic critical path) and one 'other', each run alone with "
        "the same seed and samples: adds at most K x (N + 1) Monte Carlo runs of --samples each "
        "(emulator/variability/signatures.py)",
    )
    cmd.add_argument(
        "--signatures-per-source",
        type=_positive_int,
        metavar="N",
        # the default is attribution.SIGNATURES_PER_SOURCE, written out: importing it would
        # import torch (graph.build) for every `prismbench --help`; a test compares the two
        help="with --rank-signatures: signatures run per split source before the rest are "
        "lumped as 'other' (4)",
    )
    cmd.add_argument(
        "--placement",
        type=_placement,
        metavar="K:FACTOR",
        help="also place K GPUs FACTOR x slower in one TP group, one stage, spread over DP "
        "replicas, and compare p95",
    )
    cmd.add_argument(
        "--network-steps",
        metavar="FILE",
        help="the inter-node communication time (s) of every step of a real run, one per line: "
        "the network regimes are split from them (prismbench/network_steps.py) and drawn in "
        "place of the preset's assumed ones (default: assumed, "
        + ", ".join(f"{100 * r.probability:g} %% of steps at {r.factor:g}x" for r in DEFAULT_NETWORK)
        + f"; at least {MIN_NETWORK_STEPS} steps)",
    )
    cmd.add_argument(
        "--pipeline-transfers",
        metavar="FILE",
        help="the duration (s) of every pipeline send/recv of a real run, one per line (one "
        "pipeline boundary's NCCL SendRecv kernels over the steady-state steps): the calls more "
        f"than {BUBBLE_SIGMAS:g} spreads above the median of those that did not wait are split off "
        "as waits for the peer, and the others' CV is drawn for every pipeline transfer "
        "(prismbench/pipeline_transfers.py; default: the preset's collective CV, assumed; at "
        f"least {MIN_PIPELINE_TRANSFERS} transfers)",
    )
    cmd.add_argument("--json", action="store_true", help="print one JSON object")
    cmd.add_argument("--plot", metavar="FILE", help="write a histogram and CDF (PNG)")
    _add_kernel_table_option(cmd)
    _add_capture_options(cmd, "capture processes, and Monte Carlo threads (default: cores)")
    cmd.set_defaults(handler=_cmd_variability)


def _add_variability_table(commands) -> None:
    cmd = commands.add_parser(
        "variability-table",
        help="a table for `variability --preset measured` from your GPU recordings and profiles",
    )
    cmd.add_argument(
        "--recording",
        action="append",
        required=True,
        metavar="REC.toml",
        help="a recorded baseline of a GPU run (`record --device cuda --iterations N`, N >= 2); "
        "repeatable, every recording on the same cluster.gpu",
    )
    cmd.add_argument(
        "--profile",
        action="append",
        required=True,
        metavar="PROFILE",
        help="the profile of one more iteration of the job (`record --profile`); one per "
        "--recording, the n-th --profile going with the n-th --recording; refused unless it is "
        "a profile of that recording's job (the job is captured to align it, as ingest-profile "
        "checks one), and where a summary.json beside it names its GPU, of that job's GPU",
    )
    cmd.add_argument("--out", required=True, metavar="TABLE.json", help="the table to write")
    cmd.add_argument("--json", action="store_true", help="print the table as one JSON object")
    cmd.set_defaults(handler=_cmd_variability_table)


def _add_fit(commands) -> None:
    from prismbench.fit import VARIABLES

    fit_cmd = commands.add_parser(
        "fit", help="the largest micro-batch, sequence length or layer count that fits in memory"
    )
    fit_cmd.add_argument("job", metavar="JOB.toml", help="job spec (TOML)")
    fit_cmd.add_argument(
        "--vary",
        required=True,
        choices=VARIABLES,
        help="the setting to search (micro_batch keeps the job's micro-batches a step: the "
        "global batch follows)",
    )
    fit_cmd.add_argument(
        "--step",
        type=_positive_int,
        help="values step by this (default: what the job's parallelism needs; layers start "
        "at one a pipeline stage)",
    )
    fit_cmd.add_argument(
        "--max",
        type=_positive_int,
        metavar="N",
        help="search no value above N (default: none; each probe captures the job at that "
        "value, so a small model searched far up takes long)",
    )
    fit_cmd.add_argument("--alloc-conf", default="", metavar="CONF", help=ALLOC_CONF_HELP)
    fit_cmd.add_argument("--json", action="store_true", help="print one JSON object")
    fit_cmd.set_defaults(handler=_cmd_fit)


def _add_calibrate(commands) -> None:
    calibrate = commands.add_parser(
        "calibrate", help="measure kernel durations on this machine's GPU (needs CUDA)"
    )
    calibrate.add_argument(
        "--out",
        required=True,
        metavar="CSV",
        help="output table, e.g. results/kernels/h100-sxm-80g.csv",
    )
    calibrate.add_argument("--quick", action="store_true", help="a small sweep, for smoke tests")
    calibrate.add_argument(
        "--job",
        metavar="JOB.toml",
        help="instead of the grid: profile one iteration of this one-GPU job (or "
        "--profile-iterations N) and ingest it",
    )
    calibrate.add_argument(
        "--profile-out",
        metavar="FILE",
        help="with --job: where the profile goes (default: beside --out, .ops.jsonl.gz)",
    )
    calibrate.add_argument(
        "--profile-iterations",
        type=_positive_int,
        default=None,
        metavar="N",
        help="with --job: profile N iterations (1); the rows pool them all (N x the repetitions)",
    )
    calibrate.add_argument(
        "--json", action="store_true", help="with --job: print the ingest result as one JSON object"
    )
    calibrate.set_defaults(handler=_cmd_calibrate)


def _add_ingest_profile(commands) -> None:
    ingest = commands.add_parser(
        "ingest-profile",
        help="kernel-table rows from a torch.profiler record of the job, matched to its capture",
    )
    ingest.add_argument(
        "profile", metavar="PROFILE", help="<case>.ops.jsonl[.gz] or a Chrome trace (JSON)"
    )
    ingest.add_argument("--job", required=True, metavar="JOB.toml", help="the profiled job")
    ingest.add_argument("--out", required=True, metavar="CSV", help="kernel rows to write")
    ingest.add_argument(
        "--provenance",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set a provenance column (gpu: torch's device name or the job's cluster.gpu; "
        "driver, torch, clocks, date); repeatable",
    )
    ingest.add_argument("--json", action="store_true", help="print one JSON object")
    ingest.set_defaults(handler=_cmd_ingest_profile)


def _add_compare(commands) -> None:
    compare = commands.add_parser(
        "compare",
        help="predicted vs measured compute time per op class, against a profile of a real run",
        description=(
            "Capture JOB, price every op as emulate does, match the ops to PROFILE (a "
            "torch.profiler record of the same program) and print, per op class, predicted "
            "and measured GPU time, largest absolute error first, with how each class was "
            "priced (exact table row, interpolated, extrapolated to a larger shape, an attention "
            "kernel's published rates, roofline)."
        ),
    )
    compare.add_argument("job", metavar="JOB.toml", help="the profiled job")
    compare.add_argument(
        "--profile",
        required=True,
        metavar="PROFILE",
        help="<case>.ops.jsonl[.gz] or a Chrome trace",
    )
    _add_kernel_table_option(compare)
    compare.add_argument(
        "--skip-source",
        action="append",
        default=[],
        metavar="PREFIX",
        help="leave out table rows whose source starts with PREFIX (leave-one-out: profile:CASE)",
    )
    compare.add_argument(
        "--no-kernel-table", action="store_true", help="price with the roofline curves only"
    )
    compare.add_argument("--top", type=_positive_int, default=15, help="classes shown (default 15)")
    compare.add_argument("--json", action="store_true", help="print one JSON object (all classes)")
    compare.set_defaults(handler=_cmd_compare)


def _add_gate(commands) -> None:
    from prismbench import thresholds

    gate_cmd = commands.add_parser(
        "gate",
        help="pre-merge gate: the same job before and after a change, against thresholds",
        description=(
            "Compare a candidate emulation with a reference one (each a job spec, emulated "
            "here, or a saved `emulate --json` file) and exit 1 when a threshold is crossed or "
            "the candidate is predicted to run out of memory (always checked), 2 on bad "
            "input.\n\n" + thresholds.__doc__.split("\n\n", 1)[1]
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    gate_cmd.add_argument("--reference", required=True, metavar="A", help="JOB.toml or result.json")
    gate_cmd.add_argument("--candidate", required=True, metavar="B", help="JOB.toml or result.json")
    gate_cmd.add_argument(
        "--fail",
        required=True,
        action="append",  # every one given is checked: a later one must not drop an earlier one
        metavar="THRESHOLDS",
        help='e.g. "iteration_time_s:+2%%,peak_memory_reserved_bytes:+1%%" (repeatable)',
    )
    gate_cmd.add_argument("--json", action="store_true", help="print one JSON object")
    gate_cmd.set_defaults(handler=_cmd_gate)


def _add_validate(commands) -> None:
    from prismbench.validate import DEFAULT_DB, DEFAULT_SELECTION, VALIDATED_METRICS

    validate_cmd = commands.add_parser(
        "validate",
        help="emulate recorded baselines, score them, store the run (DuckDB, MLflow), gate",
        description=(
            "Emulate the selected baselines (worker processes, captures cached), print the "
            "mean and max |error| per source, GPU and metric, write the run to DuckDB and "
            "MLflow, and with --gate exit 1 when a case's error crosses a threshold "
            "(FIELD:X% bounds |error|, FIELD:+X% a too-slow/too-large prediction, each "
            "widened by how far the measured iterations reached below and above their median "
            "where a baseline records them, said for each case it lets pass; FIELD is "
            f"one of {', '.join(VALIDATED_METRICS)}; a gate no selected case measures fails). "
            "A case that fails to emulate, or is predicted to run out of memory (every "
            "baseline records a run that completed), exits 1 too, with or without --gate, as "
            "does a run MLflow cannot log (after its figures and gate are printed)."
        ),
    )
    validate_cmd.add_argument(
        "--select",
        action="append",
        metavar="EXPR",
        help="baselines whose name matches this glob, or contains this word (repeatable; "
        f"without --select or --all: the {len(DEFAULT_SELECTION)} quick ones of "
        "prismbench.validate.DEFAULT_SELECTION)",
    )
    validate_cmd.add_argument("--all", action="store_true", help="every baseline")
    validate_cmd.add_argument(
        "--gate",
        action="append",  # every one given is checked: a later one must not drop an earlier one
        metavar="THRESHOLDS",
        help='e.g. "iteration_time_s:10%%" (repeatable)',
    )
    validate_cmd.add_argument(
        "--baselines",
        default="results/baselines",
        metavar="DIR",
        help="baseline directory, its recorded/ included (default results/baselines, from the "
        "working directory)",
    )
    validate_cmd.add_argument(
        "--db",
        default=str(DEFAULT_DB),
        metavar="PATH",
        help=f"DuckDB history (default {DEFAULT_DB})",
    )
    validate_cmd.add_argument(
        "--tracking-uri", metavar="URI", help="MLflow tracking URI (default: sqlite beside --db)"
    )
    validate_cmd.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow")
    validate_cmd.add_argument(
        "--artifacts",
        action="store_true",
        help="also write each case's Perfetto timeline and memory plots (logged to MLflow)",
    )
    validate_cmd.add_argument(
        "--no-cache",
        action="store_true",
        help="emulate again even where the same job, code and tables were",
    )
    validate_cmd.add_argument(
        "--workers", type=_positive_int,
        help="worker processes (default: the cores, at most one a case; 1: the cases run in "
        "this process, one after another)",
    )  # fmt: skip
    validate_cmd.add_argument("--json", action="store_true", help="print one JSON object")
    _add_kernel_table_option(validate_cmd)
    _add_validate_variability(validate_cmd)
    validate_cmd.set_defaults(handler=_cmd_validate)


def _add_validate_variability(validate_cmd) -> None:
    from emulator.variability.model import PRESET_NAMES
    from emulator.variability.summary import DEFAULT_STEPS_PER_ALLOCATION

    validate_cmd.add_argument(
        "--variability",
        choices=sorted(PRESET_NAMES),
        metavar="PRESET",
        help="also sample each case's step-time distribution from its capture under PRESET "
        f"({', '.join(sorted(PRESET_NAMES))}; as `variability --preset`) and store it (DuckDB "
        "table case_variability, MLflow metrics variability_*, a histogram/CDF PNG)",
    )
    validate_cmd.add_argument(
        "--variability-samples",
        type=_positive_int,
        metavar="N",
        help="Monte Carlo samples per case with --variability (1000)",
    )
    validate_cmd.add_argument(
        "--variability-seed",
        type=_non_negative_int,
        metavar="SEED",
        help="random seed of --variability (0); the same seed gives the same figures",
    )
    validate_cmd.add_argument(
        "--variability-steps-per-allocation",
        type=_positive_int,
        metavar="S",
        help=f"samples per allocation of GPUs with --variability (as `variability "
        f"--steps-per-allocation`; {DEFAULT_STEPS_PER_ALLOCATION})",
    )
    validate_cmd.add_argument(
        "--variability-table",
        metavar="TABLE.json",
        help="with --variability measured: draw from this table of your own GPU (`prismbench "
        "variability-table`) in place of the committed ones; every selected case must run on "
        "its GPU (default: results/variability/<gpu>.json)",
    )


def _add_dashboard(commands) -> None:
    from prismbench.validate import DEFAULT_DB

    dashboard = commands.add_parser(
        "dashboard", help="a static fidelity page (index.html + PNGs) from the validation history"
    )
    dashboard.add_argument("--out", required=True, metavar="DIR", help="output folder")
    dashboard.add_argument(
        "--db",
        default=str(DEFAULT_DB),
        metavar="PATH",
        help=f"DuckDB history (default {DEFAULT_DB})",
    )
    dashboard.add_argument(
        "--run",
        metavar="RUN_ID",
        help="the complete run to draw (default the latest complete one to start; validate "
        "prints each run's id): a later run of a few cases would otherwise take the page",
    )
    dashboard.set_defaults(handler=_cmd_dashboard)


def _add_record(commands) -> None:
    rec = commands.add_parser(
        "record",
        help="run a small job for real on this machine's CPU or GPUs (one process per rank) "
        "and record it",
    )
    rec.add_argument("job", metavar="JOB.toml", help="job spec (TOML)")
    rec.add_argument(
        "--out",
        required=True,
        metavar="FILE.toml",
        help="the recorded baseline (e.g. under results/baselines/recorded/)",
    )
    rec.add_argument("--iterations", type=_positive_int, default=10, help="timed iterations (10)")
    rec.add_argument(
        "--warmup", type=_non_negative_int, default=3, help="iterations left out first (3)"
    )
    rec.add_argument(
        "--threads", type=_positive_int, default=1, help="torch threads per process (1)"
    )
    rec.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cpu: gloo processes; cuda: nccl, rank r on GPU r, allocator peaks (default cpu)",
    )
    rec.add_argument(
        "--profile",
        metavar="FILE.ops.jsonl.gz",
        help="with --device cuda: profile one more iteration, write rank 0's kernel times "
        "(the shared profiles' format; ingest-profile and compare read it)",
    )
    rec.add_argument(
        "--profile-iterations",
        type=_positive_int,
        default=None,
        metavar="N",
        help="with --profile: profile N more iterations (1), each record numbered with its "
        "iteration; ingest-profile pools them all into its rows, compare reads the first",
    )
    rec.add_argument("--json", action="store_true", help="print the record")
    rec.set_defaults(handler=_cmd_record)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; returns the exit code (argparse's own exits included)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else EXIT_BAD_INPUT
    vars(args).pop(_GIVEN, None)
    try:  # outside the block too: an interrupt dropped and not yet delivered is raised as it ends
        with _sigterm_raises_terminated():
            try:
                return args.handler(args)
            # KernelsNotRecorded: a GPU whose profiler records no kernels (no CUPTI) cannot be
            # measured, as a machine without one cannot
            except (SpecError, OSError, SourceChangedError, KernelsNotRecorded) as err:
                print(f"error: {err}", file=sys.stderr)
                return EXIT_BAD_INPUT
    except Terminated:
        print("terminated", file=sys.stderr)
        return EXIT_TERMINATED
    except KeyboardInterrupt:  # Ctrl-C: what was interrupted says so itself (validate's run)
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


@contextlib.contextmanager
def _sigterm_raises_terminated():
    """While the block runs, the first SIGTERM raises Terminated, and an interrupt Python dropped
    is delivered again (prismbench.redelivery). The previous handler and hook come back after it:
    `main` also runs inside other programs (the tests)."""

    def terminate(_signum, _frame) -> None:
        # `timeout` signals the command and then its whole process group, so a second SIGTERM
        # follows at once; it must not break off the cleanup the first one started (SIGKILL
        # still ends a cleanup that hangs)
        signal.signal(signal.SIGTERM, lambda _signum, _frame: None)
        raise Terminated

    def rearm(dropped: BaseException) -> None:
        if isinstance(dropped, Terminated):
            signal.signal(signal.SIGTERM, terminate)

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        with redelivered({Terminated: signal.SIGTERM, KeyboardInterrupt: signal.SIGINT}, rearm):
            yield
    finally:
        signal.signal(signal.SIGTERM, previous)
