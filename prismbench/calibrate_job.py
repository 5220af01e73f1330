"""Calibrate for your own model in one command: profile its iterations, keep the profile, ingest it.

`calibrate_job(job, out_csv, profile_out)` runs `job` (world size 1: one GPU) for real with the
workloads (`workloads.build_training`, `train_step`), profiles one iteration after warm-up, or
`iterations` of them (`emulator.costs.kernel_timing.profile_iterations`: kernel-only times from
the profiler's kernel records), writes that profile in the shared `<case>.ops.jsonl.gz` format,
and turns it into kernel-table rows matched to the capture of the same job
(`prismbench.profile_ingest`: every iteration pooled into the rows).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from prismbench.files import write_atomically
from prismbench.spec import SpecError


def write_ops_jsonl_iterations(iterations: list[list[dict]], path: str | Path) -> Path:
    """Profiled iterations' op records (`kernel_timing.profile_iterations`) as one gzipped
    JSON-lines profile, in order, each record with its iteration's number under
    `profile_readers.ITERATION_KEY` (from 0), written atomically
    (`prismbench.files.write_atomically`): a record that cannot be written leaves no truncated
    profile for a later reader to take as a whole one. `read_profile_iterations` reads them all
    back (ingest-profile pools them into its rows, compare takes the first). Every iteration
    must hold a record: an empty one would leave a gap in the numbers, which the readers
    refuse."""
    from prismbench.profile_readers import ITERATION_KEY

    if not iterations:
        raise ValueError(f"{path}: no iteration to write")
    empty = [index for index, records in enumerate(iterations) if not records]
    if empty:
        raise ValueError(f"{path}: iteration(s) {empty} hold no op record: nothing to write")

    def write(tmp: Path) -> None:
        with gzip.open(tmp, "wt") as handle:
            for index, records in enumerate(iterations):
                for record in records:
                    handle.write(json.dumps(record | {ITERATION_KEY: index}) + "\n")

    return write_atomically(path, write)


def check_measuring_gpu(job, device_name: str) -> None:
    """Refuse (SpecError) to calibrate `job` on a GPU its cluster.gpu preset does not name
    (`GpuPreset.is_named`): the rows would carry this GPU's name, and the job's own table refuses
    them (`prismbench.emulate.check_table_gpu`) once the GPU time is spent. An empty
    `device_name` (no CUDA device asked) is not checked."""
    from emulator.hardware import gpu_preset

    preset = gpu_preset(job.cluster.gpu)
    names = preset.device_names
    if device_name and not preset.is_named(device_name):
        raise SpecError(
            f"cluster.gpu={job.cluster.gpu!r}: this machine's GPU is {device_name!r}, not one "
            f"of that preset's device names ({', '.join(map(repr, names)) or 'none listed'}); "
            "its kernels would be refused as that GPU's rows: give the job spec a cluster.gpu "
            "of the GPU here"
        )


def calibrate_job(job, out_csv: str | Path, profile_out: str | Path, *, warmup: int = 3,
                  device: str = "cuda", provenance: dict | None = None,
                  iterations: int = 1):  # fmt: skip
    """Profile `iterations` iterations of `job` on `device` and write their profile and the
    kernel rows of them all (`profile_ingest.ingest_iterations`: each row's repetitions count
    every iteration).

    Returns the ingestion result (matched rows, unmatched ops)."""
    import torch

    from emulator.costs import kernel_timing
    from prismbench.capture import capture_job
    from prismbench.profile_ingest import ingest_iterations, write_rows_csv
    from prismbench.profile_readers import read_profile_iterations
    from workloads import build_training, train_step

    if job.world_size != 1:
        raise SpecError(
            f"parallel: calibrate --job profiles one GPU, the job has world size {job.world_size}: "
            "on a machine with a GPU per rank, `record --device cuda --profile FILE` profiles "
            "rank 0 and `ingest-profile FILE --job JOB.toml` makes its rows; on one GPU, "
            "calibrate a world-size-1 cut of the job (every parallel degree 1, the same "
            "micro_batch and seq_len, fewer layers): its GEMMs and attention have the shapes "
            "of the job's ranks where tp and cp are 1"
        )
    check_measuring_gpu(job, (provenance or {}).get("gpu", ""))
    # captured first: a job the capture refuses fails before the GPU runs it, leaving no profile
    trace = capture_job(job).traces[0]
    state = build_training(job, None, device=device)
    rows = job.local_batch_rows
    tokens = torch.randint(0, job.model.vocab, (rows, job.batch.seq_len), device=device)
    profiled = kernel_timing.profile_iterations(
        lambda: train_step(job, state, tokens, tokens), iterations=iterations, warmup=warmup,
        cuda=device == "cuda",
    )  # fmt: skip
    if not all(profiled):
        raise kernel_timing.KernelsNotRecorded(
            f"the profiler recorded no kernels on device {device!r} (a CUDA build with CUPTI "
            "records them; a CPU run has none)"
        )
    write_ops_jsonl_iterations(profiled, profile_out)
    result = ingest_iterations(profile_out, read_profile_iterations(profile_out), trace,
                               provenance, check=False)  # fmt: skip
    write_rows_csv(result.rows, out_csv)
    return result
